"""GGUF block formats: exact dequantization (against the gguf package), the quant ops' IR life cycle."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.errors import IRError, ShapeError
from rlx.ir import ops as O
from rlx.ir import quant as Q
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.opt.memplan import plan
from rlx.opt.pipeline import optimize
from rlx.reference import run as reference_run

gguf_quants = pytest.importorskip("gguf.quants")  # the gguf package (llama.cpp's) is an optional dependency
FORMATS = sorted(Q.QUANT_FORMATS)


def _gguf_dequantize(raw: np.ndarray, fmt: str) -> np.ndarray:
    from gguf import GGMLQuantizationType

    return gguf_quants.dequantize(raw, GGMLQuantizationType[fmt.upper()])


def test_formats_agree_with_gguf_block_sizes() -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, f in Q.QUANT_FORMATS.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]] == (f.block_size, f.block_bytes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_is_bit_exact_with_gguf(fmt: str) -> None:
    rng = np.random.default_rng(FORMATS.index(fmt))
    cols = 3 * Q.QUANT_FORMATS[fmt].block_size
    raw = Q.random_blocks(rng, 7, cols, fmt)
    # the random blocks include negative and subnormal f16 scales (every 8th block's d is subnormal)
    ours, theirs = Q.dequantize(raw, fmt, cols), _gguf_dequantize(raw, fmt)
    assert ours.dtype == np.float32 and ours.shape == (7, cols)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    d = np.ascontiguousarray(raw.reshape(-1, Q.QUANT_FORMATS[fmt].block_bytes)[:, :2]).view("<f2")[:, 0]
    if fmt != "q6_k":  # q6_k keeps d at the end of the block
        assert (d < 0).any() and (np.abs(d) < np.float16(2.0 ** -14)).any()


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_quantize_round_trips_through_gguf(fmt: str) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 64)).astype(np.float32)
    raw = Q.quantize(w, fmt)
    assert raw.dtype == np.uint8 and raw.shape == (5, Q.row_bytes(fmt, 64))
    back = Q.dequantize(raw, fmt, 64)
    np.testing.assert_array_equal(back, _gguf_dequantize(raw, fmt))
    # a 4-bit format keeps each value within one step (range / 15) of the original
    step = (w.reshape(-1, 32).max(1) - w.reshape(-1, 32).min(1)).max() / 15
    assert np.abs(back - w).max() <= step


def test_quantize_refuses_what_gguf_cannot_quantize() -> None:
    with pytest.raises(IRError, match="cannot quantize q4_k"):
        Q.quantize(np.zeros((1, 256), np.float32), "q4_k")


def test_bad_formats_and_widths_raise() -> None:
    with pytest.raises(IRError, match="unknown quantization format 'q3_k'"):
        Q.row_bytes("q3_k", 256)
    with pytest.raises(IRError, match="whole blocks of 32"):
        Q.row_bytes("q4_1", 48)
    with pytest.raises(IRError, match=r"take 40 bytes, got an array of shape \(2, 36\)"):
        Q.dequantize(np.zeros((2, 36), np.uint8), "q4_1", 64)
    with pytest.raises(IRError, match="must be uint8"):
        Q.dequantize(np.zeros((2, 40), np.int8), "q4_1", 64)
    assert Q.quant_format("Q4_1") is Q.QUANT_FORMATS["q4_1"]


def _quant_graph(fmt: str = "q4_1") -> Graph:
    g = Graph("q")
    s = Dim.dynamic("seq", 8)
    x = g.input("x", [s, 64])
    w = g.param("w", [5, Q.row_bytes(fmt, 64)], "u8")
    e = g.param("emb", [9, Q.row_bytes("q8_0", 64)], "u8")
    ids = g.input("ids", [s], "i32")
    h = g.add_(x, g.dequantize(g.gather(e, ids), quant="q8_0"))
    y = g.dequant_matmul(h, w, quant=fmt)
    g.set_outputs({"y": g.activation("silu", y), "y2": g.dequant_matmul(h, w, quant=fmt)})
    return g


def test_reference_is_x_times_dequantized_weight_transposed() -> None:
    rng = np.random.default_rng(2)
    g = _quant_graph()
    raw, emb = Q.random_blocks(rng, 5, 64, "q4_1"), Q.random_blocks(rng, 9, 64, "q8_0")
    x, ids = rng.standard_normal((3, 64)).astype(np.float32), np.array([0, 8, 3], np.int32)
    y, y2 = reference_run(g, {"x": x, "ids": ids}, {"w": raw, "emb": emb})
    h = x.astype(np.float64) + Q.dequantize(emb, "q8_0", 64)[ids]
    want = h @ Q.dequantize(raw, "q4_1", 64).astype(np.float64).T
    np.testing.assert_allclose(y2, want, rtol=1e-6, atol=1e-6)
    assert y.shape == (3, 5) and y.dtype == np.float32


@pytest.mark.parametrize("fmt", Q.INT8_ACT_FORMATS)
def test_weight_ints_recompose_the_dequantized_weight(fmt: str) -> None:
    """The integer form act="q8" multiplies: f32(d * q) + m is GGUF's dequantization bit for bit (q4_k per
    32-value sub-block: d = d * sc, m = -dmin * min)."""
    k = 512
    raw = Q.random_blocks(np.random.default_rng(5), 3, k, fmt)
    q, d, m = Q.weight_ints(raw, fmt, k)
    assert q.shape == (3, k // 32, 32) and d.shape == m.shape == (3, k // 32)
    v = ((d[..., None] * q.astype(np.float32)).astype(np.float32) + m[..., None]).astype(np.float32)
    np.testing.assert_array_equal(v.reshape(3, k), Q.dequantize(raw, fmt, k))  # (+0 for a -0 of d * 0)


def test_q4_k_with_int8_activations_is_the_quantized_x_times_the_weight() -> None:
    """act="q8" on q4_k: the reference multiplies x quantized per 32 values (q * d) with the dequantized weight;
    only the f32 products d_w * d_x and d_x * sum(q) round. q16 stays q8_0 / q4_0 / q4_1 only."""
    rng = np.random.default_rng(6)
    k = 512
    raw = Q.random_blocks(rng, 7, k, "q4_k")
    x = rng.standard_normal((2, k)).astype(np.float32)
    g = Graph("q4k_q8")
    g.set_outputs([g.dequant_matmul(g.input("x", [2, k]), g.param("w", [7, 288], "u8"), quant="q4_k", act="q8")])
    (y,) = reference_run(g, {"x": x}, {"w": raw})
    qx, dx = Q.quantize_act(x)
    xq = (qx.reshape(2, -1, 32).astype(np.float64) * dx[..., None]).reshape(2, k)
    want = xq @ Q.dequantize(raw, "q4_k", k).astype(np.float64).T
    scale = np.abs(xq) @ Q.abs_terms(raw, "q4_k", k).astype(np.float64).T
    assert np.all(np.abs(y - want) <= 4 * 2.0 ** -24 * scale)
    with pytest.raises(ShapeError, match="act='q16' takes q8_0/q4_0/q4_1"):
        g.dequant_matmul(g.input("x16", [2, k]), g.param("w16", [7, 288], "u8"), quant="q4_k", act="q16")


def test_optimizer_keeps_raw_blocks_and_merges_duplicates() -> None:
    g = optimize(_quant_graph(), 2)
    kinds = [n.kind for n in g.nodes]
    assert kinds.count("dequant_matmul") == 1  # CSE merged the two identical products
    for p in g.params():  # u8 blocks are never re-laid out
        assert p.op.layout is None and p.shape.dtype.value == "u8"
    lir = plan(g)
    assert lir.hash() == plan(optimize(_quant_graph(), 2)).hash()
    assert lir.hash() != plan(optimize(_quant_graph("q4_0"), 2)).hash()
    from rlx.opt.lowering import lower_for

    assert not lower_for(lir, "cpu").decisions  # nothing packed: the weights are u8 blocks


def test_serialization_round_trip() -> None:
    g = _quant_graph()
    back = Graph.from_json(g.to_json())
    assert str(back) == str(g) and back.to_json() == g.to_json()
    assert isinstance(back.node(next(n.id for n in back.nodes if n.kind == "dequant_matmul")).op, O.DequantMatMul)


def test_builder_names_the_node_on_bad_shapes() -> None:
    g = Graph("bad")
    x = g.input("x", [2, 64])
    w = g.param("w", [5, 36], "u8")
    with pytest.raises(ShapeError, match=r"dequant_matmul: q4_1 rows of K=64 values take 40 bytes"):
        g.dequant_matmul(x, w, quant="Q4_1")

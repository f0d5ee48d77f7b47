"""q8_0 / q4_0 / q4_1 weights stored interleaved by 16 rows (`InterleavedQuantParam`,
kernels/quant_interleaved.h) for integer-activation `dequant_matmul`s: the decision, the products against the
reference, batch invariance (a row's bits do not depend on its step), the portable path's bits equal to the
AVX-512 one's, the prefill panels equal to those of GGUF's layout, and the decode groups on that layout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_helpers import assert_within, compile_graph  # noqa: E402
from test_cpu_quant import act_bound  # noqa: E402

import rlx  # noqa: E402
from rlx.config import Config  # noqa: E402
from rlx.ir import quant as Q  # noqa: E402
from rlx.ir.decisions_quant import InterleavedQuantParam, QuantGemvGroup  # noqa: E402
from rlx.opt.lowering_quant_cpu import interleaved_params, quant_gemv_groups  # noqa: E402
from rlx.opt.memplan import plan  # noqa: E402
from rlx.pipeline.cpu import quant_interleave  # noqa: E402
from rlx.reference import run as reference_run  # noqa: E402

FORMATS = ("q8_0", "q4_0", "q4_1")
ROWS = (1, 3, 8, 9, 16, 17, 40)  # decode tiles of 8 rows and their tails, then the prefill panels
N = 48  # three groups of 16 rows: the two threads' split falls between groups
INTERLEAVED = {"cpu_quant_layout": "interleaved"}


def _graph(fmt: str, k: int, n: int = N) -> rlx.Graph:
    g = rlx.Graph(f"qi_{fmt}")
    x = g.input("x", [rlx.Dim.dynamic("m", 64), k])
    w = g.param("w", [n, Q.row_bytes(fmt, k)], "u8")
    g.set_outputs({act: g.dequant_matmul(x, w, quant=fmt, act=act) for act in ("q8", "q16")})
    return g


def test_the_decision() -> None:
    g = _graph("q4_1", 64)
    (d,) = interleaved_params(plan(g))
    assert isinstance(d, InterleavedQuantParam) and d.quant == "q4_1" and "interleaved by 16 rows" in d.describe()
    # rows not a multiple of 16, f32 activations, or another reader (an embedding's gather): GGUF's layout
    assert interleaved_params(plan(_graph("q4_1", 64, n=40))) == ()
    g = rlx.Graph("f32")
    g.set_outputs([g.dequant_matmul(g.input("x", [2, 64]), g.param("w", [32, Q.row_bytes("q4_1", 64)], "u8"),
                                    quant="q4_1")])
    assert interleaved_params(plan(g)) == ()
    g = rlx.Graph("tied")
    table = g.param("w", [32, Q.row_bytes("q8_0", 64)], "u8")
    rows = g.dequantize(g.gather(table, g.input("ids", [2], "i32")), quant="q8_0")
    g.set_outputs([g.dequant_matmul(rows, table, quant="q8_0", act="q16")])
    assert interleaved_params(plan(g)) == ()
    # a decode group's members share one layout: 48 rows (interleaved) and 40 (not) are not one pass
    g = rlx.Graph("mixed")
    x = g.input("x", [2, 64])
    g.set_outputs([g.dequant_matmul(x, g.param(f"w{n}", [n, Q.row_bytes("q4_1", 64)], "u8"), quant="q4_1", act="q16")
                   for n in (48, 32, 40)])
    lir = plan(g)
    interleaved = frozenset(d.node for d in interleaved_params(lir))
    assert len(interleaved) == 2
    (group,) = quant_gemv_groups(lir, interleaved)
    assert isinstance(group, QuantGemvGroup) and set(group.members) == {lir.graph.users()[p][0] for p in interleaved}
    assert len(quant_gemv_groups(lir)[0].members) == 3  # without the decision: one pass of three


def test_the_layout_setting() -> None:
    assert quant_interleave(Config(cpu_quant_layout="interleaved"))
    assert not quant_interleave(Config(cpu_quant_layout="rows"))
    assert not quant_interleave(Config(cpu_target="x86-64-v3"))  # no AVX-512 VNNI: GGUF's layout
    with pytest.raises(rlx.RlxError, match="RLX_QUANT_LAYOUT"):
        Config.from_env({"RLX_QUANT_LAYOUT": "tiled"})


def _runs(fmt: str, k: int, seed: int, **config: object):
    rng = np.random.default_rng(seed)
    raw = Q.random_blocks(rng, N, k, fmt)
    g = _graph(fmt, k)
    cg = compile_graph(g, {"w": raw}, opt_level=2, **config)
    return g, raw, cg, rng


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", [96, 224])
def test_matches_reference_and_is_batch_invariant(fmt: str, k: int) -> None:
    g, raw, cg, rng = _runs(fmt, k, 3, **INTERLEAVED)
    source = cg.source or ""
    assert f"rlx_qi_gemm_{fmt}_q16(" in source and f"rlx_qgemm_panels(rlx_qi_dequant_panel_{fmt}," in source
    x = rng.standard_normal((max(ROWS), k)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: scale 0
    x[-1, -32:] *= 1e4  # q16's high bytes at their extremes
    x[2, 32:64] *= 1e4
    whole = dict(zip(g.output_names, cg.run({"x": x[:16]})))
    for m in ROWS:
        got = dict(zip(g.output_names, cg.run({"x": x[:m]})))
        want = dict(zip(g.output_names, reference_run(g, {"x": x[:m]}, {"w": raw})))
        for act in ("q8", "q16"):
            assert_within(got[act], want[act], act_bound(x[:m], raw, fmt, k, want[act], act), f"{fmt} {act}, {m} rows")
            if m <= 16:  # a decode row has the bits it has in any other step of up to 16 rows
                np.testing.assert_array_equal(got[act], whole[act][:m], f"{fmt} {act}, {m} rows")


@pytest.mark.parametrize("fmt", FORMATS)
def test_portable_path_and_gguf_layout_agree(fmt: str) -> None:
    """The portable loop computes the AVX-512 kernel's values bit for bit; the prefill panels dequantize the
    interleaved rows exactly as GGUF's, so many-row steps equal those of the other layout bit for bit."""
    import platform

    k = 224
    g, raw, native, rng = _runs(fmt, k, 4, **INTERLEAVED)
    x = rng.standard_normal((40, k)).astype(np.float32)
    if platform.machine().lower() in ("x86_64", "amd64"):
        portable = compile_graph(g, {"w": raw}, opt_level=2, cpu_target="x86-64", **INTERLEAVED)
        assert f"rlx_qi_gemm_{fmt}_q8(" in (portable.source or "")
        for m in (1, 9, 16):
            for a, b in zip(native.run({"x": x[:m]}), portable.run({"x": x[:m]})):
                np.testing.assert_array_equal(a, b, f"{fmt}, {m} rows")
    rows = compile_graph(g, {"w": raw}, opt_level=2, cpu_quant_layout="rows")
    assert "rlx_qi_" not in (rows.source or "")
    for a, b in zip(native.run({"x": x}), rows.run({"x": x})):
        np.testing.assert_array_equal(a, b, f"{fmt} prefill panels")


WIDTHS = (48, 16, 32)


@pytest.mark.parametrize("fmt,act", [("q4_1", "q16"), ("q8_0", "q8"), ("q4_0", "q16"), ("q8_0", "q16")])
def test_decode_groups(fmt: str, act: str) -> None:
    """Q/K/V-like members and a gate/up pair with its SwiGLU, on interleaved weights (the team splits groups
    of 16 rows), against the graphs' own nodes run one by one."""
    k = 96
    g = rlx.Graph("groups")
    x = g.input("x", [rlx.Dim.dynamic("m", 24), k])
    h = g.mul(x, x)
    outs = {name: g.dequant_matmul(h, g.param(f"w{name}", [n, Q.row_bytes(fmt, k)], "u8"), quant=fmt, act=act)
            for name, n in zip("qkv", WIDTHS)}
    gate, up = (g.dequant_matmul(x, g.param(n, [N, Q.row_bytes(fmt, k)], "u8"), quant=fmt, act=act)
                for n in ("wg", "wu"))
    g.set_outputs({**outs, "ffn": g.mul(g.activation("silu", gate), up)})
    rng = np.random.default_rng(9)
    w = {p.op.name: Q.random_blocks(rng, p.shape.dims[0].value, k, fmt) for p in g.params()}
    cg = compile_graph(g, w, opt_level=2, **INTERLEAVED)
    cg.num_threads = 2
    source = cg.source or ""
    assert f"rlx_qi_group_rows_{fmt}_{act}(" in source and f"rlx_qi_group_swiglu_{fmt}_{act}(" in source
    xs = rng.standard_normal((20, k)).astype(np.float32)
    whole = dict(zip(g.output_names, cg.run({"x": xs[:16]})))
    for m in (1, 5, 16, 20):  # 20: every node's own kernel (prefill panels)
        xv = xs[:m]
        got = dict(zip(g.output_names, cg.run({"x": xv})))
        want = dict(zip(g.output_names, reference_run(g, {"x": xv}, w)))
        for name in "qkv":
            assert_within(got[name], want[name], act_bound(xv * xv, w[f"w{name}"], fmt, k, want[name], act),
                          f"{fmt} {act} {name}, {m} rows")
        # the SwiGLU: gate and up each within their bound; silu's derivative is at most 1.1
        gate_v, up_v = (reference_run(_one(fmt, act, k), {"x": xv}, {"w": w[n]})[0] for n in ("wg", "wu"))
        bg, bu = (act_bound(xv, w[n], fmt, k, v, act) for n, v in (("wg", gate_v), ("wu", up_v)))
        silu = gate_v / (1.0 + np.exp(-gate_v.astype(np.float64)))
        bound = 1.1 * bg * np.abs(up_v) + np.abs(silu) * bu + bg * bu * 1.1 + 8 * 2.0 ** -24 * np.abs(want["ffn"])
        assert_within(got["ffn"], want["ffn"], bound, f"{fmt} {act} SwiGLU, {m} rows")
        if m <= 16:  # batch-invariant
            for name in g.output_names:
                np.testing.assert_array_equal(got[name], whole[name][:m], f"{name}, {m} rows")


def _one(fmt: str, act: str, k: int) -> rlx.Graph:
    g = rlx.Graph("one")
    x = g.input("x", [rlx.Dim.dynamic("m", 24), k])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [N, Q.row_bytes(fmt, k)], "u8"), quant=fmt, act=act)])
    return g

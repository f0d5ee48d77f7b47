"""Legalization: f16/bf16 ops a backend lacks run in f32 between casts, and mean the same thing."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.ir.dtype import BFLOAT16, DType
from rlx.opt.legalize import legalize


def f32_only(node, in_dtypes, out_dtype) -> bool:
    return all(d is DType.F32 for d in (*in_dtypes, out_dtype))


def _block(dtype: str) -> rlx.Graph:
    g = rlx.Graph("blk")
    x = g.input("x", [3, 8], dtype)
    w = g.param("w", [8, 8], dtype)
    h = g.matmul(x, w)
    g.set_outputs({"sm": g.softmax(h), "sum": g.add_(h, x)})
    return g


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_casts_around_refused_ops_only(dtype):
    g = _block(dtype)
    out = legalize(g, lambda node, ins, o: node.kind == "binary" or f32_only(node, ins, o))
    kinds = [n.kind for n in out.nodes]
    # x and w widened once each, the matmul's result narrowed, then widened again for softmax
    assert kinds == ["input", "param", "cast", "cast", "matmul", "cast", "cast", "softmax", "cast", "binary"]
    for n in out.nodes:
        if n.kind in ("matmul", "softmax"):
            assert n.shape.dtype is DType.F32
        if n.kind == "binary":  # accepted as it is: untouched, still on the half type
            assert n.shape.dtype is DType.parse(dtype)
    assert [out.node(o).shape.dtype.value for o in out.outputs] == [dtype, dtype]
    assert out.output_names == g.output_names
    assert any(n.name == f"legalize {dtype}->f32 for matmul %2" for n in out.nodes)


def test_leaves_accepted_and_hopeless_nodes_alone():
    g = _block("bf16")
    assert legalize(g, lambda node, ins, o: True) is g  # everything accepted: the same graph
    assert legalize(g, lambda node, ins, o: False) is g  # refused even in f32: left for the driver to report
    g32 = _block("f32")
    assert legalize(g32, f32_only) is g32


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_legalized_graph_means_the_same(dtype):
    rng = np.random.default_rng(0)
    # the reference rounds once per op, as the casts around an f32 op do
    g = _block(dtype)
    out = legalize(g, f32_only)
    np_dt = BFLOAT16 if dtype == "bf16" else np.float16
    inputs = {"x": rng.uniform(-1, 1, (3, 8)).astype(np_dt)}
    params = {"w": rng.uniform(-1, 1, (8, 8)).astype(np_dt)}
    for a, b in zip(rlx.reference.run(g, inputs, params), rlx.reference.run(out, inputs, params)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))


def test_cpu_session_legalizes_and_shows_it_in_the_lir():
    g = _block("bf16")
    lir = rlx.Session().lower(g, opt_level=0)
    text = lir.inspect()
    assert "# legalize bf16->f32 for matmul %2" in text and "# legalize f32->bf16 after softmax" in text


def mixed_gemms(node, in_dtypes, out_dtype) -> bool:
    """A backend with f32 ops and GEMMs of f32 activations on f16/bf16 weights (as the CPU)."""
    if node.kind in ("matmul", "fused_matmul_bias_act") and in_dtypes[0] is DType.F32 and out_dtype is DType.F32:
        return in_dtypes[1] in (DType.F16, DType.BF16, DType.F32)
    return f32_only(node, in_dtypes, out_dtype)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_gemm_weights_stay_narrow_where_the_backend_multiplies_them(dtype):
    g = _block(dtype)
    out = legalize(g, mixed_gemms)
    mm = next(n for n in out.nodes if n.kind == "matmul")
    assert [out.node(i).kind for i in mm.inputs] == ["cast", "param"]  # x widened, w read as stored
    assert out.node(mm.inputs[1]).shape.dtype is DType.parse(dtype) and mm.shape.dtype is DType.F32
    rng = np.random.default_rng(1)
    np_dt = BFLOAT16 if dtype == "bf16" else np.float16
    inputs = {"x": rng.uniform(-1, 1, (3, 8)).astype(np_dt)}
    params = {"w": rng.uniform(-1, 1, (8, 8)).astype(np_dt)}
    for a, b in zip(rlx.reference.run(g, inputs, params), rlx.reference.run(out, inputs, params)):
        np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_cpu_lir_reads_half_weights_without_a_cast(dtype):
    from rlx.ir.decisions import PackedParam
    from rlx.opt.lowering import lower_for

    g = _block(dtype)
    lir = lower_for(rlx.Session().lower(g, opt_level=0), "cpu")
    text = lir.inspect()
    assert f"# legalize {dtype}->f32 for matmul %2" in text  # x, not w
    mm = next(n for n in lir.graph.nodes if n.kind == "matmul")
    assert lir.graph.node(mm.inputs[1]).kind == "param"
    assert [lir.graph.node(d.node).op.name for d in lir.decided(PackedParam)] == ["w"]
    # and it runs: bf16 x bf16 products are exact in f32, so the f32 sum rounded once to the
    # half type is the reference's value or its neighbour (one ulp of the half type)
    rng = np.random.default_rng(2)
    np_dt = BFLOAT16 if dtype == "bf16" else np.float16
    inputs = {"x": rng.uniform(-1, 1, (3, 8)).astype(np_dt)}
    params = {"w": rng.uniform(-1, 1, (8, 8)).astype(np_dt)}
    cg = rlx.Session().compile(g, opt_level=0)
    cg.set_param("w", params["w"])
    ulp = 2.0 ** (-7 if dtype == "bf16" else -10)
    for a, b in zip(cg.run(inputs), rlx.reference.run(g, inputs, params)):
        a, b = a.astype(np.float64), b.astype(np.float64)
        assert np.all(np.abs(a - b) <= ulp * np.abs(b) + 1e-30)


def test_backends_without_mixed_gemms_get_the_weights_widened():
    from rlx.codegen.backends import first_unsupported_op, load_rules

    g = rlx.Graph("mixed")
    g.set_outputs([g.matmul(g.input("x", [3, 8]), g.param("w", [8, 4], "bf16"))])
    node, reason = first_unsupported_op(g, "cuda")
    assert node.kind == "matmul" and "mixed bf16/f32 operands" in reason
    assert first_unsupported_op(g, "cpu") is None  # the CPU multiplies bf16 weights
    out = legalize(g, load_rules("cuda").accepts)
    mm = next(n for n in out.nodes if n.kind == "matmul")
    assert [out.node(i).kind for i in mm.inputs] == ["input", "cast"]
    assert out.node(mm.inputs[1]).shape.dtype is DType.F32


def test_state_inputs_are_never_widened() -> None:
    """An op updating a narrow state in place (a KV cache) is left alone: a widened copy would take the update."""
    g = rlx.Graph("kv")
    q, k, v = (g.input(n, [1, 2, 16]) for n in "qkv")
    kc, vc = (g.state(n, [1, 8, 16], "f16") for n in ("k_cache", "v_cache"))
    g.set_outputs([g.cached_attention(q, k, v, kc, vc, g.input("pos", [1], "i32"), num_heads=2, head_dim=8)])
    assert legalize(g, lambda node, ins, out: all(d.value in ("f32", "i32") for d in (*ins, out))) is g

"""Every op × dtype through the Metal emulator matches the reference, or is refused before any build.

One graph per dtype holds every op case of `tests/codegen/dtype_matrix.py` that the Metal rule table
accepts; it is rendered to a .metal file, compiled as C++ against the MSL shim and run over its grids.
"""

from __future__ import annotations

import numpy as np
import pytest
from dtype_matrix import RTOL, _Prefixed, build_one, cases, feeds
from emulator import emulate, have_compiler

import rlx
from rlx.codegen.backends import first_unsupported_op
from rlx.ir import ops as O
from rlx.ir.dtype import DType

pytestmark = pytest.mark.skipif(not have_compiler(), reason="no C++ compiler for the Metal emulator")
METAL_DTYPES = tuple(d for d in DType if d is not DType.F64 and not d.is_narrow)  # Metal refuses both


def _check(g: rlx.Graph, labels: list[str], rtol: float, seed: int = 7, opt_level: int = 0) -> None:
    rng = np.random.default_rng(seed)
    inputs, params = feeds(g, rng)
    m = emulate(g, opt_level=opt_level)
    for name, value in params.items():
        m.set_param(name, value)
    got = m.run(inputs)
    want = rlx.reference.run(g, inputs, params)
    for label, a, b in zip(labels, got, want):
        if np.asarray(b).dtype.kind in "iub":
            np.testing.assert_array_equal(a, b, err_msg=label)
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6, equal_nan=True, err_msg=label)


@pytest.mark.parametrize("dtype", METAL_DTYPES, ids=lambda d: d.value)
def test_every_supported_op_matches_the_reference(dtype):
    g = rlx.Graph(f"metal_{dtype.value}")
    x = g.input("x", [2, 3, 4], dtype.value)
    y = g.input("y", [2, 3, 4], dtype.value)
    outputs: dict[str, int] = {}
    for label, build in cases(dtype):
        single = build_one(dtype, build)
        if single is None or first_unsupported_op(single, "metal") is not None:
            continue
        outputs[label] = build(_Prefixed(g, label), x, y)
    g.set_outputs(outputs)
    _check(g, list(outputs), RTOL[dtype] if dtype.is_float else 0.0)
    if dtype.is_float:  # every op of the CPU backend but the KV-cache attention, on every float dtype
        assert {label for label, _ in cases(dtype)} <= set(outputs)


def test_f64_is_refused_before_any_build():
    g = rlx.Graph("f64")
    g.set_outputs([g.activation("relu", g.input("x", [4], "f64"))])
    _node, reason = first_unsupported_op(g, "metal")
    assert "no 64-bit float" in reason
    with pytest.raises(rlx.BuildError, match="no 64-bit float"):
        emulate(g)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_cached_attention_appends_in_place_and_attends(dtype):
    """Prefill then decode steps over a KV cache (rows at different positions, GQA), caches updated in place."""
    seq = rlx.Dim.dynamic("seq", max=4)
    g = rlx.Graph("kv")
    q = g.input("q", [2, seq, 16], dtype)
    k = g.input("k", [2, seq, 8], dtype)
    v = g.input("v", [2, seq, 8], dtype)
    kc, vc = g.state("kc", [2, 8, 8], dtype), g.state("vc", [2, 8, 8], dtype)
    pos = g.input("pos", [2], "i32")
    g.set_outputs([g.cached_attention(q, k, v, kc, vc, pos, num_heads=4, head_dim=4, num_kv_heads=2)])
    m = emulate(g)
    rng = np.random.default_rng(2)
    np_dt = np.float16 if dtype == "f16" else np.float32
    caches = [np.zeros((2, 8, 8), np_dt) for _ in range(2)]
    ref_caches = [c.copy() for c in caches]
    for positions, s in (([0, 2], 3), ([3, 5], 1), ([4, 6], 2)):
        feed = {name: rng.standard_normal((2, s, w)).astype(np_dt) for name, w in (("q", 16), ("k", 8), ("v", 8))}
        feed["pos"] = np.array(positions, np.int32)
        got = m.run({**feed, "kc": caches[0], "vc": caches[1]})[0]
        want = rlx.reference.run(g, {**feed, "kc": ref_caches[0], "vc": ref_caches[1]}, {})[0]
        rtol = 2e-3 if dtype == "f16" else 2e-5
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-3 if dtype == "f16" else 1e-6)
        np.testing.assert_array_equal(caches[0], ref_caches[0])
        np.testing.assert_array_equal(caches[1], ref_caches[1])
    with pytest.raises(rlx.ExecutionError, match="exceeds the cache capacity"):
        m.run({**feed, "pos": np.array([7, 0], np.int32), "kc": caches[0], "vc": caches[1]})


def test_larger_shapes_dynamic_dims_and_every_variant():
    """Edges of the GEMM tiles, batched / broadcast GEMMs, every mask, GQA, rows wider than a simdgroup,
    softmax over a middle axis, interleaved rope, a dynamic sequence dim (two lengths, one build)."""
    seq = rlx.Dim.dynamic("seq", max=12)
    g = rlx.Graph("wide")
    x = g.input("x", [2, seq, 40])
    w = g.param("w", [40, 70])
    ga, be = g.param("ga", [70]), g.param("be", [70])
    a = g.input("a", [3, 2, 9, 20])
    b = g.input("b", [2, 20, 11])
    q = g.input("q", [2, seq, 32])
    kv = g.input("kv", [2, seq, 16])
    pad = g.input("pad", [2, seq], "i64")
    bias = g.input("bias", [1, 4, seq, seq])
    cs = g.input("cos", [seq, 2])
    sn = g.input("sin", [seq, 2])
    h = g.matmul(x, w)
    outs = {
        "gemm": h,
        "gemm_bias_act": g.add(O.FusedMatMulBiasAct("gelu_tanh"), [x, w, g.param("bi", [70])]),
        "batched_broadcast": g.matmul(a, b),
        "swiglu": g.add(O.FusedSwiGLU(), [x, w, g.param("w2", [40, 70])]),
        "layer_norm": g.layer_norm(h, ga, be),
        "res_rms": g.add(O.FusedResidualRmsNorm(1e-6), [h, h, g.param("rb", [70]), ga]),
        "softmax_rows": g.softmax(h, -1),
        "softmax_mid": g.softmax(h, 1),
        "reduce_mean": g.add(O.Reduce("mean", (0, 2)), [h]),
        "attention_gqa_padding": g.attention(q, kv, kv, num_heads=4, head_dim=8, num_kv_heads=2, mask="padding",
                                             mask_input=pad),
        "attention_causal": g.attention(q, q, q, num_heads=4, head_dim=8, mask="causal"),
        "attention_bias": g.attention(q, q, q, num_heads=4, head_dim=8, mask="bias", mask_input=bias),
        "rope_interleaved": g.rope(q, cs, sn, head_dim=8, n_rot=4, variant="interleaved"),
        "transpose": g.transpose(h, [1, 0, 2]),
    }
    g.set_outputs(outs)
    m = emulate(g)
    rng = np.random.default_rng(5)
    params = {n.op.name: rng.standard_normal(n.op.shape.static_dims).astype(np.float32) for n in g.params()}
    for name, value in params.items():
        m.set_param(name, value)
    for s in (12, 5):
        inputs = {}
        for n in g.inputs():
            shape = n.op.shape.concrete({"seq": s})
            inputs[n.op.name] = (rng.standard_normal(shape).astype(np.float32) if n.op.shape.dtype.is_float
                                 else rng.integers(0, 2, shape).astype(np.int64))
        inputs["pad"][:, 0] = 1
        got = m.run(inputs)
        want = rlx.reference.run(g, inputs, params)
        for label, a_, b_ in zip(outs, got, want):
            np.testing.assert_allclose(a_, b_, rtol=2e-4, atol=2e-5, err_msg=f"{label} seq={s}")


def test_run_time_errors_are_exceptions():
    g = rlx.Graph("errs")
    ids = g.input("ids", [3], "i32")
    g.set_outputs([g.gather(g.param("t", [4, 2]), ids)])
    m = emulate(g)
    m.set_param("t", np.zeros((4, 2), np.float32))
    np.testing.assert_array_equal(m.run(ids=np.array([0, 3, 1], np.int32))[0], np.zeros((3, 2), np.float32))
    with pytest.raises(rlx.ExecutionError, match="gather index out of range"):
        m.run(ids=np.array([0, 4, 1], np.int32))
    with pytest.raises(rlx.ExecutionError, match="must have shape"):
        m.run(ids=np.array([0, 1], np.int32))
    with pytest.raises(rlx.ExecutionError, match="unknown param"):
        m.set_param("nope", np.zeros(2))
    with pytest.raises(rlx.ExecutionError, match="must have shape"):
        m.set_param("t", np.zeros((2, 4), np.float32))
    with pytest.raises(rlx.ExecutionError, match="missing inputs"):
        m.run({})


def test_dynamic_dims_are_bound_and_checked():
    seq = rlx.Dim.dynamic("seq", max=6)
    g = rlx.Graph("dyn")
    a, b = g.input("a", [seq, 3]), g.input("b", [seq, 3])
    g.set_outputs([g.add(O.Binary("mul"), [a, b])])
    m = emulate(g)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(m.run(a=x, b=x)[0], x * x)
    with pytest.raises(rlx.ExecutionError, match=r"seq=7 is outside 1\.\.6"):
        m.run(a=np.zeros((7, 3), np.float32), b=np.zeros((7, 3), np.float32))
    with pytest.raises(rlx.ExecutionError, match="seq is 2 here but 4"):
        m.run(a=x, b=x[:2])
    with pytest.raises(rlx.ExecutionError, match="must have rank 2"):
        m.run(a=x.reshape(-1), b=x)


def test_convolution_is_refused_before_any_build():
    """Metal has no conv or pool rule yet: named by the support check, refused before the emulator builds."""
    g = rlx.Graph("conv")
    x = g.input("x", [1, 2, 6, 6])
    g.set_outputs([g.pool("max", g.conv(x, g.param("w", [3, 2, 3, 3])), (2, 2))])
    node, reason = first_unsupported_op(g, "metal")
    assert node.kind == "conv" and "no rule for conv" in reason
    with pytest.raises(rlx.BuildError, match="no rule for conv"):
        emulate(g)

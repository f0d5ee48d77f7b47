"""CPU backend parity for the GEMM family: matmul (batched, broadcast, transposed operands),
fused matmul + bias + activation, fused SwiGLU; with BLAS and with the built-in C GEMM.

Tolerance: an f32 dot product of length k accumulated in any order is within
(k+2) * u * (|a| @ |b|) of the exact value (Higham, Accuracy and Stability, Thm 3.5), and the
reference is the exact product rounded once. Epilogue activations are 1.13-Lipschitz at most
(gelu), add their own few-ulp rounding, so fused results get 1.2x the GEMM bound + 2e-6 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import assert_within, compile_graph, gemm_bound
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlx
from rlx.ir import ops as O

LIPSCHITZ_ACTS = ["gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "neg", "abs"]


def _ref(g, feed, params):
    return rlx.reference.run(g, feed, params)


@st.composite
def _batched_shapes(draw):
    m, k, n = draw(st.integers(1, 9)), draw(st.integers(1, 40)), draw(st.integers(1, 12))
    rank = draw(st.integers(0, 2))
    batch = [draw(st.integers(1, 3)) for _ in range(rank)]

    def side():
        r = draw(st.integers(0, rank))
        return [1 if draw(st.booleans()) else d for d in batch[rank - r:]]

    return [*side(), m, k], [*side(), k, n]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_batched_shapes())
def test_matmul_batched_broadcast(rng, shapes):
    sa, sb = shapes
    g = rlx.Graph("mm")
    a = g.input("a", sa)
    b = g.input("b", sb)
    g.set_outputs([g.matmul(a, b)])
    av = rng.standard_normal(sa).astype(np.float32)
    bv = rng.standard_normal(sb).astype(np.float32)
    got = compile_graph(g).run(a=av, b=bv)[0]
    want = _ref(g, {"a": av, "b": bv}, {})[0]
    assert got.shape == want.shape
    assert_within(got, want, gemm_bound(av, bv, sa[-1]) + 1e-30, "matmul")


@pytest.mark.parametrize("blas", ["openblas32", "none"])
def test_fused_matmul_bias_act_every_activation(rng, blas):
    """One graph holds every epilogue variant; the x batch folds into M (one GEMM per node)."""
    g = rlx.Graph("fused")
    x = g.input("x", [2, 7, 24])
    w = g.param("w", [24, 19])
    b = g.param("b", [19])
    outs = {}
    for act in [None, *LIPSCHITZ_ACTS]:
        outs[f"bias_{act}"] = g.add(O.FusedMatMulBiasAct(act), [x, w, b])
        outs[f"nobias_{act}"] = g.add(O.FusedMatMulBiasAct(act), [x, w])
    g.set_outputs(outs)
    params = {"w": rng.standard_normal((24, 19)).astype(np.float32),
              "b": rng.standard_normal(19).astype(np.float32)}
    xv = rng.standard_normal((2, 7, 24)).astype(np.float32)
    got = compile_graph(g, params, blas=blas).run(x=xv)
    want = _ref(g, {"x": xv}, params)
    bound = gemm_bound(xv, params["w"], 24)
    for name, a, b_ in zip(g.output_names, got, want):
        assert_within(a, b_, 1.2 * bound + 2e-6 * np.abs(b_) + 1e-7, name)


def test_transposed_operands_fold_into_blas_flags(rng):
    """transpose(w) feeding only GEMMs is not materialized: BLAS reads w with a transpose flag."""
    g = rlx.Graph("trans")
    x = g.input("x", [5, 16])
    w = g.param("w", [12, 16])  # [out, in], as checkpoints store linear weights
    k = g.input("k", [3, 8, 16])
    q = g.input("q", [3, 6, 16])
    y = g.matmul(x, g.transpose(w, [1, 0]))
    scores = g.matmul(q, g.transpose(k, [0, 2, 1]))
    at = g.matmul(g.transpose(x, [1, 0]), x)  # transposed left operand
    g.set_outputs([y, scores, at])
    params = {"w": rng.standard_normal((12, 16)).astype(np.float32)}
    feed = {"x": rng.standard_normal((5, 16)).astype(np.float32),
            "k": rng.standard_normal((3, 8, 16)).astype(np.float32),
            "q": rng.standard_normal((3, 6, 16)).astype(np.float32)}
    for blas in ("openblas32", "none"):
        cg = compile_graph(g, params, blas=blas)
        assert cg.source.count("folded into the GEMMs") == 3
        got = cg.run(feed)
        want = _ref(g, feed, params)
        assert_within(got[0], want[0], gemm_bound(feed["x"], params["w"].T, 16), "x @ w.T")
        assert_within(got[1], want[1], gemm_bound(feed["q"], feed["k"].transpose(0, 2, 1), 16), "q @ k.T")
        assert_within(got[2], want[2], gemm_bound(feed["x"].T, feed["x"], 5), "x.T @ x")


def test_matmul_dynamic_rows_one_build(rng):
    seq = rlx.Dim.dynamic("seq", max=40)
    g = rlx.Graph("dyn")
    x = g.input("x", [2, seq, 32])
    w = g.param("w", [32, 48])
    b = g.param("b", [48])
    g.set_outputs([g.add(O.FusedMatMulBiasAct("gelu"), [x, w, b])])
    params = {"w": rng.standard_normal((32, 48)).astype(np.float32),
              "b": rng.standard_normal(48).astype(np.float32)}
    cg = compile_graph(g, params)
    for s in (1, 5, 17, 40):
        xv = rng.standard_normal((2, s, 32)).astype(np.float32)
        got = cg.run(x=xv)[0]
        want = _ref(g, {"x": xv}, params)[0]
        assert got.shape == (2, s, 48)
        assert_within(got, want, 1.2 * gemm_bound(xv, params["w"], 32) + 2e-6 * np.abs(want) + 1e-7, f"seq={s}")


@pytest.mark.parametrize("rows", [3, 300])
def test_fused_swiglu(rng, rows):
    """300 rows with N=512 runs two row blocks through the scratch buffer."""
    g = rlx.Graph("swiglu")
    x = g.input("x", [rows, 24])
    wg = g.param("wg", [24, 512])
    wu = g.param("wu", [24, 512])
    g.set_outputs([g.add(O.FusedSwiGLU(), [x, wg, wu])])
    params = {"wg": rng.standard_normal((24, 512)).astype(np.float32),
              "wu": rng.standard_normal((24, 512)).astype(np.float32)}
    xv = rng.standard_normal((rows, 24)).astype(np.float32)
    got = compile_graph(g, params).run(x=xv)[0]
    want = _ref(g, {"x": xv}, params)[0]
    gate = xv.astype(np.float64) @ params["wg"]
    up = xv.astype(np.float64) @ params["wu"]
    # error of silu(g)*u: |u| * 1.1 * err(g) + |silu(g)| * err(u), plus a few roundings
    bound = (np.abs(up) * 1.1 * gemm_bound(xv, params["wg"], 24)
             + np.abs(gate) * gemm_bound(xv, params["wu"], 24) + 4e-6 * np.abs(want) + 1e-7)
    assert_within(got, want, bound, "swiglu")


def test_swiglu_batched_weights(rng):
    g = rlx.Graph("swiglu_b")
    x = g.input("x", [2, 3, 8])
    wg = g.input("wg", [2, 8, 5])
    wu = g.input("wu", [2, 8, 5])
    g.set_outputs([g.add(O.FusedSwiGLU(), [x, wg, wu])])
    feed = {k: rng.standard_normal(s).astype(np.float32) for k, s in (("x", (2, 3, 8)), ("wg", (2, 8, 5)),
                                                                       ("wu", (2, 8, 5)))}
    got = compile_graph(g).run(feed)[0]
    want = _ref(g, feed, {})[0]
    # K = 8 on unit normals: each GEMM is within 10u|x||w| ~ 3e-6 of exact; silu(g)*u stays < 1e-5
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

"""CPU backend parity for row kernels and reductions: softmax, layer/rms norm and their fused
residual variants, and reduce over every axis pattern.

Tolerances: statistics (sums, means, variances) accumulate in double in the generated code, so
norm outputs are the float64 reference up to a handful of f32 roundings: rtol 4 ulp (5e-7) with
atol 1e-6 for outputs that cancel to near zero (|y| ~ 1, so that is still ~8 ulp of the row
scale). Softmax exponentials use our vectorized exp (<= 2 ulp), the sum is double: rtol 1e-6.
Float reductions accumulate in double: rtol 4 ulp of the result plus 1e-6 of sum|x| for
cancellation. Integer reductions must be exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import check, compile_graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlx
from rlx.ir import ops as O

NORM_TOL = {"rtol": 5e-7, "atol": 1e-6}


def test_softmax_every_axis(rng):
    g = rlx.Graph("softmax")
    x = g.input("x", [3, 70, 5])
    g.set_outputs({f"axis{a}": g.softmax(x, a) for a in (-1, 0, 1)})
    xv = (rng.standard_normal((3, 70, 5)) * 4).astype(np.float32)
    xv[0, 0, :] = [-np.inf, 0, 1, 2, -np.inf]
    check(g, {"x": xv}, rtol=1e-6, atol=1e-9)


def test_softmax_large_rows_parallel(rng):
    seq = rlx.Dim.dynamic("seq", max=600)
    g = rlx.Graph("softmax_dyn")
    x = g.input("x", [seq, 512])
    g.set_outputs([g.softmax(x)])
    cg = compile_graph(g)
    for s in (1, 600):
        check(g, {"x": (rng.standard_normal((s, 512)) * 8).astype(np.float32)}, rtol=1e-6, atol=1e-9, cg=cg)


@pytest.mark.parametrize("shape", [(4, 9, 96), (3, 7, 100), (3, 7, 1100)],
                         ids=["rows_by_4", "rest_rows_odd_width", "rest_rows_long"])
def test_norms_and_fused_residual_norms(rng, shape):
    """Rows go in lockstep groups of 4 (norm_rows: on AVX-512, a layer norm's rows of a multiple of 16 through
    kernels/norm_rows.h) and one by one for the rest (21 = 5 x 4 + 1); rows longer than RLX_NORM_BUF (1024) are
    not widened into a buffer first."""
    n = shape[-1]
    g = rlx.Graph("norms")
    x = g.input("x", list(shape))
    r = g.input("r", list(shape))
    gamma = g.param("gamma", [n])
    beta = g.param("beta", [n])
    bias = g.param("bias", [n])
    g.set_outputs({
        "ln": g.layer_norm(x, gamma, beta, eps=1e-5),
        "rms": g.rms_norm(x, gamma, eps=1e-6),
        "res_ln": g.add(O.FusedResidualLayerNorm(1e-12), [x, r, gamma, beta]),
        "res_ln_bias": g.add(O.FusedResidualLayerNorm(1e-5), [x, r, bias, gamma, beta]),
        "res_rms": g.add(O.FusedResidualRmsNorm(1e-6), [x, r, gamma]),
        "res_rms_bias": g.add(O.FusedResidualRmsNorm(1e-6), [x, r, bias, gamma]),
    })
    params = {k: rng.standard_normal(n).astype(np.float32) for k in ("gamma", "beta", "bias")}
    feed = {"x": (rng.standard_normal(shape) * 3 + 1).astype(np.float32),
            "r": rng.standard_normal(shape).astype(np.float32)}
    check(g, feed, params, **NORM_TOL)


@st.composite
def _reduce_case(draw):
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 6)) for _ in range(rank)]
    axes = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
    return shape, tuple(axes), draw(st.booleans())


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_reduce_case())
def test_reduce_axis_patterns(rng, case):
    """Every reduction function over one random axis pattern (K/R groups of any arrangement)."""
    shape, axes, keep = case
    g = rlx.Graph("reduce")
    x = g.input("x", shape)
    xi = g.input("xi", shape, "i32")
    outs = {fn: g.reduce(fn, x, axes, keep) for fn in O.REDUCE_OPS}
    outs.update({f"i_{fn}": g.reduce(fn, xi, axes, keep) for fn in ("sum", "max", "min", "mean")})
    g.set_outputs(outs)
    xv = rng.uniform(0.5, 1.5, shape).astype(np.float32) * rng.choice([-1, 1], shape).astype(np.float32)
    iv = rng.integers(-50, 50, shape).astype(np.int32)
    check(g, {"x": xv, "xi": iv}, rtol=5e-7, atol=1e-6)


def test_reduce_long_rows_and_columns(rng):
    """Long reductions: the double accumulator keeps the f32 result correctly rounded."""
    g = rlx.Graph("reduce_long")
    x = g.input("x", [64, 3000])
    g.set_outputs([g.reduce("sum", x, [1]), g.reduce("mean", x, [0]), g.reduce("max", x, [0, 1]),
                   g.reduce("sum", x, [0], keep_dim=True)])
    check(g, {"x": rng.standard_normal((64, 3000)).astype(np.float32)}, rtol=5e-7, atol=1e-5)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f64", "i64", "u8"])
def test_reduce_other_dtypes(rng, dtype):
    g = rlx.Graph(f"reduce_{dtype}")
    x = g.input("x", [5, 6], dtype)
    g.set_outputs([g.reduce("sum", x, [1]), g.reduce("max", x, [0]), g.reduce("prod", x, [0])])
    dt = rlx.DType.parse(dtype)
    if dt.is_int:
        xv = rng.integers(0, 5, (5, 6)).astype(dt.np)
    else:
        xv = rlx.ir.dtype.round_to_dtype(rng.uniform(0.5, 2, (5, 6)).astype(np.float32), dt)
        xv = xv.astype(np.float16) if dt is rlx.DType.F16 else xv.astype(np.float64 if dtype == "f64" else np.float32)
    check(g, {"x": xv}, rtol=1e-12 if dtype == "f64" else 2.0 ** -8, atol=0)


def test_reduce_max_over_nan_propagates():
    g = rlx.Graph("nanmax")
    x = g.input("x", [2, 3])
    g.set_outputs([g.reduce("max", x, [1]), g.reduce("min", x, [0])])
    got = compile_graph(g).run(x=np.array([[1, np.nan, 3], [4, 5, 6]], np.float32))
    assert np.isnan(got[0][0]) and got[0][1] == 6
    assert got[1][0] == 1 and np.isnan(got[1][1]) and got[1][2] == 3

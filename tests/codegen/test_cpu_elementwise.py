"""CPU backend parity for elementwise ops: activations, binary (broadcasting), compare, where,
cast, expand, integer ops, 16-bit floats and fused elementwise regions.

Tolerances: the reference computes in float64 and rounds each op to f32 once. Arithmetic ops
(add/sub/mul/div/max/min, casts) are correctly rounded in C too, so they must match to 1 ulp
(rtol 2^-23). Transcendentals come from libm (sin, cos, log, pow: <= 1 ulp) or from RLX's
vectorizable exp/tanh (measured <= 3 ulp over [-12, 12]) and float gelu (relative error
<= 3.3e-7, 5.5 x 2^-24, over every float in [-13.5, 13.5]): rtol 5e-7, no atol: both sides form gelu's
negative tail with erfc, so it is accurate relative to the value.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import check, compile_graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlx
from rlx.ir import ops as O

ULP = 2.0 ** -23
TRANSCENDENTAL = {"rtol": 5e-7, "atol": 0.0}


def test_every_activation_f32(rng):
    g = rlx.Graph("acts")
    x = g.input("x", [5, 33])
    p = g.input("p", [5, 33])
    outs = {fn: g.activation(fn, p if fn in ("log", "sqrt", "rsqrt") else x) for fn in O.ACTIVATIONS}
    g.set_outputs(outs)
    xs = (rng.standard_normal((5, 33)) * 3).astype(np.float32)
    xs[0, :6] = [0.0, -0.0, 8.0, -8.0, 1e-6, -1e-6]
    ps = (np.abs(rng.standard_normal((5, 33))) + 1e-3).astype(np.float32)
    check(g, {"x": xs, "p": ps}, **TRANSCENDENTAL)


def test_activation_special_values():
    g = rlx.Graph("special")
    x = g.input("x", [6])
    g.set_outputs({fn: g.activation(fn, x) for fn in ("relu", "exp", "sigmoid", "silu", "tanh", "abs")})
    xs = np.array([np.nan, np.inf, -np.inf, 100.0, -100.0, 0.0], np.float32)
    got = compile_graph(g).run(x=xs)
    want = rlx.reference.run(g, {"x": xs})
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        # atol: below f32's smallest normal (1.2e-38) values are subnormal and carry no relative precision
        np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=2e-6, atol=1e-38)


def test_binary_ops_exact(rng):
    g = rlx.Graph("bin")
    a = g.input("a", [4, 17])
    b = g.input("b", [4, 17])
    g.set_outputs({fn: g.binary(fn, a, b) for fn in ("add", "sub", "mul", "div", "max", "min")})
    av = rng.standard_normal((4, 17)).astype(np.float32)
    bv = rng.standard_normal((4, 17)).astype(np.float32)
    av[0, 0], bv[0, 1] = np.nan, np.nan  # max/min propagate NaN from either side
    check(g, {"a": av, "b": bv}, rtol=ULP, atol=0)


def test_pow(rng):
    g = rlx.Graph("pow")
    a = g.input("a", [3, 8])
    b = g.input("b", [8])
    g.set_outputs([g.binary("pow", a, b)])
    av = (np.abs(rng.standard_normal((3, 8))) + 0.1).astype(np.float32)
    bv = rng.uniform(-2, 3, 8).astype(np.float32)
    check(g, {"a": av, "b": bv}, **TRANSCENDENTAL)


_dims = st.integers(1, 5)


@st.composite
def _broadcast_pair(draw):
    rank = draw(st.integers(1, 4))
    out = [draw(_dims) for _ in range(rank)]

    def operand():
        r = draw(st.integers(0, rank))
        return [1 if draw(st.booleans()) else d for d in out[rank - r:]]

    return out, operand(), operand()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_broadcast_pair(), st.sampled_from(["add", "mul", "sub", "max"]))
def test_binary_broadcasting(rng, shapes, fn):
    _, sa, sb = shapes
    g = rlx.Graph("bcast")
    a = g.input("a", sa)
    b = g.input("b", sb)
    y = g.binary(fn, a, b)
    g.set_outputs([y])
    av = rng.standard_normal(sa).astype(np.float32)
    bv = rng.standard_normal(sb).astype(np.float32)
    check(g, {"a": av, "b": bv}, rtol=ULP, atol=0)


def test_compare_and_where(rng):
    g = rlx.Graph("cmpw")
    a = g.input("a", [3, 1, 7])
    b = g.input("b", [5, 7])
    outs = {fn: g.compare(fn, a, b) for fn in O.COMPARE_OPS}
    outs["where"] = g.where(outs["lt"], a, b)
    outs["where_i"] = g.where(g.compare("ge", a, b), g.cast(a, "i32"), g.cast(b, "i32"))
    g.set_outputs(outs)
    av = rng.integers(-2, 3, (3, 1, 7)).astype(np.float32)  # small ints: plenty of equal pairs
    bv = rng.integers(-2, 3, (5, 7)).astype(np.float32)
    check(g, {"a": av, "b": bv}, rtol=0, atol=0)


CAST_DTYPES = ["f32", "f16", "bf16", "f64", "i8", "i32", "i64", "u8", "bool"]


def test_cast_matrix():
    g = rlx.Graph("casts")
    outs = {}
    for src in CAST_DTYPES:
        x = g.input(f"x_{src}", [12], src)
        for dst in CAST_DTYPES:
            if dst != src:
                outs[f"{src}_to_{dst}"] = g.cast(x, dst)
    g.set_outputs(outs)
    base = np.array([0, 1, -1, 2.5, -2.5, 3.75, 100, -100, 0.3333, 7, 65, -0.5], np.float64)
    inputs = {}
    for src in CAST_DTYPES:
        dt = rlx.DType.parse(src)
        if src == "bool":
            inputs["x_bool"] = base != 0
        elif src == "u8":
            inputs["x_u8"] = np.abs(base).astype(np.uint8)
        elif dt.is_int:
            inputs[f"x_{src}"] = np.trunc(base).astype(dt.np)
        elif src == "bf16":
            inputs["x_bf16"] = rlx.ir.dtype.bf16_to_f32(rlx.ir.dtype.f32_to_bf16(base.astype(np.float32)))
        else:
            inputs[f"x_{src}"] = base.astype(dt.np)
    check(g, inputs, rtol=0, atol=0)


def test_f32_to_f16_rounding_edges():
    g = rlx.Graph("f16round")
    x = g.input("x", [10])
    g.set_outputs([g.cast(x, "f16"), g.cast(x, "bf16")])
    xs = np.array([65504, 65519.99, 65520, 1e-8, 2.98e-8, 6.1e-5, -3e-6, np.inf, 1 + 2**-11, 1 + 3 * 2**-11],
                  np.float32)
    got = compile_graph(g).run(x=xs)
    with np.errstate(over="ignore"):  # 65520 and inf overflow to inf: the expected result
        np.testing.assert_array_equal(got[0], xs.astype(np.float16))
    np.testing.assert_array_equal(got[1], rlx.reference.run(g, {"x": xs})[1])


@pytest.mark.parametrize("dtype", ["i32", "i64", "i8"])
def test_integer_ops(dtype):
    g = rlx.Graph(f"int_{dtype}")
    a = g.input("a", [2, 9], dtype)
    b = g.input("b", [9], dtype)
    outs = {fn: g.binary(fn, a, b) for fn in ("add", "sub", "mul", "div", "max", "min")}
    outs.update({fn: g.activation(fn, a) for fn in ("neg", "abs", "relu")})
    outs["pow"] = g.binary("pow", a, g.activation("abs", b))
    g.set_outputs(outs)
    npd = rlx.DType.parse(dtype).np
    av = np.array([[7, -7, 100, -100, 0, 5, -5, 3, 1], [1, 2, 3, 4, 5, 6, 7, 8, 9]], npd)
    bv = np.array([2, 2, -3, -3, 1, -1, 3, 2, 3], npd)
    check(g, {"a": av, "b": bv}, rtol=0, atol=0)


def test_integer_division_by_zero_is_an_error():
    g = rlx.Graph("idiv0")
    a = g.input("a", [3], "i32")
    b = g.input("b", [3], "i32")
    g.set_outputs([g.div(a, b)])
    cg = compile_graph(g)
    assert cg.run(a=np.array([6, 7, 8], np.int32), b=np.array([3, -1, 2], np.int32))[0].tolist() == [2, -7, 4]
    with pytest.raises(rlx.ExecutionError, match="division by zero"):
        cg.run(a=np.array([1, 2, 3], np.int32), b=np.array([1, 0, 1], np.int32))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_elementwise(rng, dtype):
    """16-bit floats compute in f32 and round at every op boundary, exactly like the reference."""
    g = rlx.Graph(f"half_{dtype}")
    a = g.input("a", [4, 16], dtype)
    b = g.input("b", [16], dtype)
    y = g.activation("silu", g.add_(g.mul(a, b), a))
    g.set_outputs([y, g.compare("gt", a, b), g.where(g.compare("gt", a, b), a, b)])
    def rnd(v):
        return rlx.ir.dtype.round_to_dtype(v.astype(np.float32), rlx.DType.parse(dtype))

    av = rnd(rng.standard_normal((4, 16)))
    bv = rnd(rng.standard_normal(16))
    feed = {"a": av.astype(np.float16), "b": bv.astype(np.float16)} if dtype == "f16" else {"a": av, "b": bv}
    got = compile_graph(g).run(feed)
    want = rlx.reference.run(g, feed)
    # one f16/bf16 rounding step is 2^-11 / 2^-8 relative; silu's exp may flip the last rounding
    step = 2.0 ** -10 if dtype == "f16" else 2.0 ** -7
    np.testing.assert_allclose(got[0], want[0], rtol=step, atol=step * 1e-2)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])


def test_f64_elementwise(rng):
    g = rlx.Graph("f64")
    a = g.input("a", [3, 5], "f64")
    g.set_outputs([g.activation("gelu", g.mul(a, a)), g.activation("tanh", a)])
    av = rng.standard_normal((3, 5))
    check(g, {"a": av}, rtol=1e-14, atol=1e-300)


def test_elementwise_region_with_broadcasting(rng):
    """A fused region: every step evaluated per output element in one loop nest."""
    steps = (
        O.RegionStep(O.Binary("mul"), (0, 1)),          # v3 = x * scale[col]
        O.RegionStep(O.Binary("add"), (3, 2)),          # v4 = v3 + bias[row, 1]
        O.RegionStep(O.Activation("gelu_tanh"), (4,)),  # v5
        O.RegionStep(O.Compare("gt"), (5, 2)),          # v6 (bool)
        O.RegionStep(O.Where(), (6, 5, 3)),             # v7
        O.RegionStep(O.Cast(rlx.DType.F16), (7,)),      # v8 (rounded to f16)
        O.RegionStep(O.Cast(rlx.DType.F32), (8,)),      # v9
    )
    g = rlx.Graph("region")
    x = g.input("x", [2, 6, 40])
    s = g.input("scale", [40])
    b = g.input("bias", [6, 1])
    g.set_outputs([g.add(O.ElementwiseRegion(steps), [x, s, b])])
    feed = {"x": rng.standard_normal((2, 6, 40)).astype(np.float32),
            "scale": rng.standard_normal(40).astype(np.float32),
            "bias": rng.standard_normal((6, 1)).astype(np.float32)}
    check(g, feed, rtol=2.0 ** -10, atol=1e-6)  # the final f16 rounding dominates


def test_expand_and_scalar_broadcast(rng):
    g = rlx.Graph("expand")
    x = g.input("x", [3, 1, 4])
    c = g.constant(np.float32(2.5))
    g.set_outputs([g.expand(x, [2, 3, 5, 4]), g.mul(x, c), g.expand(g.cast(x, "bf16"), [3, 2, 4])])
    check(g, {"x": rng.standard_normal((3, 1, 4)).astype(np.float32)}, rtol=0, atol=0)


def test_large_elementwise_runs_parallel_path(rng):
    """Above the grain size the loops run under OpenMP; results must not change."""
    g = rlx.Graph("big")
    x = g.input("x", [300, 257])
    b = g.input("b", [257])
    g.set_outputs([g.activation("silu", g.add_(x, b)), g.add_(x, g.constant(np.float32(1.0)))])
    feed = {"x": rng.standard_normal((300, 257)).astype(np.float32), "b": rng.standard_normal(257).astype(np.float32)}
    check(g, feed, **TRANSCENDENTAL)

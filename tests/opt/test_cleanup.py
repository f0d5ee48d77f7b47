"""Unit tests of the cleanup passes: fold, simplify, cse, dce, layout."""

from __future__ import annotations

import numpy as np
import pytest
from graphs import Case, assert_equivalent, count, kinds

from rlx import reference
from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.opt.cse import cse
from rlx.opt.dce import dce
from rlx.opt.fold import fold
from rlx.opt.layout import prepack_params
from rlx.opt.simplify import simplify


def _case(g: Graph, rng: np.random.Generator, **dims: int) -> Case:
    inputs = {}
    for n in g.inputs():
        shape = n.op.shape.concrete(dims) if dims else n.op.shape.static_dims
        inputs[n.op.name] = rng.standard_normal(shape).astype(n.op.shape.dtype.np)
    params = {n.op.name: rng.standard_normal(n.op.user_shape.static_dims).astype(np.float32) for n in g.params()}
    return Case(g, inputs, params)


# ── fold ───────────────────────────────────────────────────────────────


def test_fold_collapses_constant_subgraph(rng: np.random.Generator) -> None:
    g = Graph("f")
    x = g.input("x", [3])
    c = g.activation("tanh", g.mul(g.constant(np.arange(3, dtype=np.float32)), g.expand(g.constant(2.0), [3])))
    g.set_outputs([g.add_(x, c)])
    out = dce(fold(g))
    assert kinds(out) == ["input", "constant", "binary"]
    assert_equivalent(g, out, _case(g, rng), exact=True)
    np.testing.assert_array_equal(out.node(1).op.array(), np.tanh(np.arange(3) * 2.0).astype(np.float32))


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f64", "i32", "bool"])
def test_fold_keeps_dtype_and_rounding(dtype: str) -> None:
    g = Graph("f")
    a = g.constant(np.array([1.0, 2.0, 3.0]), dtype="f32")
    a = g.cast(a, dtype)
    if dtype not in ("bool",):
        a = g.add_(a, a) if dtype != "i32" else g.mul(a, a)
    g.set_outputs([g.cast(a, "f32") if dtype in ("bf16",) else a])
    out = fold(g)
    (want,), (got,) = reference.run(g), reference.run(out)
    assert out.node(out.outputs[0]).kind == "constant"
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_fold_bf16_constant_holds_bits() -> None:
    g = Graph("f")
    third = g.div(g.cast(g.constant(1.0), "bf16"), g.cast(g.constant(3.0), "bf16"))
    g.set_outputs([third])
    out = fold(g)
    const = out.node(out.outputs[0]).op
    assert const.shape.dtype.value == "bf16"
    # 1/3 rounded to bf16: 0x3EAB
    assert const.array().tolist() == 0x3EAB
    assert reference.run(out)[0] == reference.run(g)[0]


def test_fold_does_not_inflate_the_program() -> None:
    g = Graph("big")
    x = g.input("x", [1024, 1024])
    big = g.expand(g.constant(1.5), [1024, 1024])  # 1M elements from one scalar
    small = g.expand(g.constant(1.5), [16])
    g.set_outputs([g.add_(x, big), small])
    out = fold(g)
    assert count(out, "expand") == 1  # the big one stays an op
    assert out.node(out.outputs[1]).kind == "constant"
    assert fold(g, max_growth_elements=1 << 21, max_elements=1 << 21).node(3).kind == "constant"


def test_fold_leaves_failing_ops_for_run_time() -> None:
    g = Graph("div0")
    q = g.div(g.constant(np.array([4], np.int32)), g.constant(np.array([0], np.int32)))
    table = g.constant(np.ones((2, 2), np.float32))
    bad = g.gather(table, g.constant(np.array([5], np.int32)))
    g.set_outputs([q, bad])
    out = fold(g)
    assert kinds(out)[-1] == "gather" and count(out, "binary") == 1


def test_fold_skips_dynamic_shapes() -> None:
    g = Graph("dyn")
    x = g.input("x", [Dim.dynamic("n", max=8)])
    e = g.expand(g.constant(2.0), list(g.shape(x).dims))
    g.set_outputs([g.mul(x, e)])
    assert count(fold(g), "expand") == 1


def test_fold_of_an_output_and_leaves_input_untouched() -> None:
    g = Graph("o")
    g.input("x", [2])
    c = g.add_(g.constant(1.0), g.constant(2.0))
    g.set_outputs([c])
    text = str(g)
    out = fold(g)
    assert str(g) == text
    assert out.node(out.outputs[0]).kind == "constant" and out.output_names == ["out0"]
    assert reference.run(out, {"x": np.zeros(2, np.float32)})[0].tolist() == 3.0


# ── simplify ───────────────────────────────────────────────────────────


@pytest.mark.parametrize("fn,value,left", [("mul", 1.0, False), ("mul", 1.0, True), ("add", 0.0, False),
                                           ("add", 0.0, True), ("sub", 0.0, False), ("div", 1.0, False),
                                           ("pow", 1.0, False)])
@pytest.mark.parametrize("const_shape", [(), (1,), (4,), (3, 4)])
def test_simplify_identities(fn: str, value: float, left: bool, const_shape: tuple, rng) -> None:
    g = Graph("s")
    x = g.input("x", [3, 4])
    c = g.constant(np.full(const_shape, value, np.float32))
    g.set_outputs([g.binary(fn, c, x) if left else g.binary(fn, x, c)])
    out = dce(simplify(g))
    assert kinds(out) == ["input"] and out.outputs == [0]
    assert_equivalent(g, out, _case(g, rng), exact=True)


def test_simplify_keeps_identities_that_broadcast_or_are_not_identities(rng) -> None:
    g = Graph("s")
    x = g.input("x", [4])
    outs = [
        g.mul(x, g.constant(np.ones((3, 4), np.float32))),  # x[4] * ones[3,4] changes the shape
        g.sub(g.constant(0.0), x),  # 0 - x is -x
        g.div(g.constant(1.0), x),  # 1 / x
        g.mul(x, g.constant(np.array([1, 1, 1, 2], np.float32))),
        g.add_(x, g.constant(1e-30)),
    ]
    g.set_outputs(outs)
    out = simplify(g)
    assert count(out, "binary") == 5
    assert_equivalent(g, out, _case(g, rng), exact=True)


def test_simplify_integer_identities() -> None:
    g = Graph("i")
    x = g.input("x", [3], "i32")
    g.set_outputs([g.div(g.mul(x, g.constant(np.array(1, np.int32))), g.constant(np.array(1, np.int32)))])
    assert dce(simplify(g)).outputs == [0]


def test_simplify_transposes(rng) -> None:
    g = Graph("t")
    x = g.input("x", [2, 3, 4])
    t1 = g.transpose(x, [1, 2, 0])
    t2 = g.transpose(t1, [2, 0, 1])  # identity overall
    t3 = g.transpose(g.transpose(x, [0, 2, 1]), [1, 0, 2])  # composes to one transpose
    ident = g.transpose(x, [0, 1, 2])
    g.set_outputs([t2, t3, ident])
    out = dce(simplify(g))
    assert out.outputs[0] == 0 and out.outputs[2] == 0
    assert count(out, "transpose") == 1
    assert out.node(out.outputs[1]).op == O.Transpose((2, 0, 1))
    assert_equivalent(g, out, _case(g, rng), exact=True)


def test_simplify_reshapes_casts_narrow_expand_concat(rng) -> None:
    g = Graph("r")
    b = Dim.dynamic("b", max=4)
    x = g.input("x", [b, 3, 4])
    r = g.reshape(g.reshape(g.reshape(x, [b * 3, 4]), [-1]), [b, 12])
    same = g.reshape(x, [b, 3, 4])
    cast = g.cast(x, "f32")
    full = g.narrow(x, 2, 0, 4)
    part = g.narrow(x, 2, 1, 3)
    exp = g.expand(x, [b, 3, 4])
    cat = g.concat([x], axis=1)
    g.set_outputs([r, same, cast, full, part, exp, cat])
    out = dce(simplify(g))
    assert count(out, "reshape") == 1 and out.node(out.outputs[0]).inputs == (0,)
    assert out.outputs[1:4] == [0, 0, 0] and out.outputs[5:] == [0, 0]
    assert count(out, "narrow") == 1
    assert_equivalent(g, out, _case(g, rng, b=3), exact=True)


def test_simplify_keeps_real_casts_and_expands() -> None:
    g = Graph("k")
    x = g.input("x", [1, 4])
    g.set_outputs([g.cast(x, "f16"), g.expand(x, [3, 4])])
    assert kinds(simplify(g)) == ["input", "cast", "expand"]


# ── cse ────────────────────────────────────────────────────────────────


def test_cse_merges_duplicates_and_commutative_operands(rng) -> None:
    g = Graph("c")
    x, y = g.input("x", [4]), g.input("y", [4])
    a1, a2 = g.add_(x, y), g.add_(y, x)
    s1, s2 = g.sub(x, y), g.sub(y, x)  # not commutative
    c1, c2 = g.constant(np.arange(4, dtype=np.float32)), g.constant(np.arange(4, dtype=np.float32))
    e1, e2 = g.compare("eq", x, y), g.compare("eq", y, x)
    l1, l2 = g.compare("lt", x, y), g.compare("lt", y, x)
    outs = [g.mul(a1, a2), s1, s2, g.add_(c1, c2), g.where(e1, x, y), g.where(e2, x, y), l1, l2]
    g.set_outputs(outs)
    out = cse(g)
    assert out.outputs[4] == out.outputs[5]
    assert count(out, "constant") == 1 and count(out, "compare") == 3
    mul = out.node(out.outputs[0])
    assert mul.inputs[0] == mul.inputs[1]
    assert_equivalent(g, out, _case(g, rng), exact=True)


def test_cse_never_merges_inputs_or_params() -> None:
    g = Graph("c")
    x, y = g.input("x", [4]), g.input("y", [4])
    p, q = g.param("p", [4]), g.param("q", [4])
    g.set_outputs([g.add_(g.add_(x, y), g.add_(p, q))])
    out = cse(g)
    assert [n.op.name for n in out.inputs()] == ["x", "y"] and [n.op.name for n in out.params()] == ["p", "q"]
    assert len(out) == len(g)


def test_cse_distinguishes_attributes() -> None:
    g = Graph("c")
    x = g.input("x", [4, 4])
    a, b = g.param("a", [4]), g.param("b", [4])
    g.set_outputs([g.reduce("sum", x, [0]), g.reduce("sum", x, [1]), g.transpose(x, [1, 0]),
                   g.transpose(x, [1, 0]), g.layer_norm(x, a, b, eps=1e-5), g.layer_norm(x, a, b, eps=1e-6),
                   g.layer_norm(x, a, b, eps=1e-6)])
    out = cse(g)
    assert count(out, "reduce") == 2 and count(out, "transpose") == 1 and count(out, "layer_norm") == 2
    assert out.outputs[5] == out.outputs[6]


# ── dce ────────────────────────────────────────────────────────────────


def test_dce_keeps_every_input_and_param_in_order() -> None:
    g = Graph("d")
    a = g.input("a", [2])
    g.param("unused_p", [5])
    g.input("unused_x", [3])
    dead = g.activation("exp", g.constant(np.ones(2, np.float32)))
    g.mul(dead, a)
    w = g.param("w", [2])
    g.set_outputs({"y": g.mul(a, w), "a": a})
    out = dce(g)
    assert kinds(out) == ["input", "param", "input", "param", "binary"]
    assert [n.op.name for n in out.nodes[:4]] == ["a", "unused_p", "unused_x", "w"]
    assert out.output_names == ["y", "a"]


# ── layout ─────────────────────────────────────────────────────────────


def test_layout_pretransposes_params(rng) -> None:
    g = Graph("l")
    x = g.input("x", [2, 3, 4])
    w = g.param("w", [5, 4])
    w3 = g.param("w3", [2, 3, 4])
    y = g.matmul(x, g.transpose(w, [1, 0]))
    z = g.transpose(w3, [2, 0, 1])
    g.set_outputs([y, z])
    out = prepack_params(g)
    assert count(out, "transpose") == 0
    p, p3 = (n.op for n in out.params())
    assert (p.name, p.layout, p.shape.static_dims, p.user_shape.static_dims) == ("w", (1, 0), (4, 5), (5, 4))
    assert (p3.layout, p3.shape.static_dims) == ((2, 0, 1), (4, 2, 3))
    assert out.outputs[1] == out.params()[1].id  # the transposed param is the output itself
    assert_equivalent(g, out, _case(g, rng), exact=True)


def test_layout_composes_and_merges_same_perm_users(rng) -> None:
    g = Graph("l")
    x = g.input("x", [3, 4])
    w = g.param("w", [2, 3, 4])
    t1, t2 = g.transpose(w, [2, 0, 1]), g.transpose(w, [2, 0, 1])
    g.set_outputs([g.add_(t1, t2)])
    once = prepack_params(g)
    assert count(once, "transpose") == 0 and once.params()[0].op.layout == (2, 0, 1)
    # A transpose of an already laid-out param composes with its layout.
    g2 = Graph("l2")
    p = g2.add(once.params()[0].op, name="w")
    g2.set_outputs([g2.transpose(p, [1, 2, 0])])
    twice = prepack_params(g2)
    assert twice.params()[0].op.layout is None  # (2,0,1) then (1,2,0) is the identity
    assert_equivalent(g2, twice, _case(g2, rng), exact=True)
    assert x == 0


def test_layout_leaves_params_with_other_users() -> None:
    g = Graph("l")
    x = g.input("x", [4, 4])
    w = g.param("w", [4, 4])
    v = g.param("v", [4, 4])
    g.set_outputs([g.matmul(x, g.transpose(w, [1, 0])), g.matmul(x, w), g.transpose(v, [1, 0]), v])
    out = prepack_params(g)
    assert str(out) == str(g)


def test_passes_reject_hir_and_non_graphs() -> None:
    class Fake(Graph):
        stage = "hir"

    g = Fake("h")
    for fn in (fold, simplify, cse, dce, prepack_params):
        with pytest.raises(IRError, match="MIR"):
            fn(g)

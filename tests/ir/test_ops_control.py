"""cond and while_loop (rlx/ir/ops_control.py): traced and built programs against numpy, nesting, JSON round
trips, and the errors a mistyped branch, carry or predicate gets (naming the branch or the carry)."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import IRError, ShapeError
from rlx.ir.graph import Graph
from rlx.ir.ops_control import Cond, WhileLoop, bodies_of
from rlx.reference import run


def test_traced_cond_takes_only_the_chosen_branch() -> None:
    def fn(t):
        x, k = t.input("x", [4]), t.input("k", [], "i32")
        # a gather out of range in the untaken branch is never evaluated by the reference
        return t.cond(k > 0, lambda v, i: v.exp(), lambda v, i: v.tracer.gather(v, i.reshape([1]) + 100).expand([4]),
                      x, k)

    g = rlx.trace("c", fn)
    x = np.array([0.0, 1.0, -1.0, 2.0], np.float32)
    np.testing.assert_allclose(run(g, {"x": x, "k": np.array(3, np.int32)})[0], np.exp(x), rtol=1e-6)


def test_traced_while_loop_with_bcasts_matches_a_python_loop() -> None:
    def fn(t):
        c0, step = t.input("c0", [3]), t.input("step", [3])
        return t.while_loop(lambda c, s: c.max() < 10.0, lambda c, s: c + s, c0, bcasts=[step])

    c0, step = np.array([0.0, 1.0, 2.0], np.float32), np.array([0.5, 1.0, 1.5], np.float32)
    c = c0.copy()
    while c.max() < 10.0:
        c = c + step
    np.testing.assert_array_equal(run(rlx.trace("w", fn), {"c0": c0, "step": step})[0], c)


def test_nested_control_flow_and_integer_carries() -> None:
    def fn(t):
        n = t.input("n", [1], "i32")

        def body(c):  # an i32 carry, a cond inside the loop body
            return c.tracer.cond(c.reshape([]) > 10, lambda v: v - 7, lambda v: v - 1, c)

        return t.while_loop(lambda c: c.reshape([]) > 1, body, n, max_trips=5)

    g = rlx.trace("countdown", fn)
    for start in (30, 9, 3, 1):
        c, trips = start, 0
        while c > 1 and trips < 5:
            c, trips = (c - 7 if c > 10 else c - 1), trips + 1
        assert run(g, {"n": np.array([start], np.int32)})[0].tolist() == [c]


def test_control_flow_round_trips_through_json() -> None:
    def fn(t):
        x = t.input("x", [2])
        y = t.cond(x.sum() > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)
        return t.while_loop(lambda c: c.sum() < 20.0, lambda c: c * 3.0, y, max_trips=7)

    g = rlx.trace("rt", fn)
    back = Graph.from_json(g.to_json())
    assert back.to_json() == g.to_json()
    ops = [n.op for n in back.nodes if bodies_of(n.op)]
    assert isinstance(ops[0], Cond) and isinstance(ops[1], WhileLoop) and ops[1].max_trips == 7
    x = np.array([1.0, 0.5], np.float32)
    np.testing.assert_array_equal(run(back, {"x": x})[0], run(g, {"x": x})[0])


def test_branch_mismatch_names_both_branches() -> None:
    def fn(t):
        x = t.input("x", [3])
        return t.cond(x.sum() > 0, lambda v: v, lambda v: v.sum(), x)

    with pytest.raises(ShapeError, match=r"the true branch returns f32\[3\], the false branch f32\[\]"):
        rlx.trace("bad", fn)


def test_carry_mismatch_names_the_carry() -> None:
    def fn(t):
        x = t.input("x", [3])
        return t.while_loop(lambda c: c.sum() < 1.0, lambda c: c.cast("f16"), x)

    with pytest.raises(ShapeError, match=r"carry must keep its shape and dtype: init is f32\[3\], the body "
                                         r"returns f16\[3\]"):
        rlx.trace("bad", fn)


def test_predicates_must_be_one_bool() -> None:
    def bad_pred(t):
        x = t.input("x", [3])
        return t.cond(x > 0, lambda v: v, lambda v: -v, x)

    with pytest.raises(ShapeError, match=r"cond predicate must be one bool .* got bool\[3\]"):
        rlx.trace("bad", bad_pred)

    def bad_loop_cond(t):
        return t.while_loop(lambda c: c.sum(), lambda c: c, t.input("x", [3]))

    with pytest.raises(ShapeError, match=r"while_loop cond must return one bool .* returns f32\[\]"):
        rlx.trace("bad", bad_loop_cond)


def test_body_errors_name_the_body_and_captured_tensors_are_refused() -> None:
    def not_a_tensor(t):
        x = t.input("x", [3])
        return t.cond(x.sum() > 0, lambda v: 1.0, lambda v: v, x)

    with pytest.raises(IRError, match="cond true branch: must return one TracedTensor, returned float"):
        rlx.trace("bad", not_a_tensor)

    def captures(t):
        x, w = t.input("x", [3]), t.input("w", [3])
        return t.while_loop(lambda c: c.sum() < 1.0, lambda c: c + w, x)

    with pytest.raises(IRError, match=r"while_loop body: .*tensors of two traces cannot be mixed"):
        rlx.trace("bad", captures)


def test_bad_max_trips_is_refused() -> None:
    def fn(t):
        return t.while_loop(lambda c: c.sum() < 1.0, lambda c: c, t.input("x", [3]), max_trips=-2)

    with pytest.raises(ShapeError, match="max_trips must be None or an int >= 0, got -2"):
        rlx.trace("bad", fn)


def test_branches_count_toward_the_body_depth_limit() -> None:
    def nest(t, x, depth: int):
        if depth == 0:
            return x.exp()
        return t.cond(x.sum() > 0, lambda v: nest(v.tracer, v, depth - 1), lambda v: -v, x)

    rlx.trace("deep_ok", lambda t: nest(t, t.input("x", [2]), 7))
    with pytest.raises(ShapeError, match="nests bodies deeper than 8"):
        rlx.trace("too_deep", lambda t: nest(t, t.input("x", [2]), 9))

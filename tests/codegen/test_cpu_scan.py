"""CPU `scan`: every form (final carry, trajectory, xs, bcasts, reverse, nested, constants in the body)
against a Python loop over the reference body, with a dynamic length; plus serialization and the LIR hash."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import check, compile_graph

import rlx
from rlx.errors import IRError, ShapeError
from rlx.opt.memplan import plan
from rlx.reference import run

MAXL = 12


def _step(c: np.ndarray, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.tanh(c * w + x) + 0.5 * np.maximum(x, 0)


def _graph(*, trajectory: bool = False, reverse: bool = False, nested: bool = False) -> rlx.Graph:
    length = rlx.Dim.dynamic("L", MAXL)

    def body(c, w, x):
        return (c * w + x).tanh() + x.relu() * 0.5  # 0.5 is a constant inside the body

    def fn(t):
        xs = t.input("xs", [length, 2, 3])
        c0, w = t.input("c0", [2, 3]), t.param("w", [2, 3])
        if nested:  # each outer step runs an inner scan of 3 steps over the same row
            def outer(c, w, x):
                return t_inner(c, w, x)
            out = t.scan(outer, c0, xs=[xs], bcasts=[w], trajectory=trajectory, reverse=reverse)
        else:
            out = t.scan(body, c0, xs=[xs], bcasts=[w], trajectory=trajectory, reverse=reverse)
        return out

    def t_inner(c, w, x):
        tracer = c.tracer
        xs3 = tracer.concat([x.unsqueeze(0)] * 3, 0)
        return tracer.scan(body, c, xs=[xs3], bcasts=[w])

    return rlx.trace("scan", fn)


def _loop(c0, w, xs, *, trajectory=False, reverse=False, nested=False):
    c = c0.astype(np.float64)
    rows = [None] * len(xs)
    order = range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
    for t in order:
        for _ in range(3 if nested else 1):
            c = _step(c, w, xs[t])
        rows[t] = c
    return np.stack(rows) if trajectory else c


@pytest.mark.parametrize("form", ["final", "trajectory", "reverse", "reverse_trajectory", "nested"])
def test_scan_forms_match_a_python_loop(form: str) -> None:
    kw = {"trajectory": "trajectory" in form, "reverse": "reverse" in form, "nested": form == "nested"}
    g = _graph(**kw)
    rng = np.random.default_rng(len(form))
    w = rng.standard_normal((2, 3)).astype(np.float32)
    cg = compile_graph(g, {"w": w}, opt_level=2)
    for length in (1, 5, MAXL):
        ins = {"xs": rng.standard_normal((length, 2, 3)).astype(np.float32),
               "c0": rng.standard_normal((2, 3)).astype(np.float32)}
        want = _loop(ins["c0"], w.astype(np.float64), ins["xs"].astype(np.float64), **kw)
        np.testing.assert_allclose(run(g, ins, {"w": w})[0], want, rtol=1e-5, atol=1e-6)
        check(g, ins, {"w": w}, rtol=1e-5, atol=1e-6, cg=cg)


def test_scan_without_xs_runs_a_static_length() -> None:
    body = rlx.Graph("double")
    c = body.input("c", [4])
    body.set_outputs([body.mul(c, body.constant(np.float32(2.0)))])
    g = rlx.Graph("pow2")
    g.set_outputs([g.scan(body, g.input("c0", [4]), length=5)])
    ins = {"c0": np.arange(4, dtype=np.float32)}
    got = check(g, ins, rtol=0, atol=0)[0]
    np.testing.assert_array_equal(got, ins["c0"] * 32)


def test_serialization_round_trip_and_hash_follow_the_body() -> None:
    g = _graph(trajectory=True)
    back = rlx.Graph.from_json(g.to_json())
    assert str(back) == str(g) and back.to_json() == g.to_json()
    assert back.node(back.outputs[0]).op == g.node(g.outputs[0]).op
    h1 = plan(g).hash()
    # the same graph with one op of the body changed (tanh -> sigmoid)
    op = g.node(g.outputs[0]).op
    nodes = tuple(n if getattr(n.op, "fn", None) != "tanh" else
                  type(n)(type(n.op)("sigmoid"), n.inputs, n.shape, n.name) for n in op.body.nodes)
    changed = rlx.Graph("scan")
    for n in g.nodes[:-1]:
        changed.add(n.op, n.inputs, name=n.name)
    import dataclasses

    new_op = dataclasses.replace(op, body=dataclasses.replace(op.body, nodes=nodes))
    changed.set_outputs([changed.add(new_op, g.node(g.outputs[0]).inputs)])
    assert plan(changed).hash() != h1
    assert plan(_graph(trajectory=True)).hash() == h1


def test_bad_scans_raise_clear_errors() -> None:
    body = rlx.Graph("b")
    c = body.input("c", [3])
    body.set_outputs([body.reduce("sum", c, [0], keep_dim=True)])
    g = rlx.Graph("g")
    with pytest.raises(ShapeError, match="carry must keep one shape"):
        g.scan(body, g.input("c0", [3]), length=4)
    with pytest.raises(IRError, match="needs a length"):
        g.scan(body, g.input("c1", [3]))
    ok = rlx.Graph("ok")
    ok.set_outputs([ok.add_(ok.input("c", [3]), ok.input("x", [3]))])
    with pytest.raises(ShapeError, match=r"xs 0 must be \[4,3\]"):
        g.scan(ok, g.input("c2", [3]), xs=[g.input("xs", [4, 2])], length=4)


def test_bodies_nested_too_deep_are_refused() -> None:
    from rlx.ir.ops_scan import MAX_BODY_DEPTH

    body = rlx.Graph("b1")
    body.set_outputs([body.activation("neg", body.input("c", [2]))])
    for depth in range(1, MAX_BODY_DEPTH + 1):  # `body` nests `depth` bodies deep
        outer = rlx.Graph(f"b{depth + 1}")
        c = outer.input("c", [2])
        outer.set_outputs([outer.scan(body, c, length=2)])
        body = outer
    g = rlx.Graph("top")
    with pytest.raises(ShapeError, match="nests bodies deeper"):
        g.scan(body, g.input("c", [2]), length=2)

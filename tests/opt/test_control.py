"""Control flow through the optimizer and the CPU backend (rlx/opt/control.py): constant predicates folded,
unread operands and dead body nodes dropped, the lowering (select, masked scan) planned and decided by the
pipeline, compiled CPU runs against the reference, and what is refused before any build."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.errors import BuildError
from rlx.ir.graph import Graph
from rlx.ir.ops_scan import Scan
from rlx.ir.serialize_lir import lir_from_document, lir_to_document
from rlx.opt.control import fold_control
from rlx.opt.decompose import decompose
from rlx.opt.memplan import plan
from rlx.opt.pipeline import optimize
from rlx.pipeline import decide, lower_to_lir
from rlx.reference import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cpu_helpers import check


def _kinds(g: Graph) -> list[str]:
    return [n.kind for n in g.nodes]


def _program(t):
    """A cond choosing a GEMM branch or an elementwise one, feeding a bounded while_loop with a bcast."""
    x, w = t.input("x", [4, 8]), t.input("w", [8, 8])
    y = t.cond(x.sum() > 0, lambda v, u: (v @ u).tanh(), lambda v, u: v.abs() * 0.5, x, w)
    z = t.while_loop(lambda c, b: c.abs().max() < 6.0, lambda c, b: c * 1.5 + b.sum(0) * 0.01, y,
                     bcasts=[w], max_trips=12)
    return {"y": y, "z": z}


def _numpy_program(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = np.tanh(x64 @ w64) if x64.sum() > 0 else np.abs(x64) * 0.5
    z, trips = y, 0
    while trips < 12 and np.abs(z).max() < 6.0:
        z, trips = z * 1.5 + w64.sum(0) * 0.01, trips + 1
    return y, z, trips


def _feeds(sign: float, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": (sign * (np.abs(rng.standard_normal((4, 8))) + 0.1)).astype(np.float32),
            "w": (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)}


@pytest.fixture(scope="module")
def program() -> Graph:
    return rlx.trace("control", _program)


@pytest.fixture(scope="module")
def compiled(program: Graph):
    return rlx.Session(rlx.Device.CPU).compile(program)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true_branch", "false_branch"])
def test_reference_matches_numpy(program: Graph, sign: float) -> None:
    feeds = _feeds(sign)
    y, z, trips = _numpy_program(feeds["x"], feeds["w"])
    got = run(program, feeds)
    np.testing.assert_allclose(got[0], y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], z, rtol=1e-5, atol=1e-6)
    assert 0 < trips < 12  # the cond ends the loop, not max_trips


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true_branch", "false_branch"])
def test_compiled_cpu_matches_the_reference(program: Graph, compiled, sign: float) -> None:
    check(program, _feeds(sign), rtol=1e-5, atol=1e-6, cg=compiled)


def test_constant_predicate_folds_the_cond_into_its_branch() -> None:
    def fn(t):
        x = t.input("x", [3])
        flag = t.constant(np.float32(2.0)) > 1.0  # folded to a constant true by "fold", then the cond goes
        return t.cond(flag, lambda v: v.exp(), lambda v: v.tanh(), x)

    g = rlx.trace("k", fn)
    opt = optimize(g, level=2)
    assert "cond" not in _kinds(opt) and "tanh" not in str(opt) and "exp" in str(opt)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    np.testing.assert_allclose(run(opt, {"x": x})[0], np.exp(x), rtol=1e-6)


def test_constant_false_cond_or_zero_trips_make_the_while_loop_its_init() -> None:
    def fn(t):
        x = t.input("x", [3])
        never = t.while_loop(lambda c: t_false(c), lambda c: c * 2.0, x)
        zero = t.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 3.0, x.exp(), max_trips=0)
        return {"never": never, "zero": zero}

    def t_false(c):
        return c.tracer.constant(np.float32(0.0)) > 1.0  # the body's optimizer folds it to false

    g = rlx.trace("w", fn)
    opt = optimize(g, level=2)
    assert "while_loop" not in _kinds(opt)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    got = run(opt, {"x": x})
    np.testing.assert_array_equal(got[0], x)
    np.testing.assert_allclose(got[1], np.exp(x), rtol=1e-6)


def test_bodies_are_optimized_and_unread_operands_dropped() -> None:
    def fn(t):
        x, unused, w = t.input("x", [3]), t.input("u", [3]), t.input("w", [3])

        def branch(v, u, b):
            _dead = (u * 3.0).exp()  # computed, never returned: DCE inside the body removes it
            return v * b

        y = t.cond(x.sum() > 0, branch, lambda v, u, b: v - b, x, unused, w)
        return t.while_loop(lambda c, u, b: c.sum() < 10.0, lambda c, u, b: c + 1.0, y, bcasts=[unused, w],
                            max_trips=20)

    g = rlx.trace("dce", fn)
    opt = optimize(g, level=1)
    cond = next(n for n in opt.nodes if n.kind == "cond")
    loop = next(n for n in opt.nodes if n.kind == "while_loop")
    assert len(cond.inputs) == 3 and len(loop.inputs) == 1  # pred, x, w; the carry alone
    assert not any(n.op.kind == "activation" for n in cond.op.true_body.nodes)
    feeds = {"x": np.array([1.0, 2.0, 3.0], np.float32), "u": np.ones(3, np.float32),
             "w": np.array([0.5, 0.5, 2.0], np.float32)}
    for a, b in zip(run(opt, feeds), run(g, feeds)):
        np.testing.assert_array_equal(a, b)


def test_an_unused_cond_is_removed() -> None:
    def fn(t):
        x = t.input("x", [3])
        _unused = t.cond(x.sum() > 0, lambda v: v.exp(), lambda v: -v, x)
        return x.abs()

    g = rlx.trace("unused", fn)
    assert "cond" in _kinds(g) and "cond" not in _kinds(optimize(g, level=1))


def test_fold_control_leaves_graphs_without_control_flow_alone() -> None:
    g = Graph("plain")
    g.set_outputs([g.activation("exp", g.input("x", [2]))])
    assert fold_control(g) is g


def test_the_cpu_pipeline_plans_and_decides_every_body(program: Graph) -> None:
    lir = lower_to_lir(program, 2, backend="cpu")
    nodes = [n for n in lir.graph.nodes if n.kind in ("cond", "while_loop")]
    assert [n.kind for n in nodes] == ["cond", "while_loop"]  # the CPU has rules: nothing is lowered
    workspaces = {nid: size for nid, _, size in lir.workspaces}
    assert all(n.id in workspaces for n in nodes)  # the bodies' arena (and the loop's slots) are planned
    decided = decide(lir, "cpu")
    for n in nodes:  # true then false branch; cond then body
        assert [b.backend for b in decided.bodies_of(n.id)] == ["cpu", "cpu"]
    back = lir_from_document(lir_to_document(decided))  # the decided bodies travel with the LIR
    assert back.hash() == decided.hash() and len(back.bodies) == 4


def test_cuda_rules_take_both_and_the_fallback_runs_the_loop_as_a_masked_scan(program: Graph) -> None:
    assert {"cond", "while_loop"} <= set(_kinds(lower_to_lir(program, 2, backend="cuda").graph))  # CUDA's rules
    # where a backend's rule does not take them (rlx/opt/decompose.py), the fallback lowering runs
    lir = plan(decompose(optimize(program), lambda g, n: n.kind not in ("cond", "while_loop")))
    assert {"cond", "while_loop"}.isdisjoint(_kinds(lir.graph))
    (scan,) = [n for n in lir.graph.nodes if isinstance(n.op, Scan)]
    assert scan.op.length.value == 12 and "where" in str(Graph.from_body(scan.op.body))
    assert scan.id in {nid for nid, _, _ in lir.workspaces}


def test_compiled_cpu_runs_only_the_taken_branch_and_unbounded_loops() -> None:
    def fn(t):
        x, k = t.input("x", [4]), t.input("k", [], "i32")
        far = t.cond(k > 0, lambda v, i: v.exp(), lambda v, i: v.tracer.gather(v, i.reshape([1]) + 100).expand([4]),
                     x, k)  # the false branch reads index k + 100 of a 4-row table
        grow = t.while_loop(lambda c: c.sum() < 50.0, lambda c: c * 2.0, x.abs() + 1.0)  # no max_trips
        return {"far": far, "grow": grow}

    g = rlx.trace("branches", fn)
    cg = rlx.Session(rlx.Device.CPU).compile(g)
    x = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    check(g, {"x": x, "k": np.array(1, np.int32)}, rtol=1e-6, atol=0, cg=cg)
    with pytest.raises(rlx.RlxError, match=r"gather index 99 .* out of range"):
        cg.run({"x": x, "k": np.array(-1, np.int32)})


def test_unbounded_while_loop_needs_max_trips_only_where_cuda_falls_back_to_a_masked_scan() -> None:
    def fn(t):
        return t.while_loop(lambda c: c.sum() < 50.0, lambda c: c * 2.0, t.input("x", [2]))

    def nested(t):  # a cond in the body: the CUDA rule renders one level of bodies, so the loop falls back
        return t.while_loop(lambda c: c.sum() < 50.0, lambda c: c.tracer.cond(c.sum() > 0, lambda v: v * 2.0,
                                                                              lambda v: v * 3.0, c), t.input("x", [2]))

    g = rlx.trace("unbounded", fn)
    np.testing.assert_array_equal(run(g, {"x": np.array([1.0, 2.0], np.float32)})[0], [32.0, 64.0])
    assert "while_loop" in {n.kind for n in rlx.Session(rlx.Device.CUDA).lower(g).graph.nodes}  # a real loop
    with pytest.raises(BuildError, match=r"while_loop has no max_trips: .* give max_trips"):
        rlx.Session(rlx.Device.CUDA).lower(rlx.trace("unbounded_nested", nested))


def test_metal_runs_cond_lowered_and_refuses_while_loop_naming_it() -> None:
    def cond_only(t):
        x = t.input("x", [4])
        return t.cond(x.sum() > 0, lambda v: v.exp(), lambda v: -v, x)

    metal = rlx.Session(rlx.Device.METAL)
    assert metal.supports(rlx.trace("c", cond_only))
    node, reason = metal.first_unsupported_op(rlx.trace("control", _program))
    assert "no rule for scan" in reason and "while_loop" in node.label


def test_compiled_integer_carry_with_a_cond_in_the_loop_body() -> None:
    def fn(t):
        def body(c):
            return c.tracer.cond(c.reshape([]) > 10, lambda v: v - 7, lambda v: v - 1, c)

        return t.while_loop(lambda c: c.reshape([]) > 1, body, t.input("n", [1], "i32"), max_trips=5)

    g = rlx.trace("countdown", fn)
    cg = rlx.Session(rlx.Device.CPU).compile(g)
    for start, want in ((30, 7), (9, 4), (3, 1), (1, 1)):  # 30-7-7-7-1-1; 9..4 by ones; stops at 1
        assert check(g, {"n": np.array([start], np.int32)}, rtol=0, atol=0, cg=cg)[0].tolist() == [want]

"""Compile-only checks of control flow on CUDA: cond and while_loop rendered as branches on the device predicate
(rlx/codegen/cuda/control.py: a host branch when eager, conditional graph nodes under capture), their ControlFlow
decisions, the select / masked-scan fallback where the rule does not take a node (its reason in the LIR), and the
gradient graph of both, rendered (optimized, as a session does) and nvcc-compiled. Runs on a GPU against the
reference: tests/gpu/test_cuda_control.py and tests/gpu/cases.py's control_flow case."""

from __future__ import annotations

import re
from pathlib import Path

import rlx
from rlx.codegen.cuda import CudaTarget
from rlx.driver import lower_to_lir
from rlx.ir.decisions_cuda import ControlFlow
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.lir import LirModule
from rlx.pipeline.cuda import decide_cuda, render_cuda
from rlx.toolchain.cuda import NvccToolchain
from tests.gpu.control_common import guarded_cond_graph, guarded_while_graph, nested_while_graph

TARGET = CudaTarget(precision=DType.F32, gemm="builtin")


def _lower(graph: Graph) -> LirModule:
    """The decided LIR a session renders (optimized, lowered, decided for CUDA)."""
    return decide_cuda(lower_to_lir(graph, 2, backend="cuda"), TARGET)


def _render(graph: Graph) -> str:
    return render_cuda(_lower(graph), TARGET, {"name": graph.name})


def _compile(tc: NvccToolchain, src: str, name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.cu"
    path.write_text(src)
    tc.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)


def _block(src: str, start: str) -> str:
    """The text of the rendered block opening with the comment line `start` up to the next node's comment."""
    at = src.index(start)
    nxt = re.search(r"\n    /\* %\d+ ", src[at + len(start):])
    return src[at:at + len(start) + (nxt.start() if nxt else len(src))]


def test_cond_and_while_loop_branch_on_the_device_predicate() -> None:
    """Only the taken branch's kernels run (a host branch, or IF nodes under capture); the loop is a host loop or a
    WHILE node, with no trip bound needed; the decisions say so."""
    cond_lir = _lower(guarded_cond_graph())
    (decision,) = cond_lir.decided(ControlFlow)
    assert cond_lir.graph.node(decision.node).kind == "cond" and decision.describe() == (
        f"%{decision.node} cond runs on the device predicate (only the taken branch runs): conditional graph nodes "
        "under CUDA Graph capture, a host read of the predicate when eager")
    src = render_cuda(cond_lir, TARGET, {"name": "guarded_cond"})
    block = _block(src, f"/* %{decision.node} cond[")
    eager, captured = block.split("#if RLX_CTRL_GRAPHS")
    true_eager, false_eager = eager.split("} else {  /* false branch */")
    assert "if (c->ctrl_host[0]) {  /* true branch */" in true_eager
    assert "rlx_gather" not in true_eager and "rlx_gather" in false_eager  # the gather is the false branch's only
    assert "rlx_ctrl_if_nodes(st, " in captured
    if_true, if_false = captured.split("/* IF node 2: the false branch */")
    assert "cudaStreamBeginCaptureToGraph(st, rlx_c" in if_true and "g[0]" in if_true
    assert "rlx_gather" not in if_true and "rlx_gather" in if_false and "g[1]" in if_false
    assert "rlx_ctrl_set_if" in src and "cudaGraphCondTypeIf" in src

    loop_src = _render(guarded_while_graph(None))  # no max_trips: a real loop needs no bound
    assert "for (;;) {" in loop_src and "rlx_ctrl_while_node(" in loop_src and "cudaGraphCondTypeWhile" in loop_src
    assert "for (int64_t rlx_s" not in loop_src  # no scan of masked steps
    bounded = _render(guarded_while_graph(5))
    assert "< 5; ++rlx_w" in bounded and "rlx_ctrl_set_while<<<1, 1, 0, st>>>(" in bounded


def test_a_node_the_rule_does_not_take_falls_back_with_its_reason_in_the_lir() -> None:
    lir = _lower(nested_while_graph())
    (d,) = lir.decided(ControlFlow)
    assert (d.op, d.how) == ("while_loop", "masked scan")
    assert d.reason.endswith("while_loop with a scan, cond or while_loop in a body (one level of bodies is "
                             "rendered on CUDA)")
    assert lir.graph.node(d.node).kind == "scan" and "lowered to a masked scan" in d.describe()
    src = render_cuda(lir, TARGET, {"name": "nested_while"})
    assert src.count("for (int64_t rlx_s") == 1  # the masked scan's host loop; its inner cond became a select
    assert "rlx_ctrl_" not in src.split("static int rlx_forward")[1].split("\n}\n")[0]


def test_control_flow_compiles(toolchain: NvccToolchain, tmp_path: Path) -> None:
    """nvcc -c of the guarded cond and an unbounded guarded loop in one graph (one compile)."""
    cond_g, loop_g = guarded_cond_graph(), guarded_while_graph(None)
    g = Graph("guarded_both")
    env = {}
    for sub in (cond_g, loop_g):
        for n in sub.nodes:
            if n.kind == "input":
                env[(sub.name, n.id)] = g.input(f"{sub.name}_{n.name}", n.shape)
            else:
                env[(sub.name, n.id)] = g.add(n.op, [env[(sub.name, i)] for i in n.inputs])
    g.set_outputs({"y": env[(cond_g.name, cond_g.outputs[0])], "c": env[(loop_g.name, loop_g.outputs[0])]})
    src = _render(g)
    assert "rlx_ctrl_if_nodes(" in src and "rlx_ctrl_while_node(" in src
    _compile(toolchain, src, g.name, tmp_path)


def _loss_graph() -> Graph:
    def fn(t):
        x, w = t.input("x", [4, 8]), t.input("w", [8])  # elementwise only: GEMMs compile in other tests
        y = t.cond(x.sum() > 0, lambda v, u: (v * u).tanh(), lambda v, u: v * 0.5 - u, x, w)
        z = t.while_loop(lambda c, b: (c * c).sum() < 40.0, lambda c, b: c * 1.25 + (c * b).tanh(), y,
                         bcasts=[w], max_trips=8)
        return {"loss": (z * z).sum()}

    return rlx.trace("control_loss", fn)


def test_control_flow_gradient_compiles(toolchain: NvccToolchain, tmp_path: Path) -> None:
    g = rlx.grad(_loss_graph())  # the forward cond and while_loop, then their backward: one compile for all
    src = _render(g)
    kinds = {n.kind for n in _lower(g).graph.nodes}
    assert "cond" in kinds and "while_loop" in kinds and "rlx_ctrl_if_nodes(" in src
    _compile(toolchain, src, g.name, tmp_path)

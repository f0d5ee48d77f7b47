"""Graphs with a cond and a while_loop whose untaken work would fault if it ran: shared by
tests/codegen/test_cuda_control.py (rendered and compiled here) and tests/gpu/test_cuda_control.py (run on a GPU).

Each holds a gather that is out of range exactly when the branch or trip it sits in is not taken: CUDA's gather
raises the device error flag on such an index, so a run that executed that work (as the select / masked-scan
fallback of rlx/opt/control.py does) fails with "gather index out of range", while a run that branches on the
device predicate returns the reference's values.
"""

from __future__ import annotations

import numpy as np

from rlx.codegen.cuda import CudaTarget
from rlx.ir.decisions_cuda import ControlFlow
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.opt.bodies import inline_body
from rlx.pipeline import lower_to_lir
from rlx.pipeline.cuda import decide_cuda

#: Rows of the table the guarded gathers read.
ROWS = 6


def control_decisions(graph: Graph) -> list[ControlFlow]:
    """How the CUDA pipeline runs `graph`'s control flow: its LIR's `ControlFlow` decisions (optimized as a session
    optimizes, decided for f32 with the built-in GEMM: the choice depends on neither)."""
    lir = decide_cuda(lower_to_lir(graph, 2, backend="cuda"), CudaTarget(precision=DType.F32, gemm="builtin"))
    return lir.decided(ControlFlow)


def guarded_cond_graph() -> Graph:
    """``y = tanh(x) * 2 if sum(x) > 0 else x + table[idx]``: `idx` is out of range in the feeds taking the true
    branch, so the false branch must not run there."""
    g = Graph("guarded_cond")
    x, table, idx = g.input("x", [4, 8]), g.input("table", [ROWS, 8]), g.input("idx", [4], DType.I32)
    t = Graph("tanh_branch")
    tx, _, _ = t.input("x", [4, 8]), t.input("table", [ROWS, 8]), t.input("idx", [4], DType.I32)
    t.set_outputs([t.mul(t.activation("tanh", tx), t.constant(np.float32(2.0)))])
    f = Graph("gather_branch")
    fx, ft, fi = f.input("x", [4, 8]), f.input("table", [ROWS, 8]), f.input("idx", [4], DType.I32)
    f.set_outputs([f.add_(fx, f.gather(ft, fi))])
    pred = g.compare("gt", g.reduce("sum", x), g.constant(np.float32(0)))
    g.set_outputs({"y": g.cond(pred, t, f, [x, table, idx])})
    return g


def guarded_cond_feeds(seed: int = 5) -> list[dict[str, np.ndarray]]:
    """One feed per branch: the true branch with indices far out of range, the false one with valid indices."""
    r = np.random.default_rng(seed)
    table = r.standard_normal((ROWS, 8)).astype(np.float32)
    x = np.abs(r.standard_normal((4, 8))).astype(np.float32) + np.float32(0.1)
    return [{"x": x, "table": table, "idx": np.array([1000, -7, ROWS, 99], np.int32)},
            {"x": -x, "table": table, "idx": np.array([0, ROWS - 1, 2, 3], np.int32)}]


def guarded_while_graph(max_trips: int | None) -> Graph:
    """A loop counting in the carry's first element while it is below `limit`: each trip adds row c[0] of `table`
    (whose first column is 1, so the count goes up by one). Row c[0] exists only for the trips the cond allows
    when `limit` <= ROWS: one trip more reads row ROWS, out of range."""
    g = Graph(f"guarded_while_{max_trips}")
    init, limit, table = g.input("c", [8]), g.input("limit", []), g.input("table", [ROWS, 8])
    cond = Graph("below_limit")
    cc, cl, _ = cond.input("c", [8]), cond.input("limit", []), cond.input("table", [ROWS, 8])
    cond.set_outputs([cond.compare("lt", cond.narrow(cc, 0, 0, 1), cl)])
    body = Graph("add_row")
    bc, _, bt = body.input("c", [8]), body.input("limit", []), body.input("table", [ROWS, 8])
    row = body.gather(bt, body.cast(body.narrow(bc, 0, 0, 1), DType.I32))
    body.set_outputs([body.add_(bc, body.reshape(row, [8]))])
    g.set_outputs({"c": g.while_loop(cond, body, init, bcasts=[limit, table], max_trips=max_trips)})
    return g


def guarded_while_feed(limit: float, seed: int = 9) -> dict[str, np.ndarray]:
    """A feed running min(ceil(limit), ROWS) trips (fewer under a smaller max_trips); the count starts at 0."""
    r = np.random.default_rng(seed)
    table = r.standard_normal((ROWS, 8)).astype(np.float32)
    table[:, 0] = 1.0
    c = r.standard_normal(8).astype(np.float32)
    c[0] = 0.0
    return {"c": c, "limit": np.array(limit, np.float32), "table": table}


def nested_while_graph() -> Graph:
    """The guarded loop of tests/gpu/control_common.py bounded by 8 trips, its body's step chosen by a cond (on
    c[0] >= 0, always true here): the rule renders one level of bodies, so this loop takes the masked-scan fallback,
    which runs the body past the cond (gathering row ROWS, out of range, when `limit` is ROWS)."""
    guarded = guarded_while_graph(None)
    loop = guarded.node(guarded.outputs[0]).op
    g = Graph("nested_while")
    init, limit, table = g.input("c", [8]), g.input("limit", []), g.input("table", [ROWS, 8])
    keep, back = Graph("keep"), Graph("back")  # cond(ok, next, old): the branches take (next, old)
    kn, _ = keep.input("next", [8]), keep.input("old", [8])
    keep.set_outputs([keep.mul(kn, keep.constant(np.float32(1.0)))])
    _, bo = back.input("next", [8]), back.input("old", [8])
    back.set_outputs([back.mul(bo, back.constant(np.float32(1.0)))])
    body = Graph("add_row_if")
    bc, bl, bt = body.input("c", [8]), body.input("limit", []), body.input("table", [ROWS, 8])
    stepped = inline_body(body, loop.body, [bc, bl, bt])[0]
    ok = body.compare("ge", body.reduce("sum", body.narrow(bc, 0, 0, 1)), body.constant(np.float32(0)))
    body.set_outputs([body.cond(ok, keep, back, [stepped, bc])])
    g.set_outputs({"c": g.while_loop(Graph.from_body(loop.cond_body), body, init, bcasts=[limit, table],
                                     max_trips=8)})
    return g

"""Decide how each `moe_matmul` runs: `MoeExpertPlan` records (`rlx/ir/decisions_moe.py`).

The plan follows from the largest step the graph can take: at most `top_k` pairs per token, so a graph of
at most `GEMV_MAX_PAIRS` pairs (a decode step) runs one GEMV per pair; a larger one (prefill) groups the
pairs by expert, `CHUNK_PAIRS` at a time, and still takes the GEMV path in a step of few pairs. The CUDA
rule has one kernel (a warp-per-row GEMV per pair at every size), which its plan says.

>>> import rlx
>>> from rlx.opt.memplan import plan
>>> g = rlx.Graph("moe")
>>> ids, _ = g.moe_router(g.input("logits", [rlx.Dim.dynamic("t", 64), 8]), top_k=2, normalize=False)
>>> x = g.input("x", [rlx.Dim.dynamic("t", 64), 32])
>>> g.set_outputs([g.moe_matmul(x, ids, g.param("w", [8, 4, 32]))])
>>> [(d.path, d.gemv_max_pairs, d.chunk_pairs) for d in moe_plans(plan(g), "cpu")]
[('grouped', 16, 128)]
"""

from __future__ import annotations

from rlx.ir import ops_moe as MOE
from rlx.ir.decisions_moe import MoeExpertPlan
from rlx.ir.lir import LirModule

#: Steps of at most this many (token, expert) pairs run one GEMV per pair.
GEMV_MAX_PAIRS = 16
#: Pairs sorted and multiplied per round of the grouped path (bounds its scratch).
CHUNK_PAIRS = 256


def moe_plans(lir: LirModule, backend: str) -> tuple[MoeExpertPlan, ...]:
    """One `MoeExpertPlan` per `moe_matmul` node of `lir`'s schedule, for `backend` ("cpu" or "cuda")."""
    plans = []
    for nid in lir.schedule:
        node = lir.graph.node(nid)
        if not isinstance(node.op, MOE.MoeMatMul):
            continue
        tokens, top_k, _ = node.shape.dims
        pairs = tokens.max * top_k.value
        if backend == "cuda":
            plans.append(MoeExpertPlan(nid, "gemv", pairs, 0))
        elif pairs <= GEMV_MAX_PAIRS:
            plans.append(MoeExpertPlan(nid, "gemv", GEMV_MAX_PAIRS, 0))
        else:
            plans.append(MoeExpertPlan(nid, "grouped", GEMV_MAX_PAIRS, min(pairs, CHUNK_PAIRS)))
    return tuple(plans)

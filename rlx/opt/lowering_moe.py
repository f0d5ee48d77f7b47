"""Decide how each `moe_matmul` runs: `MoeExpertPlan` records (`rlx/ir/decisions_moe.py`).

The plan follows from the largest step the graph can take: at most `top_k` pairs per token, so a graph of
at most `GEMV_MAX_PAIRS` pairs (a decode step) runs one GEMV per pair; a larger one (prefill) groups the
pairs by expert, and still takes the GEMV path in a step of few pairs: on the CPU `CHUNK_PAIRS` at a time
(bounding its scratch), on CUDA the whole step at once (its scratch holds the sorted order: `scratch_bytes`).

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
from rlx.ir.graph import Graph, Node
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
        pairs = max_pairs(node)
        if pairs <= GEMV_MAX_PAIRS:
            plans.append(MoeExpertPlan(nid, "gemv", GEMV_MAX_PAIRS, 0))
        else:
            chunk = pairs if backend == "cuda" else min(pairs, CHUNK_PAIRS)
            plans.append(MoeExpertPlan(nid, "grouped", GEMV_MAX_PAIRS, chunk))
    return tuple(plans)


def max_pairs(node: Node) -> int:
    """The most (token, chosen expert) pairs a step of `moe_matmul` node `node` has."""
    tokens, top_k, _ = node.shape.dims
    return tokens.max * top_k.value


def cuda_scratch_bytes(graph: Graph, node: Node) -> int:
    """Scratch of a `moe_matmul` on CUDA's grouped path: each expert's start and first tile, and the sorted order
    (int32); none on the GEMV path."""
    pairs = max_pairs(node)
    if pairs <= GEMV_MAX_PAIRS:
        return 0
    experts = graph.node(node.inputs[2]).shape.dims[0].value
    return (2 * (experts + 1) + pairs) * 4

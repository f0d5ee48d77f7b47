"""The CPU's norms run at a packed GEMM's store (`NormInPgemm`).

A residual + LayerNorm after a linear layer (BERT's attention-output and FFN down-projections) reads the GEMM's
output once more after the GEMM has written all of it, by then out of the core's L1/L2. Run at the GEMM's store,
each block of rows is normalized by the thread that stores the block's last tile (a counter per row block), while
most of it is still in that core's cache, and the norm's own pass over memory goes.

Taken for a layer / RMS norm (f32, with or without a residual) whose x is, through no view, the output of an f32
GEMM over rows (`fold`: a 2-D packed weight) scheduled right before it (views between), normalizing rows of that
GEMM's N. The norm's output is written while other tiles of the GEMM still run, so its bytes must be none that
another row block still reads or writes: disjoint from the GEMM's A, its output and the norm's other inputs, or
the same rows of one (the same start and row length: a row of it belongs to the row block being normalized,
which no tile reads any more). The CPU's memory plan keeps a GEMM's inputs live through such a norm
(`plan(hold_gemm_inputs=True)`), so the norm's output does not take A's bytes.

>>> from rlx.ir.graph import Graph
>>> from rlx.ir import ops as O
>>> from rlx.opt.memplan import plan
>>> g = Graph("ln")
>>> x, r = g.input("x", [8, 16]), g.input("r", [8, 32])
>>> y = g.add(O.FusedMatMulBiasAct(None), [x, g.param("w", [16, 32]), g.param("b", [32])])
>>> g.set_outputs([g.add(O.FusedResidualLayerNorm(1e-5), [y, r, g.param("g", [32]), g.param("be", [32])])])
>>> [d.describe() for d in norms_in_pgemms(plan(g, hold_gemm_inputs=True), {2})]
["%7 norm computed at the store of %4's packed GEMM (a block of rows by the thread that stores its last tile)"]
"""

from __future__ import annotations

from collections.abc import Set

from rlx.ir import ops as O
from rlx.ir.decisions import Decision, NormInPgemm
from rlx.ir.dtype import DType
from rlx.ir.graph import NodeId
from rlx.ir.lir import LirModule
from rlx.ir.norms import is_norm, norm_inputs

_GEMM_KINDS = (O.MatMul, O.FusedMatMulBiasAct)


def _bytes(lir: LirModule, nid: NodeId) -> tuple[str, int, int]:
    """Where `nid`'s value lives: (root storage and slot or arena, first byte, end byte) of its own bytes."""
    b = lir.buffers[nid]
    nbytes = b.nbytes
    offset = 0
    while b.storage == "view":
        offset += b.offset
        b = lir.buffers[b.source]
    where = "arena" if b.storage == "arena" else f"{b.storage}:{b.slot}"
    start = (b.offset if b.storage == "arena" else 0) + offset
    return where, start, start + nbytes


def _no_race(out: tuple[str, int, int], other: tuple[str, int, int], same_rows: bool) -> bool:
    """Writing `out` row block by row block races with no reader or writer of `other`'s other row blocks."""
    if out[0] != other[0] or out[2] <= other[1] or other[2] <= out[1]:
        return True  # disjoint
    return same_rows and out[1] == other[1]


def norms_in_pgemms(lir: LirModule, packed: Set[NodeId]) -> tuple[Decision, ...]:
    """The norms computed at the store of the packed GEMM before them (`packed`: params stored packed)."""
    graph = lir.graph
    position = {nid: i for i, nid in enumerate(lir.schedule)}
    out: list[Decision] = []
    for norm in graph.nodes:
        if not is_norm(norm) or norm.id not in position or lir.buffers[norm.id].storage == "view":
            continue
        roles = norm_inputs(norm)
        gemm = graph.node(roles.x)
        if not isinstance(gemm.op, _GEMM_KINDS) or gemm.id not in position or gemm.inputs[1] not in packed:
            continue
        a, b = (graph.node(i).shape for i in gemm.inputs[:2])
        ins = [graph.node(i).shape.dtype for i in norm.inputs] + [a.dtype, b.dtype, norm.shape.dtype]
        if b.rank != 2 or any(dt is not DType.F32 for dt in ins) or lir.buffers[gemm.id].storage == "view":
            continue
        if norm.shape.dims != gemm.shape.dims:
            continue
        between = lir.schedule[position[gemm.id] + 1:position[norm.id]]
        if position[norm.id] < position[gemm.id] or any(lir.buffers[q].storage != "view" for q in between):
            continue
        y = _bytes(lir, norm.id)
        row_out = norm.shape.dims[-1]
        checks = [(gemm.inputs[0], a.dims[-1] == row_out), (gemm.id, True)]
        checks += [(i, graph.node(i).shape.dims == norm.shape.dims) for i in norm.inputs[1:]]
        if all(_no_race(y, _bytes(lir, i), same) for i, same in checks):
            out.append(NormInPgemm(norm.id, gemm.id))
    return tuple(out)


__all__ = ["norms_in_pgemms"]

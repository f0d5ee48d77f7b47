"""CUDA: a row gather (an embedding lookup) read by one elementwise region is done by that region's kernel.

A BERT embedding is `word[ids] + position[pos] + type[0]`: two gather kernels and the region adding their
outputs, three dependent launches at the start of every step (at batch 1 each costs more in launch latency than
in work). When a gather's only reader is an elementwise region scheduled after it with nothing but views and
other such gathers between them, the region's kernel reads `table[idx[j]]` itself (`rlx_gather_at` in
templates/cuda/kernels/gather.cuh: the same bounds check and error flag as `rlx_gather`) and the gather renders
no code. Taken only when the table is a weight (no kernel writes it), the gather takes rows of axis 0 of a table
with static dims, and the region's output bytes are not the index's (a block writes while others read). The
decision is the codegen's (like a norm in a GEMM's prologue): the generated source says where each went.
`CudaTarget.gather_region=False` keeps every gather a kernel of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda_emit import _CTYPE, CudaEmitter
from rlx.ir.graph import Node, NodeId
from rlx.ir.shape import product

#: The op kinds the CUDA region rule renders (one generated elementwise kernel each).
REGION_KINDS = ("activation", "binary", "compare", "where", "cast", "elementwise_region")


@dataclass(frozen=True)
class GatherLoad:
    """A region input read through a gather: `table[index[p / inner] * inner + p % inner]` for flat position p
    of the gather's output (C expressions; `it` the index's C type, `idx` the region's index type)."""

    table: str
    index: str
    it: str
    idx: str
    rows: str
    inner: str


def _is_weight(e: CudaEmitter, nid: NodeId) -> bool:
    b = e.lir.buffers[nid]
    while b.storage == "view":
        b = e.lir.buffers[b.source]
    return b.storage in ("param", "const")


def _span(e: CudaEmitter, nid: NodeId) -> tuple[int, int]:
    start = e.offset(nid)
    return start, start + e.node(nid).shape.max_numel * e.ddt(nid).itemsize


def _candidate(e: CudaEmitter, g: Node, region: Node) -> bool:
    """`g` is a gather whose only reader is `region`, which could do its lookups (the checks of the module doc
    but the schedule's)."""
    if g.kind != "gather" or len(g.inputs) != 2 or g.id in e.graph.outputs or set(e.users[g.id]) != {region.id}:
        return False
    table, idx = (e.node(i) for i in g.inputs)
    if g.op.axis % table.shape.rank != 0 or table.shape.rank < 1 or not all(d.is_static for d in table.shape.dims):
        return False
    if idx.shape.dtype.value not in ("i32", "i64") or not _is_weight(e, table.id):
        return False
    (i0, i1), (r0, r1) = _span(e, idx.id), _span(e, region.id)
    return not (i0 < r1 and r0 < i1)


def absorbing_region(e: CudaEmitter, g: Node) -> NodeId | None:
    """The region whose kernel does gather `g`'s lookups, or None (`g` runs its own kernel)."""
    if not e.target.gather_region or g.kind != "gather" or g.id not in e.position:
        return None
    users = set(e.users[g.id])
    if len(users) != 1:
        return None
    region = e.node(users.pop())
    if region.kind not in REGION_KINDS or e.position.get(region.id, -1) <= e.position[g.id]:
        return None
    if not _candidate(e, g, region):
        return None
    for nid in e.lir.schedule[e.position[g.id] + 1:e.position[region.id]]:
        if e.lir.buffers[nid].storage != "view" and not _candidate(e, e.node(nid), region):
            return None  # a kernel between them could write the index (or read the gather's output)
    return region.id


def gathered_inputs(e: CudaEmitter, region: Node, idx: str) -> dict[int, GatherLoad]:
    """{input position: its lookup} for the inputs of `region` whose gathers it does (`idx`: its index type)."""
    out = {}
    for j, nid in enumerate(region.inputs):
        g = e.node(nid)
        if g.kind == "gather" and absorbing_region(e, g) == region.id:
            table, index = g.inputs
            dims = e.node(table).shape.dims
            out[j] = GatherLoad(table=e.ptr(table), index=e.ptr(index), it=_CTYPE[e.node(index).shape.dtype], idx=idx,
                                rows=f"({idx}){dims[0].value}", inner=f"({idx}){product(dims[1:]).value}")
    return out

"""CUDA: the lookups of the row gathers an elementwise region's kernel does itself (`GatherInRegion` decisions).

A BERT embedding is `word[ids] + position[pos] + type[0]`: two gather kernels and the region adding their
outputs. Where the CUDA lowering decided so (`rlx.opt.lowering_cuda_kernels.find_region_gathers`: a
`GatherInRegion` record in the LIR), the region's kernel reads `table[idx[j]]` itself (`rlx_gather_at` in
templates/cuda/kernels/gather.cuh: the same bounds check and error flag as `rlx_gather`) and the gather renders
no code; the generated source says where each went. This module only turns those records into the region's loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import _CTYPE, CudaEmitter
from rlx.ir.graph import Node, NodeId
from rlx.ir.shape import product
from rlx.opt.lowering_cuda_kernels import REGION_KINDS

__all__ = ["REGION_KINDS", "GatherLoad", "absorbing_region", "gathered_inputs"]


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


def absorbing_region(e: CudaEmitter, g: Node) -> NodeId | None:
    """The region whose kernel does gather `g`'s lookups, or None (`g` runs its own kernel)."""
    d = e.gather_in_region.get(g.id)
    return d.region if d is not None else None


def gathered_inputs(e: CudaEmitter, region: Node, idx: str) -> dict[int, GatherLoad]:
    """{input position: its lookup} for the inputs of `region` whose gathers it does (`idx`: its index type)."""
    out = {}
    for j, nid in enumerate(region.inputs):
        g = e.node(nid)
        if absorbing_region(e, g) == region.id:
            table, index = g.inputs
            dims = e.node(table).shape.dims
            out[j] = GatherLoad(table=e.ptr(table), index=e.ptr(index), it=_CTYPE[e.node(index).shape.dtype], idx=idx,
                                rows=f"({idx}){dims[0].value}", inner=f"({idx}){product(dims[1:]).value}")
    return out

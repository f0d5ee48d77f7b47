"""CPU rules for the collective ops (`all_reduce`, `all_gather`, `reduce_scatter`).

Registered into the CPU rule table when `rlx.codegen.cpu.emit` is imported. A collective
renders as one call into the transport the caller attached to the context
(`rlx_set_transport`, `templates/cpu/kernels/transport.h`): the generated code
never knows whether the other ranks are threads, processes or machines. Graphs
with collectives also include the shared-memory transport
(`kernels/transport_shm.h`, exported as `rlx_shm_transport_open`), which the
runtime uses for ranks on one machine (`rlx.runtime.transport`).

Only graphs with a collective include these headers and get the context's
`transport` member; every other graph renders exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import c_string, node_header
from rlx.codegen.registry import Kernel, RuleSet, float32_only
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.shape import product

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "collectives.c.j2"
HEADERS = ("kernels/transport.h", "kernels/collectives.h", "kernels/transport_shm.h")
#: Op kinds whose presence gives the context a transport (prelude.c.j2 checks for the header).
COLLECTIVE_KINDS = frozenset({"all_reduce", "all_gather", "reduce_scatter"})
#: Codes of kernels/transport.h.
DTYPE_CODES = {DType.F32: "RLX_DT_F32", DType.F16: "RLX_DT_F16", DType.BF16: "RLX_DT_BF16"}
REDUCE_CODES = {"sum": "RLX_RED_SUM", "max": "RLX_RED_MAX"}


@dataclass(frozen=True)
class AllReduceArgs:
    """C expressions of one `all_reduce` (macro `all_reduce`)."""

    label: str
    x: str
    y: str
    count: str
    world: int
    dtype: str
    op: str
    reduce: str


@dataclass(frozen=True)
class AllGatherArgs:
    """One `all_gather`: `outer` rows before the axis, `inner` elements of each rank per row."""

    label: str
    x: str
    y: str
    outer: str
    inner: str
    world: int
    dtype: str
    elsize: int
    #: No rows before the axis: the transport writes the output directly.
    direct: bool


@dataclass(frozen=True)
class ReduceScatterArgs:
    """One `reduce_scatter`: `outer` rows before the axis, `block` elements each rank keeps per row."""

    label: str
    x: str
    y: str
    outer: str
    block: str
    world: int
    dtype: str
    op: str
    reduce: str
    elsize: int
    direct: bool


def _label(node: Node) -> str:
    return c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))


def _kernel(node: Node, macro: str, args: object, scratch: int = 0) -> Kernel:
    return Kernel(node.id, macro, TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=_label(node), scratch_shared=scratch)


def emit_all_reduce(em, node: Node) -> Kernel:
    """`all_reduce`: the transport reduces the whole buffer (in place when the planner aliases it)."""
    op: O.AllReduce = node.op  # type: ignore[assignment]
    (x_id,) = node.inputs
    args = AllReduceArgs(label=_label(node), x=em.ptr(x_id), y=em.ptr(node.id, const=False),
                         count=em.numel(node.shape.dims), world=op.world, dtype=DTYPE_CODES[node.shape.dtype],
                         op=REDUCE_CODES[op.reduce], reduce=op.reduce)
    return _kernel(node, "all_reduce", args)


def _split(dims: tuple, axis: int) -> tuple[tuple, tuple, bool]:
    before, after = dims[:axis], dims[axis:]
    direct = all(d.is_static for d in before) and product(before).value == 1 if before else True
    return before, after, direct


def emit_all_gather(em, node: Node) -> Kernel:
    """`all_gather` along `axis`: the rank-major gather, interleaved into the axis when rows precede it."""
    op: O.AllGather = node.op  # type: ignore[assignment]
    (x_id,) = node.inputs
    x = em.node(x_id).shape
    axis = op.axis % x.rank
    before, after, direct = _split(x.dims, axis)
    args = AllGatherArgs(label=_label(node), x=em.ptr(x_id), y=em.ptr(node.id, const=False),
                         outer=em.numel(before) if before else "1", inner=em.numel(after), world=op.world,
                         dtype=DTYPE_CODES[x.dtype], elsize=x.dtype.itemsize, direct=direct)
    return _kernel(node, "all_gather", args, 0 if direct else node.shape.max_nbytes)


def emit_reduce_scatter(em, node: Node) -> Kernel:
    """`reduce_scatter` along `axis`: the axis's blocks made rank-major first when rows precede it."""
    op: O.ReduceScatter = node.op  # type: ignore[assignment]
    (x_id,) = node.inputs
    x = em.node(x_id).shape
    axis = op.axis % x.rank
    before, after, direct = _split(node.shape.dims, axis)
    args = ReduceScatterArgs(label=_label(node), x=em.ptr(x_id), y=em.ptr(node.id, const=False),
                             outer=em.numel(before) if before else "1", block=em.numel(after), world=op.world,
                             dtype=DTYPE_CODES[x.dtype], op=REDUCE_CODES[op.reduce], reduce=op.reduce,
                             elsize=x.dtype.itemsize, direct=direct)
    return _kernel(node, "reduce_scatter", args, 0 if direct else x.max_nbytes)


def _gather_dtypes(op: O.Op, in_dtypes: tuple, out_dtype: DType) -> str | None:
    # a gather only moves bytes: every float width the transport knows
    bad = sorted({d.value for d in (*in_dtypes, out_dtype) if d not in DTYPE_CODES})
    return f"on {'/'.join(bad)}; it takes f32/f16/bf16" if bad else None


# The shared-memory transport reduces f32 (legalization runs f16/bf16 reductions in f32).
RULES.register("all_reduce", accepts=float32_only)(emit_all_reduce)
RULES.register("reduce_scatter", accepts=float32_only)(emit_reduce_scatter)
RULES.register("all_gather", accepts=_gather_dtypes)(emit_all_gather)

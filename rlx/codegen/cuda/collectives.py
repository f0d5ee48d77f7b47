"""CUDA rules for the collective ops: NCCL calls on the context's stream, and small sums one-shot through the
peers' memory where the lowering decided it (`AllReduceP2P`).

Registered into the CUDA rule table when `rlx.codegen.cuda` is imported. One process per
GPU; each rank's context joins the NCCL clique through `rlx_set_nccl` (the unique id is
created by the launcher, `rlx.distributed.launch(device="cuda")`). `all_gather` /
`reduce_scatter` along an axis with rows before it move between NCCL's rank-major layout and
the axis through the scratch region (`lowering_cuda.scratch_need`). Only graphs with a
collective include `kernels/collectives.cuh` (and link NCCL); others render as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import COLLECTIVES_TEMPLATE, CudaEmitter, Launch
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = COLLECTIVES_TEMPLATE
HEADER = "cuda/kernels/collectives.cuh"
#: The exchange buffers' layout and flags (shared by the one-shot sums and the dense GEMV's reduce that sums over
#: the clique).
EXCHANGE_HEADER = "cuda/kernels/exchange.cuh"
#: Op kinds that give the CUDA context a communicator (`nccl` in the template context).
COLLECTIVE_KINDS = frozenset({"all_reduce", "all_gather", "reduce_scatter"})
NCCL_TYPES = {"float": "ncclFloat32", "__half": "ncclFloat16", "rlx_bf16": "ncclBfloat16"}
NCCL_OPS = {"sum": "ncclSum", "max": "ncclMax"}


@dataclass(frozen=True, kw_only=True)
class AllReduceLaunch(Launch):
    x: str
    y: str
    count: str
    world: int
    dtype: str
    op: str
    reduce: str
    #: the element type; `p2p`: the C condition under which a call sums one-shot through the peers' memory
    #: ("": NCCL only); `res`: the residual it then adds (AllReduceP2P.residual; "": none), `out` where that goes;
    #: `gemv_rows`: the rows of the dense GEMV that makes the one-shot sum itself when they are 1 (AllReduceP2P.gemv;
    #: "": none), `gemv` its node
    ctype: str = "float"
    p2p: str = ""
    res: str = ""
    out: str = ""
    gemv_rows: str = ""
    gemv: int = -1


@dataclass(frozen=True, kw_only=True)
class AllGatherLaunch(Launch):
    x: str
    y: str
    outer: str
    inner: str
    world: int
    dtype: str
    elsize: int


@dataclass(frozen=True, kw_only=True)
class ReduceScatterLaunch(Launch):
    x: str
    y: str
    outer: str
    block: str
    world: int
    dtype: str
    op: str
    reduce: str
    elsize: int


def _kernel(node: Node, macro: str, args: Launch) -> Kernel:
    return Kernel(node.id, macro, TEMPLATE, args, headers=(EXCHANGE_HEADER, HEADER), header=args.comment,
                  label=node.label)


def all_reduce(e: CudaEmitter, node: Node) -> Kernel:
    op: O.AllReduce = node.op  # type: ignore[assignment]
    (x,) = node.inputs
    d = e.all_reduce_p2p.get(node.id)
    res = out = gemv_rows = ""
    if d is not None and d.residual:
        add = e.node(d.residual[0])
        res, out = e.ptr(next(a for a in add.inputs if a != node.id)), e.ptr(add.id)
    if d is not None and d.gemv:
        gemv_rows = e.numel(e.node(e.node(d.gemv[0]).inputs[0]).shape.dims[:-1])
    args = AllReduceLaunch(**e.base(node), x=e.ptr(x), y=e.ptr(node.id), count=e.numel(node.shape.dims),
                           world=op.world, dtype=NCCL_TYPES[e.ctype(node.id)], op=NCCL_OPS[op.reduce],
                           reduce=op.reduce, ctype=e.ctype(node.id), p2p=e.p2p_condition(d) if d else "", res=res,
                           out=out, gemv_rows=gemv_rows, gemv=d.gemv[0] if d is not None and d.gemv else -1)
    return _kernel(node, "block_all_reduce", args)


def all_gather(e: CudaEmitter, node: Node) -> Kernel:
    op: O.AllGather = node.op  # type: ignore[assignment]
    (x,) = node.inputs
    dims = e.node(x).shape.dims
    axis = op.axis % len(dims)
    args = AllGatherLaunch(**e.base(node), x=e.ptr(x), y=e.ptr(node.id),
                           outer=e.numel(dims[:axis]) if axis else "(int64_t)1", inner=e.numel(dims[axis:]),
                           world=op.world, dtype=NCCL_TYPES[e.ctype(node.id)], elsize=e.ddt(node.id).itemsize)
    return _kernel(node, "block_all_gather", args)


def reduce_scatter(e: CudaEmitter, node: Node) -> Kernel:
    op: O.ReduceScatter = node.op  # type: ignore[assignment]
    (x,) = node.inputs
    dims = node.shape.dims
    axis = op.axis % len(dims)
    args = ReduceScatterLaunch(**e.base(node), x=e.ptr(x), y=e.ptr(node.id),
                               outer=e.numel(dims[:axis]) if axis else "(int64_t)1", block=e.numel(dims[axis:]),
                               world=op.world, dtype=NCCL_TYPES[e.ctype(node.id)], op=NCCL_OPS[op.reduce],
                               reduce=op.reduce, elsize=e.ddt(node.id).itemsize)
    return _kernel(node, "block_reduce_scatter", args)


def _accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    floats = (DType.F32, DType.F16, DType.BF16)
    bad = sorted({d.value for d in (*in_dtypes, out_dtype) if d not in floats})
    return f"on {', '.join(bad)}; it takes f32, f16 or bf16" if bad else None


RULES.register("all_reduce", accepts=_accepts)(all_reduce)
RULES.register("all_gather", accepts=_accepts)(all_gather)
RULES.register("reduce_scatter", accepts=_accepts)(reduce_scatter)

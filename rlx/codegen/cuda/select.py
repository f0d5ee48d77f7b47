"""CUDA rules for `argmax`: one block per output value (kernels/argmax.cuh), and `iota`: a grid-stride loop
writing ``start + i * delta`` (kernels/iota.cuh).

A decoder's greedy step reads back the argmax of its logits (4 bytes a row)
instead of the logits themselves.

>>> import rlx
>>> g = rlx.Graph("pick")
>>> g.set_outputs([g.argmax(g.input("x", [2, 5]))])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cuda")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.ops_range import Iota
from rlx.ir.shape import normalize_axis

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/select.cu.j2"
HEADER = "cuda/kernels/argmax.cuh"
FLOATS = (DType.F32, DType.F16, DType.BF16, DType.F64)


@dataclass(frozen=True, kw_only=True)
class ArgMaxLaunch(Launch):
    """Launch arguments of `block_argmax`: x viewed as [outer, n, inner]."""

    t: str
    acc: str
    x: str
    y: str
    outer: str
    n: str
    inner: str


def _accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return None if in_dtypes[0] in FLOATS else f"on {in_dtypes[0].value}; it takes floating-point input"


@RULES.register("argmax", accepts=_accepts)
def argmax(e: CudaEmitter, node: Node) -> Kernel:
    x_id = node.inputs[0]
    x = e.node(x_id).shape
    axis = normalize_axis(node.op.axis, x.rank, "argmax axis")
    args = ArgMaxLaunch(**e.base(node), t=e.ctype(x_id), acc="double" if e.ddt(x_id) is DType.F64 else "float",
                        x=e.ptr(x_id), y=e.ptr(node.id), outer=e.numel(x.dims[:axis]), n=e.dim(x.dims[axis]),
                        inner=e.numel(x.dims[axis + 1:]))
    return Kernel(node.id, "block_argmax", TEMPLATE, args, headers=(HEADER,), header=args.comment, label=node.label)


IOTA_HEADER = "cuda/kernels/iota.cuh"
IOTA_DTYPES = (DType.F32, DType.F16, DType.BF16, DType.F64, DType.I16, DType.I32, DType.I64)


@dataclass(frozen=True, kw_only=True)
class IotaLaunch(Launch):
    """Launch arguments of `block_iota`: y[i] = start + i * delta for i < n."""

    t: str
    y: str
    n: str
    is_float: bool
    start: str
    delta: str


def _iota_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    made = "/".join(d.value for d in IOTA_DTYPES)
    return None if out_dtype in IOTA_DTYPES else f"of {out_dtype.value}; it makes {made}"


@RULES.register("iota", accepts=_iota_accepts)
def iota(e: CudaEmitter, node: Node) -> Kernel:
    op: Iota = node.op  # type: ignore[assignment]
    is_float = node.shape.dtype.is_float
    number = (lambda v: repr(float(v))) if is_float else (lambda v: f"(int64_t){int(v)}LL")
    args = IotaLaunch(**e.base(node), t=e.ctype(node.id), y=e.ptr(node.id), n=e.dim(op.length), is_float=is_float,
                      start=number(op.start), delta=number(op.delta))
    return Kernel(node.id, "block_iota", TEMPLATE, args, headers=(IOTA_HEADER,), header=args.comment,
                  label=node.label)

"""CPU rules for `argmax` (the index of the largest value along an axis) and `iota` (``start + i * delta``).

Registered into the CPU rule table when `rlx.codegen` is imported. The argmax loop is in
`templates/cpu/kernels/argmax.h`: rows of the collapsed `[outer, n, inner]`
view in parallel, NaN tested on the bits (numpy's semantics). The iota loop is in
select.c.j2 (integers exact in int64, floats computed in double and rounded once, as the reference).

>>> import rlx
>>> g = rlx.Graph("pick")
>>> g.set_outputs([g.argmax(g.input("x", [2, 5]))])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cpu")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import c_string, node_header
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.ops_range import Iota
from rlx.ir.shape import normalize_axis

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "select.c.j2"
HEADERS = ("kernels/argmax.h",)
SUFFIX = {DType.F32: "f32", DType.F64: "f64"}


@dataclass(frozen=True)
class ArgMaxArgs:
    """C expressions of one `argmax` kernel over x viewed as [outer, n, inner]."""

    x: str
    y: str
    outer: str
    n: str
    inner: str
    suffix: str
    n_comment: str


def _accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return None if in_dtypes[0] in SUFFIX else f"on {in_dtypes[0].value}; it takes f32 or f64"


def emit_argmax(em, node: Node) -> Kernel:
    """The `argmax` kernel of an `argmax` node."""
    x = em.node(node.inputs[0]).shape
    axis = normalize_axis(node.op.axis, x.rank, "argmax axis")
    args = ArgMaxArgs(x=em.ptr(node.inputs[0]), y=em.ptr(node.id, const=False), outer=em.numel(x.dims[:axis]),
                      n=em.dim(x.dims[axis]), inner=em.numel(x.dims[axis + 1:]), suffix=SUFFIX[x.dtype],
                      n_comment=str(x.dims[axis]))
    label = c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))
    return Kernel(node.id, "argmax", TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label)


RULES.register("argmax", accepts=_accepts)(emit_argmax)


#: The C type of each dtype an iota writes on the CPU (f16/bf16: see `_iota_accepts`).
IOTA_CTYPES = {DType.F32: "float", DType.F64: "double", DType.I16: "int16_t", DType.I32: "int32_t",
               DType.I64: "int64_t"}


@dataclass(frozen=True)
class IotaArgs:
    """C expressions of one `iota` kernel: y[i] = start + i * delta for i < n."""

    y: str
    n: str
    ctype: str
    is_float: bool
    start: str
    delta: str
    n_comment: str


def _iota_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    made = "/".join(d.value for d in IOTA_CTYPES)
    return None if out_dtype in IOTA_CTYPES else f"of {out_dtype.value}; it makes {made}"


def emit_iota(em, node: Node) -> Kernel:
    """The `iota` kernel of an `iota` node."""
    op: Iota = node.op  # type: ignore[assignment]
    dt = node.shape.dtype
    number = (lambda v: repr(float(v))) if dt.is_float else (lambda v: f"INT64_C({int(v)})")
    args = IotaArgs(y=em.ptr(node.id, const=False), n=em.dim(op.length), ctype=IOTA_CTYPES[dt], is_float=dt.is_float,
                    start=number(op.start), delta=number(op.delta), n_comment=str(op.length))
    label = c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))
    return Kernel(node.id, "iota", TEMPLATE, args, header=node_header(node, 80), func=f"rlx_op_{node.id}",
                  label=label)


RULES.register("iota", accepts=_iota_accepts)(emit_iota)

"""CUDA rules for the convolution family: `conv` and `pool` (`rlx.ir.ops_conv`), cuDNN-free.

A conv is an implicit GEMM (`rlx_conv_igemm`: 64 x 64 tiles of pixels x output
channels, the receptive fields gathered into shared memory slice by slice, no
im2col buffer; bias and activation in the epilogue, stored channels-first), or
for depthwise convolutions (groups == C == O) one thread per output value.
Pooling is one thread per output value. Kernels: `templates/cuda/kernels/conv.cuh`;
launches: `templates/cuda/conv.cu.j2`. f32, f16 and bf16 storage, f32 accumulation.

>>> import rlx
>>> g = rlx.Graph("c")
>>> x, w = g.input("x", [1, 4, 8, 8]), g.param("w", [8, 4, 3, 3])
>>> g.set_outputs([g.pool("avg", g.conv(x, w, activation="relu"), (2, 2))])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cuda")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch, _act
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.ops_conv import Conv, Pool, Window2d, pool_kernel_why_not, window_2d
from rlx.opt.lowering_conv import is_depthwise

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/conv.cu.j2"
HEADER = "cuda/kernels/conv.cuh"
FLOATS = (DType.F32, DType.F16, DType.BF16)


@dataclass(frozen=True, kw_only=True)
class WindowLaunch(Launch):
    """The 2-D window shared by the conv and pool launches (a 1-D one has h = kh = 1)."""

    t: str
    x: str
    y: str
    cg: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    ph: int
    pw: int


@dataclass(frozen=True, kw_only=True)
class ConvLaunch(WindowLaunch):
    """Launch arguments of `block_conv`."""

    w_ptr: str
    bias: str
    batch: str
    o: int
    og: int
    groups: int
    act: str
    direct: bool


@dataclass(frozen=True, kw_only=True)
class PoolLaunch(WindowLaunch):
    """Launch arguments of `block_pool`."""

    planes: str
    peh: int
    pew: int
    is_max: int
    count_pad: int


def _accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    bad = sorted({d.value for d in in_dtypes if d not in FLOATS})
    return f"on {'/'.join(bad)}; it takes f32, f16 or bf16" if bad else None


def _window(geo: Window2d) -> dict:
    return {f: getattr(geo, f) for f in ("cg", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "ph", "pw")}


@RULES.register("conv", accepts=_accepts)
def conv(e: CudaEmitter, node: Node) -> Kernel:
    op: Conv = node.op  # type: ignore[assignment]
    x_id, w_id = node.inputs[:2]
    x = e.node(x_id).shape
    o, cg, *kernel = e.node(w_id).shape.static_dims
    geo = window_2d(op, tuple(d.value for d in x.dims[2:]), tuple(d.value for d in node.shape.dims[2:]),
                    tuple(kernel), cg)
    args = ConvLaunch(**e.base(node), t=e.ctype(x_id), x=e.ptr(x_id), y=e.ptr(node.id), w_ptr=e.ptr(w_id),
                      bias=e.ptr(node.inputs[2]) if len(node.inputs) == 3 else "nullptr", batch=e.dim(x.dims[0]),
                      o=o, og=o // op.groups, groups=op.groups, act=_act(op.activation),
                      direct=is_depthwise(op.groups, x.dims[1].value, o), **_window(geo))
    return Kernel(node.id, "block_conv", TEMPLATE, args, headers=(HEADER,), header=args.comment, label=node.label)


def _pool_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return pool_kernel_why_not(op) or _accepts(op, in_dtypes, out_dtype)


@RULES.register("pool", accepts=_pool_accepts)
def pool(e: CudaEmitter, node: Node) -> Kernel:
    op: Pool = node.op  # type: ignore[assignment]
    x_id = node.inputs[0]
    x = e.node(x_id).shape
    geo = window_2d(op, tuple(d.value for d in x.dims[2:]), tuple(d.value for d in node.shape.dims[2:]),
                    op.kernel, 1)
    args = PoolLaunch(**e.base(node), t=e.ctype(x_id), x=e.ptr(x_id), y=e.ptr(node.id), planes=e.numel(x.dims[:2]),
                      peh=geo.peh, pew=geo.pew, is_max=int(op.fn == "max"), count_pad=int(op.count_include_pad),
                      **_window(geo))
    return Kernel(node.id, "block_pool", TEMPLATE, args, headers=(HEADER,), header=args.comment, label=node.label)

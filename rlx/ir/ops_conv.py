"""Convolution family: `conv` (1-D / 2-D, groups, stride, dilation, pads, fused bias + activation),
`pool` (max / average, 1-D / 2-D / 3-D) and inference `batch_norm`, all channels-first (NCHW / NCL) as ONNX and torch.

Inputs and outputs are channels-first at the graph boundary; how a backend lays
out its tiles inside a kernel is a decision of the LIR (`rlx.ir.decisions_conv`).
Spatial sizes follow ONNX: ``out = floor((in + pad_begin + pad_end - dilation *
(k - 1) - 1) / stride) + 1`` (pooling's `ceil_mode` rounds up, and drops a last
window that would start in the end padding). `auto_pad` modes are resolved to
explicit pads by the importer (`pads_for_auto`).

This module registers the ops in the MIR op set when imported (`rlx.ir.graph`
imports it).

>>> from rlx.ir.shape import Shape
>>> print(Conv(strides=(2, 2), pads=(1, 1, 1, 1)).infer([Shape.of([1, 3, 8, 8]), Shape.of([4, 3, 3, 3])]))
f32[1,4,4,4]
>>> pads_for_auto("SAME_UPPER", (5,), (4,), (1,), (1,))
(1, 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx.errors import ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import ACTIVATIONS, Op
from rlx.ir.shape import Dim, Shape

POOL_FNS = ("max", "avg")
AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def _ints(kind: str, name: str, value: object, n: int, minimum: int) -> tuple[int, ...]:
    if not isinstance(value, tuple) or len(value) != n or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value):
        raise ShapeError(f"{kind} {name} must be {n} int(s) >= {minimum}, got {value!r}")
    return value


def out_size(size: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int,
             ceil_mode: bool = False) -> int:
    """Output length of one spatial axis (ONNX's formula; `ceil_mode` as ONNX's pooling)."""
    span = size + pad_begin + pad_end - dilation * (k - 1) - 1
    if span < 0:
        return 0
    if not ceil_mode:
        return span // stride + 1
    n = -(-span // stride) + 1
    if (n - 1) * stride >= size + pad_begin:  # the last window would start inside the end padding
        n -= 1
    return n


def pads_for_auto(mode: str, sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int]) -> tuple[int, ...]:
    """Explicit pads (begins, then ends) of ONNX's `auto_pad` mode for these spatial sizes."""
    if mode not in AUTO_PADS or mode == "NOTSET":
        raise ShapeError(f"auto_pad {mode!r} has no implied pads; expected one of {AUTO_PADS[1:]}")
    r = len(sizes)
    if mode == "VALID":
        return (0,) * (2 * r)
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + d * (k - 1) + 1 - size)
        small = total // 2
        begins.append(small if mode == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return (*begins, *ends)


def _spatial(kind: str, x: Shape, ranks: tuple[int, ...] = (3, 4)) -> tuple[int, ...]:
    if x.rank not in ranks:
        forms = ("[N, C, L]", "[N, C, H, W]", "[N, C, D, H, W]")[:len(ranks)]
        raise ShapeError(f"{kind} input must be {' or '.join(forms)}, got {x}")
    if not all(d.is_static for d in x.dims[1:]):
        raise ShapeError(f"{kind} input needs static channels and spatial sizes (the batch may be dynamic), got {x}")
    return tuple(d.value for d in x.dims[2:])


def _window_out(kind: str, sizes: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
                dilations: tuple[int, ...], pads: tuple[int, ...], ceil_mode: bool = False) -> list[Dim]:
    r = len(sizes)
    out = []
    for i in range(r):
        n = out_size(sizes[i], kernel[i], strides[i], dilations[i], pads[i], pads[r + i], ceil_mode)
        if n < 1:
            raise ShapeError(f"{kind}: spatial axis {i} of size {sizes[i]} (pads {pads[i]}+{pads[r + i]}) is "
                             f"smaller than the window {kernel[i]} (dilation {dilations[i]})")
        out.append(Dim(n))
    return out


@dataclass(frozen=True)
class Conv(Op):
    """`act(conv(x, w) + bias)`: x `[N, C, *S]`, w `[O, C/groups, *K]`, optional bias `[O]` → `[N, O, *S']`.

    One or two spatial axes. `strides`, `dilations` (one per axis, default 1) and
    `pads` (begins then ends, default 0) as ONNX's Conv; `groups` splits C and O
    alike (groups == C == O is depthwise). `activation` (one of ACTIVATIONS, or
    None) is applied after the bias. Empty tuples mean the defaults.
    """

    kind: ClassVar[str] = "conv"
    arity: ClassVar[tuple[int, int]] = (2, 3)
    strides: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    groups: int = 1
    activation: str | None = None

    def geometry(self, rank: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(strides, dilations, pads) with defaults filled for `rank` spatial axes."""
        return (self.strides or (1,) * rank, self.dilations or (1,) * rank, self.pads or (0,) * (2 * rank))

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, w = inputs[:2]
        sizes = _spatial("conv", x)
        r = len(sizes)
        if x.dtype not in (DType.F32, DType.F16, DType.BF16) or any(s.dtype != x.dtype for s in inputs):
            raise ShapeError(f"conv needs float inputs of one dtype, got {', '.join(map(str, inputs))}")
        if w.rank != r + 2 or not w.is_static:
            raise ShapeError(f"conv weight must be a static [O, C/groups, {', '.join('k' * r)}] tensor for "
                             f"input {x}, got {w}")
        strides, dilations, pads = self.geometry(r)
        _ints("conv", "strides", strides, r, 1)
        _ints("conv", "dilations", dilations, r, 1)
        _ints("conv", "pads", pads, 2 * r, 0)
        o, cg, *kernel = w.static_dims
        c = x.dims[1].value
        if isinstance(self.groups, bool) or not isinstance(self.groups, int) or self.groups < 1 \
                or c % self.groups or o % self.groups:
            raise ShapeError(f"conv groups={self.groups!r} must divide both the {c} input and {o} output channels")
        if cg != c // self.groups:
            raise ShapeError(f"conv weight {w} has {cg} channels per group; input {x} with groups={self.groups} "
                             f"has {c // self.groups}")
        if len(inputs) == 3 and inputs[2].dims != (Dim(o),):
            raise ShapeError(f"conv bias must be [{o}], got {inputs[2]}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ShapeError(f"conv: unknown activation {self.activation!r}")
        out = _window_out("conv", sizes, tuple(kernel), strides, dilations, pads)
        return x.with_dims((x.dims[0], Dim(o), *out))


@dataclass(frozen=True)
class Pool(Op):
    """Max or average pooling over windows `kernel` of the 1, 2 or 3 spatial axes of x `[N, C, *S]`.

    `strides` (default 1), `pads` (begins then ends; padding never wins a max,
    and counts in an average only with `count_include_pad`), `dilations`
    (as ONNX's pooling ops from opset 19), `ceil_mode` as ONNX's pooling ops.
    Backends have 1-D / 2-D kernels; a 3-D pool is decomposed into two of them
    (`rlx.opt.decompose`: max and average are separable over a box window).
    """

    kind: ClassVar[str] = "pool"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    fn: str
    kernel: tuple[int, ...]
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    ceil_mode: bool = False
    count_include_pad: bool = False

    def geometry(self, rank: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(strides, dilations, pads) with defaults filled for `rank` spatial axes."""
        return (self.strides or (1,) * rank, self.dilations or (1,) * rank, self.pads or (0,) * (2 * rank))

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        (x,) = inputs
        if self.fn not in POOL_FNS:
            raise ShapeError(f"unknown pooling {self.fn!r}; expected one of {POOL_FNS}")
        sizes = _spatial("pool", x, (3, 4, 5))
        r = len(sizes)
        if x.dtype not in (DType.F32, DType.F16, DType.BF16):
            raise ShapeError(f"pool needs a float input, got {x}")
        strides, dilations, pads = self.geometry(r)
        kernel = _ints("pool", "kernel", self.kernel, r, 1)
        _ints("pool", "strides", strides, r, 1)
        _ints("pool", "dilations", dilations, r, 1)
        _ints("pool", "pads", pads, 2 * r, 0)
        if any(pads[i] >= kernel[i] * 1 or pads[r + i] >= kernel[i] for i in range(r)):
            raise ShapeError(f"pool pads {pads} must be smaller than the window {kernel}")
        out = _window_out("pool", sizes, kernel, strides, dilations, pads, bool(self.ceil_mode))
        return x.with_dims((*x.dims[:2], *out))


def pool_kernel_why_not(op: Op) -> str | None:
    """Why a backend's 1-D / 2-D pool kernel does not take `op` (a 3-D pool: decomposed into two 2-D ones)."""
    if isinstance(op, Pool) and len(op.kernel) > 2:
        return f"over {len(op.kernel)} spatial axes; the kernels take 1 or 2 (a 3-D pool is decomposed)"
    return None


@dataclass(frozen=True)
class BatchNorm(Op):
    """Inference batch normalization over channel axis 1: ``(x - mean) / sqrt(var + eps) * scale + bias``.

    Inputs x `[N, C, ...]`, then scale, bias, mean and var, each `[C]`.
    """

    kind: ClassVar[str] = "batch_norm"
    arity: ClassVar[tuple[int, int]] = (5, 5)
    eps: float = 1e-5

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        if x.rank < 2 or not x.dims[1].is_static or not x.dtype.is_float:
            raise ShapeError(f"batch_norm input must be float [N, C, ...] with static C, got {x}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not math.isfinite(self.eps) \
                or self.eps < 0:
            raise ShapeError(f"batch_norm eps must be a finite number >= 0, got {self.eps!r}")
        for name, s in zip(("scale", "bias", "mean", "var"), inputs[1:]):
            if s.dims != (x.dims[1],) or s.dtype != x.dtype:
                raise ShapeError(f"batch_norm {name} must be {x.dtype}[{x.dims[1]}], got {s}")
        return x


@dataclass(frozen=True)
class Window2d:
    """The 2-D window of a conv or pool (a 1-D one has h = kh = sh = dh = 1, ph = 0)."""

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
    #: end pads (pooling's average counts them with count_include_pad)
    peh: int
    pew: int

    @property
    def phase_cols(self) -> int:
        """Columns of one stride-phase plane of the padded input (WQ): every tap of a run of output columns
        reads consecutive values of one."""
        return self.ow + (self.kw - 1) * self.dw // self.sw

    @property
    def phase_rows(self) -> int:
        """Rows of one stride-phase plane (HQ; the copies hold one row more)."""
        return self.oh + (self.kh - 1) * self.dh // self.sh


def window_2d(op: Conv | Pool, x_dims: tuple[int, ...], out_dims: tuple[int, ...], kernel: tuple[int, ...],
              channels: int) -> Window2d:
    """The window of `op` on spatial sizes `x_dims` → `out_dims`, as 2-D."""
    rank = len(x_dims)
    strides, dilations, pads = op.geometry(rank)
    if rank == 1:
        return Window2d(channels, 1, x_dims[0], 1, out_dims[0], 1, kernel[0], 1, strides[0], 1, dilations[0],
                        0, pads[0], 0, pads[1])
    return Window2d(channels, *x_dims, *out_dims, *kernel, *strides, *dilations, *pads)

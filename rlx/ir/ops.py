"""The MIR op set: frozen dataclasses with shape and dtype inference.

Every op knows its arity and infers its output `Shape` from its input shapes;
inference raises `ShapeError` describing the problem, and `Graph` prefixes the
node it was building. Semantics of every op are written once, in
`rlx/reference.py`; the docstrings here say what the attributes mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar

import numpy as np

from rlx.errors import IRError, ShapeError
from rlx.ir.dtype import DType
from rlx.ir.quant import QUANT_FORMATS, QuantFormat, act_formats
from rlx.ir.shape import Dim, Shape, broadcast_dims, normalize_axis, product
from rlx.ir.transport import COLLECTIVE_REDUCES

ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "exp", "log", "sqrt",
               "rsqrt", "neg", "abs", "sin", "cos", "softplus", "mish", "hardswish")
#: "fmod" is C's fmod (floats only): the remainder of a / b truncated, with the sign of a.
BINARY_OPS = ("add", "sub", "mul", "div", "max", "min", "pow", "fmod")
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
MASK_KINDS = ("none", "causal", "padding", "bias")
ROPE_VARIANTS = ("neox", "interleaved")
#: How dequant_matmul takes its activations: exactly, or quantized to int8 / int16 per 32-block.
ACT_MODES = ("f32", "q8", "q16")

OPS: dict[str, type[Op]] = {}


def _fmt(shapes: Sequence[Shape]) -> str:
    return ", ".join(str(s) for s in shapes)


@dataclass(frozen=True)
class Op:
    """Base of every op. Subclasses set `kind` and `arity` (min, max inputs)."""

    kind: ClassVar[str] = ""
    arity: ClassVar[tuple[int, int]] = (0, 0)
    elementwise: ClassVar[bool] = False
    #: Where subclasses register by `kind`: MIR ops in OPS; HIR blocks use their own.
    registry: ClassVar[dict[str, type[Op]]] = OPS

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind and "kind" in cls.__dict__:
            if cls.kind in cls.registry and cls.registry[cls.kind] is not cls:
                raise TypeError(f"op kind {cls.kind!r} registered twice")
            cls.registry[cls.kind] = cls

    def infer(self, inputs: Sequence[Shape]) -> Shape:  # pragma: no cover - abstract
        raise NotImplementedError

    def check_arity(self, n: int) -> None:
        lo, hi = self.arity
        if not lo <= n <= hi:
            want = str(lo) if lo == hi else f"{lo}..{hi}"
            raise IRError(f"{self.kind} takes {want} inputs, got {n}")

    def attrs(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def describe(self) -> str:
        parts = []
        for k, v in self.attrs().items():
            if k == "data" or v is None:
                continue
            parts.append(f"{k}={_attr_text(v)}")
        return f"{self.kind}[{', '.join(parts)}]" if parts else self.kind


def _attr_text(v: object) -> str:
    if isinstance(v, tuple):
        return "(" + ",".join(_attr_text(x) for x in v) + ")"
    return str(v)


def _same_float_dtype(kind: str, shapes: Sequence[Shape]) -> DType:
    dtypes = {s.dtype for s in shapes}
    if len(dtypes) != 1:
        raise ShapeError(f"{kind} needs inputs of one dtype, got {_fmt(shapes)}")
    return shapes[0].dtype


def _gemm_dtype(kind: str, shapes: Sequence[Shape]) -> DType:
    """The result dtype of a GEMM: its inputs' one dtype, or f32 for an f32 left operand times
    f16/bf16 weights (a bias then f32 or the weights' dtype): B is read exactly, the product is f32."""
    a, b = shapes[0], shapes[1]
    if a.dtype is DType.F32 and b.dtype in (DType.F16, DType.BF16) and all(
            s.dtype in (DType.F32, b.dtype) for s in shapes[2:]):
        return DType.F32
    return _same_float_dtype(kind, shapes)


def _require_float(kind: str, shape: Shape) -> None:
    if not shape.dtype.is_float:
        raise ShapeError(f"{kind} needs a floating-point input, got {shape}")


def _check_eps(kind: str, eps: float) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ShapeError(f"{kind} eps must be a finite number >= 0, got {eps!r}")


# ── leaves ──────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Input(Op):
    """A graph input, fed by the caller at run time.

    A `state` input is a persistent buffer the caller owns and passes on every
    run (a KV cache): ops such as `CachedAttention` update it in place, so it
    must have a static shape and the runtime never copies it.
    """

    kind: ClassVar[str] = "input"
    name: str
    shape: Shape
    state: bool = False

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if self.state and not self.shape.is_static:
            raise ShapeError(f"state input {self.name!r} must have a static shape, got {self.shape}")
        return self.shape


@dataclass(frozen=True)
class Param(Op):
    """A weight, set once with `set_param` and resident between runs.

    `layout` (set by the layout pass) is a permutation applied to the user's
    array at `set_param` time; `shape` is then the stored (permuted) shape.
    `rounds_f32` (set by `store_params_in`): declared f32 by the user and stored
    narrower by the session's precision, so `set_param` rounds float32 arrays
    into it (the library's manifest says so: an artifact keeps the rule).
    """

    kind: ClassVar[str] = "param"
    name: str
    shape: Shape
    layout: tuple[int, ...] | None = None
    rounds_f32: bool = False

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if self.layout is not None and sorted(self.layout) != list(range(self.shape.rank)):
            raise ShapeError(f"param layout {self.layout} is not a permutation of rank {self.shape.rank}")
        if not self.shape.is_static:
            raise ShapeError(f"param {self.name!r} must have a static shape, got {self.shape}")
        return self.shape

    @property
    def user_shape(self) -> Shape:
        """The shape the user passes to `set_param` (before `layout`)."""
        if self.layout is None:
            return self.shape
        inverse = [0] * len(self.layout)
        for i, p in enumerate(self.layout):
            inverse[p] = i
        return self.shape.with_dims(self.shape.dims[i] for i in inverse)


@dataclass(frozen=True)
class Constant(Op):
    """A constant tensor baked into the program (row-major bytes of `shape`)."""

    kind: ClassVar[str] = "constant"
    data: bytes
    shape: Shape

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if not self.shape.is_static:
            raise ShapeError(f"constant must have a static shape, got {self.shape}")
        if len(self.data) != self.shape.max_nbytes:
            raise ShapeError(f"constant holds {len(self.data)} bytes but {self.shape} needs {self.shape.max_nbytes}")
        return self.shape

    @staticmethod
    def from_array(array: np.ndarray, dtype: DType | None = None) -> Constant:
        arr = np.asarray(array)
        dt = dtype or DType.parse(arr.dtype)
        # reshape: ascontiguousarray turns a 0-d scalar into shape (1,).
        stored = np.ascontiguousarray(arr, dtype=dt.np).reshape(arr.shape)
        return Constant(stored.tobytes(), Shape.of(stored.shape, dt))

    def array(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype=self.shape.dtype.np).reshape(self.shape.static_dims).copy()

    def describe(self) -> str:
        arr = self.array()
        if arr.size <= 4:
            return f"constant[{arr.tolist()}]"
        return f"constant[{arr.size} values]"


# ── elementwise ─────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Activation(Op):
    """Unary elementwise function `fn` (one of ACTIVATIONS)."""

    kind: ClassVar[str] = "activation"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    elementwise: ClassVar[bool] = True
    fn: str

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if self.fn not in ACTIVATIONS:
            raise ShapeError(f"unknown activation {self.fn!r}; expected one of {ACTIVATIONS}")
        if self.fn not in ("neg", "abs", "relu"):
            _require_float(f"activation {self.fn}", inputs[0])
        elif inputs[0].dtype is DType.BOOL:
            raise ShapeError(f"activation {self.fn} does not accept bool input")
        return inputs[0]


@dataclass(frozen=True)
class Binary(Op):
    """Binary elementwise `fn` (one of BINARY_OPS) with numpy broadcasting."""

    kind: ClassVar[str] = "binary"
    arity: ClassVar[tuple[int, int]] = (2, 2)
    elementwise: ClassVar[bool] = True
    fn: str

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if self.fn not in BINARY_OPS:
            raise ShapeError(f"unknown binary op {self.fn!r}; expected one of {BINARY_OPS}")
        dtype = _same_float_dtype(f"binary {self.fn}", inputs)
        if dtype is DType.BOOL:
            raise ShapeError(f"binary {self.fn} does not accept bool inputs")
        if self.fn == "fmod" and not dtype.is_float:
            raise ShapeError(f"binary fmod needs floating-point inputs, got {_fmt(inputs)}")
        return Shape(broadcast_dims(inputs[0].dims, inputs[1].dims), dtype)


@dataclass(frozen=True)
class Compare(Op):
    """Elementwise comparison `fn` (one of COMPARE_OPS), broadcasting, bool result."""

    kind: ClassVar[str] = "compare"
    arity: ClassVar[tuple[int, int]] = (2, 2)
    elementwise: ClassVar[bool] = True
    fn: str

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if self.fn not in COMPARE_OPS:
            raise ShapeError(f"unknown comparison {self.fn!r}; expected one of {COMPARE_OPS}")
        _same_float_dtype(f"compare {self.fn}", inputs)
        return Shape(broadcast_dims(inputs[0].dims, inputs[1].dims), DType.BOOL)


@dataclass(frozen=True)
class Where(Op):
    """`cond ? a : b`, broadcasting all three; `cond` is bool."""

    kind: ClassVar[str] = "where"
    arity: ClassVar[tuple[int, int]] = (3, 3)
    elementwise: ClassVar[bool] = True

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        cond, a, b = inputs
        if cond.dtype is not DType.BOOL:
            raise ShapeError(f"where needs a bool condition, got {cond}")
        dtype = _same_float_dtype("where", [a, b])
        return Shape(broadcast_dims(cond.dims, a.dims, b.dims), dtype)


@dataclass(frozen=True)
class Cast(Op):
    """Convert to `dtype` (float→int truncates toward zero; →bool is `!= 0`)."""

    kind: ClassVar[str] = "cast"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    elementwise: ClassVar[bool] = True
    dtype: DType

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        return inputs[0].with_dtype(DType.parse(self.dtype))


# ── linear algebra and normalization ────────────────────────────────────


def _matmul_dims(kind: str, a: Shape, b: Shape) -> tuple[Dim, ...]:
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"{kind} needs rank >= 2 operands, got {a} @ {b}")
    if a.dims[-1] != b.dims[-2]:
        raise ShapeError(f"{kind} inner dims differ: {a} @ {b} ({a.dims[-1]} vs {b.dims[-2]})")
    try:
        batch = broadcast_dims(a.dims[:-2], b.dims[:-2])
    except ShapeError as exc:
        raise ShapeError(f"{kind} batch dims do not broadcast: {a} @ {b}") from exc
    return (*batch, a.dims[-2], b.dims[-1])


@dataclass(frozen=True)
class MatMul(Op):
    """Batched matrix product `a[..., M, K] @ b[..., K, N]`, batch dims broadcast.

    Inputs of one float dtype, or `a` f32 with `b` f16/bf16 (weights stored narrow): then the
    result is f32, `b` read exactly (a backend may round `a` to `b`'s type for its dot products)."""

    kind: ClassVar[str] = "matmul"
    arity: ClassVar[tuple[int, int]] = (2, 2)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        a, b = inputs
        dtype = _gemm_dtype("matmul", inputs)
        _require_float("matmul", a)
        return Shape(_matmul_dims("matmul", a, b), dtype)


def _quant_format(kind: str, quant: str) -> QuantFormat:
    fmt = QUANT_FORMATS.get(quant) if isinstance(quant, str) else None
    if fmt is None:
        raise ShapeError(f"{kind}: unknown quantization {quant!r}; expected one of {sorted(QUANT_FORMATS)}")
    return fmt


def _quant_rows(kind: str, fmt: QuantFormat, w: Shape) -> int:
    """Values per row of raw blocks `w` (u8 `[..., row_bytes]`, static row width)."""
    if w.dtype is not DType.U8:
        raise ShapeError(f"{kind} weight must hold raw {fmt.name} blocks as u8, got {w}")
    last = w.dims[-1] if w.rank else None
    if last is None or not last.is_static or last.value % fmt.block_bytes:
        raise ShapeError(f"{kind}: rows of {fmt.name} blocks must be a static multiple of {fmt.block_bytes} "
                         f"bytes, got {w}")
    return last.value // fmt.block_bytes * fmt.block_size


@dataclass(frozen=True)
class DequantMatMul(Op):
    """`x @ dequant(w).T` with w a matrix stored in a GGUF block format (`rlx.ir.quant`).

    Inputs: x f32 `[..., K]`; w u8 `[N, row_bytes(quant, K)]`, the raw blocks of
    an `[N, K]` weight in GGUF's row-major layout (a param, typically). Output
    f32 `[..., N]`. `quant` names the block format ("q4_1", "q8_0", ...).

    `act` is how x enters the product: "f32" exactly; "q8" quantized first to
    int8 per block of 32 values, as llama.cpp does (`rlx.ir.quant.quantize_act`:
    scale max|x|/127, round half to even), so the block products are integer
    dot products; "q16" the same with int16 (scale max|x|/32767: errors 258x
    smaller than q8's, for about q8's speed on CPUs with VNNI). Both are defined
    for q8_0, q4_0 and q4_1 weights; "q8" for q4_k too (`rlx.ir.quant.act_formats`).
    """

    kind: ClassVar[str] = "dequant_matmul"
    arity: ClassVar[tuple[int, int]] = (2, 2)
    quant: str
    act: str = "f32"

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, w = inputs
        fmt = _quant_format("dequant_matmul", self.quant)
        if self.act not in ACT_MODES:
            raise ShapeError(f"dequant_matmul: unknown activation mode {self.act!r}; expected one of {ACT_MODES}")
        if fmt.name not in act_formats(self.act):
            raise ShapeError(f"dequant_matmul: act={self.act!r} takes {'/'.join(act_formats(self.act))} weights, "
                             f"not {fmt.name}")
        if x.dtype is not DType.F32 or x.rank < 1:
            raise ShapeError(f"dequant_matmul input must be f32 [..., K], got {x}")
        k = x.dims[-1]
        if not k.is_static or k.value % fmt.block_size:
            raise ShapeError(f"dequant_matmul: K={k} must be a static multiple of the {fmt.name} block size "
                             f"{fmt.block_size} (input {x})")
        if w.rank != 2 or not w.is_static:
            raise ShapeError(f"dequant_matmul weight must be a static u8 [N, row_bytes] matrix, got {w}")
        want = k.value // fmt.block_size * fmt.block_bytes
        if w.dtype is not DType.U8 or w.dims[1].value != want:
            raise ShapeError(f"dequant_matmul: {fmt.name} rows of K={k.value} values take {want} bytes, "
                             f"so the weight must be u8[N, {want}], got {w}")
        return x.with_dims((*x.dims[:-1], w.dims[0]))


@dataclass(frozen=True)
class Dequantize(Op):
    """Rows of GGUF blocks → f32: u8 `[..., row_bytes]` → f32 `[..., cols]` (e.g. gathered embedding rows)."""

    kind: ClassVar[str] = "dequantize"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    quant: str

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        fmt = _quant_format("dequantize", self.quant)
        if x.rank < 1:
            raise ShapeError(f"dequantize needs rows of blocks [..., row_bytes], got {x}")
        cols = _quant_rows("dequantize", fmt, x)
        return Shape((*x.dims[:-1], Dim(cols)), DType.F32)


@dataclass(frozen=True)
class Reduce(Op):
    """Reduce `fn` over `axes` (empty = all axes), keeping them as 1 if `keep_dim`."""

    kind: ClassVar[str] = "reduce"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    fn: str
    axes: tuple[int, ...]
    keep_dim: bool = False

    def normalized_axes(self, rank: int) -> tuple[int, ...]:
        if not self.axes:
            return tuple(range(rank))
        axes = tuple(sorted({normalize_axis(a, rank, "reduce axis") for a in self.axes}))
        if len(axes) != len(self.axes):
            raise ShapeError(f"reduce axes {self.axes} repeat an axis")
        return axes

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if self.fn not in REDUCE_OPS:
            raise ShapeError(f"unknown reduction {self.fn!r}; expected one of {REDUCE_OPS}")
        x = inputs[0]
        if x.dtype is DType.BOOL:
            raise ShapeError("reduce does not accept bool input")
        axes = self.normalized_axes(x.rank)
        dims = [Dim(1) if i in axes else d for i, d in enumerate(x.dims)] if self.keep_dim else \
            [d for i, d in enumerate(x.dims) if i not in axes]
        return x.with_dims(dims)


@dataclass(frozen=True)
class ArgMax(Op):
    """Index of the largest value along `axis`, as i32, that axis dropped: the first index on ties, and a NaN
    counts as larger than any number (numpy's `argmax`). A decoder's greedy next token reads back this, not
    its logits."""

    kind: ClassVar[str] = "argmax"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    axis: int = -1

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        _require_float("argmax", x)
        axis = normalize_axis(self.axis, x.rank, "argmax axis")
        if x.dims[axis].max == 0:
            raise ShapeError(f"argmax over an empty axis {axis} of {x}")
        return Shape(tuple(d for i, d in enumerate(x.dims) if i != axis), DType.I32)


@dataclass(frozen=True)
class Softmax(Op):
    """Numerically stable softmax along `axis`."""

    kind: ClassVar[str] = "softmax"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    axis: int = -1

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        _require_float("softmax", inputs[0])
        normalize_axis(self.axis, inputs[0].rank, "softmax axis")
        return inputs[0]


def _check_norm_params(kind: str, x: Shape, params: Sequence[Shape]) -> None:
    _require_float(kind, x)
    if x.rank < 1:
        raise ShapeError(f"{kind} needs rank >= 1 input, got {x}")
    for p in params:
        if p.dims != (x.dims[-1],) or p.dtype != x.dtype:
            raise ShapeError(f"{kind} parameter must be {x.dtype}[{x.dims[-1]}], got {p} for input {x}")


@dataclass(frozen=True)
class LayerNorm(Op):
    """`(x - mean) / sqrt(var + eps) * gamma + beta` over the last axis. Inputs x, gamma, beta."""

    kind: ClassVar[str] = "layer_norm"
    arity: ClassVar[tuple[int, int]] = (3, 3)
    eps: float = 1e-5

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        _check_eps("layer_norm", self.eps)
        _check_norm_params("layer_norm", inputs[0], inputs[1:])
        return inputs[0]


@dataclass(frozen=True)
class RmsNorm(Op):
    """`x / sqrt(mean(x^2) + eps) * gamma` over the last axis. Inputs x, gamma."""

    kind: ClassVar[str] = "rms_norm"
    arity: ClassVar[tuple[int, int]] = (2, 2)
    eps: float = 1e-6

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        _check_eps("rms_norm", self.eps)
        _check_norm_params("rms_norm", inputs[0], inputs[1:])
        return inputs[0]


# ── shape ops ───────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Reshape(Op):
    """Reshape to `shape` (ints, Dims, at most one -1), element count preserved."""

    kind: ClassVar[str] = "reshape"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    shape: tuple[Dim | int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple):
            raise IRError(f"reshape shape must be a tuple, got {self.shape!r}")
        norm = tuple(d if isinstance(d, int) and not isinstance(d, bool) and d == -1 else Dim.of(d) for d in self.shape)
        object.__setattr__(self, "shape", norm)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        wildcard = [i for i, d in enumerate(self.shape) if isinstance(d, int) and d == -1]
        if len(wildcard) > 1:
            raise ShapeError(f"reshape of {x} to {list(map(str, self.shape))}: at most one -1 allowed")
        known = [Dim.of(d) for d in self.shape if not (isinstance(d, int) and d == -1)]
        total = x.numel
        if wildcard:
            rest = total.divide(product(known))
            if rest is None:
                raise ShapeError(f"cannot reshape {x} to [{','.join(map(str, self.shape))}]: {total} elements "
                                 f"not divisible by {product(known)}")
            dims = list(known)
            dims.insert(wildcard[0], rest)
        else:
            dims = known
            if product(dims) != total:
                raise ShapeError(f"cannot reshape {x} ({total} elements) to "
                                 f"[{','.join(map(str, dims))}] ({product(dims)} elements)")
        return x.with_dims(dims)


@dataclass(frozen=True)
class Transpose(Op):
    """Permute axes: output axis i is input axis `perm[i]`."""

    kind: ClassVar[str] = "transpose"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    perm: tuple[int, ...]

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        if sorted(self.perm) != list(range(x.rank)):
            raise ShapeError(f"transpose perm {list(self.perm)} is not a permutation of rank {x.rank} ({x})")
        return x.with_dims(x.dims[p] for p in self.perm)


@dataclass(frozen=True)
class Narrow(Op):
    """Slice `length` elements starting at `start` along static axis `axis`."""

    kind: ClassVar[str] = "narrow"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    axis: int
    start: int
    length: int

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        axis = normalize_axis(self.axis, x.rank, "narrow axis")
        dim = x.dims[axis]
        if not dim.is_static:
            raise ShapeError(f"narrow along dynamic axis {axis} of {x} is not supported")
        if self.start < 0 or self.length < 0 or self.start + self.length > dim.value:
            end = self.start + self.length
            raise ShapeError(f"narrow [{self.start}, {end}) is out of range for axis {axis} of {x}")
        dims = list(x.dims)
        dims[axis] = Dim(self.length)
        return x.with_dims(dims)


@dataclass(frozen=True)
class Concat(Op):
    """Concatenate inputs along `axis` (static along that axis)."""

    kind: ClassVar[str] = "concat"
    arity: ClassVar[tuple[int, int]] = (1, 1024)
    axis: int

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        first = inputs[0]
        axis = normalize_axis(self.axis, first.rank, "concat axis")
        total = 0
        for s in inputs:
            if s.rank != first.rank or s.dtype != first.dtype:
                raise ShapeError(f"concat inputs differ in rank or dtype: {_fmt(inputs)}")
            for i, (a, b) in enumerate(zip(s.dims, first.dims)):
                if i != axis and a != b:
                    raise ShapeError(f"concat inputs differ on axis {i}: {_fmt(inputs)}")
            if not s.dims[axis].is_static:
                raise ShapeError(f"concat along dynamic axis {axis} is not supported: {_fmt(inputs)}")
            total += s.dims[axis].value
        dims = list(first.dims)
        dims[axis] = Dim(total)
        return first.with_dims(dims)


@dataclass(frozen=True)
class Expand(Op):
    """Broadcast to `shape` (numpy `broadcast_to` rules)."""

    kind: ClassVar[str] = "expand"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple):
            raise IRError(f"expand shape must be a tuple, got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(Dim.of(d) for d in self.shape))

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        target = tuple(Dim.of(d) for d in self.shape)
        if len(target) < x.rank:
            raise ShapeError(f"cannot expand {x} to fewer dims {[str(d) for d in target]}")
        for xd, td in zip(reversed(x.dims), reversed(target)):
            if xd != td and xd != 1:
                raise ShapeError(f"cannot expand {x} to [{','.join(map(str, target))}]")
        return x.with_dims(target)


@dataclass(frozen=True)
class Gather(Op):
    """`table.take(indices, axis)`: indices are i32/i64; out-of-range index is a run-time error."""

    kind: ClassVar[str] = "gather"
    arity: ClassVar[tuple[int, int]] = (2, 2)
    axis: int = 0

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        table, idx = inputs
        if idx.dtype not in (DType.I32, DType.I64):
            raise ShapeError(f"gather indices must be i32 or i64, got {idx}")
        axis = normalize_axis(self.axis, table.rank, "gather axis")
        return table.with_dims(table.dims[:axis] + idx.dims + table.dims[axis + 1:])


# ── transformer blocks ──────────────────────────────────────────────────


class _AttentionHeads:
    """Head counts and softmax scale of `Attention` and `CachedAttention`: one set of checks for both.

    The subclass declares `num_heads`, `head_dim`, `num_kv_heads` and `scale` as dataclass fields."""

    num_heads: int
    head_dim: int
    num_kv_heads: int | None
    scale: float | None

    @property
    def kv_heads(self) -> int:
        # `is None`, not `or`: num_kv_heads=0 must be rejected, not read as "same as num_heads".
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    def _check_heads(self, kind: str) -> None:
        """Positive head counts, query heads a multiple of the KV heads, a finite scale (if given)."""
        if self.num_heads < 1 or self.head_dim < 1 or self.kv_heads < 1 or self.num_heads % self.kv_heads:
            raise ShapeError(f"{kind} heads invalid: num_heads={self.num_heads}, kv_heads={self.kv_heads}, "
                             f"head_dim={self.head_dim}")
        if self.scale is not None and (isinstance(self.scale, bool) or not isinstance(self.scale, (int, float))
                                       or not math.isfinite(self.scale)):
            raise ShapeError(f"{kind} scale must be a finite number, got {self.scale!r}")

    def _check_rows(self, kind: str, name: str, s: Shape, heads: int) -> None:
        """`s` is `[batch, seq, heads*head_dim]`."""
        if s.rank != 3 or s.dims[2] != heads * self.head_dim:
            raise ShapeError(f"{kind} {name} must be [batch, seq, {heads}*{self.head_dim}], got {s}")


@dataclass(frozen=True)
class Attention(_AttentionHeads, Op):
    """Multi-head scaled dot-product attention.

    Inputs: q `[B, Sq, H*D]`, k and v `[B, Skv, Hkv*D]`, and for mask
    "padding" a `[B, Skv]` tensor (nonzero = attend), for "bias" an additive
    tensor broadcastable to `[B, H, Sq, Skv]`. "causal" lets query i see keys
    `j <= i + Skv - Sq` (so decode with Sq=1 sees the whole cache). `scale`
    defaults to `1/sqrt(D)`. `num_kv_heads` < `num_heads` is grouped-query.
    Output `[B, Sq, H*D]`.
    """

    kind: ClassVar[str] = "attention"
    arity: ClassVar[tuple[int, int]] = (3, 4)
    num_heads: int
    head_dim: int
    mask: str = "none"
    scale: float | None = None
    num_kv_heads: int | None = None

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if self.mask not in MASK_KINDS:
            raise ShapeError(f"unknown attention mask {self.mask!r}; expected one of {MASK_KINDS}")
        needs_mask = self.mask in ("padding", "bias")
        if len(inputs) != (4 if needs_mask else 3):
            want = 4 if needs_mask else 3
            raise ShapeError(f"attention with mask={self.mask!r} takes {want} inputs, got {len(inputs)}")
        self._check_heads("attention")
        q, k, v = inputs[:3]
        _same_float_dtype("attention", [q, k, v])
        for name, s, heads in (("q", q, self.num_heads), ("k", k, self.kv_heads), ("v", v, self.kv_heads)):
            self._check_rows("attention", name, s, heads)
        if k.dims[:2] != v.dims[:2] or q.dims[0] != k.dims[0]:
            raise ShapeError(f"attention q/k/v batch or kv length disagree: q={q}, k={k}, v={v}")
        if self.mask == "padding":
            m = inputs[3]
            if m.dims != (q.dims[0], k.dims[1]):
                raise ShapeError(f"attention padding mask must be [{q.dims[0]},{k.dims[1]}], got {m}")
        if self.mask == "bias":
            m = inputs[3]
            if m.rank > 4:
                raise ShapeError(f"attention bias must broadcast to [B,H,Sq,Skv], got {m}")
            target = (q.dims[0], Dim(self.num_heads), q.dims[1], k.dims[1])
            if broadcast_dims(m.dims, target) != target:
                raise ShapeError(f"attention bias {m} does not broadcast to [{','.join(map(str, target))}]")
            if m.dtype != q.dtype:
                raise ShapeError(f"attention bias dtype {m.dtype} differs from q {q.dtype}")
        return q


@dataclass(frozen=True)
class Rope(Op):
    """Rotary position embedding on the first `n_rot` dims of every head.

    Inputs: x `[B, S, H*head_dim]`, cos and sin `[S, n_rot/2]` (one table for
    every batch row) or `[B, S, n_rot/2]` (per row: sequences at different
    positions, as in batched decoding). "neox" pairs dim i with i + n_rot/2;
    "interleaved" pairs 2i with 2i+1.
    """

    kind: ClassVar[str] = "rope"
    arity: ClassVar[tuple[int, int]] = (3, 3)
    head_dim: int
    n_rot: int | None = None
    variant: str = "neox"

    @property
    def rot(self) -> int:
        return self.head_dim if self.n_rot is None else self.n_rot

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, cos, sin = inputs
        if self.variant not in ROPE_VARIANTS:
            raise ShapeError(f"unknown rope variant {self.variant!r}; expected one of {ROPE_VARIANTS}")
        if self.rot % 2 or not 0 < self.rot <= self.head_dim:
            raise ShapeError(f"rope n_rot={self.rot} must be even and within head_dim={self.head_dim}")
        _require_float("rope", x)
        if x.rank != 3 or not x.dims[2].is_static or x.dims[2].value % self.head_dim:
            raise ShapeError(f"rope input must be [batch, seq, heads*{self.head_dim}], got {x}")
        for name, t in (("cos", cos), ("sin", sin)):
            if t.dims not in ((x.dims[1], Dim(self.rot // 2)), (x.dims[0], x.dims[1], Dim(self.rot // 2))) \
                    or t.dtype != x.dtype:
                raise ShapeError(f"rope {name} must be {x.dtype}[{x.dims[1]},{self.rot // 2}] or "
                                 f"{x.dtype}[{x.dims[0]},{x.dims[1]},{self.rot // 2}], got {t}")
        if cos.dims != sin.dims:
            raise ShapeError(f"rope cos {cos} and sin {sin} differ (one per-row, one shared)")
        return x


#: Dtypes a `CachedAttention`'s caches may have beside another compute dtype.
CACHE_DTYPES = (DType.F32, DType.F16, DType.BF16, DType.F8E4M3FN)


@dataclass(frozen=True)
class CachedAttention(_AttentionHeads, Op):
    """Causal grouped-query attention over a KV cache, appending to it.

    Inputs: q `[B, S, H*D]`; this step's k and v `[B, S, Hkv*D]`; the caches
    k_cache and v_cache, state inputs `[Bmax, T, Hkv*D]` (B <= Bmax, T the
    context capacity); positions, i32 `[B]`: how many tokens each row already
    holds. Row b's new keys and values are written to cache rows
    `[pos_b, pos_b + S)` (in place: the caches are updated by the run), then
    query s of row b attends to keys `0 .. pos_b + s` — with a `window` W, only
    to the last W of them (keys j with `pos_b + s - j < W`: sliding-window
    attention). Rows of a batch may sit at different positions; `pos_b + S > T`
    is a run-time error. Output `[B, S, H*D]`. The caches may have another float
    dtype than q, k, v (an f16 cache beside f32 compute: values are rounded to it
    when stored, and attention reads them back as stored); an f8e4m3fn cache rounds
    to 8 bits, saturating at +-448 (CUDA's satfinite conversion).

    Paged layout (`page_size` P set): the caches are a pool of pages `[num_pages, P, Hkv*D]`
    shared by all rows, and a seventh input, the block table, i32 `[B, max_pages]`, names each
    row's pages in order: token t of row b lives in page `block_table[b, t // P]` at row `t % P`.
    The capacity is then `max_pages * P` tokens per row; rows may share pages (a common prefix)
    and several rows may name the same table (one sequence's prefill chunk as one-token rows: every
    row's new keys are written before any row attends). Keys are read in the same order as in the
    contiguous layout, so the results are the same bit for bit.
    An eighth input, paged only, is a hint read for its shape alone: i32 `[n]`, n 1 or 2 (a dynamic dim of
    bound 2). n = 2 promises that no two rows of the step are tokens of one sequence at different positions
    (no row reads a cache row another row of the step writes; repeated identical rows are allowed), so a
    backend may store each row's keys while that row attends (CUDA: no append launch before the attention).
    The values are the same either way.
    """

    kind: ClassVar[str] = "cached_attention"
    arity: ClassVar[tuple[int, int]] = (6, 8)
    num_heads: int
    head_dim: int
    num_kv_heads: int | None = None
    scale: float | None = None
    window: int | None = None
    page_size: int | None = None

    @property
    def paged(self) -> bool:
        return self.page_size is not None

    def capacity(self, cache: Shape, block_table: Shape | None = None) -> int:
        """Tokens per row: the cache's second dim, or max_pages x page_size when paged."""
        if self.page_size is None:
            return cache.dims[1].value
        if block_table is None:
            raise ShapeError("a paged cached_attention's capacity needs its block table")
        return block_table.dims[1].value * self.page_size

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        self._check_heads("cached_attention")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 1):
            raise ShapeError(f"cached_attention window must be None or a positive int, got {self.window!r}")
        if self.page_size is not None and (isinstance(self.page_size, bool) or not isinstance(self.page_size, int)
                                           or self.page_size < 1):
            raise ShapeError(f"cached_attention page_size must be None or a positive int, got {self.page_size!r}")
        if len(inputs) not in ((7, 8) if self.paged else (6,)):
            raise ShapeError("cached_attention takes a block table (a 7th input, and optionally the distinct-rows "
                             f"hint) exactly when page_size is set, got {len(inputs)} inputs with "
                             f"page_size={self.page_size}")
        if len(inputs) == 8 and (inputs[7].dtype is not DType.I32 or inputs[7].rank != 1
                                 or inputs[7].dims[0].max > 2):
            raise ShapeError(f"cached_attention's distinct-rows hint must be i32[n] with n <= 2, got {inputs[7]}")
        q, k, v, kc, vc, pos = inputs[:6]
        _same_float_dtype("cached_attention", [q, k, v])
        check_narrow("cached_attention q/k/v", [q, k, v], q)
        # the caches may be narrower than the compute (an f16/bf16/f8e4m3fn KV cache beside f32 queries)
        if kc.dtype != vc.dtype or (kc.dtype != q.dtype and kc.dtype not in CACHE_DTYPES):
            raise ShapeError(f"cached_attention caches must share one dtype, q's or f32/f16/bf16/f8e4m3fn, got "
                             f"q={q}, k_cache={kc}, v_cache={vc}")
        kw = self.kv_heads * self.head_dim
        self._check_rows("cached_attention", "q", q, self.num_heads)
        for name, s in (("k", k), ("v", v)):
            if s.dims != (q.dims[0], q.dims[1], Dim(kw)):
                raise ShapeError(f"cached_attention {name} must be [{q.dims[0]},{q.dims[1]},{kw}], got {s}")
        if self.paged:
            table = inputs[6]
            if kc.dims != vc.dims or kc.rank != 3 or not kc.is_static or kc.dims[1:] != (Dim(self.page_size), Dim(kw)):
                raise ShapeError(f"paged cached_attention caches must be static [num_pages, {self.page_size}, {kw}] "
                                 f"and alike, got k_cache={kc}, v_cache={vc}")
            if table.dtype is not DType.I32 or table.rank != 2 or table.dims[0] != q.dims[0] \
                    or not table.dims[1].is_static:
                raise ShapeError(f"cached_attention block table must be i32[{q.dims[0]}, max_pages], got {table}")
            if q.dims[1].max > self.capacity(kc, table):
                raise ShapeError(f"cached_attention seq bound {q.dims[1]} exceeds the {self.capacity(kc, table)} "
                                 "tokens a block table holds")
        elif kc.dims != vc.dims or kc.rank != 3 or not kc.is_static or kc.dims[2] != kw:
            raise ShapeError(f"cached_attention caches must be static [max_batch, capacity, {kw}] and alike, "
                             f"got k_cache={kc}, v_cache={vc}")
        elif q.dims[0].max > kc.dims[0].value or q.dims[1].max > kc.dims[1].value:
            raise ShapeError(f"cached_attention batch/seq bounds {q.dims[0]},{q.dims[1]} exceed the cache "
                             f"{kc.dims[0]}x{kc.dims[1]}")
        if pos.dtype is not DType.I32 or pos.dims != (q.dims[0],):
            raise ShapeError(f"cached_attention positions must be i32[{q.dims[0]}], got {pos}")
        return q


# ── fused ops (produced by the optimizer, implemented by every backend) ──


@dataclass(frozen=True)
class FusedMatMulBiasAct(Op):
    """`act(a @ b + bias)`; inputs a, b and an optional bias `[N]`; `activation` may be None.

    Dtypes as for `MatMul` (an f32 `a` may take f16/bf16 `b`; the bias is then f32 or b's dtype)."""

    kind: ClassVar[str] = "fused_matmul_bias_act"
    arity: ClassVar[tuple[int, int]] = (2, 3)
    activation: str | None = None

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        a, b = inputs[:2]
        dtype = _gemm_dtype("fused_matmul_bias_act", inputs)
        _require_float("fused_matmul_bias_act", a)
        dims = _matmul_dims("fused_matmul_bias_act", a, b)
        if len(inputs) == 3 and inputs[2].dims != (dims[-1],):
            raise ShapeError(f"fused_matmul_bias_act bias must be [{dims[-1]}], got {inputs[2]}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ShapeError(f"unknown activation {self.activation!r}")
        return Shape(dims, dtype)


@dataclass(frozen=True)
class FusedResidualLayerNorm(Op):
    """`layer_norm(x + residual [+ bias], gamma, beta)`. Inputs x, residual, [bias], gamma, beta."""

    kind: ClassVar[str] = "fused_residual_layer_norm"
    arity: ClassVar[tuple[int, int]] = (4, 5)
    eps: float = 1e-5

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, res = inputs[:2]
        _check_eps("fused_residual_layer_norm", self.eps)
        if x != res:
            raise ShapeError(f"residual must match input exactly: {x} vs {res}")
        _check_norm_params("fused_residual_layer_norm", x, inputs[2:])
        return x


@dataclass(frozen=True)
class FusedResidualRmsNorm(Op):
    """`rms_norm(x + residual [+ bias], gamma)`. Inputs x, residual, [bias], gamma."""

    kind: ClassVar[str] = "fused_residual_rms_norm"
    arity: ClassVar[tuple[int, int]] = (3, 4)
    eps: float = 1e-6

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, res = inputs[:2]
        _check_eps("fused_residual_rms_norm", self.eps)
        if x != res:
            raise ShapeError(f"residual must match input exactly: {x} vs {res}")
        _check_norm_params("fused_residual_rms_norm", x, inputs[2:])
        return x


@dataclass(frozen=True)
class FusedSwiGLU(Op):
    """`silu(x @ w_gate) * (x @ w_up)`. Inputs x, w_gate, w_up."""

    kind: ClassVar[str] = "fused_swiglu"
    arity: ClassVar[tuple[int, int]] = (3, 3)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, wg, wu = inputs
        _same_float_dtype("fused_swiglu", inputs)
        _require_float("fused_swiglu", x)
        if wg != wu:
            raise ShapeError(f"fused_swiglu gate and up weights differ: {wg} vs {wu}")
        return Shape(_matmul_dims("fused_swiglu", x, wg), x.dtype)


@dataclass(frozen=True)
class RegionStep:
    """One instruction of an ElementwiseRegion: `op` applied to `args`.

    `args` index the region's value list: region inputs first (0..n_in-1),
    then the results of earlier steps in order.
    """

    op: Op
    args: tuple[int, ...]


@dataclass(frozen=True)
class ElementwiseRegion(Op):
    """A tree of elementwise ops evaluated in one loop nest; the last step is the result."""

    kind: ClassVar[str] = "elementwise_region"
    arity: ClassVar[tuple[int, int]] = (1, 64)
    steps: tuple[RegionStep, ...] = field(default_factory=tuple)

    def step_shapes(self, inputs: Sequence[Shape]) -> list[Shape]:
        values = list(inputs)
        for i, step in enumerate(self.steps):
            if not step.op.elementwise:
                raise ShapeError(f"region step {i} is {step.op.kind}, which is not elementwise")
            for a in step.args:
                if not 0 <= a < len(values):
                    raise ShapeError(f"region step {i} reads value {a}, which is not defined yet")
            step.op.check_arity(len(step.args))
            args = [values[a] for a in step.args]
            values.append(step.op.infer(args))
            check_narrow(step.op.kind, args, values[-1])
        return values

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if not self.steps:
            raise ShapeError("elementwise_region has no steps")
        return self.step_shapes(inputs)[-1]

    def describe(self) -> str:
        # Values are numbered as the steps index them: inputs first, then step results.
        n_in = 1 + max((a - i for i, s in enumerate(self.steps) for a in s.args), default=-1)
        return "elementwise_region[" + "; ".join(
            f"v{n_in + i}={s.op.describe()}({','.join(f'v{a}' for a in s.args)})" for i, s in enumerate(self.steps)
        ) + "]"


# ── collectives (across ranks; rlx/ir/transport.py runs them on CPU threads) ──

COLLECTIVE_DTYPES = (DType.F32, DType.F16, DType.BF16)


def _check_collective(kind: str, x: Shape, world: int, reduce: str | None) -> None:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ShapeError(f"{kind} world must be a positive int, got {world!r}")
    if reduce is not None and reduce not in COLLECTIVE_REDUCES:
        raise ShapeError(f"{kind} reduce must be one of {COLLECTIVE_REDUCES}, got {reduce!r}")
    if x.dtype not in COLLECTIVE_DTYPES:
        raise ShapeError(f"{kind} supports {', '.join(d.value for d in COLLECTIVE_DTYPES)}, got {x}")


@dataclass(frozen=True)
class AllReduce(Op):
    """Every rank gets the elementwise `reduce` (sum/max) of all `world` ranks' inputs (same shape)."""

    kind: ClassVar[str] = "all_reduce"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    world: int
    reduce: str = "sum"

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        _check_collective(self.kind, inputs[0], self.world, self.reduce)
        return inputs[0]


@dataclass(frozen=True)
class AllGather(Op):
    """Every rank gets all ranks' inputs concatenated along `axis` (static there), in rank order."""

    kind: ClassVar[str] = "all_gather"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    world: int
    axis: int = 0

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        _check_collective(self.kind, x, self.world, None)
        axis = normalize_axis(self.axis, x.rank, "all_gather axis")
        if not x.dims[axis].is_static:
            raise ShapeError(f"all_gather along dynamic axis {axis} is not supported: {x}")
        dims = list(x.dims)
        dims[axis] = Dim(x.dims[axis].value * self.world)
        return x.with_dims(dims)


@dataclass(frozen=True)
class ReduceScatter(Op):
    """Rank r gets block r (of `world` equal blocks along `axis`) of the all-reduced input."""

    kind: ClassVar[str] = "reduce_scatter"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    world: int
    reduce: str = "sum"
    axis: int = 0

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x = inputs[0]
        _check_collective(self.kind, x, self.world, self.reduce)
        axis = normalize_axis(self.axis, x.rank, "reduce_scatter axis")
        n = x.dims[axis]
        if not n.is_static or n.value % self.world:
            raise ShapeError(f"reduce_scatter axis {axis} must be static and divisible by world {self.world}: {x}")
        dims = list(x.dims)
        dims[axis] = Dim(n.value // self.world)
        return x.with_dims(dims)


LEAF_KINDS = frozenset({"input", "param", "constant"})
#: GEMMs whose right operand (input 1, the weights) may be f16/bf16 under an f32 left operand.
NARROW_WEIGHT_KINDS = frozenset({"matmul", "fused_matmul_bias_act"})
#: Ops whose output may share storage with their first input (no data movement).
VIEW_KINDS = frozenset({"reshape"})
#: Ops that take values of a storage-only dtype (`DType.is_narrow`: float8, int4 …): they convert (cast) or
#: move them, never compute on them. A fused region takes them only in its cast steps; a cached attention only as
#: its caches (CACHE_DTYPES: values rounded when stored, converted when read).
NARROW_KINDS = frozenset({"cast", "where", "reshape", "transpose", "narrow", "concat", "expand", "gather", "input",
                          "param", "constant", "elementwise_region", "cached_attention"})


def check_narrow(kind: str, inputs: Sequence[Shape], out: Shape) -> None:
    """Refuse an op of `kind` reading or making a storage-only dtype unless it is one of `NARROW_KINDS`.

    >>> check_narrow("binary", [Shape.of([2], "f8e4m3fn")] * 2, Shape.of([2], "f8e4m3fn"))
    Traceback (most recent call last):
    ...
    rlx.errors.ShapeError: binary does not take f8e4m3fn: a storage format is only cast to and from, and moved
    """
    if kind in NARROW_KINDS:
        return
    for s in (*inputs, out):
        if s.dtype.is_narrow:
            raise ShapeError(f"{kind} does not take {s.dtype}: a storage format is only cast to and from, and moved")

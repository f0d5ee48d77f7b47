"""The oracle: a numpy interpreter of every MIR op, fused ops included.

`run(graph, inputs, params)` evaluates a graph and returns its outputs. This
file is where the meaning of each op is written down; every backend is tested
against it. Floating-point values are computed in float64 and rounded to the
node's dtype after every op (so f16/bf16 graphs see the rounding a backend
does at op boundaries); integers keep their type; bool is numpy bool.

Conventions at the boundary: arrays use `DType.np`, except bf16, which is
exchanged as numpy bfloat16 (`ml_dtypes`); bf16 inputs may also be float32
holding bf16-representable values.

>>> import numpy as np
>>> from rlx.ir.graph import Graph
>>> g = Graph("demo")
>>> x = g.input("x", [2])
>>> g.set_outputs([g.activation("relu", x)])
>>> run(g, {"x": np.array([-1.0, 2.0], np.float32)})[0].tolist()
[0.0, 2.0]
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import ml_dtypes
import numpy as np

from rlx.errors import ExecutionError
from rlx.ir import ops as O
from rlx.ir import ops_control as C
from rlx.ir import ops_conv as CV
from rlx.ir import ops_feedback as FB
from rlx.ir import ops_int8 as Q8
from rlx.ir import ops_lora as LR
from rlx.ir import ops_moe as MOE
from rlx.ir import ops_range as RG
from rlx.ir import ops_sample as SP
from rlx.ir import ops_scan as L
from rlx.ir import ops_ssm as S
from rlx.ir import ops_user as U
from rlx.ir import transport
from rlx.ir.dtype import BFLOAT16, DType, bf16_to_f32, f32_to_bf16, round_to_dtype
from rlx.ir.graph import Graph, Node
from rlx.ir.quant import dequantize as dequantize_blocks
from rlx.ir.quant import q8_act_terms
from rlx.ir.shape import Shape, normalize_axis
from rlx.ir.view import movement_view

_erfc = np.frompyfunc(math.erfc, 1, 1)


def _gelu(x: np.ndarray) -> np.ndarray:
    # 0.5 * x * (1 + erf(x/√2)) written with erfc so the negative tail does not cancel.
    return 0.5 * x * _erfc(-x / math.sqrt(2.0)).astype(np.float64)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    # 0.5 * (1 + tanh(u)) == sigmoid(2u), which keeps precision where tanh(u) is near -1.
    u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
    return x * _sigmoid(2.0 * u)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


ACTIVATION_FNS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "silu": lambda x: x * _sigmoid(x),
    "relu": lambda x: np.maximum(x, 0),  # NaN propagates
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "neg": np.negative,
    "abs": np.abs,
    "sin": np.sin,
    "cos": np.cos,
    # log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|).
    "softplus": lambda x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
    "mish": lambda x: x * np.tanh(np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))),
    # x relu6(x + 3) / 6 (MobileNetV3), as torch's hardswish: NaN propagates through x
    "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
}


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.any(b == 0):
        raise ExecutionError("integer division by zero")
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) ^ (b < 0), -q, q)


def _binary(fn: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    is_int = a.dtype.kind in "iu"
    if fn == "add":
        return a + b
    if fn == "sub":
        return a - b
    if fn == "mul":
        return a * b
    if fn == "div":
        return _int_div(a, b) if is_int else a / b
    if fn == "max":
        return np.maximum(a, b)  # NaN propagates
    if fn == "min":
        return np.minimum(a, b)
    if fn == "pow":
        if is_int and np.any(b < 0):
            raise ExecutionError("integer pow with a negative exponent")
        return np.power(a, b)
    if fn == "fmod":  # C's fmod: the sign of a (fmod(x, 0) and fmod(inf, y) are NaN)
        with np.errstate(invalid="ignore"):
            return np.fmod(a, b)
    raise ExecutionError(f"unknown binary op {fn!r}")


_COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
            "gt": np.greater, "ge": np.greater_equal}


def _compute_type(dtype: DType) -> np.dtype:
    return np.dtype(np.float64) if dtype.is_float else dtype.np


def _finish(value: np.ndarray, dtype: DType) -> np.ndarray:
    """Round a computed value to the precision of `dtype`, in the compute type."""
    if dtype.is_float:
        v = np.asarray(value, dtype=np.float64)
        if dtype in (DType.F32, DType.F16, DType.BF16):
            v = round_to_dtype(v.astype(np.float32), dtype).astype(np.float64)
        return v
    return np.asarray(value).astype(dtype.np)


def _to_narrow(x: np.ndarray, dtype: DType) -> np.ndarray:
    """ONNX's cast to a storage format: a float format rounds to nearest even and saturates (inf and finite
    values beyond the largest become the largest, NaN stays NaN: ONNX's ``saturate=1``; float4 e2m1 has no
    NaN: it writes one as ONNX's reference does, +NaN as -0 and -NaN as +0); an integer format
    truncates a float toward zero and keeps the low bits (two's complement), as a fixed-point narrowing does."""
    if dtype in _NARROW_INT_BITS:
        bits, signed = _NARROW_INT_BITS[dtype]
        with np.errstate(invalid="ignore"):
            v = np.trunc(x).astype(np.int64) if x.dtype.kind == "f" else x.astype(np.int64)
        v = v & ((1 << bits) - 1)
        if signed:
            v = np.where(v >= 1 << (bits - 1), v - (1 << bits), v)
        return v.astype(dtype.np)
    top = float(ml_dtypes.finfo(dtype.np).max)
    v = x.astype(np.float64)
    return np.where(np.isnan(v), v, np.clip(v, -top, top)).astype(dtype.np)


#: numpy's types of the storage formats (ml_dtypes': float8_e5m2 says kind "f", the others "V").
_NARROW_NUMPY = frozenset(d.np for d in DType if d.is_narrow)
#: The integer storage formats: (bits, signed).
_NARROW_INT_BITS = {DType.I4: (4, True), DType.U4: (4, False), DType.I2: (2, True), DType.U2: (2, False)}


def cast_value(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Cast semantics shared by every backend: truncation toward zero, `!= 0` for bool; a storage format
    (`DType.is_narrow`) is read exactly and written as `_to_narrow` says."""
    if x.dtype in _NARROW_NUMPY:  # a storage format's values are exact in float64
        x = x.astype(np.float64)
    if dtype.is_narrow:
        return _to_narrow(x, dtype)
    if dtype is DType.BOOL:
        return x != 0
    if dtype.is_float:
        return _finish(x.astype(np.float64), dtype)
    if x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return np.trunc(x).astype(dtype.np)
    return x.astype(dtype.np)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * gamma


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, op: O.Attention) -> np.ndarray:
    """Reference attention on `[B, S, H*D]` tensors (see `ops.Attention`)."""
    b, sq, _ = q.shape
    skv = k.shape[1]
    h, hkv, d = op.num_heads, op.kv_heads, op.head_dim
    qh = q.reshape(b, sq, h, d).transpose(0, 2, 1, 3)
    kh = k.reshape(b, skv, hkv, d).transpose(0, 2, 1, 3)
    vh = v.reshape(b, skv, hkv, d).transpose(0, 2, 1, 3)
    if hkv != h:
        kh = np.repeat(kh, h // hkv, axis=1)
        vh = np.repeat(vh, h // hkv, axis=1)
    scores = (qh @ kh.transpose(0, 1, 3, 2)) * op.softmax_scale
    if op.mask == "causal":
        i = np.arange(sq)[:, None]
        j = np.arange(skv)[None, :]
        scores = np.where(j <= i + (skv - sq), scores, -np.inf)
    elif op.mask == "padding":
        keep = (np.asarray(mask) != 0)[:, None, None, :]
        scores = np.where(keep, scores, -np.inf)
    elif op.mask == "bias":
        scores = scores + mask
    m = np.max(scores, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # a fully masked row yields zeros, not NaN
    e = np.exp(scores - m)
    s = np.sum(e, axis=-1, keepdims=True)
    probs = np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)
    out = probs @ vh
    return out.transpose(0, 2, 1, 3).reshape(b, sq, h * d)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, op: O.Rope) -> np.ndarray:
    """Reference rotary embedding on `[B, S, H*head_dim]` (see `ops.Rope`)."""
    b, s, hd_total = x.shape
    hd, rot = op.head_dim, op.rot
    xh = x.reshape(b, s, hd_total // hd, hd).copy()
    # [S, half] tables serve every row; [B, S, half] ones are per row
    c = cos[..., None, :] if cos.ndim == 3 else cos[None, :, None, :]
    sn = sin[..., None, :] if sin.ndim == 3 else sin[None, :, None, :]
    half = rot // 2
    if op.variant == "neox":
        x1 = xh[..., :half].copy()
        x2 = xh[..., half:rot].copy()
        xh[..., :half] = x1 * c - x2 * sn
        xh[..., half:rot] = x2 * c + x1 * sn
    else:
        x1 = xh[..., 0:rot:2].copy()
        x2 = xh[..., 1:rot:2].copy()
        xh[..., 0:rot:2] = x1 * c - x2 * sn
        xh[..., 1:rot:2] = x2 * c + x1 * sn
    return xh.reshape(b, s, hd_total)


def _gather(table: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    n = table.shape[axis]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx[(idx < 0) | (idx >= n)].flat[0]
        raise ExecutionError(f"gather index {int(bad)} is out of range [0, {n})")
    return np.take(table, idx.astype(np.int64), axis=axis)


#: How the reference evaluates each op type: `fn(op, args, shape, symbols, in_shapes) -> value`.
EVALUATORS: dict[type[O.Op], Callable[..., np.ndarray]] = {}


def evaluates(*op_types: type[O.Op]) -> Callable[[Callable[..., np.ndarray]], Callable[..., np.ndarray]]:
    """Decorator registering the reference semantics of `op_types` (one entry per op, no dispatch chain)."""

    def wrap(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        for t in op_types:
            if t in EVALUATORS:
                raise TypeError(f"reference semantics of {t.kind!r} registered twice")
            EVALUATORS[t] = fn
        return fn

    return wrap


def evaluate(op: O.Op, args: list[np.ndarray], shape: Shape, symbols: Mapping[str, int] | None = None,
             in_shapes: Sequence[Shape] | None = None) -> np.ndarray:
    """Evaluate one non-leaf op on computed arguments; the result has `shape`'s dtype.

    `symbols` gives the values of dynamic dims (needed by reshape and expand).
    `in_shapes` are the declared shapes of `args`: float values are computed
    in float64, so their declared dtype (f32, f16, bf16) cannot be read from
    the arrays; an elementwise region needs it to round every step as the
    unfused ops would. Without it, float args are taken to have the result's
    float dtype (f32 if the result is not a float).
    """
    fn = EVALUATORS.get(type(op))
    if fn is None:
        raise ExecutionError(f"reference has no semantics for op {op.kind!r}")
    return fn(op, args, shape, dict(symbols or {}), in_shapes)


@evaluates(O.Activation)
def _eval_activation(op: O.Activation, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    with np.errstate(all="ignore"):
        return _finish(ACTIVATION_FNS[op.fn](args[0]), shape.dtype)


@evaluates(O.Binary)
def _eval_binary(op: O.Binary, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    with np.errstate(all="ignore"):
        return _finish(_binary(op.fn, args[0], args[1]), shape.dtype)


@evaluates(O.Compare)
def _eval_compare(op: O.Compare, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _COMPARE[op.fn](args[0], args[1])


@evaluates(O.Where)
def _eval_where(op: O.Where, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(np.where(args[0], args[1], args[2]), shape.dtype)


@evaluates(O.Cast)
def _eval_cast(op: O.Cast, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return cast_value(args[0], op.dtype)


@evaluates(O.MatMul)
def _eval_matmul(op: O.MatMul, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(np.matmul(args[0], args[1]), shape.dtype)


@evaluates(O.DequantMatMul)
def _eval_dequant_matmul(op: O.DequantMatMul, args: list, shape: Shape, symbols: dict,
                         in_shapes: object) -> np.ndarray:
    # the weight dequantized exactly as GGUF defines its blocks, then an f64 product
    x, raw = args
    k = x.shape[-1]
    if op.act != "f32":  # x quantized to int8 / int16 per 32-block first (q8: llama.cpp's activations)
        dots, mins = q8_act_terms(x.astype(np.float32), np.asarray(raw, dtype=np.uint8), op.quant, k, op.act)
        return _finish((dots + mins).sum(axis=-1).reshape(*x.shape[:-1], raw.shape[0]), shape.dtype)
    w = dequantize_blocks(np.asarray(raw, dtype=np.uint8), op.quant, k)
    return _finish(np.matmul(x, w.astype(np.float64).T), shape.dtype)


@evaluates(Q8.Int8MatMul)
def _eval_int8_matmul(op: Q8.Int8MatMul, args: list, shape: Shape, symbols: dict,
                      in_shapes: object) -> np.ndarray:
    # the kernels' exact integer arithmetic (ops_int8.int8_matmul_ref), then the activation
    x, w = (np.asarray(a, dtype=np.float32) for a in args[:2])
    y, _ = Q8.int8_matmul_ref(x, w, np.asarray(args[2], dtype=np.float32) if len(args) == 3 else None)
    if op.activation:
        with np.errstate(all="ignore"):
            y = ACTIVATION_FNS[op.activation](y.astype(np.float64))
    return _finish(y, shape.dtype)


@evaluates(O.Dequantize)
def _eval_dequantize(op: O.Dequantize, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(dequantize_blocks(np.asarray(args[0], dtype=np.uint8), op.quant, shape.dims[-1].value),
                   shape.dtype)


_REDUCERS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}


def _as_2d(x: np.ndarray) -> np.ndarray:
    """A channels-first 1-D value [N, C, L] as 2-D [N, C, 1, L]; 2-D values unchanged."""
    return x[:, :, None, :] if x.ndim == 3 else x


def _geometry_2d(op: CV.Conv | CV.Pool, rank: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, ...]]:
    strides, dilations, pads = op.geometry(rank)
    if rank == 1:
        return (1, strides[0]), (1, dilations[0]), (0, pads[0], 0, pads[1])
    return strides, dilations, pads


@evaluates(CV.Conv)
def _eval_conv(op: CV.Conv, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    # direct summation over the window in f64: out[n, o] += w[o, c, i, j] * x_padded[n, c, oh*s + i*d, ...]
    x, w = (_as_2d(np.asarray(a, dtype=np.float64)) for a in args[:2])
    rank = np.asarray(args[0]).ndim - 2
    (sh, sw), (dh, dw), pads = _geometry_2d(op, rank)
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    g = op.groups
    oh, ow = (1, shape.dims[2].value) if rank == 1 else (shape.dims[2].value, shape.dims[3].value)
    xg = xp.reshape(n, g, cg, *xp.shape[2:])
    wg = w.reshape(g, o // g, cg, kh, kw)
    out = np.zeros((n, g, o // g, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xg[:, :, :, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw]
            out += np.einsum("ngchw,goc->ngohw", patch, wg[:, :, :, i, j])
    out = out.reshape(n, o, oh, ow)
    if len(args) == 3:
        out = out + np.asarray(args[2], dtype=np.float64)[None, :, None, None]
    if op.activation:
        with np.errstate(all="ignore"):
            out = ACTIVATION_FNS[op.activation](out)
    return _finish(out[:, :, 0, :] if rank == 1 else out, shape.dtype)


@evaluates(CV.Pool)
def _eval_pool(op: CV.Pool, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    # any number of spatial axes: each window offset (one per kernel cell) read as a strided slice
    x = np.asarray(args[0], dtype=np.float64)
    rank = x.ndim - 2
    strides, dilations, pads = op.geometry(rank)
    sizes = x.shape[2:]
    outs = tuple(d.value for d in shape.dims[2:])
    # pad generously (ceil_mode windows may run past the end padding): -inf for max, 0 (and a count) for avg
    extra = [max(0, (o - 1) * s + (k - 1) * d + 1 - (n + pads[i] + pads[rank + i]))
             for i, (o, s, k, d, n) in enumerate(zip(outs, strides, op.kernel, dilations, sizes))]
    widths = [(pads[i], pads[rank + i] + extra[i]) for i in range(rank)]
    inside = np.pad(np.ones(sizes), widths)
    # 1 on the input and its declared pads (0 past them, where a ceil_mode window may reach)
    in_pads = np.pad(np.ones([n + pads[i] + pads[rank + i] for i, n in enumerate(sizes)]), [(0, e) for e in extra])
    fill = -np.inf if op.fn == "max" else 0.0
    xp = np.pad(x, [(0, 0), (0, 0), *widths], constant_values=fill)
    acc = np.full((*x.shape[:2], *outs), fill)
    count = np.zeros(outs)
    for offsets in itertools.product(*(range(k) for k in op.kernel)):
        sl = tuple(slice(j * d, j * d + (o - 1) * s + 1, s) for j, d, o, s in zip(offsets, dilations, outs, strides))
        patch = xp[(slice(None), slice(None), *sl)]
        if op.fn == "max":
            acc = np.where(np.isnan(patch) | (patch > acc), patch, acc)
        else:
            acc = acc + patch
            count = count + (in_pads if op.count_include_pad else inside)[sl]
    if op.fn == "avg":
        acc = acc / count
    return _finish(acc, shape.dtype)


@evaluates(CV.BatchNorm)
def _eval_batch_norm(op: CV.BatchNorm, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    x, scale, bias, mean, var = (np.asarray(a, dtype=np.float64) for a in args)
    axes = (slice(None),) + (None,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + op.eps)
    return _finish((x - mean[axes]) * inv[axes] + bias[axes], shape.dtype)


@evaluates(O.Reduce)
def _eval_reduce(op: O.Reduce, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    x = args[0]
    axes = op.normalized_axes(x.ndim)
    if op.fn in ("max", "min") and any(x.shape[a] == 0 for a in axes):
        raise ExecutionError(f"reduce {op.fn} over an empty axis")
    return _finish(_REDUCERS[op.fn](x, axis=axes, keepdims=op.keep_dim), shape.dtype)


@evaluates(O.ArgMax)
def _eval_argmax(op: O.ArgMax, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    x = args[0]
    axis = op.axis % x.ndim
    if x.shape[axis] == 0:
        raise ExecutionError("argmax over an empty axis")
    return np.argmax(x, axis=axis).astype(np.int32)  # first index on ties; the first NaN wins


@evaluates(RG.Iota)
def _eval_iota(op: RG.Iota, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(RG.iota_values(op.length.evaluate(symbols), op.start, op.delta, op.dtype), shape.dtype)


@evaluates(FB.TokenFeed)
def _eval_token_feed(op: FB.TokenFeed, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return FB.feed_tokens(args[0], args[1], args[2])


@evaluates(FB.TokenStore)
def _eval_token_store(op: FB.TokenStore, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return FB.store_tokens(args[0], args[1], args[2])  # args[2]: the caller's state buffer, written in place


@evaluates(LR.LoraMatMul)
def _eval_lora_matmul(op: LR.LoraMatMul, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return LR.lora_rows(*(np.asarray(a) for a in args))


@evaluates(SP.SampleTopK)
def _eval_sample_top_k(op: SP.SampleTopK, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    temperature, top_k, top_p = (float(v) for v in np.asarray(args[2], dtype=np.float64))
    SP.check_settings(temperature, top_k, top_p, SP.SAMPLE_TOP_K_MAX)
    return SP.sample_rows(np.asarray(args[0]).astype(np.float32), args[1], temperature, int(top_k), top_p)


@evaluates(O.Softmax)
def _eval_softmax(op: O.Softmax, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(_softmax(args[0], op.axis), shape.dtype)


@evaluates(O.LayerNorm)
def _eval_layer_norm(op: O.LayerNorm, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(_layer_norm(args[0], args[1], args[2], op.eps), shape.dtype)


@evaluates(O.RmsNorm)
def _eval_rms_norm(op: O.RmsNorm, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(_rms_norm(args[0], args[1], op.eps), shape.dtype)


@evaluates(O.Reshape)
def _eval_reshape(op: O.Reshape, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return args[0].reshape(shape.concrete(symbols))


@evaluates(O.Transpose, O.Narrow, O.Expand)
def _eval_strided(op: O.Op, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    # Pure data movement: read the input through the op's View (the same View the backends use).
    x = np.ascontiguousarray(args[0])
    stored = x.dtype
    if stored.kind == "V" or stored in _NARROW_NUMPY:  # ml_dtypes' types: as_strided takes their bytes as uints
        x = x.view(np.dtype(f"u{stored.itemsize}"))
    view = movement_view(op, Shape.of(x.shape, DType.F64), shape, symbols)
    dims, strides, offset = view.numpy_strides(x.itemsize, {})
    flat = x.reshape(-1)
    base = flat[offset // x.itemsize:] if x.size else flat
    return np.lib.stride_tricks.as_strided(base, dims, strides, writeable=False).copy().view(stored)


@evaluates(O.Concat)
def _eval_concat(op: O.Concat, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return np.concatenate(args, axis=op.axis)


@evaluates(O.Gather)
def _eval_gather(op: O.Gather, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _gather(args[0], args[1], op.axis % args[0].ndim)


@evaluates(O.Attention)
def _eval_attention(op: O.Attention, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(attention(args[0], args[1], args[2], args[3] if len(args) > 3 else None, op), shape.dtype)


#: The largest finite f8e4m3fn value: an f8e4m3fn cache saturates there, as CUDA's satfinite conversion does
#: (ml_dtypes' cast would give NaN past it).
F8E4M3FN_MAX = 448.0


def _as_stored(x: np.ndarray, cache: np.dtype) -> np.ndarray:
    """`x` ready for a KV cache of numpy dtype `cache` (the assignment rounds it): f32 values, clamped to
    +-F8E4M3FN_MAX for an f8e4m3fn cache; a bf16 cache (numpy holds its bit patterns as uint16: a cache is never
    an integer) takes the rounded bits."""
    if cache == np.dtype(ml_dtypes.float8_e4m3fn):
        return np.clip(np.asarray(x, np.float32), -F8E4M3FN_MAX, F8E4M3FN_MAX)
    if cache == np.uint16:
        return f32_to_bf16(np.asarray(x, np.float32))
    return x


def _cache_values(cache: np.ndarray) -> np.ndarray:
    """A KV cache's values as float64 (a bf16 cache's uint16 bit patterns widened)."""
    return bf16_to_f32(cache).astype(np.float64) if cache.dtype == np.uint16 else np.asarray(cache, np.float64)


def cached_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                     positions: np.ndarray, op: O.CachedAttention, block_table: np.ndarray | None = None,
                     ) -> np.ndarray:
    """Reference `ops.CachedAttention`: writes k, v into the caches (in place), then attends causally."""
    if op.paged:
        return _paged_cached_attention(q, k, v, k_cache, v_cache, positions, op, block_table)
    b, s, _ = q.shape
    capacity = k_cache.shape[1]
    out = np.empty((b, s, op.num_heads * op.head_dim))
    plain = O.Attention(op.num_heads, op.head_dim, "causal" if op.window is None else "bias", op.scale,
                        op.num_kv_heads)
    for row in range(b):
        p = int(positions[row])
        if p < 0 or p + s > capacity:
            raise ExecutionError(f"cached_attention: row {row} at position {p} + {s} new tokens exceeds the "
                                 f"cache capacity {capacity}")
        k_cache[row, p:p + s] = _as_stored(k[row], k_cache.dtype)
        v_cache[row, p:p + s] = _as_stored(v[row], v_cache.dtype)
        # the cache holds what the compiled code stores (the cache dtype), then attention reads it back
        kc = _cache_values(k_cache[row:row + 1, :p + s])
        vc = _cache_values(v_cache[row:row + 1, :p + s])
        bias = None
        if op.window is not None:  # query s (at p + s) sees keys j with j <= p + s and p + s - j < window
            at, j = p + np.arange(s)[:, None], np.arange(p + s)[None, :]
            bias = np.where((j <= at) & (at - j < op.window), 0.0, -np.inf)
        out[row] = attention(q[row:row + 1], kc, vc, bias, plain)[0]
    return out


def _paged_cached_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                            positions: np.ndarray, op: O.CachedAttention, block_table: np.ndarray) -> np.ndarray:
    """The paged layout: token t of row b is page `block_table[b, t // P]`, row `t % P`. Every row's new keys
    are written first (rows may share pages), then each row attends over its pages' rows in token order."""
    b, s, _ = q.shape
    page = op.page_size
    capacity = block_table.shape[1] * page
    num_pages = k_cache.shape[0]

    def where(row: int, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pages = block_table[row, tokens // page].astype(np.int64)
        if pages.size and (pages.min() < 0 or pages.max() >= num_pages):
            raise ExecutionError(f"cached_attention: row {row}'s block table names a page outside the "
                                 f"{num_pages} pages of the cache")
        return pages, tokens % page

    for row in range(b):
        p = int(positions[row])
        if p < 0 or p + s > capacity:
            raise ExecutionError(f"cached_attention: row {row} at position {p} + {s} new tokens exceeds the "
                                 f"cache capacity {capacity}")
        pages, offsets = where(row, p + np.arange(s))
        k_cache[pages, offsets] = _as_stored(k[row], k_cache.dtype)
        v_cache[pages, offsets] = _as_stored(v[row], v_cache.dtype)
    out = np.empty((b, s, op.num_heads * op.head_dim))
    plain = O.CachedAttention(op.num_heads, op.head_dim, op.num_kv_heads, op.scale, op.window)
    for row in range(b):
        p = int(positions[row])
        pages, offsets = where(row, np.arange(p + s))
        # this row's tokens gathered into a contiguous one-row cache: the contiguous rule's arithmetic
        kc = np.zeros((1, p + s, k_cache.shape[2]), k_cache.dtype)
        vc = np.zeros_like(kc)
        kc[0], vc[0] = k_cache[pages, offsets], v_cache[pages, offsets]
        out[row] = cached_attention(q[row:row + 1], k[row:row + 1], v[row:row + 1], kc, vc,
                                    np.array([p], np.int32), plain)[0]
    return out


@evaluates(O.CachedAttention)
def _eval_cached_attention(op: O.CachedAttention, args: list, shape: Shape, symbols: dict,
                           in_shapes: object) -> np.ndarray:
    return _finish(cached_attention(*args[:6], op, *args[6:7]), shape.dtype)  # (the 8th: a shape-only hint)


@evaluates(O.Rope)
def _eval_rope(op: O.Rope, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(rope(args[0], args[1], args[2], op), shape.dtype)


@evaluates(O.FusedMatMulBiasAct)
def _eval_fused_gemm(op: O.FusedMatMulBiasAct, args: list, shape: Shape, symbols: dict,
                     in_shapes: object) -> np.ndarray:
    y = np.matmul(args[0], args[1])
    if len(args) == 3:
        y = y + args[2]
    if op.activation:
        with np.errstate(all="ignore"):
            y = ACTIVATION_FNS[op.activation](y)
    return _finish(y, shape.dtype)


@evaluates(O.FusedResidualLayerNorm)
def _eval_fused_res_ln(op: O.FusedResidualLayerNorm, args: list, shape: Shape, symbols: dict,
                       in_shapes: object) -> np.ndarray:
    x = args[0] + args[1] + (args[2] if len(args) == 5 else 0.0)
    return _finish(_layer_norm(x, args[-2], args[-1], op.eps), shape.dtype)


@evaluates(O.FusedResidualRmsNorm)
def _eval_fused_res_rms(op: O.FusedResidualRmsNorm, args: list, shape: Shape, symbols: dict,
                        in_shapes: object) -> np.ndarray:
    x = args[0] + args[1] + (args[2] if len(args) == 4 else 0.0)
    return _finish(_rms_norm(x, args[-1], op.eps), shape.dtype)


@evaluates(O.FusedSwiGLU)
def _eval_fused_swiglu(op: O.FusedSwiGLU, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    gate = np.matmul(args[0], args[1])
    up = np.matmul(args[0], args[2])
    return _finish(ACTIVATION_FNS["silu"](gate) * up, shape.dtype)


def selective_scan(x: np.ndarray, delta: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Reference `ops_ssm.SelectiveScan`: the Mamba recurrence, one step at a time, state from zero."""
    return selective_scan_carry(x, delta, a, b, c, None)[0]


def selective_scan_carry(x: np.ndarray, delta: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                         state: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The selective scan from `state` `[b,h,n]` (None: zeros): (y `[b,s,h]`, the final state)."""
    bsz, seq, h = x.shape
    s = np.zeros((bsz, h, a.shape[1])) if state is None else np.array(state, dtype=np.float64)
    y = np.empty((bsz, seq, h))
    for t in range(seq):
        dt = delta[:, t, :, None]  # [b, h, 1]
        s = np.exp(dt * a[None]) * s + dt * x[:, t, :, None] * b[:, t, None, :]
        y[:, t] = np.einsum("bhn,bn->bh", s, c[:, t])
    return y, s


def gated_delta_net(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                    state: np.ndarray | None, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Reference `ops_ssm.GatedDeltaNet`: (output `[b,s,h,n]`, final state `[b,h,n,n]`)."""
    bsz, seq, h, n = q.shape
    s = np.zeros((bsz, h, n, n)) if state is None else np.array(state, dtype=np.float64)
    o = np.empty((bsz, seq, h, n))
    for t in range(seq):
        s = s * np.exp(g[:, t])[..., None, None]
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - np.einsum("bhij,bhi->bhj", s, kt))
        s = s + kt[..., :, None] * u[..., None, :]
        o[:, t] = np.einsum("bhij,bhi->bhj", s, q[:, t] * scale)
    return o, s


def conv_state_after(x: np.ndarray, left_pad: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The conv state after `depthwise_conv1d_causal`'s carry form: per row, the last k-1 rows of
    (left_pad, x[:lengths[b]])."""
    keep = left_pad.shape[1]
    out = np.empty(left_pad.shape, dtype=np.float64)
    for row, n in enumerate(np.asarray(lengths, dtype=np.int64)):
        xp = np.concatenate([left_pad[row], x[row, :int(n)]], axis=0)
        out[row] = xp[len(xp) - keep:]
    return out


def depthwise_conv1d_causal(x: np.ndarray, w: np.ndarray, left_pad: np.ndarray | None,
                            reverse: bool = False) -> np.ndarray:
    """Reference `ops_ssm.DepthwiseConv1dCausal`."""
    bsz, seq, ch = x.shape
    ksz = w.shape[1]
    if reverse:  # y[t] = sum_j w[:, j] x[t + k-1 - j], zeros past the end
        xp = np.concatenate([x, np.zeros((bsz, ksz - 1, ch))], axis=1)
        return sum(w[None, None, :, j] * xp[:, ksz - 1 - j:ksz - 1 - j + seq] for j in range(ksz))
    pad = np.zeros((bsz, ksz - 1, ch)) if left_pad is None else left_pad
    xp = np.concatenate([pad, x], axis=1)
    y = np.zeros((bsz, seq, ch))
    for j in range(ksz):
        y += w[None, None, :, j] * xp[:, j:j + seq]
    return y


@evaluates(S.SelectiveScan)
def _eval_selective_scan(op: S.SelectiveScan, args: list, shape: Shape, symbols: dict,
                         in_shapes: object) -> np.ndarray:
    state = args[5] if op.carry_state else None
    with np.errstate(all="ignore"):
        y, final = selective_scan_carry(*args[:5], state)
    if state is not None:  # the caller's state buffer receives the final state, as compiled code does
        state[...] = final if state.dtype == np.float64 else final.astype(state.dtype)
    return _finish(y, shape.dtype)


@evaluates(S.GatedDeltaNet)
def _eval_gated_delta_net(op: S.GatedDeltaNet, args: list, shape: Shape, symbols: dict,
                          in_shapes: object) -> np.ndarray:
    state = args[5] if op.carry_state else None
    with np.errstate(all="ignore"):
        o, final = gated_delta_net(*args[:5], state, op.q_scale)
    if state is not None:  # the caller's state buffer receives the final state, as compiled code does
        state[...] = final if state.dtype == np.float64 else final.astype(state.dtype)
    return _finish(o, shape.dtype)


@evaluates(S.DepthwiseConv1dCausal)
def _eval_dwconv(op: S.DepthwiseConv1dCausal, args: list, shape: Shape, symbols: dict,
                 in_shapes: object) -> np.ndarray:
    y = depthwise_conv1d_causal(args[0], args[1], args[2] if len(args) > 2 else None, op.reverse)
    if op.carry_state:  # the state buffer receives each row's last k-1 real inputs, after the outputs are read
        pad = args[2]
        lengths = np.asarray(args[3], dtype=np.int64)
        if lengths.min(initial=0) < 0 or lengths.max(initial=0) > args[0].shape[1]:
            raise ExecutionError(f"depthwise_conv1d_causal lengths must lie in [0, {args[0].shape[1]}], "
                                 f"got {lengths.tolist()}")
        pad[...] = conv_state_after(args[0], pad, lengths).astype(pad.dtype)
    return _finish(y, shape.dtype)


# ── sparse mixture of experts (rlx/ir/ops_moe.py) ──


def moe_topk_ids(logits: np.ndarray, top_k: int) -> np.ndarray:
    """i32 ids of the `top_k` largest values of each row, largest first; ties to the lower id, NaN largest."""
    v = np.asarray(logits, dtype=np.float64)
    nan = np.isnan(v)
    idx = np.broadcast_to(np.arange(v.shape[-1]), v.shape)
    order = np.lexsort((idx, -np.where(nan, 0.0, v), ~nan), axis=-1)
    return order[..., :top_k].astype(np.int32)


def moe_gate_weights(logits: np.ndarray, ids: np.ndarray, normalize: bool) -> np.ndarray:
    """softmax(logits)[ids] per row, divided by its sum over the chosen experts when `normalize`."""
    v = np.asarray(logits, dtype=np.float64)
    with np.errstate(all="ignore"):
        e = np.exp(v - v.max(axis=-1, keepdims=True))
        p = np.take_along_axis(e / e.sum(axis=-1, keepdims=True), np.asarray(ids, dtype=np.int64), axis=-1)
        return p / p.sum(axis=-1, keepdims=True) if normalize else p


def moe_expert_matmul(x: np.ndarray, ids: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """`[T, k, N]`: ``experts[ids[t, s]] @ x[t(, s)]`` (experts f64 `[E, N, K]`); NaN rows for ids outside [0, E)."""
    ids = np.asarray(ids, dtype=np.int64)
    t, k = ids.shape
    xs = np.broadcast_to(x[:, None, :], (t, k, x.shape[-1])) if x.ndim == 2 else x
    inside = (ids >= 0) & (ids < experts.shape[0])
    w = experts[np.where(inside, ids, 0)]  # [T, k, N, K]
    y = np.einsum("tsnk,tsk->tsn", w, xs)
    y[~inside] = np.nan
    return y


@evaluates(MOE.MoeTopK)
def _eval_moe_topk(op: MOE.MoeTopK, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return moe_topk_ids(args[0], op.top_k)


@evaluates(MOE.MoeGate)
def _eval_moe_gate(op: MOE.MoeGate, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    ids = np.asarray(args[1])
    if ((ids < 0) | (ids >= args[0].shape[-1])).any():
        raise ExecutionError(f"moe_gate: expert ids outside [0, {args[0].shape[-1]})")
    return _finish(moe_gate_weights(args[0], ids, op.normalize), shape.dtype)


@evaluates(MOE.MoeMatMul)
def _eval_moe_matmul(op: MOE.MoeMatMul, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    x, ids, w = args
    if op.quant is not None:
        e, n, _ = w.shape
        k = x.shape[-1]
        w = dequantize_blocks(np.asarray(w, dtype=np.uint8).reshape(e * n, -1), op.quant, k).reshape(e, n, k)
    return _finish(moe_expert_matmul(np.asarray(x, dtype=np.float64), ids, np.asarray(w, dtype=np.float64)),
                   shape.dtype)


@functools.lru_cache(maxsize=256)
def body_graph(body: L.Body) -> Graph:
    """The graph of a scan / custom_fn body (cached: bodies are immutable values)."""
    return Graph.from_body(body)


def eval_body(body: L.Body, args: Sequence[np.ndarray], symbols: Mapping[str, int]) -> list[np.ndarray]:
    """Evaluate a body on compute-typed values (inputs in declaration order); returns its outputs."""
    g = body_graph(body)
    values: dict[int, np.ndarray] = {}
    feed = iter(args)
    for node in g.nodes:
        if isinstance(node.op, O.Input):
            values[node.id] = next(feed)
        elif isinstance(node.op, O.Constant):
            values[node.id] = _eval_constant(node.op, {}, {})
        else:
            values[node.id] = evaluate(node.op, [values[i] for i in node.inputs], node.shape, symbols,
                                       [g.node(i).shape for i in node.inputs])
    return [values[o] for o in g.outputs]


@evaluates(L.Scan)
def _eval_scan(op: L.Scan, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    carry = args[0]
    bcasts = args[1:1 + op.num_bcast]
    xs = args[1 + op.num_bcast:]
    length = op.length.evaluate(symbols)
    steps = range(length - 1, -1, -1) if op.reverse else range(length)
    traj = np.empty((length, *np.shape(carry)), dtype=np.asarray(carry).dtype) if op.save_trajectory else None
    for t in steps:
        (carry,) = eval_body(op.body, [carry, *bcasts, *(x[t] for x in xs)], symbols)
        if traj is not None:
            traj[t] = carry
    return traj if traj is not None else carry


@evaluates(L.CustomFn)
def _eval_custom_fn(op: L.CustomFn, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return eval_body(op.fwd, args, symbols)[0]


def _truth(pred: np.ndarray) -> bool:
    return bool(np.asarray(pred).reshape(-1)[0])


@evaluates(C.Cond)
def _eval_cond(op: C.Cond, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    """Only the chosen branch runs (lax.cond)."""
    return eval_body(op.true_body if _truth(args[0]) else op.false_body, args[1:], symbols)[0]


@evaluates(C.WhileLoop)
def _eval_while_loop(op: C.WhileLoop, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    """Trips while the cond body holds, stopping early after `max_trips` trips (lax.while_loop)."""
    carry, bcasts = args[0], args[1:]
    trips = 0
    while (op.max_trips is None or trips < op.max_trips) and _truth(eval_body(op.cond_body, [carry, *bcasts],
                                                                               symbols)[0]):
        (carry,) = eval_body(op.body, [carry, *bcasts], symbols)
        trips += 1
    return carry


@evaluates(U.UserOp)
def _eval_user_op(op: U.UserOp, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    """The registered numpy `reference` of a user op, on its inputs in their declared dtypes (bf16 as f32)."""
    if in_shapes is not None:
        args = [np.asarray(a).astype(np.float32 if s.dtype is DType.BF16 else s.dtype.np)
                for a, s in zip(args, in_shapes)]
    value = np.asarray(U.user_op_spec(op.name).reference(*args))
    want = shape.concrete(symbols or {})
    if value.shape != want:
        raise ExecutionError(f"custom op {op.name!r}: reference returned shape {value.shape}, infer says {want}")
    return _finish(value, shape.dtype)


@evaluates(O.ElementwiseRegion)
def _eval_region(op: O.ElementwiseRegion, args: list, shape: Shape, symbols: dict,
                 in_shapes: Sequence[Shape] | None) -> np.ndarray:
    return _region(op, args, shape, symbols, in_shapes)


def _region(op: O.ElementwiseRegion, args: list[np.ndarray], shape: Shape, symbols: Mapping[str, int] | None,
            in_shapes: Sequence[Shape] | None) -> np.ndarray:
    if in_shapes is not None:
        dtypes = [s.dtype for s in in_shapes]
    else:
        float_dt = shape.dtype if shape.dtype.is_float else DType.F32
        dtypes = [float_dt if a.dtype.kind == "f" else DType.parse(a.dtype) for a in args]
    shapes = [Shape.of(a.shape, dt) for a, dt in zip(args, dtypes)]
    step_shapes = op.step_shapes(shapes)
    values = list(args)
    for i, step in enumerate(op.steps):
        values.append(evaluate(step.op, [values[a] for a in step.args], step_shapes[len(args) + i], symbols))
    return values[-1]


def bind_symbols(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Deduce dynamic dim values from input arrays, checking shapes and bounds."""
    values: dict[str, int] = {}
    for node in graph.inputs():
        spec = node.op.shape
        arr = inputs[node.op.name]
        if arr.ndim != spec.rank:
            raise ExecutionError(f"input {node.op.name!r} must have rank {spec.rank} ({spec}), got shape {arr.shape}")
        for axis, (dim, size) in enumerate(zip(spec.dims, arr.shape)):
            if dim.is_static:
                if size != dim.value:
                    raise ExecutionError(f"input {node.op.name!r} axis {axis} must be {dim.value} ({spec}), got {size}")
                continue
            if len(dim.symbols) == 1 and dim.coeff == 1:
                name, bound = dim.symbols[0]
                if size > bound:
                    raise ExecutionError(f"input {node.op.name!r} axis {axis}: {name}={size} exceeds its bound {bound}")
                if values.setdefault(name, size) != size:
                    raise ExecutionError(f"input {node.op.name!r} axis {axis}: {name} is {size} here but "
                                         f"{values[name]} in another input")
    for node in graph.inputs():
        spec = node.op.shape
        for axis, (dim, size) in enumerate(zip(spec.dims, inputs[node.op.name].shape)):
            if not dim.is_static:
                missing = [n for n in dim.symbol_names if n not in values]
                if missing:
                    raise ExecutionError(f"cannot deduce dynamic dims {missing} from the inputs")
                want = dim.evaluate(values)
                if want != size:
                    raise ExecutionError(f"input {node.op.name!r} axis {axis} must be {dim}={want}, got {size}")
    return values


def to_compute(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """Convert a boundary array to the reference's compute representation."""
    if dtype.is_float:
        return _finish(np.asarray(arr, dtype=np.float64), dtype)
    return np.asarray(arr).astype(dtype.np)


def to_boundary(value: np.ndarray, dtype: DType) -> np.ndarray:
    """Convert a compute value to the array a caller receives."""
    if dtype is DType.BF16:  # values are bf16-representable already: exact
        return np.asarray(value, dtype=np.float32).astype(BFLOAT16)
    # reshape: ascontiguousarray turns a 0-d value into shape (1,).
    return np.ascontiguousarray(value, dtype=dtype.np).reshape(np.shape(value))


def run(graph: Graph, inputs: Mapping[str, np.ndarray] | None = None,
        params: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """Evaluate `graph`; params are given in their user layout (before any `layout`)."""
    inputs = dict(inputs or {})
    params = dict(params or {})
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    expected = {n.op.name for n in graph.inputs()}
    missing = expected - set(arrays)
    if missing:
        raise ExecutionError(f"missing inputs: {sorted(missing)}")
    extra = set(arrays) - expected
    if extra:
        raise ExecutionError(f"unknown inputs: {sorted(extra)} (graph takes {sorted(expected)})")
    symbols = bind_symbols(graph, arrays)
    values: dict[int, np.ndarray] = {}
    for node in graph.nodes:
        in_shapes = [graph.node(i).shape for i in node.inputs]
        values[node.id] = _eval_node(node, values, arrays, params, symbols, in_shapes)
    return [to_boundary(values[o], graph.node(o).shape.dtype) for o in graph.outputs]


def _eval_input(op: O.Input, inputs: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]) -> np.ndarray:
    if op.state:  # the caller's own buffer: ops update it in place, as compiled code does
        arr = inputs[op.name]
        if not (isinstance(arr, np.ndarray) and arr.dtype == op.shape.dtype.np and arr.flags.c_contiguous
                and arr.flags.writeable and arr.shape == op.shape.static_dims):
            raise ExecutionError(f"state {op.name!r} must be a writeable C-contiguous {op.shape.dtype} array of "
                                 f"shape {op.shape.static_dims}")
        return arr
    return to_compute(inputs[op.name], op.shape.dtype)


def _eval_param(op: O.Param, inputs: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]) -> np.ndarray:
    if op.name not in params:
        raise ExecutionError(f"param {op.name!r} was not given")
    arr = np.asarray(params[op.name])
    user = op.user_shape
    if arr.shape != user.static_dims:
        raise ExecutionError(f"param {op.name!r} must have shape {user.static_dims}, got {arr.shape}")
    if op.layout is not None:
        arr = arr.transpose(op.layout)
    return to_compute(np.ascontiguousarray(arr).reshape(arr.shape), op.shape.dtype)


def _eval_constant(op: O.Constant, inputs: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]) -> np.ndarray:
    arr = op.array()
    if op.shape.dtype is DType.BF16:
        arr = bf16_to_f32(arr)
    return to_compute(arr, op.shape.dtype)


#: Leaves read their value from the caller (inputs, params) or the op itself (constants).
LEAVES: dict[type[O.Op], Callable[..., np.ndarray]] = {
    O.Input: _eval_input, O.Param: _eval_param, O.Constant: _eval_constant,
}


def _eval_node(node: Node, values: dict[int, np.ndarray], inputs: Mapping[str, np.ndarray],
               params: Mapping[str, np.ndarray], symbols: Mapping[str, int],
               in_shapes: list[Shape] | None = None) -> np.ndarray:
    leaf = LEAVES.get(type(node.op))
    if leaf is not None:
        return leaf(node.op, inputs, params)
    return evaluate(node.op, [values[i] for i in node.inputs], node.shape, symbols, in_shapes)


# ── collectives (the ranks of one run meet in rlx/ir/transport.py) ──


@evaluates(O.AllReduce)
def _eval_all_reduce(op: O.AllReduce, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _finish(_rank(op.world).all_reduce(args[0], op.reduce), shape.dtype)


@evaluates(O.AllGather)
def _eval_all_gather(op: O.AllGather, args: list, shape: Shape, symbols: dict, in_shapes: object) -> np.ndarray:
    return _rank(op.world).all_gather(args[0], normalize_axis(op.axis, args[0].ndim))


@evaluates(O.ReduceScatter)
def _eval_reduce_scatter(op: O.ReduceScatter, args: list, shape: Shape, symbols: dict,
                         in_shapes: object) -> np.ndarray:
    axis = normalize_axis(op.axis, args[0].ndim)
    return _finish(_rank(op.world).reduce_scatter(args[0], op.reduce, axis), shape.dtype)


def _rank(world: int) -> transport.RankHandle:
    # A collective's value needs every rank's: the calling thread's rank within run_ranks.
    handle = transport.current()
    if handle.world != world:
        raise ExecutionError(f"collective for world {world} ran among {handle.world} ranks")
    return handle


def run_ranks(graphs: Graph | Sequence[Graph], inputs: Sequence[Mapping[str, np.ndarray]],
              params: Sequence[Mapping[str, np.ndarray]] | None = None) -> list[list[np.ndarray]]:
    """Evaluate a multi-rank program: rank r runs `graphs[r]` (or the one graph) on `inputs[r]`, `params[r]`.

    The ranks run as threads over a `LocalTransport` (rlx/ir/transport.py); their collective
    ops meet there. Returns each rank's outputs, in rank order.

    >>> g = Graph("sum")
    >>> x = g.input("x", [2])
    >>> g.set_outputs([g.add(O.AllReduce(world=2), [x])])
    >>> [o[0].tolist() for o in run_ranks(g, [{"x": np.ones(2, np.float32)}, {"x": np.full(2, 2, np.float32)}])]
    [[3.0, 3.0], [3.0, 3.0]]
    """
    world = len(inputs)
    per_rank = [graphs] * world if isinstance(graphs, Graph) else list(graphs)
    if len(per_rank) != world or (params is not None and len(params) != world):
        raise ExecutionError(f"run_ranks needs one graph, input dict and param dict per rank; got {len(per_rank)} "
                             f"graphs, {world} input dicts, {len(params) if params is not None else 0} param dicts")
    return transport.run_ranks(world, lambda r: run(per_rank[r], inputs[r], params[r] if params else None))

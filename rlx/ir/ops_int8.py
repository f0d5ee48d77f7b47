"""Dynamic int8 quantization: the `int8_matmul` op and its exact integer arithmetic.

`int8_matmul(x, w[, bias], activation=None)` is a linear layer computed in
int8 with dynamic activation scales, as ONNX Runtime's `quantize_dynamic`
does, but with finer scales:

- the weight `w` (f32 `[K, N]`, a param) is quantized once per output
  channel (column n): ``sw[n] = max|w[:, n]| / 127``, ``wq = rint(w * (127 /
  max|w[:, n]|))`` in [-127, 127];
- each row m of the activations `x` (f32 `[..., K]`) is quantized when the op
  runs, the same way: ``sx[m] = max|x[m]| / 127``, ``xq = rint(x * (127 /
  max|x[m]|))``;
- the product is the exact integer dot product ``acc = xq[m] . wq[:, n]``
  (int32), dequantized in the epilogue: ``y = fma(f32(acc) * sx[m], sw[n],
  bias[n])`` (``f32(acc) * sx[m] * sw[n]`` without bias), then the activation.

Every multiplication above is one f32 rounding (round half to even), so a
backend and the numpy reference (`quantize_symmetric`, `int8_matmul_ref`)
agree on the integers bit for bit. A row or column of zeros has scale 0; a
row holding inf or NaN gives NaN outputs (its scale is NaN).

This module registers the op in the MIR op set when imported (`rlx.ir.graph`
imports it).

>>> import numpy as np
>>> q, s = quantize_symmetric(np.array([[1.0, -0.5, 0.25]], np.float32), axis=1)
>>> q.tolist(), s.tolist()
([[127, -64, 32]], [0.007874015718698502])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx.errors import ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import ACTIVATIONS, Op
from rlx.ir.shape import Shape

#: The quantization modes `rlx.quantize` knows.
QUANT_MODES = ("int8-dynamic",)
#: The largest K whose integer dot products cannot overflow int32 (K * 255 * 127 < 2**31, the
#: kernels' unsigned-activation form included).
INT8_MAX_K = (2**31 - 1) // (255 * 127)


@dataclass(frozen=True)
class Int8MatMul(Op):
    """`act(dynq(x) @ q(w) + bias)`: x f32 `[..., K]`, w f32 `[K, N]`, optional bias f32 `[N]`.

    w is quantized per output channel (column), x per row at run time; see the
    module docstring for the exact arithmetic. `activation` may be None.
    """

    kind: ClassVar[str] = "int8_matmul"
    arity: ClassVar[tuple[int, int]] = (2, 3)
    activation: str | None = None

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, w = inputs[:2]
        if x.dtype is not DType.F32 or x.rank < 1:
            raise ShapeError(f"int8_matmul input must be f32 [..., K], got {x}")
        if w.dtype is not DType.F32 or w.rank != 2 or not w.is_static:
            raise ShapeError(f"int8_matmul weight must be a static f32 [K, N] matrix, got {w}")
        k, n = w.dims
        if x.dims[-1] != k:
            raise ShapeError(f"int8_matmul inner dims differ: {x} @ {w} ({x.dims[-1]} vs {k})")
        if k.value > INT8_MAX_K:
            raise ShapeError(f"int8_matmul: K={k.value} could overflow the int32 accumulators "
                             f"(at most {INT8_MAX_K})")
        if len(inputs) == 3 and (inputs[2].dtype is not DType.F32 or inputs[2].dims != (n,)):
            raise ShapeError(f"int8_matmul bias must be f32 [{n}], got {inputs[2]}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ShapeError(f"int8_matmul: unknown activation {self.activation!r}")
        return Shape((*x.dims[:-1], n), DType.F32)


def quantize_symmetric(values: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """int8 values and f32 scales of `values` quantized symmetrically along `axis` (one scale per slice).

    ``scale = amax / 127`` and ``q = rint(v * (127 / amax))`` clipped to [-127, 127], every step
    one f32 rounding, as the kernels compute it. amax = 0 gives scale 0 and q = 0; a slice with inf or
    NaN gets scale NaN (and q = 0).
    """
    v = np.asarray(values, dtype=np.float32)
    with np.errstate(all="ignore"):
        amax = np.max(np.abs(v), axis=axis, keepdims=True).astype(np.float32)
        bad = ~np.isfinite(amax)
        inv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, np.float32(1)), np.float32(0))
        inv = np.where(bad, np.float32(0), inv).astype(np.float32)
        q = np.clip(np.rint((v * inv).astype(np.float32)), -127, 127)
        q = np.where(np.isfinite(q), q, 0).astype(np.int8)
        scale = np.where(bad, np.float32(np.nan), (amax / np.float32(127.0)).astype(np.float32))
    return q, np.squeeze(scale.astype(np.float32), axis=axis)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a * b + c for f32 arrays with one rounding (what the kernels' fused multiply-add gives).

    The product of two f32 values is exact in f64; the sum is then rounded twice (f64, f32),
    which differs from one rounding only on exact f32 midpoints (vanishingly rare).
    """
    exact = np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)
    return exact.astype(np.float32)


def int8_matmul_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(f32 result before the activation, int32 dot products) of `int8_matmul` on x `[..., K]`, w `[K, N]`."""
    xq, sx = quantize_symmetric(x, axis=-1)
    wq, sw = quantize_symmetric(w, axis=0)
    acc = np.matmul(xq.astype(np.int64), wq.astype(np.int64)).astype(np.int32)
    with np.errstate(all="ignore"):
        t = (acc.astype(np.float32) * sx[..., None]).astype(np.float32)
        y = (t * sw).astype(np.float32) if bias is None else fma_f32(t, sw, np.asarray(bias, np.float32))
    return y, acc

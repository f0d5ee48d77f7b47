"""`iota`: the arithmetic sequence ``start + i * delta`` for ``i < length``, where `length` may be a dynamic dim.

What ONNX's ``Range(0, Shape(x)[i], 1)`` becomes when the axis is dynamic (the
position ids and masks of torch exports): the length is a `Dim` known when the
graph runs (a symbol bound by the caller's input shapes), not a tensor value,
so the output's shape is ``[length]`` and its buffer is sized for the bound.
A length that depends on run-time tensor values (not on dims) has no shape
RLX can express; the ONNX importer refuses it by name.

The op takes no inputs; with a static length, constant folding makes it a
constant. This module registers the op in the MIR op set when imported
(`rlx.ir.graph` imports it).

>>> from rlx.ir.shape import Dim
>>> print(Iota(Dim.dynamic("seq", max=128), 0, 1, "i64").infer([]))
i64[seq]
>>> iota_values(4, 1.5, -0.5, "f32").tolist()
[1.5, 1.0, 0.5, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx.errors import ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import Op
from rlx.ir.shape import Dim, Shape

#: The dtypes an iota produces (the numeric types of ONNX's Range).
IOTA_DTYPES = (DType.F32, DType.F64, DType.F16, DType.BF16, DType.I16, DType.I32, DType.I64)


def iota_values(n: int, start: int | float, delta: int | float, dtype: DType | str) -> np.ndarray:
    """``start + i * delta`` for i < n: float64 for a float `dtype` (the caller rounds it once to `dtype`),
    else exact integers in `dtype`."""
    dt = DType.parse(dtype)
    if dt.is_float:
        return float(start) + np.arange(n, dtype=np.float64) * float(delta)
    return (int(start) + np.arange(n, dtype=np.int64) * int(delta)).astype(dt.np)


@dataclass(frozen=True)
class Iota(Op):
    """`[length]` values ``start + i * delta`` of `dtype` (integers for integer dtypes, else numbers)."""

    kind: ClassVar[str] = "iota"
    arity: ClassVar[tuple[int, int]] = (0, 0)
    length: Dim
    start: int | float = 0
    delta: int | float = 1
    dtype: DType = DType.I64

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", Dim.of(self.length))
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        # one value, one spelling (documents write 3 as 3.0): ints for an integer dtype, floats for a float one
        for name in ("start", "delta"):
            v = getattr(self, name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                if self.dtype.is_float:
                    object.__setattr__(self, name, float(v))
                elif float(v).is_integer():
                    object.__setattr__(self, name, int(v))

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        if self.dtype not in IOTA_DTYPES:
            raise ShapeError(f"iota of {self.dtype.value} is not supported; it makes {[d.value for d in IOTA_DTYPES]}")
        for name in ("start", "delta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ShapeError(f"iota {name} must be a finite number, got {v!r}")
            if not self.dtype.is_float and not isinstance(v, int):
                raise ShapeError(f"iota of {self.dtype.value} needs an integer {name}, got {v!r}")
        if self.delta == 0:
            raise ShapeError("iota delta must not be 0")
        if not self.dtype.is_float:
            info = np.iinfo(self.dtype.np)
            last = self.start + (max(self.length.max, 1) - 1) * self.delta
            if not (info.min <= self.start <= info.max and info.min <= last <= info.max):
                raise ShapeError(f"iota {self.start} + i * {self.delta} for i < {self.length.max} overflows "
                                 f"{self.dtype.value}")
        return Shape((self.length,), self.dtype)

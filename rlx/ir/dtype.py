"""Element types of tensors, with their numpy storage and C spelling.

numpy's types of bfloat16 and the narrow storage formats come from the `ml_dtypes` package, imported
when one of them is first asked for (`BFLOAT16`, a narrow type's `DType.np`): a program that exchanges
none of them (an f32 model's warm start) does not pay for its import. Until it is imported no array of
those types can exist, which is how `is_bfloat16` answers without importing it.
"""

from __future__ import annotations

import enum
import functools
import sys
from typing import Any

import numpy as np

from rlx.errors import IRError


class DType(enum.Enum):
    """Element type of a tensor.

    >>> DType.F32.itemsize, DType.BF16.itemsize
    (4, 2)
    >>> DType.parse("f16") is DType.F16
    True
    """

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F64 = "f64"
    I8 = "i8"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    BOOL = "bool"
    #: Last, so the positions of the older members (their codes anywhere they are enumerated) stay put.
    I16 = "i16"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    #: Storage formats of 8 bits or fewer (`is_narrow`): one value per byte, as ml_dtypes holds them.
    F8E4M3FN = "f8e4m3fn"
    F8E4M3FNUZ = "f8e4m3fnuz"
    F8E5M2 = "f8e5m2"
    F8E5M2FNUZ = "f8e5m2fnuz"
    F4E2M1 = "f4e2m1"
    I4 = "i4"
    U4 = "u4"
    I2 = "i2"
    U2 = "u2"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def np(self) -> np.dtype:
        """The numpy dtype used to *store* this type (bf16 is stored as uint16 bits)."""
        return np.dtype(_narrow_numpy()[self] if self in _NARROW else _NUMPY[self])

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.BF16, DType.F64)

    @property
    def is_int(self) -> bool:
        return self in (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32, DType.U64)

    @property
    def is_unsigned(self) -> bool:
        """An unsigned integer type (no negative values; division and comparison are unsigned)."""
        return self in (DType.U8, DType.U16, DType.U32, DType.U64)

    @property
    def is_narrow(self) -> bool:
        """A storage format of 8 bits or fewer (float8/float4, int4/int2): values are cast to and from it and
        moved, never computed on (`rlx.ir.ops.NARROW_KINDS`). One value per byte, the format's bits in the
        low bits of the byte, as numpy's `ml_dtypes` types store them.

        >>> DType.F8E4M3FN.is_narrow, DType.F8E4M3FN.is_float, DType.I8.is_narrow
        (True, False, False)
        """
        return self in _NARROW

    @property
    def c_type(self) -> str:
        """C storage type in generated CPU code."""
        return _C_TYPE[self]

    @staticmethod
    def parse(value: DType | str | np.dtype | type) -> DType:
        """Accept a DType, its short name ("f32"), or a numpy dtype."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            key = value.strip().lower()
            aliases = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                       "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
                       "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool_": "bool"}
            found = _BY_NAME.get(aliases.get(key, key))  # a lookup: a manifest parses one per tensor
            if found is not None:
                return found
            raise IRError(f"unknown dtype {value!r}; expected one of {[d.value for d in DType]}")
        try:
            npd = np.dtype(value)
        except TypeError as exc:
            raise IRError(f"unknown dtype {value!r}") from exc
        if is_bfloat16(npd):
            return DType.BF16
        for dt, name in _NUMPY.items():
            if dt is not DType.BF16 and np.dtype(name) == npd:
                return dt
        if "ml_dtypes" in sys.modules:  # else no array of a narrow format can exist
            for dt, kind in _narrow_numpy().items():
                if np.dtype(kind) == npd:
                    return dt
        raise IRError(f"numpy dtype {npd} has no RLX equivalent")

    def __str__(self) -> str:
        return self.value


#: Every DType by its short name (`DType.parse`).
_BY_NAME = {dt.value: dt for dt in DType}
_ITEMSIZE = {DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.F64: 8, DType.I8: 1, DType.I16: 2,
             DType.I32: 4, DType.I64: 8, DType.U8: 1, DType.U16: 2, DType.U32: 4, DType.U64: 8, DType.BOOL: 1}
_NUMPY = {DType.F32: "float32", DType.F16: "float16", DType.BF16: "uint16", DType.F64: "float64",
          DType.I8: "int8", DType.I16: "int16", DType.I32: "int32", DType.I64: "int64", DType.U8: "uint8",
          DType.U16: "uint16", DType.U32: "uint32", DType.U64: "uint64", DType.BOOL: "bool"}
_C_TYPE = {DType.F32: "float", DType.F16: "uint16_t", DType.BF16: "uint16_t", DType.F64: "double",
           DType.I8: "int8_t", DType.I16: "int16_t", DType.I32: "int32_t", DType.I64: "int64_t", DType.U8: "uint8_t",
           DType.U16: "uint16_t", DType.U32: "uint32_t", DType.U64: "uint64_t", DType.BOOL: "uint8_t"}

#: The narrow storage formats, by their names in `ml_dtypes` (`_narrow_numpy` has the types).
_NARROW_NAMES = {DType.F8E4M3FN: "float8_e4m3fn", DType.F8E4M3FNUZ: "float8_e4m3fnuz", DType.F8E5M2: "float8_e5m2",
                 DType.F8E5M2FNUZ: "float8_e5m2fnuz", DType.F4E2M1: "float4_e2m1fn", DType.I4: "int4",
                 DType.U4: "uint4", DType.I2: "int2", DType.U2: "uint2"}
_NARROW = frozenset(_NARROW_NAMES)
_ITEMSIZE |= dict.fromkeys(_NARROW, 1)
_C_TYPE |= dict.fromkeys(_NARROW, "uint8_t")


@functools.cache
def _narrow_numpy() -> dict[DType, type]:
    """numpy's type of each narrow storage format (imports `ml_dtypes`)."""
    import ml_dtypes

    return {dt: getattr(ml_dtypes, name) for dt, name in _NARROW_NAMES.items()}


def is_bfloat16(dtype: Any) -> bool:
    """Whether numpy dtype `dtype` is `BFLOAT16`, without importing `ml_dtypes` (no bfloat16 array exists
    before it is imported).

    >>> from rlx.ir.dtype import BFLOAT16
    >>> is_bfloat16(np.dtype(np.float32)), is_bfloat16(np.dtype(np.uint16)), is_bfloat16(BFLOAT16)
    (False, False, True)
    """
    ml_dtypes = sys.modules.get("ml_dtypes")
    return ml_dtypes is not None and dtype == ml_dtypes.bfloat16


@functools.cache
def _bfloat16() -> np.dtype:
    """numpy's bfloat16 (imports `ml_dtypes`); cached by the function, not bound as a module global, which
    `rlx.pristine` would read as a monkeypatch."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def __getattr__(name: str) -> Any:
    """`BFLOAT16`, numpy's bfloat16 (the `ml_dtypes` package): what bf16 arrays are at the Python boundary,
    imported on first use."""
    if name == "BFLOAT16":
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


F32, F16, BF16, F64 = DType.F32, DType.F16, DType.BF16, DType.F64
I8, I16, I32, I64, U8, BOOL = DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.BOOL
U16, U32, U64 = DType.U16, DType.U32, DType.U64


def bits_to_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) as a bfloat16 array (the same bytes, no copy).

    >>> bits_to_bfloat16(np.array([0x3F80, 0xC000], np.uint16)).astype(np.float32).tolist()
    [1.0, -2.0]
    """
    return np.asarray(bits, dtype=np.uint16).view(_bfloat16())


def bfloat16_to_bits(values: np.ndarray) -> np.ndarray:
    """A bfloat16 array's bit patterns (uint16), contiguous, no rounding."""
    arr = np.asarray(values)
    if not is_bfloat16(arr.dtype):
        raise IRError(f"expected a bfloat16 array, got {arr.dtype}")
    return np.ascontiguousarray(arr).reshape(arr.shape).view(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bf16 bit patterns (uint16) to float32 exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 values to bf16 bit patterns (round to nearest even, NaN kept NaN)."""
    # reshape: ascontiguousarray turns a 0-d value into shape (1,).
    v = np.ascontiguousarray(values, dtype=np.float32).reshape(np.shape(values)).view(np.uint32)
    rounded = ((v + 0x7FFF + ((v >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if np.any(nan):
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return rounded


def round_to_dtype(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Round float32 values to the precision of `dtype`, returned as float32.

    The reference computes narrow float types in float32 and rounds at every op
    boundary, which is what the backends do.
    """
    if dtype is DType.F16:
        with np.errstate(over="ignore"):  # overflow to inf is the defined result, not a warning
            return np.asarray(values, dtype=np.float32).astype(np.float16).astype(np.float32)
    if dtype is DType.BF16:
        return bf16_to_f32(f32_to_bf16(values))
    return values

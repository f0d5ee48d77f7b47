"""DType parsing, storage and rounding helpers."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.errors import IRError
from rlx.ir.dtype import DType, bf16_to_f32, f32_to_bf16, round_to_dtype


@pytest.mark.parametrize("dt", list(DType))
def test_itemsize_matches_numpy_storage(dt: DType) -> None:
    assert dt.itemsize == dt.np.itemsize
    assert DType.parse(dt.value) is dt
    assert str(dt) == dt.value


@pytest.mark.parametrize(("text", "expected"), [
    ("float32", DType.F32), ("F16", DType.F16), (" bfloat16 ", DType.BF16), ("int64", DType.I64),
    ("uint8", DType.U8), ("bool_", DType.BOOL),
])
def test_parse_aliases(text: str, expected: DType) -> None:
    assert DType.parse(text) is expected


@pytest.mark.parametrize(("np_dtype", "expected"), [
    (np.float32, DType.F32), (np.float16, DType.F16), (np.float64, DType.F64), (np.int8, DType.I8),
    (np.int32, DType.I32), (np.int64, DType.I64), (np.uint8, DType.U8), (np.bool_, DType.BOOL),
    (np.uint32, DType.U32), (np.uint64, DType.U64),
])
def test_parse_numpy(np_dtype: type, expected: DType) -> None:
    assert DType.parse(np_dtype) is expected
    assert DType.parse(np.dtype(np_dtype)) is expected


def test_uint16_is_not_silently_bf16() -> None:
    # bf16 is *stored* as uint16, but a uint16 array is not a bf16 tensor: it is u16 (DType.U16).
    assert DType.parse(np.uint16) is DType.U16
    assert DType.parse(np.dtype(np.uint16)) is not DType.BF16
    assert DType.BF16.np == np.uint16 and DType.U16.np == np.uint16


@pytest.mark.parametrize("bad", ["f33", "", "complex64", np.complex64, object()])
def test_parse_rejects_unknown(bad: object) -> None:
    with pytest.raises(IRError):
        DType.parse(bad)


def test_kind_predicates() -> None:
    assert {d for d in DType if d.is_float} == {DType.F32, DType.F16, DType.BF16, DType.F64}
    assert {d for d in DType if d.is_int} == {DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16,
                                              DType.U32, DType.U64}
    assert {d for d in DType if d.is_unsigned} == {DType.U8, DType.U16, DType.U32, DType.U64}
    assert not DType.BOOL.is_float and not DType.BOOL.is_int
    assert DType.F32.c_type == "float" and DType.F64.c_type == "double" and DType.BF16.c_type == "uint16_t"


def test_bf16_round_to_nearest_even() -> None:
    # bf16 keeps 8 significant bits: around 1.0 the spacing is 2**-7.
    ulp = 2.0**-7
    values = np.array([1.0, 1.0 + ulp / 2, 1.0 + 1.5 * ulp, 1.0 + ulp / 2 + 2**-20, -2.5, 3.0e38], np.float32)
    bits = f32_to_bf16(values)
    back = bf16_to_f32(bits)
    # 1 + ulp/2 is a tie: rounds to the even neighbour 1.0; 1 + 1.5ulp ties to 1 + 2ulp (even).
    assert back[0] == 1.0
    assert back[1] == 1.0
    assert back[2] == 1.0 + 2 * ulp
    assert back[3] == 1.0 + ulp  # just above the tie goes up
    assert back[4] == -2.5
    assert bits[0] == 0x3F80


def test_bf16_special_values() -> None:
    values = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)
    back = bf16_to_f32(f32_to_bf16(values))
    assert back[0] == np.inf and back[1] == -np.inf
    assert np.isnan(back[2])
    assert back[3] == 0.0 and np.signbit(back[4])
    # the largest finite f32 rounds up past bf16's largest finite value, to inf
    assert bf16_to_f32(f32_to_bf16(np.array([np.finfo(np.float32).max], np.float32)))[0] == np.inf


def test_bf16_widening_is_exact_for_all_patterns() -> None:
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    widened = bf16_to_f32(bits)
    finite = np.isfinite(widened)
    assert np.array_equal(f32_to_bf16(widened[finite]), bits[finite])


def test_round_to_dtype() -> None:
    x = np.array([1.0 + 2**-12, 1.0 + 2**-9, 65520.0], np.float32)
    f16 = round_to_dtype(x, DType.F16)
    assert f16.dtype == np.float32
    assert f16[0] == 1.0  # below half an f16 ulp (2**-10)
    assert f16[1] == 1.0 + 2**-9
    assert f16[2] == np.inf  # overflows f16
    bf = round_to_dtype(x, DType.BF16)
    assert bf[1] == 1.0  # 2**-9 is below bf16's half ulp (2**-8)
    assert round_to_dtype(x, DType.F32) is x

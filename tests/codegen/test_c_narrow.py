"""Storage formats (`DType.is_narrow`: float8, float4, int4, int2) on the CPU: every code of each format read
into f32/f16/i32/bool/i8 and another format, and f32/f16/i32 values (specials, both signs, every binade, the
saturation edges) written to each, compiled once and equal bit for bit to `rlx.reference`; other backends and
the IR refuse them."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.errors import ShapeError
from rlx.ir import ops as O
from rlx.ir.dtype import DType

NARROW = tuple(d for d in DType if d.is_narrow)
_CODE_BITS = {DType.F4E2M1: 4, DType.I4: 4, DType.U4: 4, DType.I2: 2, DType.U2: 2}
N = 2048
_INTEGERS = {DType.I32, DType.I8, DType.I4, DType.U4, DType.I2, DType.U2}


def _codes(dt: DType) -> np.ndarray:
    """Every code of `dt`, as its numpy type holds it (the format's bits in the low bits of a byte)."""
    return np.arange(1 << _CODE_BITS.get(dt, 8), dtype=np.uint8).view(dt.np)


def _float_values(rng: np.random.Generator) -> np.ndarray:
    special = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 448, 464, 465, 480, 240, 248, 57344, 61440, 6, 7, -6.5,
               2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -17, 2.0 ** -18, 0.25, 0.75, 1.25, -2.5, 3.5, 1e30]
    scaled = rng.standard_normal(N // 2) * 10.0 ** rng.integers(-7, 6, N // 2)
    halves = (np.arange(N // 2 - len(special)) - N // 4) / 16.0  # ties of every format near 1
    return np.concatenate([special, scaled, halves]).astype(np.float32)


@pytest.fixture(scope="module")
def narrow_run() -> tuple[list[str], list[np.ndarray], list[np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    g = rlx.Graph("narrow")
    x, h, i = g.input("x", [N], "f32"), g.input("h", [N], "f16"), g.input("i", [N], "i32")
    x_values = _float_values(rng)
    feeds = {"x": x_values, "h": x_values.astype(np.float16), "i": rng.integers(-300, 300, N).astype(np.int32)}
    outs = {}
    for dt in NARROW:
        for src, name in ((x, "f32"), (h, "f16"), (i, "i32")):
            outs[f"{name}->{dt}"] = g.cast(src, dt.value)
        codes = g.input(f"codes_{dt}", [len(_codes(dt))], dt.value)
        feeds[f"codes_{dt}"] = _codes(dt)
        other = DType.F8E5M2 if dt is not DType.F8E5M2 else DType.I4
        for target in ("f32", "f16", "i32", "bool", "i8", other.value):
            outs[f"{dt}->{target}"] = g.cast(codes, target)
        outs[f"{dt} moved"] = g.concat([g.transpose(g.reshape(codes, [2, -1]), [1, 0]), g.narrow(
            g.reshape(codes, [-1, 2]), 1, 0, 1)], 1)  # data movement passes the bits through
    g.set_outputs(outs)
    with np.errstate(all="ignore"):
        want = reference.run(g, feeds)
    got = rlx.Session(rlx.Device.CPU).compile(g).run(feeds)
    return list(outs), got, want, feeds


def test_casts_to_and_from_storage_formats_equal_the_reference(narrow_run) -> None:
    names, got, want, feeds = narrow_run
    checked = 0
    for name, g, w in zip(names, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        src, _, target = name.partition("->")
        if target and DType(target) in _INTEGERS:  # NaN, inf, 1e30 -> integer: undefined (C, ONNX)
            values = feeds[{"f32": "x", "f16": "h", "i32": "i"}[src]] if src in ("f32", "f16", "i32") \
                else _codes(DType(src))
            keep = np.abs(values.astype(np.float64)) < 2.0 ** 62
            g, w = g[keep], w[keep]
        if g.dtype in {d.np for d in NARROW}:  # a storage format: the same bits
            np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8), err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)  # floats: NaN positions equal too
        checked += 1
    assert checked == len(NARROW) * 10


def test_storage_format_semantics_in_the_reference() -> None:
    """What the formats hold, independently of the backends: ONNX's saturating float8 cast, wrapping int4."""
    x = np.array([np.inf, -1000.0, 447.0, 1e-6, np.nan], np.float32)
    f8 = reference.cast_value(x, DType.F8E4M3FN).astype(np.float32)
    np.testing.assert_array_equal(f8[:4], [448.0, -448.0, 448.0, 0.0])
    assert np.isnan(f8[4])
    np.testing.assert_array_equal(reference.cast_value(np.array([-9.5, 7.9, 8.0]), DType.I4).astype(np.int8),
                                  [7, 7, -8])  # truncated, low 4 bits (ONNX: -9 -> 7)
    nan = reference.cast_value(np.array([np.nan, -np.nan], np.float32), DType.F4E2M1)
    assert nan.view(np.uint8).tolist() == [8, 0]  # e2m1 has no NaN: written as ONNX's reference writes it


def test_computing_on_a_storage_format_is_refused() -> None:
    g = rlx.Graph("f8")
    x = g.input("x", [4], "f8e4m3fn")
    with pytest.raises(ShapeError, match="f8e4m3fn"):
        g.add(O.Binary("add"), [x, x])
    with pytest.raises(ShapeError, match="i4"):
        g.add(O.ElementwiseRegion((O.RegionStep(O.Cast(DType.I4), (0,)), O.RegionStep(O.Activation("neg"), (1,)))),
              [g.input("y", [4])])
    g.set_outputs([g.cast(x, "f32")])
    assert rlx.Session(rlx.Device.CPU).first_unsupported_op(g) is None
    for backend in ("cuda", "metal"):
        from rlx.codegen.registry import UNCOMPUTED_DTYPES

        assert set(NARROW) <= UNCOMPUTED_DTYPES[backend]

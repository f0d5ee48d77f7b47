"""The erf GELU of the CUTLASS unit's epilogue (templates/cuda/kernels/gelu_erfc.cuh: a fitted polynomial and one
ex2 instead of libm's erff) against rlx.reference, on the host: the bounds its header derives (5e-6 relative
where the fit holds, |x| <= 5.5; 1 / 5.5^2 in the tail beyond it), and every f16 input, and every bf16 input
where the fit holds, rounds to within one unit of the exactly rounded value (bf16's tail, |gelu| < 1e-7, is
within the tail's bound: a few units). Needs g++ with C++20."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
from cuda_emu_build import build_emu

from rlx.reference import ACTIVATION_FNS

#: Smallest normal f32: below it the host's f32 products lose bits (the GPU flushes them to 0).
TINY = float(np.finfo(np.float32).tiny)


@pytest.fixture(scope="module")
def gelu(tmp_path_factory: pytest.TempPathFactory):
    lib = build_emu(tmp_path_factory, "gelu_emu.cpp")
    lib.emu_gelu_erfc.restype = None
    lib.emu_gelu_erfc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        y = np.full_like(x, np.nan)
        lib.emu_gelu_erfc(x.ctypes.data, y.ctypes.data, x.size)
        return y

    return run


def _exact(x: np.ndarray) -> np.ndarray:
    return ACTIVATION_FNS["gelu"](x.astype(np.float64))


def _relative(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    g = _exact(x)
    return np.abs(y.astype(np.float64) - g) / np.abs(g)


def test_within_the_fit_5e6_relative(gelu) -> None:
    x = np.linspace(-5.5, 5.5, 1_100_001, dtype=np.float32)
    x = x[np.abs(x) >= 1e-30]  # gelu(x) ~ x / 2 is then normal
    rel = _relative(gelu(x), x)
    assert rel.max() <= 5e-6, f"max relative error {rel.max():.3g} at x = {x[rel.argmax()]}"


def test_tail_beyond_the_fit(gelu) -> None:
    """x < -5.5: the polynomial is held at Q(5.5), within 1 / 5.5^2 relative while the result is a normal f32;
    x > 5.5: gelu(x) = x to f32's precision."""
    neg = np.linspace(-13.2, -5.5, 200_001, dtype=np.float32)
    neg = neg[np.abs(_exact(neg)) >= TINY]
    rel = _relative(gelu(neg), neg)
    assert rel.max() <= 1 / 5.5**2, f"max relative error {rel.max():.3g} at x = {neg[rel.argmax()]}"
    pos = np.linspace(5.5, 1e6, 100_001, dtype=np.float32)
    np.testing.assert_allclose(gelu(pos), pos, rtol=2 ** -23, atol=0)
    assert np.all(np.abs(gelu(np.array([-14.0, -100.0, -3e38], np.float32))) <= TINY)


def _ordered(v: np.ndarray, bits: np.dtype) -> np.ndarray:
    """Integers in value order (one apart = one unit in the last place); -0 and +0 are the same."""
    i = v.view(bits).astype(np.int64)
    sign = np.int64(1) << (8 * v.itemsize - 1)
    return np.where(i < 0, -(i & (sign - 1)), i)


@pytest.mark.parametrize(("dtype", "bits", "fit_only"), [(np.float16, np.int16, False),
                                                     (ml_dtypes.bfloat16, np.int16, True)])
def test_every_half_input_rounds_within_one_unit(gelu, dtype, bits, fit_only) -> None:
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    x = every[np.isfinite(every.astype(np.float32))].astype(np.float32)
    exact = _exact(x)
    keep = np.abs(exact) >= TINY  # results the GPU does not flush (and the host computes in full precision)
    if fit_only:  # f16 flushes the tail's results (below 3e-8) to 0 anyway
        keep &= np.abs(x) <= 5.5
    x = x[keep]
    got = gelu(x).astype(dtype)
    want = _exact(x).astype(np.float32).astype(dtype)
    apart = np.abs(_ordered(got, bits) - _ordered(want, bits))
    assert apart.max() <= 1, f"{apart.max()} units apart at x = {x[apart.argmax()]}"


def test_special_values(gelu) -> None:
    y = gelu(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32))
    assert np.isnan(y[0])
    assert y[1] == np.inf
    assert y[2] == 0.0  # the limit (libm's 0.5 x (1 + erf) gives -inf * 0 = NaN)
    assert y[3] == 0.0 and y[4] == 0.0

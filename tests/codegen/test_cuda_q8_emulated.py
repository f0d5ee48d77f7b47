"""The int8-activation kernels of CUDA's `dequant_matmul(act="q8")` (templates/cuda/kernels/quant_q8.cuh, and
quant.cuh's fused decode GEMV with ACT = 1) run on the CPU through the CUDA shim (tests/codegen/cuda_emu), against
rlx.reference: the activation records bit for bit against `quantize_act`, the decode GEMV over records for 1, 2, 5
and 8 rows, and the fused GEMV (plain members, RMSNorm + SwiGLU, the residual add) for 1 and 3 rows, for every
format CUDA runs it on (`INT8_ACT_FORMATS`: q8_0, q4_0, q4_1, q4_k). Needs g++ with C++20.

Bounds: tests/codegen/q8_bounds.py (the integer block dots are exact; only f32 scaling and summation round).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_emu_build import build_emu
from q8_bounds import flip_allowance, fused_checks, q8_bound, rms

import rlx
from rlx.ir import quant as Q
from rlx.reference import run as reference_run

F32P = ctypes.POINTER(ctypes.c_float)
FORMATS = {"q8_0": 0, "q4_0": 1, "q4_1": 2, "q4_k": 5}  # kernels/quant.cuh's format ids
REC = 12  # words of a record in global memory (RLX_Q8_REC)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "q8_emu.cpp")
    i64, i32, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.emu_q8_act.argtypes = [F32P, i64, i64, vp, vp]
    lib.emu_q8_gemv.argtypes = [i32, vp, vp, F32P, i64, i64, i64, i64]
    lib.emu_q8_fused.argtypes = [i32, i32, F32P, vp, ctypes.c_float, i32, vp, vp, vp, vp, vp, i64, i64, i64, i64,
                                 ctypes.c_uint]
    return lib


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _records(emu: ctypes.CDLL, x: np.ndarray) -> np.ndarray:
    m, k = x.shape
    rec = np.zeros((m, k // 32, REC), np.uint32)
    emu.emu_q8_act(x.ctypes.data_as(F32P), m, k, _ptr(rec), None)
    return rec


def _activations(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: scale 0
    x[-1, -32:] *= 1e3
    x[m // 2, 32:64] = np.arange(-16, 16, dtype=np.float32) + 0.5  # ties: d = 1, so x / d lies halfway
    x[m // 2, 32] = 127.0
    return x


def _reference(x: np.ndarray, raw: np.ndarray, fmt: str) -> np.ndarray:
    g = rlx.Graph("q8")
    g.set_outputs([g.dequant_matmul(g.input("x", list(x.shape)), g.param("w", list(raw.shape), "u8"), quant=fmt,
                                    act="q8")])
    return reference_run(g, {"x": x}, {"w": raw})[0].astype(np.float64)


def test_activation_records_are_quantize_act(emu: ctypes.CDLL) -> None:
    """Every record's bytes, scale, scale * sum and sum, and x' = q * d, equal the reference's quantization."""
    rng = np.random.default_rng(0)
    x = _activations(rng, 3, 256)
    rec = _records(emu, x)
    xd = np.zeros_like(x)
    emu.emu_q8_act(x.ctypes.data_as(F32P), 3, 256, None, _ptr(xd))
    q, d = Q.quantize_act(x, "q8")
    q = q.reshape(3, 8, 32)
    np.testing.assert_array_equal(rec[..., :8].copy().view(np.int8).reshape(3, 8, 32), q)
    np.testing.assert_array_equal(rec[..., 8].view(np.float32), d)
    sums = q.astype(np.int32).sum(-1)
    np.testing.assert_array_equal(rec[..., 10].view(np.int32), sums)
    np.testing.assert_array_equal(rec[..., 9].view(np.float32), (d * sums.astype(np.float32)).astype(np.float32))
    np.testing.assert_array_equal(xd, (q.astype(np.float32) * d[..., None]).reshape(3, 256))
    assert d[1, 1] == 1 and q[1, 1, 1:6].tolist() == [-14, -14, -12, -12, -10]  # -14.5 .. -10.5: ties to even


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_q8_gemv_matches_reference(emu: ctypes.CDLL, fmt: str, m: int) -> None:
    rng = np.random.default_rng(m)
    # 35 blocks (q4_k: 36 units of two sub-blocks): lanes 0-2 (0-3) take a round of two in-flight units, the rest one
    n, k = 9, 2304 if fmt == "q4_k" else 1024 + 96
    raw = Q.random_blocks(rng, n, k, fmt)
    x = _activations(rng, m, k)
    y = np.full((m, n), np.nan, np.float32)
    rec = _records(emu, x)  # held: the call takes its address
    emu.emu_q8_gemv(FORMATS[fmt], _ptr(rec), _ptr(raw), y.ctypes.data_as(F32P), m, n, k, raw.shape[1])
    want = _reference(x, raw, fmt)
    err = np.abs(y - want)
    bound = q8_bound(x, raw, fmt, k, want)
    assert np.all(err <= bound), f"{fmt} m={m}: worst excess {np.max(err - bound):.3g}"


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("kind", ["plain", "norm_swiglu", "residual"])
@pytest.mark.parametrize(("n", "k", "max_grid"), [(10, 512, 1 << 30), (37, 2304, 1)])
def test_fused_q8_gemv_matches_reference(emu: ctypes.CDLL, fmt: str, kind: str, n: int, k: int, max_grid: int) -> None:
    """Also one block (a grid-stride loop of several passes a warp) over rows of 36 q4_k units or 73 blocks (a lane
    takes 1-3, in and past the in-flight rounds)."""
    rng = np.random.default_rng(len(fmt) + len(kind) + n)
    k, eps = k if fmt == "q4_k" else k + 32, 1e-5
    w0, w1 = Q.random_blocks(rng, n, k, fmt), Q.random_blocks(rng, n, k, fmt)
    gamma = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    for m in (1, 3):
        x = _activations(rng, m, k)
        res = rng.standard_normal((m, n)).astype(np.float32)
        y0, y1 = np.full((m, n), np.nan, np.float32), np.full((m, n), np.nan, np.float32)
        kid = {"plain": 0, "norm_swiglu": 1, "residual": 2}[kind]
        emu.emu_q8_fused(FORMATS[fmt], kid, x.ctypes.data_as(F32P), _ptr(gamma), eps, 1 if kind == "residual" else 2,
                         _ptr(w0), _ptr(w1), _ptr(y0), _ptr(y1), _ptr(res), m, n, k, w0.shape[1], max_grid)
        h = rms(x, gamma, eps) if kind == "norm_swiglu" else x
        a, b = _reference(h, w0, fmt), _reference(h, w1, fmt)
        ba, bb = q8_bound(h, w0, fmt, k, a), q8_bound(h, w1, fmt, k, b)
        if kind == "norm_swiglu":
            ba, bb = ba + flip_allowance(h, w0, fmt, k), bb + flip_allowance(h, w1, fmt, k)
        checks = fused_checks(kind, a, b, ba, bb, y0, y1, res)
        for got, want, bound in checks:
            err = np.abs(got.astype(np.float64) - want)
            assert np.all(err <= bound), f"{fmt} {kind} m={m}: worst excess {np.max(err - bound):.3g}"

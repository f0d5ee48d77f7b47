"""The fused decode GEMV with f32 activations (templates/cuda/kernels/quant.cuh's rlx_qgemv_fused, ACT = 0) run on
the CPU through the CUDA shim (tests/codegen/cuda_emu), against rlx.reference: plain members, RMSNorm + SwiGLU and the
residual add, for 1 row of X (a warp walks RLX_QF_ROWS weight rows together, x read once for all: rlx_qf_rows1) and
3 rows (one weight row at a time), for the byte-permute formats (q4_k, q4_0, q4_1, q8_0) and one on the general loop
(q6_k). Row counts that leave a warp's last group short, grids smaller than the rows (several passes of the
grid-stride loop) and rows of 72-73 units (a lane takes 2 or 3: the in-flight rounds and the tail) are all taken.
The one-row walks rlx_qgemv_xr and rlx_qgemv_occ (kernels/quant_occ.cuh) have their own tests below, rlx_qgemv_occ
also with int8 activations (act="q8", ACT = 1: bounds of tests/codegen/q8_bounds.py).
Needs g++ with C++20.

Bound, as tests/gpu/test_cuda_quant_decode.py's: the kernel sums scale * (integer dot with x) + min * (sum of x) in f32
over K terms, |err| <= (K + 36) u32 (|h| @ |terms of w|^T), h the (normalized) activation.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_emu_build import build_emu
from q8_bounds import U32, flip_allowance, fused_checks, q8_bound, rms

import rlx
from rlx.ir import quant as Q
from rlx.reference import run as reference_run

F32P = ctypes.POINTER(ctypes.c_float)
FORMATS = {"q8_0": 0, "q4_0": 1, "q4_1": 2, "q4_k": 5, "q6_k": 6}  # kernels/quant.cuh's format ids


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "q8_emu.cpp")
    i64, i32, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.emu_qf_fused.argtypes = [i32, i32, F32P, vp, ctypes.c_float, i32, vp, vp, vp, vp, vp, i64, i64, i64, i64,
                                 ctypes.c_uint]
    return lib


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _reference(x: np.ndarray, raw: np.ndarray, fmt: str) -> np.ndarray:
    g = rlx.Graph("qf")
    g.set_outputs([g.dequant_matmul(g.input("x", list(x.shape)), g.param("w", list(raw.shape), "u8"), quant=fmt)])
    return reference_run(g, {"x": x}, {"w": raw})[0].astype(np.float64)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("kind", ["plain", "norm_swiglu", "residual"])
@pytest.mark.parametrize(("n", "k", "max_grid"), [(11, 512, 1 << 30), (37, 2304, 1)])
def test_fused_f32_gemv_matches_reference(emu: ctypes.CDLL, fmt: str, kind: str, n: int, k: int,
                                          max_grid: int) -> None:
    rng = np.random.default_rng(len(fmt) * 7 + len(kind) + n)
    k, eps = k if fmt in ("q4_k", "q6_k") else k + 32, 1e-5
    w0, w1 = Q.random_blocks(rng, n, k, fmt), Q.random_blocks(rng, n, k, fmt)
    gamma = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    for m in (1, 3):
        x = rng.standard_normal((m, k)).astype(np.float32)
        res = rng.standard_normal((m, n)).astype(np.float32)
        y0, y1 = np.full((m, n), np.nan, np.float32), np.full((m, n), np.nan, np.float32)
        kid = {"plain": 0, "norm_swiglu": 1, "residual": 2}[kind]
        emu.emu_qf_fused(FORMATS[fmt], kid, x.ctypes.data_as(F32P), _ptr(gamma), eps, 1 if kind == "residual" else 2,
                         _ptr(w0), _ptr(w1), _ptr(y0), _ptr(y1), _ptr(res), m, n, k, w0.shape[1], max_grid)
        h = rms(x, gamma, eps) if kind == "norm_swiglu" else x
        a, b = _reference(h, w0, fmt), _reference(h, w1, fmt)
        ha = np.abs(h).astype(np.float64)
        ba = (k + 36) * U32 * (ha @ Q.abs_terms(w0, fmt, k).astype(np.float64).T)
        bb = (k + 36) * U32 * (ha @ Q.abs_terms(w1, fmt, k).astype(np.float64).T)
        checks = fused_checks(kind, a, b, ba, bb, y0, y1, res)
        for got, want, bound in checks:
            assert not np.isnan(got).any(), f"{fmt} {kind} m={m} n={n}: an output row was never written"
            err = np.abs(got.astype(np.float64) - want)
            assert np.all(err <= bound), f"{fmt} {kind} m={m} n={n}: worst excess {np.max(err - bound):.3g}"


@pytest.mark.parametrize("fmt", ["q4_k", "q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("kind", ["plain", "norm_swiglu", "residual"])
@pytest.mark.parametrize(("n", "k", "xg", "max_grid"),
                         [(11, 768, 1, 1 << 30), (37, 4096, 2, 2), (21, 3584, 4, 1)])
def test_xr_gemv_matches_reference(emu: ctypes.CDLL, fmt: str, kind: str, n: int, k: int, xg: int,
                                   max_grid: int) -> None:
    """rlx_qgemv_xr (x in registers, one row of X): a partial slab alone (K = 768: 24 units), 4 full slabs, 3
    slabs and a partial one (K = 3584: 112 units); rows not a multiple of the tile; grids smaller than the tiles."""
    i32 = ctypes.c_int
    emu.emu_qf_xr.argtypes = [i32, i32, i32, F32P, ctypes.c_void_p, ctypes.c_float, i32, *[ctypes.c_void_p] * 5,
                              ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    rng = np.random.default_rng(len(kind) + n + xg + len(fmt))
    eps = 1e-5
    w0, w1 = Q.random_blocks(rng, n, k, fmt), Q.random_blocks(rng, n, k, fmt)
    gamma = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    res = rng.standard_normal((1, n)).astype(np.float32)
    y0, y1 = np.full((1, n), np.nan, np.float32), np.full((1, n), np.nan, np.float32)
    kid = {"plain": 0, "norm_swiglu": 1, "residual": 2}[kind]
    emu.emu_qf_xr(FORMATS[fmt], xg, kid, x.ctypes.data_as(F32P), _ptr(gamma), eps, 1 if kind == "residual" else 2,
                  _ptr(w0), _ptr(w1), _ptr(y0), _ptr(y1), _ptr(res), n, k, w0.shape[1], max_grid)
    _check_fused("xr", fmt, kind, x, gamma, eps, w0, w1, y0, y1, res)


def _check_fused(walk: str, fmt: str, kind: str, x: np.ndarray, gamma: np.ndarray, eps: float, w0: np.ndarray,
                 w1: np.ndarray, y0: np.ndarray, y1: np.ndarray, res: np.ndarray) -> None:
    """A one-row fused GEMV's outputs (`y0`, `y1`) against the reference: every row written, within (K + 36) u32
    of the products' |terms| (norm_swiglu: over the normalized x)."""
    n, k = w0.shape[0], x.shape[1]
    h = rms(x, gamma, eps) if kind == "norm_swiglu" else x
    a, b = _reference(h, w0, fmt), _reference(h, w1, fmt)
    ha = np.abs(h).astype(np.float64)
    ba = (k + 36) * U32 * (ha @ Q.abs_terms(w0, fmt, k).astype(np.float64).T)
    bb = (k + 36) * U32 * (ha @ Q.abs_terms(w1, fmt, k).astype(np.float64).T)
    for got, want, bound in fused_checks(kind, a, b, ba, bb, y0, y1, res):
        assert not np.isnan(got).any(), f"{walk} {fmt} {kind} n={n} k={k}: an output row was never written"
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= bound), f"{walk} {fmt} {kind} n={n} k={k}: worst excess {np.max(err - bound):.3g}"


@pytest.mark.parametrize("fmt", ["q4_k", "q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("kind", ["plain", "norm_swiglu", "residual"])
@pytest.mark.parametrize(("n", "k", "g", "tr", "max_grid"),
                         [(11, 768, 2, 4, 1 << 30), (37, 4096, 2, 6, 2), (21, 3584, 4, 5, 1), (19, 14336, 2, 8, 3),
                          (29, 4096, 8, 12, 2)])
def test_occ_gemv_matches_reference(emu: ctypes.CDLL, fmt: str, kind: str, n: int, k: int, g: int, tr: int,
                                    max_grid: int) -> None:
    """rlx_qgemv_occ (kernels/quant_occ.cuh: K split over a block's warps, x in registers, no staging; an item's G
    row sums in one butterfly): a partial slab alone (K = 768), 4 slabs in 4 replicas, 3 slabs and a partial one
    (K = 3584) with 4-row items, 14 slabs in one replica (K = 14336, the down projection's); tiles that leave the last
    one short and odd tile sizes; grids smaller than the tiles (several passes)."""
    i32, vp, i64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
    emu.emu_qf_occ.argtypes = [i32, i32, i32, F32P, vp, ctypes.c_float, i32, *[vp] * 5, i64, i64, i64, i64,
                               ctypes.c_uint]
    rng = np.random.default_rng(len(kind) + n + g + len(fmt) + k)
    eps = 1e-5
    w0, w1 = Q.random_blocks(rng, n, k, fmt), Q.random_blocks(rng, n, k, fmt)
    gamma = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    res = rng.standard_normal((1, n)).astype(np.float32)
    kid = {"plain": 0, "norm_swiglu": 1, "residual": 2}[kind]
    y0, y1 = np.full((1, n), np.nan, np.float32), np.full((1, n), np.nan, np.float32)
    emu.emu_qf_occ(FORMATS[fmt], g, kid, x.ctypes.data_as(F32P), _ptr(gamma), eps, 1 if kind == "residual" else 2,
                   _ptr(w0), _ptr(w1), _ptr(y0), _ptr(y1), _ptr(res), n, k, w0.shape[1], tr, max_grid)
    _check_fused("occ", fmt, kind, x, gamma, eps, w0, w1, y0, y1, res)


@pytest.mark.parametrize("kind", ["plain", "residual"])
def test_occ_q4k_subnormal_products_hold_at_extreme_activations(emu: ctypes.CDLL, kind: str) -> None:
    """q4_k's dot products in rlx_qgemv_occ multiply x 2^100 by bytes as subnormal floats (rlx_qocc_bytes): exact while
    |x| < 2^28 and |x b| >= 2^-77. Activations of 3e4 (f16's range) and of 1e-30 (products below the normal range,
    rounded there, far below the bound) next to ordinary ones stay within the reference's bound."""
    i32, vp, i64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
    emu.emu_qf_occ.argtypes = [i32, i32, i32, F32P, vp, ctypes.c_float, i32, *[vp] * 5, i64, i64, i64, i64,
                               ctypes.c_uint]
    rng = np.random.default_rng(7)
    n, k = 13, 4096
    w0, w1 = Q.random_blocks(rng, n, k, "q4_k"), Q.random_blocks(rng, n, k, "q4_k")
    x = rng.standard_normal((1, k)).astype(np.float32)
    x[0, ::5] *= 3e4
    x[0, 1::7] *= 1e-30
    res = rng.standard_normal((1, n)).astype(np.float32)
    y0, y1 = np.full((1, n), np.nan, np.float32), np.full((1, n), np.nan, np.float32)
    kid = {"plain": 0, "residual": 2}[kind]
    emu.emu_qf_occ(FORMATS["q4_k"], 2, kid, x.ctypes.data_as(F32P), None, 1e-5, 1 if kind == "residual" else 2,
                   _ptr(w0), _ptr(w1), _ptr(y0), _ptr(y1), _ptr(res), n, k, w0.shape[1], 4, 2)
    a, b = _reference(x, w0, "q4_k"), _reference(x, w1, "q4_k")
    ha = np.abs(x).astype(np.float64)
    ba = (k + 36) * U32 * (ha @ Q.abs_terms(w0, "q4_k", k).astype(np.float64).T)
    bb = (k + 36) * U32 * (ha @ Q.abs_terms(w1, "q4_k", k).astype(np.float64).T)
    for got, want, bound in fused_checks(kind, a, b, ba, bb, y0, y1, res):
        assert not np.isnan(got).any()
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= bound), f"occ q4_k {kind}: worst excess {np.max(err - bound):.3g}"


@pytest.mark.parametrize("fmt", ["q4_k", "q8_0"])
@pytest.mark.parametrize(("k", "g", "tr", "max_grid"), [(2048, 2, 6, 1 << 30), (576, 4, 8, 2), (4096, 2, 7, 3),
                                                        (2048, 8, 9, 2)])
def test_occ_gemv_of_unequal_members_matches_reference(emu: ctypes.CDLL, fmt: str, k: int, g: int, tr: int,
                                                       max_grid: int) -> None:
    """rlx_qgemv_occ over three members of 13, 5 and 7 rows (Q / K / V shaped: items and tiles straddle the members'
    boundaries, found by selects), K = 2048 (2 slabs x 8 replicas), 576 (one partial slab, 14 idle lanes: the
    formats of 32 values only) and 4096."""
    if fmt == "q4_k" and k % 256:
        k = 512
    i32, vp, i64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
    emu.emu_qf_occ3.argtypes = [i32, i32, F32P, *[vp] * 6, i64, i64, i64, i64, i64, i64, ctypes.c_uint]
    rng = np.random.default_rng(k + g + tr + len(fmt))
    ns = (13, 5, 7)
    ws = [Q.random_blocks(rng, n, k, fmt) for n in ns]
    x = rng.standard_normal((1, k)).astype(np.float32)
    ys = [np.full((1, n), np.nan, np.float32) for n in ns]
    emu.emu_qf_occ3(FORMATS[fmt], g, x.ctypes.data_as(F32P), *[_ptr(w) for w in ws], *[_ptr(y) for y in ys], *ns, k,
                    ws[0].shape[1], tr, max_grid)
    ha = np.abs(x).astype(np.float64)
    for w, y in zip(ws, ys):
        want = _reference(x, w, fmt)
        bound = (k + 36) * U32 * (ha @ Q.abs_terms(w, fmt, k).astype(np.float64).T)
        assert not np.isnan(y).any(), f"occ3 {fmt} k={k}: an output row was never written"
        err = np.abs(y.astype(np.float64) - want)
        assert np.all(err <= bound), f"occ3 {fmt} k={k}: worst excess {np.max(err - bound):.3g}"


@pytest.mark.parametrize("fmt", ["q4_k", "q8_0"])
def test_occ_gemv_with_next_item_prefetch_matches_reference(emu: ctypes.CDLL, fmt: str) -> None:
    """rlx_qgemv_occ with PF (walk "occp": the warp's next item prefetched into L2; a no-op in the shim, so this checks
    that the prefetching instantiation walks the same rows): norm + SwiGLU, 4 slabs, short last tile, 2 passes."""
    i32, vp, i64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
    emu.emu_qf_occ.argtypes = [i32, i32, i32, F32P, vp, ctypes.c_float, i32, *[vp] * 5, i64, i64, i64, i64,
                               ctypes.c_uint]
    rng = np.random.default_rng(41)
    n, k, eps = 37, 4096, 1e-5
    w0, w1 = Q.random_blocks(rng, n, k, fmt), Q.random_blocks(rng, n, k, fmt)
    gamma = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    y0, y1 = np.full((1, n), np.nan, np.float32), np.full((1, n), np.nan, np.float32)
    emu.emu_qf_occ(FORMATS[fmt], 3, 1, x.ctypes.data_as(F32P), _ptr(gamma), eps, 2, _ptr(w0), _ptr(w1), _ptr(y0),
                   _ptr(y1), None, n, k, w0.shape[1], 6, 2)
    h = rms(x, gamma, eps)
    a, b = _reference(h, w0, fmt), _reference(h, w1, fmt)
    ha = np.abs(h).astype(np.float64)
    ba = (k + 36) * U32 * (ha @ Q.abs_terms(w0, fmt, k).astype(np.float64).T)
    bb = (k + 36) * U32 * (ha @ Q.abs_terms(w1, fmt, k).astype(np.float64).T)
    for got, want, bound in fused_checks("norm_swiglu", a, b, ba, bb, y0, y1, np.zeros((1, n), np.float32)):
        assert not np.isnan(got).any(), f"occp {fmt}: an output row was never written"
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= bound), f"occp {fmt}: worst excess {np.max(err - bound):.3g}"


def _q8_reference(x: np.ndarray, raw: np.ndarray, fmt: str) -> np.ndarray:
    g = rlx.Graph("qocc8")
    g.set_outputs([g.dequant_matmul(g.input("x", list(x.shape)), g.param("w", list(raw.shape), "u8"), quant=fmt,
                                    act="q8")])
    return reference_run(g, {"x": x}, {"w": raw})[0].astype(np.float64)


@pytest.mark.parametrize("fmt", ["q4_k", "q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("kind", ["plain", "norm_swiglu", "residual"])
@pytest.mark.parametrize(("n", "k", "g", "tr", "max_grid"),
                         [(11, 768, 2, 4, 1 << 30), (37, 4096, 4, 6, 2), (21, 3584, 4, 5, 1), (19, 14336, 4, 8, 3),
                          (29, 4096, 8, 12, 2)])
def test_occ_gemv_int8_activations_match_reference(emu: ctypes.CDLL, fmt: str, kind: str, n: int, k: int, g: int,
                                                   tr: int, max_grid: int) -> None:
    """rlx_qgemv_occ with ACT = 1 (act="q8"): each lane quantizes its unit's x (after the norm) as quantize_act does
    (q4_k: the two lanes of a sub-block exchange max |x| and sum(q)), integer dot products with the weights' ints,
    the reference's per-block terms. Shapes as the f32 occ test's; x holds an all-zero block, ties of x / d (d = 1:
    127 in the block's first half, so q4_k's partner lane learns the maximum through the shuffle) and a block of
    large values. Bound: q8_bound (the integer dots are exact), plus flip_allowance with the kernel's own norm."""
    _check_q8_occ(emu, fmt, kind, n, k, g, tr, max_grid)


@pytest.mark.parametrize("fmt", ["q4_k", "q4_0", "q4_1", "q8_0"])
def test_occ_gemv_int8_activations_with_next_item_prefetch(emu: ctypes.CDLL, fmt: str) -> None:
    """ACT = 1 with PF (walk "occp" over act="q8"; the shim's prefetch does nothing): norm + SwiGLU, 4 slabs, short
    last tile, 2 passes."""
    _check_q8_occ(emu, fmt, "norm_swiglu", 37, 4096, 3, 6, 2)


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
@pytest.mark.parametrize("kind", ["plain", "residual"])
def test_occ_gemv_int8_activations_of_2_byte_aligned_rows(emu: ctypes.CDLL, fmt: str, kind: str) -> None:
    """q8_0's and q4_0's blocks (34 and 18 bytes) load as aligned words and one 16-bit load (rlx_qocc_load_a2),
    whichever of a block's start and its quants is 4-byte aligned: K = 800 (25 blocks a row) makes every other row
    start 2 bytes past a word too."""
    _check_q8_occ(emu, fmt, kind, 13, 800, 4, 5, 2)


def _check_q8_occ(emu: ctypes.CDLL, fmt: str, kind: str, n: int, k: int, g: int, tr: int, max_grid: int) -> None:
    """emu_q8_occ (g 2, 4, 8; 3: 2 and PF, norm + SwiGLU) against the reference with act="q8"."""
    i32, vp, i64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
    emu.emu_q8_occ.argtypes = [i32, i32, i32, F32P, vp, ctypes.c_float, i32, *[vp] * 5, i64, i64, i64, i64,
                               ctypes.c_uint]
    rng = np.random.default_rng(3 * len(kind) + n + g + len(fmt) + k)
    eps = 1e-5
    w0, w1 = Q.random_blocks(rng, n, k, fmt), Q.random_blocks(rng, n, k, fmt)
    gamma = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    x[0, :32] = 0.0  # scale 0
    x[0, 32:64] = np.arange(-16, 16, dtype=np.float32) + 0.5  # ties: d = 1
    x[0, 32] = 127.0
    x[0, -32:] *= 1e3
    res = rng.standard_normal((1, n)).astype(np.float32)
    kid = {"plain": 0, "norm_swiglu": 1, "residual": 2}[kind]
    y0, y1 = np.full((1, n), np.nan, np.float32), np.full((1, n), np.nan, np.float32)
    emu.emu_q8_occ(FORMATS[fmt], g, kid, x.ctypes.data_as(F32P), _ptr(gamma), eps, 1 if kind == "residual" else 2,
                   _ptr(w0), _ptr(w1), _ptr(y0), _ptr(y1), _ptr(res), n, k, w0.shape[1], tr, max_grid)
    h = rms(x, gamma, eps) if kind == "norm_swiglu" else x
    a, b = _q8_reference(h, w0, fmt), _q8_reference(h, w1, fmt)
    ba, bb = q8_bound(h, w0, fmt, k, a), q8_bound(h, w1, fmt, k, b)
    if kind == "norm_swiglu":
        ba, bb = ba + flip_allowance(h, w0, fmt, k), bb + flip_allowance(h, w1, fmt, k)
    for got, want, bound in fused_checks(kind, a, b, ba, bb, y0, y1, res):
        assert not np.isnan(got).any(), f"occ q8 {fmt} {kind} n={n} k={k}: an output row was never written"
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= bound), f"occ q8 {fmt} {kind} n={n} k={k}: worst excess {np.max(err - bound):.3g}"

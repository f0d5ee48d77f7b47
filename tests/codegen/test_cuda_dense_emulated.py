"""The one-row decode GEMV over dense 16-bit weights (templates/cuda/kernels/dense_gemv.cuh's rlx_dgemv: f16 or bf16
weights [K, N] as stored, f32 x) run on the CPU through the CUDA shim (tests/codegen/cuda_emu), against rlx.reference's
matmul of f32 x and the narrow weight: plain members (Q / K / V shaped: three of unequal N), the RMS norm producing x,
norm + SwiGLU (gate and up read together), and the residual add; N odd (2-byte loads, columns clamped into the member)
or a multiple of 8 (16-byte loads); K from 64 to 16384; every tile width the host picks (8 << lg columns); grids
smaller than the tiles (several passes, each block's first tile loaded before the PDL wait); K split over blocks
(SPLIT: 2..8 splits, tiles up to 512 columns, splits short or empty, f32 partials then rlx_dgemv_reduce with the
epilogue); the row-parallel form whose split reduce also sums over the ranks (rlx_dgemv_reduce_ar,
kernels/dense_gemv_ar.cuh). Needs g++ with C++20.

Bound, as the quantized GEMVs' (tests/codegen/test_cuda_qgemv_emulated.py): the kernel sums exact products x w in f32
over K terms (per thread, then over the threads in a fixed order; split: then over the splits), |err| <= (K + 36) u32
(|h| @ |w|), h the (normalized) activation.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
from cuda_emu_build import build_emu
from q8_bounds import U32, fused_checks, rms

import rlx
from rlx.reference import run as reference_run

F32P = ctypes.POINTER(ctypes.c_float)
KINDS = {"plain": 0, "norm_swiglu": 1, "residual": 2, "norm": 3}
NARROW = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "dense_emu.cpp")
    i32, i64, vp = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    lib.emu_dgemv.argtypes = [i32, i32, F32P, vp, ctypes.c_float, i32, vp, vp, vp, vp, i64, i32, i32, ctypes.c_uint]
    lib.emu_dgemv_unwritten.restype = i64
    lib.emu_dgemv_plan.argtypes = [i32, i32, vp, i64, i64, i32, i32, i32, i32, vp]
    lib.emu_dgemv_plan.restype = i64
    lib.emu_dgemv_ar.argtypes = [i32, i32, i32, F32P, vp, vp, F32P, i64, i64, i32, vp, vp]
    return lib


def _weights(rng: np.random.Generator, k: int, n: int, dt: str) -> np.ndarray:
    """A [K, N] weight of `dt` (values of a trained layer's size, a few large ones, some exact zeros)."""
    w = (0.05 * rng.standard_normal((k, n))).astype(np.float32)
    w[rng.random((k, n)) < 0.01] *= 40.0
    w[rng.random((k, n)) < 0.01] = 0.0
    return w.astype(NARROW[dt])


def _reference(h: np.ndarray, w: np.ndarray, dt: str) -> np.ndarray:
    """h @ w in rlx.reference (matmul of an f32 activation and a param of the weight's own type), as f64."""
    g = rlx.Graph("dense")
    g.set_outputs([g.matmul(g.input("x", list(h.shape)), g.param("w", list(w.shape), dt))])
    return reference_run(g, {"x": h}, {"w": w})[0].astype(np.float64)


def _run(emu: ctypes.CDLL, dt: str, kind: str, x: np.ndarray, gamma: np.ndarray | None, ws: list[np.ndarray],
         res: np.ndarray | None, lg: int, max_grid: int, splits: int = 1) -> list[np.ndarray]:
    k = x.shape[1]
    ys = [np.full((1, w.shape[1]), np.nan, np.float32) for w in ws]
    wp = (ctypes.c_void_p * 4)(*[w.ctypes.data for w in ws])
    yp = (ctypes.c_void_p * 4)(*[y.ctypes.data for y in ys])
    ns = (ctypes.c_int64 * 4)(*[w.shape[1] for w in ws])
    emu.emu_dgemv(1 if dt == "bf16" else 0, KINDS[kind], x.ctypes.data_as(F32P),
                  None if gamma is None else gamma.ctypes.data, 1e-5, len(ws), wp, yp, ns,
                  None if res is None else res.ctypes.data, k, lg, splits, max_grid)
    assert emu.emu_dgemv_unwritten() == 0, "a split's partial was never written"
    return ys


def _bound(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    k = h.shape[1]
    return (k + 36) * U32 * (np.abs(h).astype(np.float64) @ np.abs(w.astype(np.float64)))


def _check(label: str, got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> None:
    assert not np.isnan(got).any(), f"{label}: an output column was never written"
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound), f"{label}: worst excess {np.max(err - bound):.3g}"


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("kind", ["norm_swiglu", "residual", "norm"])
@pytest.mark.parametrize(("n", "k", "lg", "max_grid"),
                         [(37, 64, 1, 1 << 30), (40, 256, 3, 1), (13, 1000, 0, 2), (64, 4096, 2, 3),
                          (19, 16384, 1, 2), (64, 48, 3, 1 << 30), (96, 64, 3, 1 << 30), (64, 8, 2, 2),
                          (32, 24, 0, 1)])
def test_dense_gemv_matches_reference(emu: ctypes.CDLL, dt: str, kind: str, n: int, k: int, lg: int,
                                      max_grid: int) -> None:
    """One member (residual, norm) or the SwiGLU pair, N odd or a multiple of 8, tile widths 8..64 columns, short
    last tiles, one or several passes of the grid."""
    _check_one_group(emu, dt, kind, n, k, lg, max_grid, 1, np.random.default_rng(n + k + lg + len(kind) + len(dt)))


def _check_one_group(emu: ctypes.CDLL, dt: str, kind: str, n: int, k: int, lg: int, max_grid: int, splits: int,
                     rng: np.random.Generator) -> None:
    """One member (residual, norm) or the SwiGLU pair of random values, run through the shim and checked against
    the reference within the products' bounds."""
    x = rng.standard_normal((1, k)).astype(np.float32)
    gamma = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    res = rng.standard_normal((1, n)).astype(np.float32)
    w0, w1 = _weights(rng, k, n, dt), _weights(rng, k, n, dt)
    norm = kind in ("norm_swiglu", "norm")
    ws = [w0, w1] if kind == "norm_swiglu" else [w0]
    ys = _run(emu, dt, kind, x, gamma if norm else None, ws, res if kind == "residual" else None, lg, max_grid, splits)
    h = rms(x, gamma, 1e-5) if norm else x
    a, b = _reference(h, w0, dt), _reference(h, w1, dt)
    ba, bb = _bound(h, w0), _bound(h, w1)
    checks = [(ys[0], a, ba)] if kind == "norm" else fused_checks(kind, a, b, ba, bb, ys[0], ys[0], res)
    for got, want, bound in checks:
        _check(f"{dt} {kind} n={n} k={k} lg={lg} splits={splits}", got, want, bound)


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize(("ns", "k", "lg", "max_grid"),
                         [((48, 16, 16), 512, 1, 3), ((13, 5, 7), 2048, 2, 1 << 30), ((64, 24, 40, 8), 128, 3, 2)])
def test_dense_gemv_of_unequal_members_matches_reference(emu: ctypes.CDLL, dt: str, ns: tuple[int, ...], k: int,
                                                         lg: int, max_grid: int) -> None:
    """Q / K / V shaped groups (3 or 4 members of unequal N, each tiled on its own; odd N take the 2-byte loads)."""
    rng = np.random.default_rng(sum(ns) + k + lg)
    x = rng.standard_normal((1, k)).astype(np.float32)
    ws = [_weights(rng, k, n, dt) for n in ns]
    ys = _run(emu, dt, "plain", x, None, ws, None, lg, max_grid)
    for w, y in zip(ws, ys):
        _check(f"{dt} plain {ns} k={k}", y, _reference(x, w, dt), _bound(x, w))


def test_dense_gemv_reads_bf16_and_f16_bits_exactly(emu: ctypes.CDLL) -> None:
    """With x one-hot at row r the output is weight row r exactly (each value converted without rounding): for bf16 and
    f16 every subnormal bit pattern (and the zeros), the largest finite values, and every 61st finite pattern (every
    exponent, both signs), 1024 columns a launch."""
    k, n = 64, 1024
    for dt in ("bf16", "f16"):
        bits = np.arange(0, 1 << 16, dtype=np.uint16)
        finite = np.isfinite(bits.view(NARROW[dt]).astype(np.float32))
        exp = (bits & 0x7FFF) >> (7 if dt == "bf16" else 10)
        top = bits & 0x7FFF == (0x7F7F if dt == "bf16" else 0x7BFF)
        bits = bits[finite & ((exp == 0) | top | (bits % 61 == 0))]
        bits = np.concatenate([bits, bits[: -len(bits) % n]]).reshape(-1, n)  # whole rows (a few patterns twice)
        for i, row in enumerate(bits):
            r = (7 * i) % k
            x = np.zeros((1, k), np.float32)
            x[0, r] = 1.0
            w = np.zeros((k, n), np.uint16)
            w[r] = row
            (y,) = _run(emu, dt, "plain", x, None, [w.view(NARROW[dt])], None, 3, 2)
            np.testing.assert_array_equal(y[0], row.view(NARROW[dt]).astype(np.float32), err_msg=dt)


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize(("ns", "k", "lg"), [((64, 32, 32), 64, 1), ((64, 32, 32), 48, 0), ((96, 48, 40), 256, 2)])
def test_dense_gemv_of_members_with_the_norm_matches_reference(emu: ctypes.CDLL, dt: str, ns: tuple[int, ...], k: int,
                                                               lg: int) -> None:
    """A Q / K / V group of unequal N normalizing its input in the prologue (a decoder's attention projections)."""
    rng = np.random.default_rng(sum(ns) + k + lg + 7)
    x = (4.0 * rng.standard_normal((1, k))).astype(np.float32)
    gamma = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    ws = [_weights(rng, k, n, dt) for n in ns]
    ys = _run(emu, dt, "norm", x, gamma, ws, None, lg, 1 << 30)
    h = rms(x, gamma, 1e-5)
    for w, y in zip(ws, ys):
        _check(f"{dt} norm {ns} k={k}", y, _reference(h, w, dt), _bound(h, w))


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("kind", ["norm_swiglu", "residual", "norm"])
@pytest.mark.parametrize(("n", "k", "lg", "splits"),
                         [(64, 256, 4, 2), (200, 1000, 4, 3), (37, 520, 5, 4), (520, 2048, 6, 8), (96, 4096, 3, 8),
                          (13, 64, 1, 3), (136, 16384, 5, 3), (40, 72, 6, 2)])
def test_dense_gemv_split_over_k_matches_reference(emu: ctypes.CDLL, dt: str, kind: str, n: int, k: int, lg: int,
                                                   splits: int) -> None:
    """K split over blocks (SPLIT): tiles of 16..512 columns (wider than N too), K not a multiple of splits x step
    (a short last split), splits with no rows at all (they write zero partials), odd N; the norm's sum of squares over
    all of K with each block staging its own rows; the residual add and SwiGLU applied by rlx_dgemv_reduce."""
    _check_one_group(emu, dt, kind, n, k, lg, 1 << 30, splits,
                     np.random.default_rng(3 * n + k + lg + splits + len(kind) + len(dt)))


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize(("ns", "k", "lg", "splits"),
                         [((136, 40, 40), 512, 4, 3), ((13, 5, 7), 2048, 5, 2), ((64, 24, 40, 8), 128, 6, 8),
                          ((256, 64, 64), 1200, 4, 4)])
def test_dense_gemv_split_of_members_matches_reference(emu: ctypes.CDLL, dt: str, norm: bool, ns: tuple[int, ...],
                                                       k: int, lg: int, splits: int) -> None:
    """Q / K / V shaped groups with K split: each member's columns at their own offset in the partials, the reduce
    kernel's member selects, with and without the norm; two runs give the same bits (partials added in split order)."""
    rng = np.random.default_rng(sum(ns) + k + lg + splits + norm)
    x = (4.0 * rng.standard_normal((1, k))).astype(np.float32)
    gamma = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    ws = [_weights(rng, k, n, dt) for n in ns]
    kind = "norm" if norm else "plain"
    ys = _run(emu, dt, kind, x, gamma if norm else None, ws, None, lg, 1 << 30, splits)
    again = _run(emu, dt, kind, x, gamma if norm else None, ws, None, lg, 1 << 30, splits)
    h = rms(x, gamma, 1e-5) if norm else x
    for w, y, y2 in zip(ws, ys, again):
        _check(f"{dt} {kind} {ns} k={k} lg={lg} splits={splits}", y, _reference(h, w, dt), _bound(h, w))
        np.testing.assert_array_equal(y, y2)


def _plan(emu: ctypes.CDLL, kind: str, ns: tuple[int, ...], k: int, wave: int, lgs: tuple[int, int],
          splits: tuple[int, int]) -> tuple[int, int, int]:
    """rlx_dgemv_plan: (tile columns, splits, tiles) for the members' widths, K and `wave` resident blocks."""
    choice = (ctypes.c_int * 2)()
    nsa = (ctypes.c_int64 * 4)(*ns)
    tiles = emu.emu_dgemv_plan(KINDS[kind], len(ns), nsa, k, wave, *lgs, *splits, choice)
    return 8 << choice[0], choice[1], tiles


def _plan_before_the_split(kind: str, ns: tuple[int, ...], wave: int) -> tuple[int, int, int]:
    """The tile rule of before the K split (templates/cuda/dense.cu.j2 then): the widest of 64 / 32 / 16 columns whose
    tiles fill 4/5 of their waves, else the fullest (the first among equals)."""
    best, choice = -1.0, (16, 1, 0)
    for g in (3, 2, 1):
        cols = 8 << g
        nt = sum(-(-n // cols) for n in (ns[:1] if kind == "norm_swiglu" else ns))
        fill = nt / (-(-nt // wave) * wave)
        if fill > best + 1e-9:
            best, choice = fill, (cols, 1, nt)
        if fill >= 0.8:
            return cols, 1, nt
    return choice


#: Llama-3-8B's one-row GEMVs: (kind, members' N, K)
GEMVS_8B = {"qkv": ("norm", (4096, 1024, 1024), 4096), "out": ("residual", (4096,), 4096),
            "gateup": ("norm_swiglu", (14336, 14336), 4096), "down": ("residual", (4096,), 14336),
            "head": ("norm", (128256,), 4096)}


@pytest.mark.parametrize("wave", [264, 132, 228, 16])
def test_dense_gemv_plan_without_the_split_is_the_rule_before_it(emu: ctypes.CDLL, wave: int) -> None:
    """RLX_DENSE_GEMV_SPLIT=1 (splits 1..1, tiles 64..16 columns) chooses as the host did before the K split."""
    for kind, ns, k in GEMVS_8B.values():
        assert _plan(emu, kind, ns, k, wave, (3, 1), (1, 1)) == _plan_before_the_split(kind, ns, wave), (kind, ns)


def test_dense_gemv_plan_at_an_h200_wave(emu: ctypes.CDLL) -> None:
    """The choice at an H200's wave (132 SMs x 2 blocks) for the 8B shapes: tiles of 256 or 512 columns, splits that
    fill the wave (Q/K/V 24 tiles x 11, output and down 16 x 16, gate/up 28 x 9), the head's 251 tiles of 512 columns
    unsplit; forced splits and tiles; no split left without rows (K = 64, 16-column tiles: one step of 1024 rows)."""
    auto = {name: _plan(emu, kind, ns, k, 264, (6, 1), (1, 16)) for name, (kind, ns, k) in GEMVS_8B.items()}
    assert auto == {"qkv": (256, 11, 24), "out": (256, 16, 16), "gateup": (512, 9, 28), "down": (256, 16, 16),
                    "head": (512, 1, 251)}
    assert _plan(emu, "residual", (4096,), 14336, 264, (6, 1), (4, 4)) == (64, 4, 64)  # the split forced
    assert _plan(emu, "residual", (4096,), 14336, 264, (4, 4), (1, 16)) == (128, 8, 32)  # the tile forced
    assert _plan(emu, "residual", (4096,), 14336, 264, (6, 6), (32, 32)) == (512, 32, 8)  # both
    assert _plan(emu, "plain", (100, 37), 64, 264, (1, 1), (1, 16)) == (16, 1, 10)


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize(("world", "n", "k", "lg", "splits", "residual"),
                         [(2, 256, 1024, 4, (4, 4), True), (2, 600, 520, 3, (3, 5), False),
                          (4, 136, 2048, 5, (2, 8, 6, 3), True), (2, 13, 64, 1, (3, 2), True)])
def test_dense_gemv_summed_over_the_clique_equals_split_gemv_then_all_reduce(
        emu: ctypes.CDLL, dt: str, world: int, n: int, k: int, lg: int, splits: tuple[int, ...],
        residual: bool) -> None:
    """The split rlx_dgemv then rlx_dgemv_reduce_ar over `world` emulated ranks, three calls on the same exchange
    buffers (both parities, the third reusing the first's slots): every rank's output is bit for bit rank 0 + rank 1 +
    ... of each rank's split GEMV (rlx_dgemv + rlx_dgemv_reduce, its own split count), added in rank order in f32,
    then the residual; every rank gets the same bits, and each rank's call counter ends at 3."""
    rng = np.random.default_rng(world * n + k + lg + sum(splits) + residual + len(dt))
    calls = 3
    ws = [_weights(rng, k, n, dt) for _ in range(world)]
    x = (4.0 * rng.standard_normal((calls, world, k))).astype(np.float32)
    res = rng.standard_normal((calls, n)).astype(np.float32) if residual else None
    ys = np.full((calls, world, n), np.nan, np.float32)
    counters = (ctypes.c_uint32 * world)()
    wp = (ctypes.c_void_p * world)(*[w.ctypes.data for w in ws])
    emu.emu_dgemv_ar(1 if dt == "bf16" else 0, world, calls, x.ctypes.data_as(F32P), wp,
                     None if res is None else res.ctypes.data, ys.ctypes.data_as(F32P), n, k, lg,
                     (ctypes.c_int * world)(*splits), counters)
    assert list(counters) == [calls] * world
    for c in range(calls):
        want = np.zeros((1, n), np.float32)
        for r in range(world):  # rank r's own row, as the split GEMV and its reduce give it, added in rank order
            (row,) = _run(emu, dt, "plain", x[c, r][None], None, [ws[r]], None, lg, 1 << 30, splits[r])
            want = want + row
        if res is not None:
            want = want + res[c][None]
        for r in range(world):
            np.testing.assert_array_equal(ys[c, r], want[0], err_msg=f"call {c} rank {r}")

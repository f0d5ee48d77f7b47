"""The explicit vector forms of RLX's CPU kernels give the values of the forms they replace, bit for bit.

- `rlx_gelu_block` (the packed GEMM's erf GELU epilogue, templates/cpu/kernels/vgelu.h, in the packed_core kernel
  unit) against `rlx_gelu_f` per element (kernels/scalar.h): over a dense sweep of [-14, 14] and gelu's special
  values, on whole panels (16 / 32 columns, the fast path) and on a masked 37-column block of odd rows.
- `rlx_pack_b` reading B transposed (each column contiguous, sk == 1: an attention task's K^T, a PyTorch [out, in]
  weight), which AVX-512 does 16 x 16 blocks at a time in registers, against the panel layout built in numpy, for
  shapes with and without whole blocks.
- `rlx_attn_rows` (an `AttentionPlan` of form rows: a 12-row group's scores, softmax and weighted sum of V in L1)
  against the float64 reference and the blocks form's steps (`rlx_attn_scores`, `rlx_softmax_row`,
  `rlx_attn_values`, the rows scaled by 1 / sum; its softmax differs: 2^x of log2-scaled scores, summed in float),
  on AVX-512: odd query and key counts, heads of 32 and 64, padding masks (one key kept, every key dropped), scores
  spread far enough for exps to underflow.
- `rlx_exp2_16_nonpos` (that softmax's 2^y) against float64 over [-160, 0] densely: <= 2 ulps where 2^y is normal,
  <= one subnormal step below, and its special values.
- The softmax's `rlx_exp8_nonpos` / `rlx_exp16_nonpos` against `rlx_exp8` / `rlx_exp16`, for the arguments it
  gets (a score less its row's max: <= 0, -inf, or NaN), over [-110, 0] densely.

Built by gcc from tests/codegen/cpu_kernels/vector_forms.c with RLX's base flags, for x86-64-v3 (AVX2+FMA) and
x86-64-v4 (AVX-512); a level this CPU cannot run is skipped with the reason, as is a machine without gcc.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cpu_helpers import cpu_flags

from rlx.templates_path import templates_dir
from rlx.toolchain.compiler import BASE_FLAGS

HARNESS = Path(__file__).resolve().parent / "cpu_kernels" / "vector_forms.c"
LEVELS = {"x86-64-v3": {"avx2", "fma"}, "x86-64-v4": {"avx512f", "avx512bw", "avx512dq", "avx512vl"}}
PANEL = {"x86-64-v3": 16, "x86-64-v4": 32}

# gelu's special values (kernels/scalar.h): the -16 cut, the 0.75 range switch, tails, inf, NaN, signed zeros
GELU_SPECIALS = [np.inf, -np.inf, np.nan, -0.0, 0.0, -16.0, -15.99, -20.0, 16.0, 20.0, 0.75, -0.75, 0.7499999,
                 -0.7499999, 13.5, -13.5, 1e-30, -1e-30, 1e-45, -1e-45, 3e38, -3e38, 5.0, -5.0]


@pytest.fixture(scope="module", params=sorted(LEVELS))
def lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[ctypes.CDLL, str]:
    level = request.param
    if os.uname().machine not in ("x86_64", "AMD64"):
        pytest.skip(f"{level} is an x86-64 level; this machine is {os.uname().machine}")
    missing = LEVELS[level] - cpu_flags()
    if missing:
        pytest.skip(f"this CPU cannot run {level} code (lacks {', '.join(sorted(missing))})")
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("vector_forms") / f"vector_forms_{level}.so"
    cmd = [cc, *BASE_FLAGS, f"-march={level}", "-fopenmp-simd", f"-I{templates_dir() / 'cpu'}", str(HARNESS),
           "-o", str(out), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    so = ctypes.CDLL(str(out))
    so.chk_lanes.restype = ctypes.c_int
    ptr, n = ctypes.c_void_p, ctypes.c_longlong
    for name, args in (("chk_gelu_scalar", [ptr, ptr, n]), ("chk_gelu_block", [ptr, n, n, n, n]),
                       ("chk_exp", [ptr, ptr, ptr, n]), ("chk_pack_b", [ptr, ptr, n, n, n, n])):
        getattr(so, name).restype = None
        getattr(so, name).argtypes = args
    so.chk_exp2.restype = ctypes.c_int
    so.chk_exp2.argtypes = [ptr, ptr, n]
    so.chk_attn.restype = ctypes.c_int
    so.chk_attn.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, n, n, n, n, n, ctypes.c_float]
    assert so.chk_lanes() == PANEL[level] // 2, f"the {level} build has no vector exp of its lanes"
    return so, level


def _gelu_scalar(so: ctypes.CDLL, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    so.chk_gelu_scalar(x.ctypes.data, out.ctypes.data, x.size)
    return out


def _gelu_block(so: ctypes.CDLL, x: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """x (a multiple of rows * cols values) laid out as blocks of rows x cols with row stride ld, through
    rlx_gelu_block; the padding columns hold a sentinel that must come back untouched."""
    x = np.ascontiguousarray(x, np.float32).reshape(-1, rows, cols)
    buf = np.full((x.shape[0], rows, ld), 12345.0, np.float32)
    buf[:, :, :cols] = x
    so.chk_gelu_block(buf.ctypes.data, x.shape[0], rows, cols, ld)
    assert np.all(buf[:, :, cols:] == 12345.0), "rlx_gelu_block wrote past its block's columns"
    return buf[:, :, :cols].reshape(-1)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.int32)


@pytest.mark.parametrize("shape", ["panel", "masked", "panel_mixed", "panel_7rows", "panel_25rows"])
def test_gelu_block_is_rlx_gelu_f(lib, shape) -> None:
    """`_mixed` / `_7rows` / `_25rows`: the sweep shuffled, so a vector's lanes fall in both of gelu's ranges, with
    odd rows and more rows than a tile."""
    so, level = lib
    rows = {"panel_7rows": 7, "panel_25rows": 25}.get(shape, 6 if level == "x86-64-v3" else 12)
    rows, cols, ld = (rows, PANEL[level], PANEL[level] + 8) if shape.startswith("panel") else (13, 37, 40)
    per = rows * cols
    sweep = np.linspace(-14.0, 14.0, 2_000_001, dtype=np.float32)
    if shape not in ("panel", "masked"):
        sweep = np.random.default_rng(7).permutation(sweep)
    x = np.concatenate([np.array(GELU_SPECIALS, np.float32), sweep])
    x = np.resize(x, (x.size + per - 1) // per * per)  # whole blocks (the tail repeats the start)
    got = _gelu_block(so, x, rows, cols, ld)
    want = _gelu_scalar(so, x)
    diff = np.flatnonzero(_bits(got) != _bits(want))
    assert diff.size == 0, (f"{diff.size} values differ on {level}; first at x = {x[diff[0]]!r}: "
                            f"{got[diff[0]]!r} vs rlx_gelu_f {want[diff[0]]!r}")
    assert np.signbit(want[3]) and want[3] == 0.0 and np.signbit(want[5]) and want[5] == 0.0  # -0 -> -0; -16 -> -0
    assert np.isnan(want[1]) and np.isnan(want[2]) and want[0] == np.inf


@pytest.mark.parametrize(("k", "n", "ld"), [(32, 128, 384), (16, 70, 64), (40, 100, 41), (7, 5, 9), (33, 17, 50)])
def test_pack_b_transposed_read(lib, k, n, ld) -> None:
    so, level = lib
    nr = PANEL[level]
    src = np.arange(n * ld, dtype=np.float32)  # column j of B (n columns, k rows) at src[j * ld : j * ld + k]
    b = src.reshape(n, ld)[:, :k].T  # B[k, n]
    panels = -(-n // nr)
    got = np.full(panels * nr * k, -1.0, np.float32)
    so.chk_pack_b(got.ctypes.data, src.ctypes.data, k, n, 1, ld)
    padded = np.zeros((k, panels * nr), np.float32)
    padded[:, :n] = b
    want = padded.reshape(k, panels, nr).transpose(1, 0, 2).reshape(-1)
    np.testing.assert_array_equal(got, want)


def test_softmax_exp_nonpos_is_the_general_exp(lib) -> None:
    so, level = lib
    lanes = so.chk_lanes()
    specials = np.array([-np.inf, np.nan, -0.0, 0.0, -1e-45, -1e-30, -87.0, -87.5, -88.0, -100.0, -103.9, -103.98,
                         -104.0, -1e30, -3e38, -0.5], np.float32)
    x = np.concatenate([specials, np.linspace(-110.0, 0.0, 1_100_001, dtype=np.float32)])
    x = np.resize(x, (x.size + lanes - 1) // lanes * lanes)
    general, nonpos = np.empty_like(x), np.empty_like(x)
    so.chk_exp(x.ctypes.data, general.ctypes.data, nonpos.ctypes.data, x.size)
    diff = np.flatnonzero(_bits(general) != _bits(nonpos))
    assert diff.size == 0, (f"{diff.size} values differ on {level}; first at x = {x[diff[0]]!r}: "
                            f"{nonpos[diff[0]]!r} vs {general[diff[0]]!r}")
    assert general[0] == 0.0 and np.isnan(general[1]) and general[2] == 1.0


def test_softmax_exp2_against_float64(lib) -> None:
    so, level = lib
    specials = np.array([-np.inf, np.nan, 0.0, -0.0, -0.5, -1.5, -126.0, -126.5, -149.0, -149.5, -150.0, -150.5,
                         -199.0, -200.0, -1000.0, -3e38, -1e-30, -1e-45], np.float32)
    y = np.concatenate([specials, np.linspace(-160.0, 0.0, 1_600_001, dtype=np.float32)])
    y = np.resize(y, (y.size + 15) // 16 * 16)
    got = np.full_like(y, 7.0)
    if not so.chk_exp2(y.ctypes.data, got.ctypes.data, y.size):
        assert level == "x86-64-v3"  # rlx_exp2_16_nonpos is the AVX-512 softmax's
        return
    assert got[0] == 0.0 and np.isnan(got[1]) and got[2] == 1.0 and got[3] == 1.0
    assert np.all(got[12:16] == 0.0)  # -199 .. -3e38: below half the smallest subnormal
    assert got[16] == 1.0 and got[17] == 1.0  # 2^-1e-30, 2^-1e-45 round to 1
    fin = np.isfinite(y)
    want = np.exp2(y[fin].astype(np.float64))
    err = np.abs(got[fin].astype(np.float64) - want)
    normal = want >= 2.0**-126
    assert np.all(err[normal] <= 2.0**-23 * want[normal]), (err[normal] / want[normal]).max() / 2.0**-24
    assert np.all(err[~normal] <= 2.0**-149)


@pytest.mark.parametrize(("sq", "skv", "hd", "mask"),
                         [(128, 128, 32, "none"), (1, 1, 32, "none"), (13, 45, 32, "padding"), (25, 33, 64, "padding"),
                          (7, 129, 32, "one"), (30, 17, 32, "all"), (12, 64, 96, "none")])
def test_attention_rows_against_the_reference_and_the_blocks(lib, sq, skv, hd, mask) -> None:
    so, level = lib
    rng = np.random.default_rng(sq * 1000 + skv)
    ldq, ldk = hd * 3 + 8, hd * 2 + 16  # heads inside wider rows, as Q / K / V of a layer
    q = (rng.standard_normal((sq, ldq)) * 4).astype(np.float32)  # scores spread over ~[-60, 60]: some exps underflow
    k = rng.standard_normal((skv, ldk)).astype(np.float32)
    v = rng.standard_normal((skv, ldk)).astype(np.float32)
    keep = {"none": None, "padding": (np.arange(skv) < skv - 5), "one": (np.arange(skv) == skv // 2),
            "all": np.zeros(skv, bool)}[mask]
    keep_arr = None if keep is None else keep.astype(np.float32)
    blocks, rows = np.full((sq, hd), np.nan, np.float32), np.full((sq, hd), np.nan, np.float32)
    scale = np.float32(1.0 / np.sqrt(hd))
    done = so.chk_attn(blocks.ctypes.data, rows.ctypes.data, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                       None if keep_arr is None else keep_arr.ctypes.data, sq, skv, hd, ldq, ldk, scale)
    if not done:
        assert level == "x86-64-v3"  # rlx_attn_rows is the AVX-512 tile's
        return
    np.testing.assert_allclose(rows, blocks, rtol=1e-5, atol=2e-5)  # the two forms, the reference's tolerance
    assert np.array_equal(rows == 0.0, blocks == 0.0)
    s = (q[:, :hd].astype(np.float64) @ k[:, :hd].astype(np.float64).T) * float(scale)
    if keep is not None:
        s[:, ~keep] = -np.inf
    if mask == "all":
        assert np.all(rows == 0.0)
        return
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = (p / p.sum(axis=1, keepdims=True)) @ v[:, :hd].astype(np.float64)
    np.testing.assert_allclose(rows, want, rtol=1e-5, atol=2e-5)

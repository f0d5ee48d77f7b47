"""CUDA `dequant_matmul` / `dequantize` against rlx.reference on a real GPU (every format; f32 and f16).

Bounds: in f32 sessions the decode GEMV accumulates in f32 (fmaf) and the prefill GEMM is cuBLASLt / the
built-in GEMM in f32 without TF32, so |err| <= (K + 4) u32 (|x| @ |terms of w|^T) as on the CPU. In f16 sessions
x and the output are stored in f16 and prefill multiplies weights rounded to f16 (f32 accumulation), adding at
most 3 u16 (|x| @ |w|^T).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.config import Config
from rlx.driver import Device, Session
from rlx.ir import quant as Q
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

U32, U16 = 2.0 ** -24, 2.0 ** -11
FORMATS = sorted(Q.QUANT_FORMATS)


def _check(got: np.ndarray, want: np.ndarray, x: np.ndarray, mag: np.ndarray, k: int, precision: str, what: str):
    scale = np.abs(x.astype(np.float64)) @ mag.T
    bound = (k + 4) * U32 * scale + (3 * U16 * scale if precision == "f16" else 0.0)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert np.all(err <= bound), f"{what}: worst excess {np.max(err - bound):.3g}"


@pytest.mark.parametrize("precision", ["f32", "f16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_matmul_matches_reference(fmt: str, precision: str) -> None:
    rng = np.random.default_rng(FORMATS.index(fmt))
    k, n = 512, 37
    raw = Q.random_blocks(rng, n, k, fmt)
    g = rlx.Graph("q")
    x = g.input("x", [rlx.Dim.dynamic("m", 300), k])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [n, raw.shape[1]], "u8"), quant=fmt)])
    cg = Session(Device.CUDA, precision=precision).compile(g, opt_level=0)
    cg.set_param("w", raw)
    mag = Q.abs_terms(raw, fmt, k).astype(np.float64)
    for m in (1, 3, 4, 8, 9, 17, 64, 300):  # GEMV up to 8 rows, then dequantized tiles + GEMM
        xv = rng.standard_normal((m, k)).astype(np.float32)
        got = cg.run({"x": xv})[0]
        want = reference.run(g, {"x": xv}, {"w": raw})[0]
        _check(got, want, xv, mag, k, precision, f"{fmt}[{precision}] m={m}")


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("precision", ["f16", "bf16"])
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q4_k", "q8_0"])
def test_batched_steps_on_the_tensor_cores_match_reference(fmt: str, precision: str, size: str) -> None:
    """Steps that take rlx_qmma (blocks dequantized in registers into mma.sync fragments; `QuantMma` decides the
    rows: up to 16 for a small weight, 64 for one of 4M+ values): every count of 8-row fragments of X, N not a
    multiple of a block's 16 rows, units of K not a multiple of the block's warps. Weights rounded to the compute
    type, f32 accumulation: the f16 bound above, with bf16's unit roundoff for bf16."""
    rng = np.random.default_rng(100 + FORMATS.index(fmt))
    if size == "small":
        k, n, rows = (576 if Q.quant_format(fmt).block_size == 32 else 1280), 70, (2, 5, 8, 9, 16)
    else:
        k, n, rows = 4096, 1030, (17, 33, 48, 63, 64)
    raw = Q.random_blocks(rng, n, k, fmt)
    g = rlx.Graph("qmma")
    x = g.input("x", [rlx.Dim.dynamic("m", 64), k])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [n, raw.shape[1]], "u8"), quant=fmt)])
    # without a dequantized copy (`DequantCopy`), which would take the small weight's steps from 5 rows
    no_copies = dataclasses.replace(Config.from_env(), cuda_dequant_copies=0)
    cg = Session(Device.CUDA, no_copies, precision=precision).compile(g, opt_level=0)
    assert f"M >= 2 && M <= {16 if size == 'small' else 64}" in cg.source
    cg.set_param("w", raw)
    mag = Q.abs_terms(raw, fmt, k).astype(np.float64)
    unit = U16 if precision == "f16" else 2.0 ** -8
    for m in rows:
        xv = rng.standard_normal((m, k)).astype(np.float32)
        got = cg.run({"x": xv})[0].astype(np.float64)
        want = reference.run(g, {"x": xv}, {"w": raw})[0].astype(np.float64)
        scale = np.abs(xv.astype(np.float64)) @ mag.T
        bound = (k + 4) * U32 * scale + 3 * unit * scale
        err = np.abs(got - want)
        assert np.all(err <= bound), f"{fmt}[{precision}] m={m}: worst excess {np.max(err - bound):.3g}"


@pytest.mark.parametrize("fmt", ["q4_1", "q4_k", "q6_k"])
def test_large_steps_on_the_dequantized_copy(fmt: str) -> None:
    """f16: steps past the GEMVs and rlx_qmma multiply the weight's copy dequantized at set_param (`DequantCopy`):
    the reference's values at the f16 bound, the same as the build without copies (RLX_CUDA_DEQUANT_COPIES=0,
    dequantized tiles), a second `set_param` refreshes the copy, and a clone (`rlx_clone`) holds it too."""
    rng = np.random.default_rng(7)
    k, n = (576 if Q.quant_format(fmt).block_size == 32 else 1280), 300
    raw, fresh = Q.random_blocks(rng, n, k, fmt), Q.random_blocks(rng, n, k, fmt)
    g = rlx.Graph("qcopy")
    x = g.input("x", [rlx.Dim.dynamic("m", 128), k])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [n, raw.shape[1]], "u8"), quant=fmt)])
    cg = Session(Device.CUDA, precision="f16").compile(g, opt_level=0)
    assert cg.source.count("DequantCopy: the blocks also dequantized") == 1
    off = dataclasses.replace(Config.from_env(), cuda_dequant_copies=0)
    tiles = Session(Device.CUDA, off, precision="f16").compile(g, opt_level=0)
    assert "DequantCopy" not in tiles.source
    for w in (raw, fresh):  # the second set_param must dequantize the copy again
        cg.set_param("w", w)
        tiles.set_param("w", w)
        mag = Q.abs_terms(w, fmt, k).astype(np.float64)
        for m in (2, 5, 17, 64, 128):
            xv = rng.standard_normal((m, k)).astype(np.float32)
            got = cg.run({"x": xv})[0]
            _check(got, reference.run(g, {"x": xv}, {"w": w})[0], xv, mag, k, "f16", f"{fmt} m={m}")
            np.testing.assert_allclose(got, tiles.run({"x": xv})[0], rtol=2e-3, atol=1e-3 * np.abs(got).max())
    twin = cg.clone()
    xv = rng.standard_normal((40, k)).astype(np.float32)
    np.testing.assert_array_equal(twin.run({"x": xv})[0], cg.run({"x": xv})[0])


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_vocabulary_sized_weight_is_split_into_tiles(precision: str) -> None:
    """49152 x 576 q8_0 exceeds the scratch tile, so prefill runs column tiles (and places each product)."""
    rng = np.random.default_rng(9)
    k, n = 576, 49152
    raw = Q.random_blocks(rng, n, k, "q8_0", scale=0.002)
    g = rlx.Graph("vocab")
    x = g.input("x", [rlx.Dim.dynamic("m", 64), k])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [n, raw.shape[1]], "u8"), quant="q8_0")])
    cg = Session(Device.CUDA, precision=precision).compile(g, opt_level=0)
    cg.set_param("w", raw)
    mag = np.abs(Q.dequantize(raw, "q8_0", k)).astype(np.float64)
    for m in (1, 40):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        _check(cg.run({"x": xv})[0], reference.run(g, {"x": xv}, {"w": raw})[0], xv, mag, k, precision, f"m={m}")


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_dequantize_rows(precision: str) -> None:
    rng = np.random.default_rng(4)
    k = 256
    table = Q.random_blocks(rng, 9, k, "q4_k")
    g = rlx.Graph("deq")
    ids = g.input("ids", [rlx.Dim.dynamic("n", 8)], "i32")
    g.set_outputs([g.dequantize(g.gather(g.param("t", [9, table.shape[1]], "u8"), ids), quant="q4_k")])
    cg = Session(Device.CUDA, precision=precision).compile(g, opt_level=0)
    cg.set_param("t", table)
    idx = np.array([8, 0, 5], np.int32)
    want = Q.dequantize(table[idx], "q4_k", k)
    if precision == "f16":
        want = want.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(cg.run({"ids": idx})[0], want)

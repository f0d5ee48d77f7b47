"""Quantized products on rlx_gemm_small over their dequantized copy (`CopySmallGemm`) against rlx.reference on a GPU.

Steps of 5..64 rows multiply the weight's f16 copy (`DequantCopy`, [K, N]) on the small GEMM, the RMS
norm that produces X computed in its prologue (the fused decode GEMV does it up to 4 rows, the norm's own kernel and
cuBLASLt past 64). Bound as tests/gpu/test_cuda_quant.py's f16 one, over the normalized activations (three more
f16 unit roundoffs: gamma's, the normed row's and its scale computed from the rounded x)."""

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


def _graph(fmt: str, k: int, n: int, norm: bool = True) -> rlx.Graph:
    """rms_norm(x) @ W^T: the norm the product's decode GEMV absorbs (`norm` False: x @ W^T)."""
    g = rlx.Graph("copy_small")
    x = g.input("x", [rlx.Dim.dynamic("m", 128), k])
    w = g.param("w", [n, Q.row_bytes(fmt, k)], "u8")
    g.set_outputs([g.dequant_matmul(g.rms_norm(x, g.param("g", [k]), eps=1e-5) if norm else x, w, quant=fmt)])
    return g


def _check_rows(g: rlx.Graph, cg, lt, params: dict, fmt: str, k: int, rows: tuple[int, ...], norm: bool = True,
                seed: int = 23) -> None:
    """Every step of `rows` rows against rlx.reference (the f16 bound below) and against the cuBLASLt build `lt`."""
    rng = np.random.default_rng(seed)
    mag = Q.abs_terms(params["w"], fmt, k).astype(np.float64)
    for m in rows:
        xv = rng.standard_normal((m, k)).astype(np.float32)
        want = reference.run(g, {"x": xv}, params)[0].astype(np.float64)
        got = cg.run({"x": xv})[0].astype(np.float64)
        x64 = xv.astype(np.float64)
        normed = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-5) * params["g"] if norm else x64
        scale = np.abs(normed) @ mag.T
        # f16 roundings: x, gamma, the norm's scale (from the rounded x), the normed row, the weight copy, the output
        bound = (k + 4) * U32 * scale + 6 * U16 * scale
        err = np.abs(got - want)
        assert np.all(err <= bound), (
            f"{fmt} m={m}: worst excess {np.max(err - bound):.3g}, err / scale {np.max(err / scale) / U16:.2f} u16")
        ref_lt = lt.run({"x": xv})[0].astype(np.float64)
        np.testing.assert_allclose(got, ref_lt, rtol=2e-3, atol=2e-3 * np.abs(ref_lt).max())


def _small_and_lt(g: rlx.Graph, params: dict):
    """The default f16 build (small GEMMs on) and the same graph on cuBLASLt (RLX_CUDA_SMALL_GEMM=0), weights set."""
    cg = Session(Device.CUDA, precision="f16").compile(g)
    off = dataclasses.replace(Config.from_env(), cuda_small_gemm=False)
    lt = Session(Device.CUDA, off, precision="f16").compile(g)
    assert "(CopySmallGemm)" not in lt.source
    for name, value in params.items():
        cg.set_param(name, value)
        lt.set_param(name, value)
    return cg, lt


@pytest.mark.parametrize(("fmt", "k"), [("q4_1", 576), ("q8_0", 1536), ("q4_k", 1280)])
def test_copy_steps_on_the_small_gemm_match_reference(fmt: str, k: int) -> None:
    rng = np.random.default_rng(23)
    n = 136  # 8 full blocks of 16 columns and a half one
    g = _graph(fmt, k, n)
    params = {"w": Q.random_blocks(rng, n, k, fmt), "g": (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)}
    cg, lt = _small_and_lt(g, params)
    assert cg.source.count("(CopySmallGemm)") == 1
    assert "rlx_gemm_small<__half, RLX_ACT_NONE, false, 2, false, " in cg.source  # the norm in its prologue
    _check_rows(g, cg, lt, params, fmt, k, (1, 4, 5, 8, 16, 17, 33, 64, 65, 100))  # fused GEMV, small GEMM, cuBLASLt


@pytest.mark.parametrize(("fmt", "k", "norm"), [("q4_1", 576, True), ("q8_0", 256, False), ("q4_0", 544, True)])
def test_a_vocabulary_head_on_the_wide_small_gemm_matches_reference(fmt: str, k: int, norm: bool) -> None:
    """N >= 8192 (a head): persistent blocks over 32-column tiles, every row of X in shared memory (CopySmallGemm.wide),
    the norm in the prologue or not. N = 8200 ends in a partial tile (8 of its 32 columns), so the blocks' last
    tiles fetch zero-filled slabs and store only their columns inside N."""
    rng = np.random.default_rng(29)
    n = 8200
    g = _graph(fmt, k, n, norm)
    params = {"w": Q.random_blocks(rng, n, k, fmt), "g": (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)}
    if not norm:
        del params["g"]
    cg, lt = _small_and_lt(g, params)
    assert "with every row of X in shared memory (the copy read once)" in cg.source
    assert f"rlx_gemm_small_wide<__half, {2 if norm else 0}, false, " in cg.source
    _check_rows(g, cg, lt, params, fmt, k, (1, 5, 16, 17, 33, 64, 65), norm)


def test_decoder_steps_of_many_rows_on_the_small_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A q4_1 decoder's steps of 24 rows: Q/K/V with the norm in the first product's prologue, the output and down
    projections adding their residual in the epilogue, gate and up in one launch writing the SwiGLU. Each row's
    logits against the CPU's f32 decoder, no worse than the same build on cuBLASLt (RLX_CUDA_SMALL_GEMM=0: the norm,
    each product and the SwiGLU their own kernels) beyond f16 noise, and every row the logits of its token alone."""
    from rlx.models.causal_lm import CausalLM
    from tests.gpu.test_cuda_decoder import CONFIG, _quantized_tensors, _rel

    tensors = _quantized_tensors(11)
    rows = 24
    kw = dict(device="cuda", precision="f16", max_context=48, max_batch=rows, prefill_chunk=8)
    small = CausalLM(CONFIG, tensors, **kw)
    src = small._compiled.source
    assert "rlx_gemm_small<__half, RLX_ACT_NONE, false, 2, false, 1, false, true>" in src  # norm + SwiGLU pair
    assert "rlx_gemm_small<__half, RLX_ACT_NONE, false, 0, false, 1, true, false>" in src  # residual add
    monkeypatch.setenv("RLX_CUDA_SMALL_GEMM", "0")
    lt = CausalLM(CONFIG, tensors, **kw)
    assert "(CopySmallGemm)" not in lt._compiled.source
    cpu = CausalLM(CONFIG, tensors, device="cpu", max_context=48, prefill_chunk=8, quant_act="f32")
    prompt = np.array([[4, 8, 15, 16, 23, 42]])
    last = prompt.shape[1] - 1
    caches = [lm.new_cache() for lm in (small, lt)]
    for lm, cache in zip((small, lt), caches):
        lm.step(np.repeat(prompt, rows, axis=0), cache, [b * prompt.shape[1] + last for b in range(rows)])
    ref = cpu.new_cache()
    cpu.step(prompt, ref, [last])
    token, errors = 7, []
    for step in range(8):
        got = small.step(np.full((rows, 1), token), caches[0], list(range(rows)))
        base = lt.step(np.full((rows, 1), token), caches[1], list(range(rows)))
        want = cpu.step(np.array([[token]]), ref, [0])[0]
        assert all(np.array_equal(got[0], row) for row in got[1:]), f"step {step}: the rows differ"
        errors.append((_rel(got[0], want), _rel(base[0], want)))
        token = int(want.argmax())
    small_err, lt_err = np.mean(errors, axis=0)
    assert small_err <= 1.5 * lt_err + 1e-3, f"f16 errors (small, cuBLASLt) per step: {errors}"

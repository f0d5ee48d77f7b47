"""The decoder on a GPU: cached_attention keeps its cache on the device, and a small CausalLM on CUDA
generates what the CPU backend generates."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import random_specs
from rlx.toolchain.cuda import visible_gpu_arch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from llama_numpy import llama_logits

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

CONFIG = DecoderConfig(arch="llama", vocab_size=96, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=32, ffn_size=160, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=32, context_length=128, tie_embeddings=True, bos_id=1, eos_id=2)


def test_cuda_decoder_logits_and_greedy_match_cpu() -> None:
    tensors = random_tensors(random_specs(CONFIG), seed=3, scale=2.0)
    gpu = CausalLM(CONFIG, tensors, device="cuda", max_context=96, max_batch=2, prefill_chunk=16)
    cpu = CausalLM(CONFIG, tensors, device="cpu", max_context=96, max_batch=2, prefill_chunk=16)
    ids = list(np.random.default_rng(0).integers(0, CONFIG.vocab_size, 37))
    got = gpu.logits(ids)
    want = llama_logits(CONFIG, {n: d for n, (_, d) in tensors.items()}, ids)
    cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.9999
    prompts = [[5, 17, 33, 8], list(range(10, 31))]
    assert [g.token_ids for g in gpu.generate_batch(prompts, 24)] == \
        [g.token_ids for g in cpu.generate_batch(prompts, 24)]


def _quantized_tensors(seed: int) -> dict:
    """Weights in GGUF blocks as SmolLM2 ships them (Q4_1 layers, Q8_0 token embedding), norms in f32."""
    from rlx.ir.quant import random_blocks
    from rlx.models.llama import WeightSpec

    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in random_specs(CONFIG).items():
        if len(spec.shape) == 1:
            out[name] = (spec, (1.0 + 0.1 * rng.standard_normal(spec.shape)).astype(np.float32))
        else:
            fmt = "q8_0" if name == "token_embd.weight" else "q4_1"
            out[name] = (WeightSpec(fmt, spec.shape), random_blocks(rng, spec.shape[0], spec.shape[1], fmt, scale=0.03))
    return out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _alternate(lm: CausalLM, caches: tuple, prompts: tuple, steps: int, order: tuple = (0, 1)) -> list:
    """Step each conversation in `order` after the other (greedy); the logits of every step, per conversation."""
    out: list = [[] for _ in prompts]
    tokens = [0] * len(prompts)
    for step in range(steps):
        for conv in order:
            feed = prompts[conv] if step == 0 else np.array([[tokens[conv]]])
            logits = lm.step(feed, caches[conv], [feed.shape[1] - 1])[0]
            out[conv].append(logits)
            tokens[conv] = int(logits.argmax())
    return out


PROMPTS = (np.array([[3, 14, 15, 92, 65]]), np.array([[2, 71, 82, 81, 82, 84, 59, 4]]))


def test_resident_caches_follow_their_conversations_f32() -> None:
    """Two conversations stepped alternately on one GPU library (each cache resident in turn, written back
    when the other comes) give the CPU's logits step for step; release_states hands back the CPU's cache."""
    tensors = _quantized_tensors(5)
    gpu = CausalLM(CONFIG, tensors, device="cuda", max_context=64, prefill_chunk=8)
    cpu = CausalLM(CONFIG, tensors, device="cpu", max_context=64, prefill_chunk=8, quant_act="f32")
    gpu_caches, cpu_caches = (gpu.new_cache(), gpu.new_cache()), (cpu.new_cache(), cpu.new_cache())
    got = _alternate(gpu, gpu_caches, PROMPTS, 12)
    want = _alternate(cpu, cpu_caches, PROMPTS, 12)
    for conv in (0, 1):
        for step, (g, w) in enumerate(zip(got[conv], want[conv])):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max(), err_msg=f"step {step}")
    gpu._compiled.release_states()
    for conv in (0, 1):
        n = int(cpu_caches[conv].lengths[0])
        for name, w in cpu_caches[conv].arrays.items():
            g = gpu_caches[conv].arrays[name].numpy()
            np.testing.assert_allclose(g[:, :n], w[:, :n], rtol=1e-4, atol=1e-4 * np.abs(w[:, :n]).max())


def test_resident_caches_are_exact_in_f16() -> None:
    """In f16 the caches go back and forth as f32 (exact for f16 values): conversations stepped alternately give
    bit for bit the logits each gives alone."""
    tensors = _quantized_tensors(5)
    lm = CausalLM(CONFIG, tensors, device="cuda", precision="f16", max_context=64, prefill_chunk=8)
    together = _alternate(lm, (lm.new_cache(), lm.new_cache()), PROMPTS, 12)
    alone = [_alternate(lm, (lm.new_cache(),), (PROMPTS[c],), 12, order=(0,))[0] for c in (0, 1)]
    for conv in (0, 1):
        for step, (a, b) in enumerate(zip(together[conv], alone[conv])):
            np.testing.assert_array_equal(a, b, err_msg=f"conversation {conv}, step {step}")


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_fused_decode_kernels_match_the_large_step_path(precision: str) -> None:
    """A one-row decode step (fused GEMVs with norm / residual / SwiGLU, rope inside attention) gives the logits
    of the same token in a five-row step, where the projections multiply their dequantized copies on the small GEMM
    (`CopySmallGemm`: the norms and, on sm_90, the SwiGLU inside it; the rope stays inside the attention: one token a
    row). In f16 both differ from the CPU's f32 by their roundings (the
    fused kernels round less often): over the steps the fused error is no larger than the other's, and each step's
    under 0.1. (Per step the two are f16 noise: measured on an H200, 1.1e-3..8.4e-3 fused and 1.0e-3..2.7e-2 large,
    either one ahead; the small GEMM reading its copies transposed, a bug found by tests/gpu/test_cuda_copy_small.py,
    gave 1.3-1.5 there.)"""
    tensors = _quantized_tensors(7)
    lm = CausalLM(CONFIG, tensors, device="cuda", precision=precision, max_context=48, max_batch=5, prefill_chunk=8)
    cpu = CausalLM(CONFIG, tensors, device="cpu", max_context=48, prefill_chunk=8, quant_act="f32")
    one, five, ref = lm.new_cache(), lm.new_cache(), cpu.new_cache()
    prompt = np.array([[4, 8, 15, 16, 23, 42]])
    last = prompt.shape[1] - 1
    lm.step(prompt, one, [last])
    lm.step(np.repeat(prompt, 5, axis=0), five, [b * prompt.shape[1] + last for b in range(5)])
    cpu.step(prompt, ref, [last])
    token = 7
    errors = []  # (fused, large) relative errors against the CPU, per step
    for step in range(10):
        fused = lm.step(np.array([[token]]), one, [0])[0]
        large = lm.step(np.full((5, 1), token), five, list(range(5)))
        want = cpu.step(np.array([[token]]), ref, [0])[0]
        assert all(np.array_equal(large[0], row) for row in large[1:]), f"step {step}: the five rows differ"
        if precision == "f32":
            np.testing.assert_allclose(fused, large[0], rtol=1e-4, atol=1e-4 * np.abs(large[0]).max(),
                                       err_msg=f"step {step}")
        errors.append((_rel(fused, want), _rel(large[0], want)))
        token = int(want.argmax())
    if precision == "f16":
        fused_err, large_err = np.mean(errors, axis=0)
        assert fused_err <= 1.5 * large_err + 1e-3, f"fused f16 errors {errors}"
        # and neither is far from the CPU (a broken large-step path would pass the comparison above)
        assert max(max(e) for e in errors) < 0.1, f"f16 errors (fused, large) per step {errors}"

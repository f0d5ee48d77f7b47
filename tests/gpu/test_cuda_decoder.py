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

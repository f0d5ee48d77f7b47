"""Checks the GPU decoder tests share (test_cuda_hf_families.py, test_cuda_recurrent_decoder.py), and the tiny
LLaMA-shaped decoder the paged and token-feedback tests build (`TINY_LLAMA`, `tiny_llama_tensors`)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from hf_checkpoints import cosine

from rlx.models.causal_lm import random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import random_specs

#: 2 layers, hidden 128, 4 / 2 heads of 32: small enough to build in seconds, large enough for real tiles.
TINY_LLAMA = DecoderConfig(arch="llama", vocab_size=96, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                           head_dim=32, ffn_size=160, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                           n_rot=32, context_length=128, tie_embeddings=True, bos_id=1, eos_id=-1)


@functools.cache
def tiny_llama_tensors() -> dict:
    """`TINY_LLAMA`'s random weights (seed 3, scale 2: peaked logits), made once."""
    return random_tensors(random_specs(TINY_LLAMA), seed=3, scale=2.0)


def assert_f16_greedy_tracks_f32(half: Any, cpu: Any, ids: list[int], what: str, n: int = 24) -> None:
    """f16 storage (f32 accumulation): `n` greedy tokens of `half` after `ids`, each a valid id, and on those
    tokens every step's logits point where the f32 CPU model's do (finite, cosine >= 0.999, the greedy token
    the row's largest logit)."""
    tokens = half.generate(ids, max_new_tokens=n).token_ids
    assert tokens and all(0 <= t < cpu.config.vocab_size for t in tokens), what
    hcache, ccache = half.new_cache(), cpu.new_cache()
    got, exp = half.step(np.array([ids]), hcache, [len(ids) - 1]), cpu.step(np.array([ids]), ccache, [len(ids) - 1])
    for step, token in enumerate(tokens):
        assert np.all(np.isfinite(got)), f"{what} f16 step {step}"
        assert cosine(got, exp) >= 0.999, f"{what} f16 step {step}"
        assert got[0, token] == got[0].max(), f"{what} f16 step {step}: not the greedy token"
        got, exp = half.step(np.array([[token]]), hcache, [0]), cpu.step(np.array([[token]]), ccache, [0])

"""Speculative decoding on a GPU: a verification step of k+1 rows against the one-row steps it replaces,
and greedy speculative output against plain greedy output, for q8_0 and f32 weights."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import random_specs
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

CONFIG = DecoderConfig(arch="llama", vocab_size=96, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=32, ffn_size=160, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=32, context_length=128, tie_embeddings=True, bos_id=-1, eos_id=-1)


@pytest.fixture(scope="module", params=["q8_0", "f32"])
def lm(request: pytest.FixtureRequest) -> CausalLM:
    tensors = random_tensors(random_specs(CONFIG, request.param), seed=3, scale=2.0)
    return CausalLM(CONFIG, tensors, device="cuda", max_context=96, prefill_chunk=32)


def test_verification_rows_against_one_row_steps(lm: CausalLM) -> None:
    ids = [int(t) for t in np.random.default_rng(0).integers(0, CONFIG.vocab_size, 30)]
    for k in (2, 4, 9):
        together = lm.new_cache()
        lm.step(np.array([ids[:20]]), together, [0])
        rows = lm.step(np.array([ids[20:20 + k]]), together, np.arange(k))
        alone = lm.new_cache()
        lm.step(np.array([ids[:20]]), alone, [0])
        singles = np.concatenate([lm.step(np.array([[t]]), alone, [0]) for t in ids[20:20 + k]])
        np.testing.assert_allclose(rows, singles, rtol=0, atol=1e-4 * np.abs(singles).max())
        assert (rows.argmax(-1) == singles.argmax(-1)).all()


def test_greedy_speculative_equals_plain_greedy(lm: CausalLM) -> None:
    motif = [int(t) for t in np.random.default_rng(1).integers(3, CONFIG.vocab_size, 7)]
    prompt = motif * 3 + motif[:3]
    plain = lm.generate(prompt, 40).token_ids
    fast = lm.generate(prompt, 40, speculative="prompt_lookup")
    assert fast.token_ids == plain
    assert fast.timings["speculative_steps"] > 0

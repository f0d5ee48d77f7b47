"""The engine on the tiny model: batch invariance (a greedy request gives the same tokens alone or among 15
others, at any row), agreement with CausalLM.generate, sampling by seed, cancellation, preemption and
recompute, and a fault in one step failing only its requests."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.errors import RlxError
from rlx.models.causal_lm import CausalLM
from rlx.serving.engine import Engine, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)  # lengths 3..40: one to three prefill chunks of 16
    return [rng.integers(0, 256, int(rng.integers(3, 41))).tolist() for _ in range(n)]


def _together(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    requests = [engine.submit(p, params) for p in prompts]
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    return [[e.token_id for e in r if e.token_id is not None] for r in requests]


def test_greedy_tokens_do_not_depend_on_the_batch(tiny_runner) -> None:
    """Each of 16 requests alone, then all 16 together (rows 0..15), then in reverse order (every request at
    another row, joining while others decode): the same tokens, token for token."""
    prompts = _prompts(16)
    engine = Engine(tiny_runner)
    alone = [engine.generate(p, GREEDY).token_ids for p in prompts]
    assert sum(map(len, alone)) > 16 * 8  # not all stopping at once
    assert _together(engine, prompts) == alone
    assert _together(engine, prompts[::-1])[::-1] == alone
    # staggered: a new request joins every step, so rows prefill while others decode
    requests, k = [], 0
    while k < len(prompts) or any(r._seq.finish_reason is None for r in requests):
        if k < len(prompts):
            requests.append(engine.submit(prompts[k], GREEDY))
            k += 1
        engine.step()
    assert [[e.token_id for e in r if e.token_id is not None] for r in requests] == alone
    assert engine.kv.used_tokens == 0 and engine.kv.used_slots == 0


def test_engine_agrees_with_causal_lm_generate(tiny_runner) -> None:
    lm = CausalLM(tiny_runner.config, tiny_runner.prefiller.tensors, tiny_runner.tokenizer, max_context=128,
                  prefill_chunk=16)
    engine = Engine(tiny_runner)
    for prompt in _prompts(3, seed=1):
        want = lm.generate(prompt, max_new_tokens=24)
        got = engine.generate(prompt, GREEDY)
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_runner) -> None:
    params = SamplingParams(max_tokens=16, temperature=0.9, top_k=40, seed=7)
    engine = Engine(tiny_runner)
    prompt = _prompts(1, seed=2)[0]
    alone = engine.generate(prompt, params).token_ids
    others = _prompts(5, seed=3)
    together = _together(engine, [*others, prompt], params)
    assert together[-1] == alone
    assert alone != engine.generate(prompt, SamplingParams(max_tokens=16, temperature=0.9, top_k=40, seed=8)).token_ids


def test_cancel_frees_the_slot_and_the_others_go_on(tiny_runner) -> None:
    engine = Engine(tiny_runner)
    a, b = (engine.submit(p, SamplingParams(max_tokens=40, temperature=0.0)) for p in _prompts(2, seed=4))
    for _ in range(5):
        engine.step()
    a.cancel()
    engine.step()
    assert engine.kv.used_slots == 1
    events_a = list(a)
    assert events_a[-1].finish_reason == "cancelled"
    while b._seq.finish_reason is None:
        engine.step()
    assert list(b)[-1].finish_reason in ("length", "stop")
    assert engine.kv.used_tokens == 0


def test_preemption_recomputes_and_finishes_every_request(tiny_runner) -> None:
    """A KV budget of 160 tokens for 6 requests of up to 40 + 60 tokens: the newest are preempted, recomputed
    from prompt plus what they generated, and every request ends with all its tokens."""
    prompts = _prompts(6, seed=5)
    params = SamplingParams(max_tokens=60, temperature=0.0)
    tight = Engine(tiny_runner, token_budget=128 + 32)
    got = _together(tight, prompts, params)
    assert tight.scheduler.idle and tight.kv.used_tokens == 0
    assert tight.preemptions > 0
    want = [Engine(tiny_runner).generate(p, params).token_ids for p in prompts]
    assert [len(g) for g in got] == [len(w) for w in want]
    # recompute feeds prompt + generated through prefill: the same greedy tokens as never preempted
    assert got == want


def test_an_exception_in_a_step_fails_only_its_requests(tiny_runner, monkeypatch) -> None:
    engine = Engine(tiny_runner)
    first = engine.submit(_prompts(1, seed=6)[0], SamplingParams(max_tokens=30, temperature=0.0))
    while first._seq.filled == 0 or first._seq.state.value != "decode":
        engine.step()
    real = tiny_runner.decode
    calls = []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected fault")
        return real(*args, **kw)

    monkeypatch.setattr(tiny_runner, "decode", failing)
    engine.step()  # the decode step of `first` raises
    events = list(first)
    assert events[-1].finish_reason == "error" and "injected fault" in events[-1].error
    assert engine.kv.used_slots == 0
    later = engine.generate(_prompts(1, seed=7)[0], SamplingParams(max_tokens=8, temperature=0.0))
    assert len(later.token_ids) > 0 and engine.step_errors == 1


def test_bad_requests_are_refused(tiny_runner) -> None:
    engine = Engine(tiny_runner)
    with pytest.raises(RlxError, match="over the context"):
        engine.submit([1] * 100, SamplingParams(max_tokens=64))
    with pytest.raises(RlxError, match="token ids"):
        engine.submit([1, 9999], GREEDY)
    with pytest.raises(RlxError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_prefix_cache_skips_the_shared_prefill_and_changes_no_token(tiny_runner) -> None:
    system = np.random.default_rng(8).integers(0, 256, 50).tolist()  # three full blocks of 16, and 2 more tokens
    prompts = [system + tail for tail in ([1, 2, 3], [4, 5], [6], [7, 8, 9, 10])]
    plain = Engine(tiny_runner)
    want = [plain.generate(p, GREEDY).token_ids for p in prompts]
    cached = Engine(tiny_runner, prefix_cache_bytes=1 << 20)
    prefilled = []
    for p in prompts:
        request = cached.submit(p, GREEDY)
        n = 0
        while request._seq.finish_reason is None:
            n += sum(k for _, _, k in cached.step().prefill)
        prefilled.append(n)
        assert [e.token_id for e in request if e.token_id is not None] == want[len(prefilled) - 1]
    assert prefilled == [len(prompts[0])] + [len(p) - 48 for p in prompts[1:]]
    assert cached.prefix.hits == 48 * 3 and len(cached.prefix) == 3


def test_a_decode_row_gets_the_same_logits_bit_for_bit_in_any_batch(tiny_runner) -> None:
    """The kernels under the token test: each slot's next-token logits alone (a one-row step, or rows up to
    it) equal, bit for bit, those of a step of all 16 rows (attention split over a fixed number of
    cache-row ranges, quantized GEMV rows summed alike for up to 16 rows)."""
    rng = np.random.default_rng(9)
    for slot in range(16):  # 20 to 60 tokens: prefill chunks of 16, then decode positions of every kind
        prompt = rng.integers(0, 256, int(rng.integers(20, 61))).tolist()
        for start in range(0, len(prompt), 16):
            tiny_runner.prefill(slot, prompt[start:start + 16], start, logits=False)
    lengths = tiny_runner.cache.lengths.copy()
    tokens = rng.integers(0, 256, 16).tolist()
    alone = []
    for slot in range(16):
        tiny_runner.cache.lengths[:] = lengths
        alone.append(tiny_runner.decode([slot], [tokens[slot]], logits=True)[0])
    tiny_runner.cache.lengths[:] = lengths
    together = tiny_runner.decode(list(range(16)), tokens, logits=True)
    tiny_runner.cache.lengths[:] = lengths
    reverse = tiny_runner.decode(list(range(15, -1, -1)), tokens[::-1], logits=True)[::-1]
    for slot in range(16):
        np.testing.assert_array_equal(together[slot], alone[slot])
        np.testing.assert_array_equal(reverse[slot], alone[slot])


def test_a_fault_outside_the_model_fails_what_is_in_flight_and_the_loop_goes_on(tiny_runner, monkeypatch) -> None:
    engine = Engine(tiny_runner).start()
    try:
        real, calls = engine.scheduler.schedule, []

        def failing():
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("planning fault")
            return real()

        monkeypatch.setattr(engine.scheduler, "schedule", failing)
        with pytest.raises(RlxError, match="planning fault"):
            engine.generate([5, 6, 7], GREEDY)
        assert len(engine.generate([5, 6, 7], GREEDY).token_ids) > 0
    finally:
        engine.stop()
    assert engine.kv.used_slots == 0

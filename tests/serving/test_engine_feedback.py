"""The pipelined engine with device-side token feedback (`Engine(feedback=True)`; here over the tiny model's CPU
`PagedRunner`, where a launched step runs at once but is planned as on a GPU): a decode step is planned and
launched before the step before it lands, its rows taking their tokens from the ones that step stored for their
slots. Every request gets the tokens, text and finish reason it gets from the plain engine — greedy and seeded
sampling, stop strings and ids, max_tokens, staggered arrivals, cancels, preemption, failing steps — and every
page comes back."""

from __future__ import annotations

import pytest
from engine_steps import cancel_one_mid_run, generate_on_threads, random_prompts, run_by_hand

from rlx.errors import RlxError
from rlx.serving.engine import Engine, SamplingParams


@pytest.fixture(scope="module")
def greedy(paged_runner) -> tuple[list[list[int]], list[SamplingParams]]:
    """14 greedy prompts, of different max_tokens, some with a stop string from the middle of their own text
    (they end while the step after already holds their row)."""
    prompts = random_prompts(14, seed=7)
    plain = Engine(paged_runner)
    params = []
    for i, p in enumerate(prompts):
        text = plain.generate(p, SamplingParams(max_tokens=24)).text
        stop = text[len(text) // 2:len(text) // 2 + 3] if i % 3 == 2 and len(text) > 8 else None
        params.append(SamplingParams(max_tokens=24 - i % 5, stop=(stop,) if stop else ()))
    return prompts, params


def test_feedback_hands_out_what_the_plain_engine_does(paged_runner, greedy) -> None:
    prompts, params = greedy
    want = run_by_hand(Engine(paged_runner), prompts, params)
    engine = Engine(paged_runner, feedback=True)
    assert engine.feedback and not Engine(paged_runner).feedback  # off by default
    assert run_by_hand(engine, prompts, params) == want
    assert {reason for _, _, reason, _ in want} == {"stop", "length"}  # stop strings ended some mid-way
    assert engine.ahead_steps > 10  # most decode steps were launched ahead of the landing


def test_feedback_with_staggered_arrivals(paged_runner, greedy) -> None:
    prompts, params = greedy
    want = run_by_hand(Engine(paged_runner), prompts, params, stagger=3)
    engine = Engine(paged_runner, feedback=True)
    assert run_by_hand(engine, prompts, params, stagger=3) == want
    assert engine.ahead_steps > 0


def test_feedback_with_sampling_and_logprobs(paged_runner, greedy) -> None:
    """Seeded sampling and logprobs read logits back: their steps wait for a step boundary, and give the same."""
    prompts, params = greedy
    mixed = [SamplingParams(max_tokens=s.max_tokens, temperature=0.8, seed=i) if i % 4 == 1 else
             SamplingParams(max_tokens=s.max_tokens, logprobs=True, top_logprobs=2) if i % 4 == 3 else s
             for i, s in enumerate(params)]
    want = run_by_hand(Engine(paged_runner), prompts[:8], mixed[:8], stagger=2)
    assert run_by_hand(Engine(paged_runner, feedback=True), prompts[:8], mixed[:8], stagger=2) == want
    # once the sampled requests ended, the greedy ones go on with steps ahead
    engine = Engine(paged_runner, feedback=True)
    got = run_by_hand(engine, prompts[:8], [SamplingParams(max_tokens=3, temperature=0.8, seed=1), *mixed[:7]][:8])
    assert got == run_by_hand(Engine(paged_runner), prompts[:8],
                       [SamplingParams(max_tokens=3, temperature=0.8, seed=1), *mixed[:7]][:8])


def test_feedback_under_preemption(tiny_gguf, greedy) -> None:
    """Few pages: sequences are preempted and recomputed; the steps ahead grow pages only where they are free."""
    from rlx.serving.runner import PagedRunner

    runner = PagedRunner.from_gguf(tiny_gguf, slots=8, max_context=128, page_size=8, kv_pages=24, quant_act="f32")
    prompts, params = greedy
    plain = Engine(runner)
    want = run_by_hand(plain, prompts[:8], params[:8])
    engine = Engine(runner, feedback=True)
    assert run_by_hand(engine, prompts[:8], params[:8]) == want
    assert plain.preemptions > 0 and engine.preemptions > 0 and engine.ahead_steps > 0


def test_feedback_cancel_and_failing_steps_end_their_requests_only(paged_runner, monkeypatch) -> None:
    engine, prompts, alone = cancel_one_mid_run(paged_runner, 6, feedback=True)
    params = SamplingParams(max_tokens=16)

    real, calls = paged_runner.launch, []

    def failing(tables, rows, outputs, logits, feedback=None):
        calls.append(len(rows))
        if len(calls) == 5:  # a step launched ahead
            raise RuntimeError("device fault")
        return real(tables, rows, outputs, logits, feedback)

    monkeypatch.setattr(paged_runner, "launch", failing)
    first = engine.submit(prompts[0], params)
    while first._seq.finish_reason is None:
        engine.step()
    second = engine.submit(prompts[2], params)
    while second._seq.finish_reason is None:
        engine.step()
    engine.settle()
    assert first._seq.finish_reason == "error" and second._seq.finish_reason == "length"
    assert list(first)[-1].error == "RuntimeError: device fault" and engine.step_errors == 1
    assert [e.token_id for e in second if e.token_id is not None] == alone[2]
    assert engine.kv.used_pages == 0


def test_feedback_on_the_worker_thread(paged_runner, greedy) -> None:
    prompts, params = greedy
    engine, got, want = generate_on_threads(paged_runner, prompts, params, feedback=True)
    assert got == want and engine.kv.used_pages == 0


def test_feedback_needs_a_paged_runner_with_token_feedback(paged_runner, tiny_runner) -> None:
    for runner, kw in ((tiny_runner, {}), (paged_runner, {"speculative": "prompt_lookup"}),
                       (paged_runner, {"overlap": True})):
        with pytest.raises(RlxError, match="feedback takes a paged runner"):
            Engine(runner, feedback=True, **kw)

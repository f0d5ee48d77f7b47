"""The engine overlapping the host with the next step (`Engine(overlap=True)`, off by default; here over the tiny
model's CPU `PagedRunner`): a step is launched before the last one's events are
handed out, so a sequence whose text stops meanwhile is in the running step and its row is dropped. Every
request gets the tokens, text and finish reason it gets without overlap, pages all come back, and cancels and
failing steps end only their requests."""

from __future__ import annotations

import pytest
from engine_steps import cancel_one_mid_run, generate_on_threads, random_prompts, run_by_hand

from rlx.errors import RlxError
from rlx.serving.engine import Engine, SamplingParams


@pytest.fixture(scope="module")
def mixed(paged_runner) -> tuple[list[list[int]], list[SamplingParams]]:
    """12 prompts: greedy, sampled (seeded), and some with a stop string taken from the middle of their own
    greedy text (so they stop early, while the next step already holds their row)."""
    prompts = random_prompts(12, seed=3)
    plain = Engine(paged_runner)
    params = []
    for i, p in enumerate(prompts):
        if i % 3 == 1:
            params.append(SamplingParams(max_tokens=20, temperature=0.8, seed=i))
            continue
        text = plain.generate(p, SamplingParams(max_tokens=20)).text
        stop = text[len(text) // 2:len(text) // 2 + 3] if i % 3 == 2 and len(text) > 8 else None
        params.append(SamplingParams(max_tokens=20 - i % 4, stop=(stop,) if stop else ()))
    return prompts, params


def test_overlap_hands_out_what_a_plain_engine_does(paged_runner, mixed) -> None:
    prompts, params = mixed
    want = run_by_hand(Engine(paged_runner), prompts, params)
    engine = Engine(paged_runner, overlap=True)
    assert engine.overlap and not Engine(paged_runner).overlap  # off by default
    got = run_by_hand(engine, prompts, params)
    assert got == want
    assert {reason for _, _, reason, _ in want} == {"stop", "length"}  # stop strings ended some mid-way
    assert engine.kv.used_pages == 0 and engine.scheduler.idle


def test_overlap_on_the_worker_thread(paged_runner, mixed) -> None:
    """The engine's own thread, requests from several threads: each gets its plain tokens."""
    prompts, params = mixed
    _, got, want = generate_on_threads(paged_runner, prompts, params, overlap=True)
    assert got == want


def test_overlap_cancel_and_a_failing_step_end_their_requests_only(paged_runner, monkeypatch) -> None:
    engine, prompts, _ = cancel_one_mid_run(paged_runner, 4, overlap=True)
    params = SamplingParams(max_tokens=16)

    real, calls = paged_runner.run, []

    def failing(tables, rows, outputs, logits):
        calls.append(len(rows))
        if len(calls) == 3:
            raise RuntimeError("device fault")
        return real(tables, rows, outputs, logits)

    monkeypatch.setattr(paged_runner, "run", failing)
    first = engine.submit(prompts[0], params)
    engine.step()
    engine.step()  # the second call is in flight, the third (which fails) is launched by the next step
    second = engine.submit(prompts[2], params)
    while first._seq.finish_reason is None or second._seq.finish_reason is None:
        engine.step()
    engine.settle()
    assert first._seq.finish_reason == "error" and engine.step_errors == 1
    events = list(first)
    assert events[-1].error == "RuntimeError: device fault"
    assert engine.kv.used_pages == 0


def test_overlap_needs_a_paged_runner_without_speculation(paged_runner, tiny_runner) -> None:
    with pytest.raises(RlxError, match="overlap takes a paged runner without speculative decoding"):
        Engine(tiny_runner, overlap=True)
    with pytest.raises(RlxError, match="overlap takes a paged runner without speculative decoding"):
        Engine(paged_runner, overlap=True, speculative="prompt_lookup")

"""The engine overlapping the host with the next step (`Engine(overlap=True)`, off by default; here over the tiny
model's CPU `PagedRunner`): a step is launched before the last one's events are
handed out, so a sequence whose text stops meanwhile is in the running step and its row is dropped. Every
request gets the tokens, text and finish reason it gets without overlap, pages all come back, and cancels and
failing steps end only their requests."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rlx.errors import RlxError
from rlx.serving.engine import Engine, SamplingParams


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(3, 41))).tolist() for _ in range(n)]


def _run(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> list[tuple]:
    """All requests submitted, then stepped by hand to the end: each one's (tokens, text, finish reason)."""
    requests = [engine.submit(p, s) for p, s in zip(prompts, params)]
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    engine.settle()
    out = []
    for r in requests:
        events = []
        while not r._queue.empty():
            events.append(r._queue.get_nowait())
        assert events and events[-1].finish_reason is not None and all(e.finish_reason is None for e in events[:-1])
        out.append(([e.token_id for e in events if e.token_id is not None], "".join(e.text for e in events),
                    events[-1].finish_reason))
    return out


@pytest.fixture(scope="module")
def mixed(paged_runner) -> tuple[list[list[int]], list[SamplingParams]]:
    """12 prompts: greedy, sampled (seeded), and some with a stop string taken from the middle of their own
    greedy text (so they stop early, while the next step already holds their row)."""
    prompts = _prompts(12, seed=3)
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
    want = _run(Engine(paged_runner), prompts, params)
    engine = Engine(paged_runner, overlap=True)
    assert engine.overlap and not Engine(paged_runner).overlap  # off by default
    got = _run(engine, prompts, params)
    assert got == want
    assert {reason for _, _, reason in want} == {"stop", "length"}  # stop strings ended some mid-way
    assert engine.kv.used_pages == 0 and engine.scheduler.idle


def test_overlap_on_the_worker_thread(paged_runner, mixed) -> None:
    """The engine's own thread, requests from several threads: each gets its plain tokens."""
    prompts, params = mixed
    want = [Engine(paged_runner).generate(p, s).token_ids for p, s in zip(prompts, params)]
    got: list = [None] * len(prompts)
    with Engine(paged_runner, overlap=True) as engine:
        def one(i: int) -> None:
            got[i] = engine.generate(prompts[i], params[i]).token_ids
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert got == want


def test_overlap_cancel_and_a_failing_step_end_their_requests_only(paged_runner, monkeypatch) -> None:
    prompts = _prompts(4, seed=5)
    params = SamplingParams(max_tokens=16)
    alone = [Engine(paged_runner).generate(p, params).token_ids for p in prompts]
    engine = Engine(paged_runner, overlap=True)
    requests = [engine.submit(p, params) for p in prompts]
    for _ in range(4):
        engine.step()
    engine.cancel(requests[1])
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    engine.settle()
    reasons = [r._seq.finish_reason for r in requests]
    assert reasons == ["length", "cancelled", "length", "length"]
    tokens = [[e.token_id for e in r if e.token_id is not None] for r in requests]
    assert tokens[0] == alone[0] and tokens[2:] == alone[2:] and tokens[1] == alone[1][:len(tokens[1])]
    assert engine.kv.used_pages == 0

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

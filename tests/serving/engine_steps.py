"""Engine runs stepped by hand, shared by the tests of the engine's step variants (overlap, token feedback)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx.serving.engine import Engine, SamplingParams


def random_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts of 3..40 token ids below 256."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(3, 41))).tolist() for _ in range(n)]


def events_of(request: Any) -> tuple:
    """A finished request's (tokens, text, finish reason, logprobs), from its queued events."""
    events = []
    while not request._queue.empty():
        events.append(request._queue.get_nowait())
    assert events and events[-1].finish_reason is not None and all(e.finish_reason is None for e in events[:-1])
    return ([e.token_id for e in events if e.token_id is not None], "".join(e.text for e in events),
            events[-1].finish_reason, [e.logprob for e in events])


def run_by_hand(engine: Engine, prompts: list[list[int]], params: list[SamplingParams],
                stagger: int = 0) -> list[tuple]:
    """The requests submitted (`stagger` > 0: one every `stagger` steps), stepped by hand to the end: each one's
    `events_of`; no page left in use."""
    requests: list[Any] = []
    pending = list(zip(prompts, params))
    while pending or any(r._seq.finish_reason is None for r in requests):
        for _ in range(len(pending) if not stagger else 1):
            if pending:
                requests.append(engine.submit(*pending.pop(0)))
        for _ in range(max(stagger, 1)):
            engine.step()
    engine.settle()
    assert engine.kv.used_pages == 0 and engine.scheduler.idle
    return [events_of(r) for r in requests]


def cancel_one_mid_run(runner: Any, steps: int, **engine_kw: Any) -> tuple[Engine, list[list[int]], list[list[int]]]:
    """Four requests of 16 tokens on `Engine(runner, **engine_kw)`, the second cancelled after `steps` steps: the
    others' tokens equal their runs alone, the cancelled one's are a prefix of its own, no page stays in use.
    Returns the engine, the prompts and the tokens of each run alone (for a test's next part)."""
    prompts = random_prompts(4, seed=5)
    params = SamplingParams(max_tokens=16)
    alone = [Engine(runner).generate(p, params).token_ids for p in prompts]
    engine = Engine(runner, **engine_kw)
    requests = [engine.submit(p, params) for p in prompts]
    for _ in range(steps):
        engine.step()
    engine.cancel(requests[1])
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    engine.settle()
    assert [r._seq.finish_reason for r in requests] == ["length", "cancelled", "length", "length"]
    tokens = [[e.token_id for e in r if e.token_id is not None] for r in requests]
    assert tokens[0] == alone[0] and tokens[2:] == alone[2:] and tokens[1] == alone[1][:len(tokens[1])]
    assert engine.kv.used_pages == 0
    return engine, prompts, alone

"""The engine's host fast paths (issue 28) against the general ones, on the tiny model's CPU `PagedRunner`: plain
greedy decode rows landing in one loop (`Engine._land_tokens`) hand out the same events, end the same requests for
the same reasons and tell the observer the same counts as landing each row through `_next`, on one scripted
schedule with stop ids, stop strings, length limits, cancels, a sampled request, preemption and a prefix cache;
`StopText`'s shortcuts give what its search gives; `PagedKv.capacity` follows every slot's pages."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.serving.engine import Engine, Event, Observer, SamplingParams
from rlx.serving.pages import PagedKv, PagePool
from rlx.serving.text import StopText


class Recorder(Observer):
    """Counts what the engine reports (times are the clock's: only how many of each)."""

    def __init__(self) -> None:
        self.firsts = self.inters = self.total = 0

    def first_token(self, seconds: float) -> None:
        self.firsts += 1

    def inter_token(self, seconds: float) -> None:
        self.inters += 1

    def tokens(self, n: int) -> None:
        self.total += n


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 256, 40).tolist()  # a shared prefix (two full pages of 16) for half of them
    return [([*system] if i % 2 else []) + rng.integers(0, 256, int(rng.integers(3, 30))).tolist() for i in range(n)]


def _scripted(runner, fast: bool, prompts: list[list[int]], params: list[SamplingParams],
              cancel_at: dict[int, int]) -> tuple[list[list[Event]], Recorder, int, int]:
    """Submit a request a step (the first four at once), cancel request i at step cancel_at[i], step to the end;
    every request's events, the observer, the fast loop's calls and the preemptions."""
    observer = Recorder()
    engine = Engine(runner, kv_pages=14, prefix_cache_bytes=1 << 30, observer=observer)
    engine.fast_landing = fast
    calls = 0
    real = engine._land_tokens

    def counted(seqs, tokens):
        nonlocal calls
        calls += 1
        real(seqs, tokens)

    engine._land_tokens = counted
    requests, step = [], 0
    while len(requests) < len(prompts) or any(r._seq.finish_reason is None for r in requests):
        for _ in range(4 if step == 0 else 1):
            if len(requests) < len(prompts):
                requests.append(engine.submit(prompts[len(requests)], params[len(requests)]))
        for i, at in cancel_at.items():
            if at == step and i < len(requests):
                requests[i].cancel()
        engine.step()
        step += 1
    events = []
    for r in requests:
        got = []
        while not r._queue.empty():
            got.append(r._queue.get_nowait())
        events.append(got)
    assert engine.kv.used_pages == 0 and engine.scheduler.idle
    return events, observer, calls, engine.preemptions


@pytest.fixture(scope="module")
def script(paged_runner) -> tuple[list[list[int]], list[SamplingParams], int]:
    """10 prompts; stop strings cut from the middle of some requests' own greedy text; a stop id that some
    request meets midway; request 3 sampled (its steps return logits: the general path)."""
    prompts = _prompts(10, seed=11)
    plain = Engine(paged_runner)
    texts = [plain.generate(p, SamplingParams(max_tokens=30)) for p in prompts]
    stop_id = texts[0].token_ids[6]
    params = []
    for i, done in enumerate(texts):
        if i == 3:
            params.append(SamplingParams(max_tokens=25, temperature=0.7, seed=5))
            continue
        stop = done.text[len(done.text) // 2:len(done.text) // 2 + 2] if i % 3 == 2 and len(done.text) > 8 else None
        params.append(SamplingParams(max_tokens=30 - i, stop=(stop,) if stop else ("\u2603never\u2603",)))
    return prompts, params, stop_id


def test_fast_landing_hands_out_what_the_general_path_does(paged_runner, script, monkeypatch) -> None:
    prompts, params, stop_id = script
    monkeypatch.setattr(paged_runner, "stop_ids", frozenset({*paged_runner.stop_ids, stop_id}))
    cancel_at = {5: 9, 7: 4}  # request 5 mid-decode, request 7 as it is submitted (waiting)
    general, observed, calls, preempted = _scripted(paged_runner, False, prompts, params, cancel_at)
    assert calls == 0
    fast, fast_observed, fast_calls, fast_preempted = _scripted(paged_runner, True, prompts, params, cancel_at)
    assert fast_calls > 10 and fast_preempted == preempted > 0
    assert fast == general  # every event: token, text, logprobs, finish reason, in order
    made = fast[0][0]  # an event the fast loop built: an Event as any other, frozen
    assert type(made) is Event and vars(made) == vars(general[0][0]) and hash(made) == hash(general[0][0])
    with pytest.raises(AttributeError):
        made.text = "changed"
    reasons = {e[-1].finish_reason for e in general}
    assert general[5][-1].finish_reason == "cancelled" and [e.finish_reason for e in general[7]] == ["cancelled"]
    assert {"stop", "length", "cancelled"} <= reasons
    assert general[0][-1].finish_reason == "stop" and len(general[0]) == 7  # its 7th token is the stop id
    assert all(e.token_id != stop_id for r in general for e in r)  # a stop id is never handed out
    assert ((fast_observed.firsts, fast_observed.inters, fast_observed.total)
            == (observed.firsts, observed.inters, observed.total))
    assert observed.total == sum(e.token_id is not None for r in general for e in r)


class _Searched(StopText):
    """`StopText` without its shortcuts: every push goes through the search (`_release`)."""

    def push(self, token_id: int) -> str:
        if self._decoder is None or self.stopped:
            return ""
        self._pending += self._decoder.push(token_id)
        return self._release(final=False)


class _Utf8Tokenizer:
    """Token i is a byte of a fixed text's UTF-8 (multibyte characters come in pieces: pushes that give "")."""

    def incremental_decoder(self):
        from rlx.models.gguf_tokenizer import IncrementalDecoder

        return IncrementalDecoder(lambda i: bytes([i]))


@pytest.mark.parametrize("stop", [(), ("lo w",), ("é", "wor", "xyz"), ("d!",)])
def test_stop_text_shortcuts_give_what_the_search_gives(stop) -> None:
    data = "hello wörld, héllo world!".encode()
    fast, searched = StopText(_Utf8Tokenizer(), stop), _Searched(_Utf8Tokenizer(), stop)
    assert [fast.push(b) for b in data] == [searched.push(b) for b in data]
    assert (fast.stopped, fast.flush()) == (searched.stopped, searched.flush())


def test_paged_kv_capacity_follows_the_pages() -> None:
    kv = PagedKv(PagePool(num_pages=12, page_size=4), max_seqs=3, max_context=16)
    rng = np.random.default_rng(2)
    slots: list[int] = []
    for _ in range(300):
        op = rng.integers(0, 4)
        if op == 0 and (slot := kv.allocate(int(rng.integers(1, 17)))) is not None:
            slots.append(slot)
        elif op == 1 and slots:
            kv.grow(slots[int(rng.integers(len(slots)))], int(rng.integers(1, 17)))
        elif op == 2 and slots:
            kv.truncate(slots[int(rng.integers(len(slots)))], int(rng.integers(0, 17)))
        elif op == 3 and slots:
            kv.free(slots.pop(int(rng.integers(len(slots)))))
        for s in range(3):
            held = kv._pages[s]
            assert kv.capacity[s] == (0 if held is None else len(held) * 4)


def test_a_shared_page_among_many_rows_is_copied_before_it_is_written(paged_runner) -> None:
    """Past a few sequences a step looks up the pages its rows write at once (`Engine._rows`): a decoding
    sequence's page that another holder shares (here held once more by hand, as a cached page is) among six rows
    is still found and copied first (the sequence's table names a page of its own, the shared one keeps its other
    holder), and every request gets the tokens it gets alone."""
    prompts = _prompts(6, seed=2)
    params = SamplingParams(max_tokens=12)
    want = [Engine(paged_runner).generate(p, params).token_ids for p in prompts]
    engine = Engine(paged_runner)
    requests = [engine.submit(p, params) for p in prompts]
    while not all(r._seq.generated for r in requests):
        engine.step()
    seq = requests[3]._seq
    index = seq.filled // engine.kv.page_size  # the page its next decode row writes into
    page = engine.kv.pages(seq.slot)[index]
    engine.kv.pool.share([page])
    engine.step()
    assert engine.kv.pages(seq.slot)[index] != page and engine.kv.pool.refs[page] == 1
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    assert [[e.token_id for e in r if e.token_id is not None] for r in requests] == want
    engine.kv.pool.release([page])
    assert engine.kv.free_pages == paged_runner.kv_pages

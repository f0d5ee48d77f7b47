"""The engine over the paged KV cache (`PagedRunner` on the tiny model): each iteration is one model call of
decode rows and prefill tokens together; greedy tokens do not depend on the batch, the chunking or the pages a
sequence holds (token for token); pages go back when sequences end, are shared by a repeated prefix, and run out
into preemption and recompute; a fault in a step fails only its requests."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.serving.engine import Engine, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)  # lengths 3..40: up to three pages of 16
    return [rng.integers(0, 256, int(rng.integers(3, 41))).tolist() for _ in range(n)]


def _tokens(requests) -> list[list[int]]:
    return [[e.token_id for e in r if e.token_id is not None] for r in requests]


def _together(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    requests = [engine.submit(p, params) for p in prompts]
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    return _tokens(requests)


@pytest.fixture(scope="module")
def alone(paged_runner) -> list[list[int]]:
    engine = Engine(paged_runner)
    return [engine.generate(p, GREEDY).token_ids for p in _prompts(16)]


def test_one_call_a_step_and_greedy_tokens_do_not_depend_on_the_batch(paged_runner, alone, monkeypatch) -> None:
    """16 requests together, in reverse order, and staggered (one joins every step, so its prefill tokens share
    steps with the others' decode rows): each gets the tokens it gets alone, and every step is one call."""
    prompts = _prompts(16)
    assert sum(map(len, alone)) > 16 * 8
    engine = Engine(paged_runner)
    assert _together(engine, prompts) == alone
    assert _together(engine, prompts[::-1])[::-1] == alone
    calls, mixed = [], []
    real = paged_runner.run

    def counted(tables, rows, outputs, logits):
        calls.append(len(rows))
        return real(tables, rows, outputs, logits)

    monkeypatch.setattr(paged_runner, "run", counted)
    requests, k, steps = [], 0, 0
    while k < len(prompts) or any(r._seq.finish_reason is None for r in requests):
        if k < len(prompts):
            requests.append(engine.submit(prompts[k], GREEDY))
            k += 1
        plan = engine.step()
        steps += not plan.empty
        mixed.append(bool(plan.decode and plan.prefill))
    assert _tokens(requests) == alone
    assert len(calls) == steps and max(calls) <= paged_runner.max_rows  # one call per step, within its rows
    assert sum(mixed) > 5  # decode rows and prefill tokens in the same call
    assert engine.kv.used_pages == 0 and engine.kv.free_pages == paged_runner.kv_pages


def test_padded_calls_give_the_same_tokens(paged_runner, alone, monkeypatch) -> None:
    """Calls padded to multiples of 8 rows by repeating their last row (what a CUDA runner does, `padded_rows`):
    the repeated row writes the same K/V to the same place and its output is dropped, so every request gets the
    tokens it gets alone; the calls did run padded."""
    ran = []
    real_step = paged_runner.lm.step_greedy

    def step_greedy(tokens, cache, rows, **kw):
        ran.append(tokens.shape[0])
        return real_step(tokens, cache, rows, **kw)

    monkeypatch.setattr(paged_runner, "padded_rows", lambda n: min(-(-n // 8) * 8, paged_runner.call_rows))
    monkeypatch.setattr(paged_runner.lm, "step_greedy", step_greedy)
    assert _together(Engine(paged_runner), _prompts(16)) == alone
    assert ran and all(n % 8 == 0 for n in ran)


@pytest.mark.parametrize("max_stall", [None, 0, 1])
def test_max_stall_changes_the_steps_not_the_tokens(paged_runner, alone, max_stall) -> None:
    """Whether decode rows go first (None, 0) or prompts' prefill does (a decoding sequence waiting at most
    `max_stall` steps): the same greedy tokens as alone."""
    engine = Engine(paged_runner, max_stall=max_stall)
    assert engine.scheduler.max_stall == max_stall
    assert _together(engine, _prompts(16)) == alone


def test_paged_engine_agrees_with_the_contiguous_engine(paged_runner, tiny_runner, alone) -> None:
    contiguous = Engine(tiny_runner)
    assert [contiguous.generate(p, GREEDY).token_ids for p in _prompts(16)[:4]] == alone[:4]


def test_a_repeated_prefix_shares_its_pages_and_changes_no_token(paged_runner) -> None:
    system = np.random.default_rng(8).integers(0, 256, 50).tolist()  # three full pages of 16, and 2 more tokens
    prompts = [system + tail for tail in ([1, 2, 3], [4, 5], [6], [7, 8, 9, 10])]
    want = [Engine(paged_runner).generate(p, GREEDY).token_ids for p in prompts]
    engine = Engine(paged_runner, prefix_cache_bytes=1 << 20)
    first = engine.generate(prompts[0], GREEDY)
    assert first.token_ids == want[0] and engine.kv.used_pages == 0 and engine.kv.cached_pages >= 3
    requests = [engine.submit(p, GREEDY) for p in prompts[1:]]
    engine.step()  # admitted: each holds the three cached pages, shared (no copy)
    shared = [engine.kv.pages(r._seq.slot)[:3] for r in requests]
    assert shared[0] == shared[1] == shared[2] and all(engine.kv.pool.refs[p] == 4 for p in shared[0])
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    assert _tokens(requests) == want[1:]
    assert engine.prefix.hits == 48 * 3
    assert engine.kv.used_pages == 0
    engine.prefix.clear()
    assert engine.kv.free_pages == paged_runner.kv_pages


def test_pages_run_out_into_preemption_and_cached_pages_are_reclaimed(paged_runner) -> None:
    """12 pages (192 tokens) for 6 requests of up to 40 + 60 tokens: the newest are preempted and recomputed, every
    request ends with the tokens it gets unhindered; cached prefix pages give way before anyone is preempted."""
    prompts = _prompts(6, seed=5)
    params = SamplingParams(max_tokens=60, temperature=0.0)
    want = [Engine(paged_runner).generate(p, params).token_ids for p in prompts]
    tight = Engine(paged_runner, kv_pages=12, prefix_cache_bytes=1 << 30)
    assert _together(tight, prompts, params) == want
    assert tight.preemptions > 0 and tight.scheduler.idle and tight.kv.used_pages == 0
    assert tight.prefix.evictions > 0  # cached pages reclaimed when the pool ran short
    assert tight.kv.cached_pages + tight.kv.free_pages == 12


def test_cancel_and_a_failing_step_free_their_pages(paged_runner, monkeypatch) -> None:
    engine = Engine(paged_runner)
    a, b = (engine.submit(p, SamplingParams(max_tokens=40)) for p in _prompts(2, seed=4))
    for _ in range(5):
        engine.step()
    a.cancel()
    engine.step()
    assert list(a)[-1].finish_reason == "cancelled" and engine.kv.used_slots == 1
    real, calls = paged_runner.run, []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected fault")
        return real(*args, **kw)

    monkeypatch.setattr(paged_runner, "run", failing)
    engine.step()
    events = list(b)
    assert events[-1].finish_reason == "error" and "injected fault" in events[-1].error
    assert engine.kv.used_pages == 0 and engine.kv.used_slots == 0
    assert len(engine.generate(_prompts(1, seed=7)[0], SamplingParams(max_tokens=8)).token_ids) == 8


def test_copy_on_write_copies_a_shared_page_in_every_layer(paged_runner) -> None:
    """A sequence about to write into a page another holder shares gets its own copy first (every layer's K and
    V of that page), and the shared page is left as it was."""
    kv = paged_runner.kv_store()
    a = kv.allocate(20)
    page = kv.pages(a)[0]
    paged_runner.run(kv.tables, [(a, t, i) for i, t in enumerate(range(40, 56))], [15], logits=False)
    before = {name: arr[page].copy() for name, arr in paged_runner.cache.arrays.items()}
    b = kv.allocate(20)
    kv.adopt(b, [page])
    assert kv.writable(b, 10, 12)  # b writes into the shared page: copied first
    mine = kv.pages(b)[0]
    assert mine != page and kv.pool.refs[page] == 1 and kv.tables[b, 0] == mine
    for name, arr in paged_runner.cache.arrays.items():
        np.testing.assert_array_equal(arr[mine], before[name])
        np.testing.assert_array_equal(arr[page], before[name])
    kv.free(a)
    kv.free(b)
    assert kv.used_pages == 0 and kv.free_pages == paged_runner.kv_pages


def test_more_sequences_than_the_invariant_rows_decode_as_they_would_alone(tiny_gguf, alone) -> None:
    """With more slots than `DECODE_ROWS` (`rlxc serve --max-seqs 20`) a step of 20 rows still gives each row the
    decode GEMV's arithmetic (past 16 rows the quantized matmuls take dequantized panels and the GEMM): 20
    requests together, a chunk's tokens split across the slices, get the tokens each gets alone."""
    from rlx.serving.runner import PagedRunner

    wide = PagedRunner.from_gguf(tiny_gguf, slots=20, max_context=128, page_size=16, quant_act="f32")
    assert wide.max_rows == 20 > PagedRunner.DECODE_ROWS
    kv = wide.kv_store()
    slots = [kv.allocate(40) for _ in range(20)]
    one = wide.run(kv.tables, [(slots[0], 5, 0)], [0], logits=True)
    rows = [(s, 5 + i, 0) for i, s in enumerate(slots)]
    np.testing.assert_array_equal(wide.run(kv.tables, rows, [19, 0], logits=True)[1], one[0])
    # a 20-row step: 4 decode rows and a 16-token chunk, its last output row past the first slice
    chunk = [(slots[5], 40 + i, i) for i in range(16)]
    both = wide.run(kv.tables, [(s, 9, 1) for s in slots[:4]] + chunk, [3, 19], logits=False)
    assert both.tolist()[1] == int(wide.run(kv.tables, chunk, [15], logits=False)[0])
    prompts = _prompts(20)
    assert _together(Engine(wide), prompts)[:16] == alone


def test_integer_activations_keep_tokens_independent_of_the_batch(tiny_gguf) -> None:
    """`rlxc serve`'s default on CPUs with AVX-512 VNNI (`quant_act="q16"`, int16 activations): each row is quantized
    on its own and its integer block products are summed in block order whatever the other rows of a call (up to
    the 16 a CPU call takes), so 16 requests together, in either order, get the tokens each gets alone, and a
    decode row's logits are the same bits alone and in a full call."""
    from rlx.serving.runner import PagedRunner

    runner = PagedRunner.from_gguf(tiny_gguf, slots=16, max_context=128, page_size=16, quant_act="q16")
    assert runner.lm.quant_act == "q16"
    kv = runner.kv_store()
    slots = [kv.allocate(40) for _ in range(16)]
    one = runner.run(kv.tables, [(slots[3], 7, 0)], [0], logits=True)
    full = runner.run(kv.tables, [(s, 7 if i == 3 else 11 + i, 0) for i, s in enumerate(slots)], [3], logits=True)
    np.testing.assert_array_equal(full[0], one[0])
    for s in slots:
        kv.free(s)
    alone = [Engine(runner).generate(p, GREEDY).token_ids for p in _prompts(16, seed=3)]
    assert sum(map(len, alone)) > 16 * 8
    assert _together(Engine(runner), _prompts(16, seed=3)) == alone
    assert _together(Engine(runner), _prompts(16, seed=3)[::-1])[::-1] == alone

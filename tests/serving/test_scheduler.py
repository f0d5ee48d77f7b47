"""The scheduler alone, with a fake clock and a SlotKv: admission, chunked prefill under the token budget,
preemption of the newest when KV runs out, the bounded queue, and times of first tokens."""

from __future__ import annotations

import pytest

from rlx.serving.kv import SlotKv
from rlx.serving.scheduler import QueueFull, Scheduler, State


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _run(s: Scheduler, plan, token: int = 7) -> None:
    """What the engine does with a plan: chunks land in the cache, rows produce tokens."""
    for seq in plan.decode:
        s.decoded(seq)
        s.append(seq, token)
    for seq, _, n in plan.prefill:
        s.prefilled(seq, n)
        if seq.state is State.DECODE:
            s.append(seq, token)


def test_admission_waits_for_a_free_slot() -> None:
    clock = FakeClock()
    s = Scheduler(SlotKv(slots=2, max_context=64), chunk=8, max_step_tokens=64, clock=clock)
    a, b, c = (s.add([1] * 5, max_new=4) for _ in range(3))
    plan = s.schedule()
    assert [q for q, _, _ in plan.prefill] == [a, b] and (a.slot, b.slot) == (0, 1)
    assert c.state is State.WAITING
    _run(s, plan)
    clock.now = 100.5
    plan = s.schedule()
    assert plan.decode == [a, b] and plan.prefill == []  # no slot for c yet
    s.finish(a, "stop")
    plan = s.schedule()
    assert plan.decode == [b] and [(q, start, n) for q, start, n in plan.prefill] == [(c, 0, 5)]
    assert c.slot == 0  # the lowest free slot: running rows stay packed
    assert a.first_token_at == 100.0 and a.arrival == 100.0


def test_chunked_prefill_is_aligned_and_shares_the_budget_with_decode_rows() -> None:
    s = Scheduler(SlotKv(slots=4, max_context=64), chunk=8, max_step_tokens=10, clock=FakeClock())
    short = s.add([1, 2], max_new=8)
    _run(s, s.schedule())
    assert short.state is State.DECODE
    long = s.add(list(range(20)), max_new=4)
    chunks = []
    while long.state is not State.DECODE:
        plan = s.schedule()
        assert len(plan.decode) + sum(n for _, _, n in plan.prefill) <= 10  # the token budget
        assert plan.decode == [short]  # decoding goes on between the chunks
        chunks += [(start, n) for q, start, n in plan.prefill if q is long]
        _run(s, plan)
    assert chunks == [(0, 8), (8, 8), (16, 4)]


def test_split_chunks_fill_the_rows_the_decode_rows_leave_over_pages() -> None:
    """Over a paged store with `split_chunks` (a runner whose rows are computed alike in any step): a prompt
    prefills in every step, cut to the rows three decoding sequences leave, and the pages follow the tokens."""
    from rlx.serving.pages import PagedKv, PagePool

    kv = PagedKv(PagePool(num_pages=16, page_size=4), max_seqs=4, max_context=32)
    s = Scheduler(kv, chunk=8, max_step_tokens=8, clock=FakeClock(), split_chunks=True)
    running = [s.add([i + 1] * 3, max_new=12) for i in range(3)]
    first = s.schedule()
    assert [n for _, _, n in first.prefill] == [3, 3, 2]  # the third prompt cut to the 8 rows' budget
    while not all(q.state is State.DECODE for q in running):
        _run(s, first)
        first = s.schedule()
    long = s.add(list(range(20)), max_new=4)
    chunks = []
    while long.state is not State.DECODE:
        plan = s.schedule()
        assert plan.decode == running and len(plan.decode) + sum(n for _, _, n in plan.prefill) <= 8
        chunks += [(start, n) for q, start, n in plan.prefill if q is long]
        _run(s, plan)
    assert chunks == [(0, 5), (5, 3), (8, 5), (13, 3), (16, 4)]  # 8 - 3 decode rows, then up to a chunk's end
    held = kv.pages(long.slot)
    assert len(set(held)) == 5 and kv.tables[long.slot, :5].tolist() == held  # 20 tokens in pages of 4
    assert kv.used_pages == 5 + sum(-(-q.filled // 4) for q in running)  # each grown to the tokens it holds


def test_the_newest_is_preempted_when_kv_runs_out_and_recomputed_later() -> None:
    s = Scheduler(SlotKv(slots=3, max_context=16, token_budget=24), chunk=16, max_step_tokens=64, clock=FakeClock())
    old, new = s.add([1] * 10, max_new=6), s.add([2] * 10, max_new=6)
    plan = s.schedule()
    assert [q for q, _, _ in plan.prefill] == [old, new]  # 10 + 10 tokens of 24
    _run(s, plan)
    assert new.state is State.DECODE and s.kv.used_tokens == 20
    preempted = []
    for _ in range(4):
        plan = s.schedule()
        preempted += plan.preempted
        _run(s, plan)
    # steps grow both to 11, then 12 (24 tokens); old's 13th preempts new, whose slot old's rows take
    assert preempted == [new] and new.state is State.WAITING and s.waiting[0] is new
    assert old.state is State.DECODE and s.kv.used_tokens == old.filled  # new (13 tokens) does not fit again yet
    assert new.preemptions == 1 and new.slot is None and new.filled == 0
    generated = list(new.generated)
    s.finish(old, "length")
    plan = s.schedule()
    # recompute: its prompt plus what it generated, in one chunk
    assert [(q, start, n) for q, start, n in plan.prefill] == [(new, 0, 10 + len(generated))]
    assert new.context == [2] * 10 + generated


def test_the_queue_is_bounded_and_finish_frees_waiting_and_running() -> None:
    s = Scheduler(SlotKv(slots=1, max_context=16), chunk=8, max_step_tokens=8, max_waiting=2, clock=FakeClock())
    a, b = s.add([1], max_new=2), s.add([1], max_new=2)
    with pytest.raises(QueueFull, match="2 requests are already waiting"):
        s.add([1], max_new=2)
    s.schedule()
    s.finish(b, "cancelled")  # waiting
    s.finish(a, "cancelled")  # running
    assert s.idle and s.kv.used_slots == 0 and s.kv.used_tokens == 0


def test_a_prefix_hit_starts_prefill_after_the_reused_blocks() -> None:
    reused = {}

    def reuse(seq):
        reused[seq.id] = 8 if seq.prompt[:8] == list(range(8)) else 0
        return reused[seq.id]

    s = Scheduler(SlotKv(slots=2, max_context=64), chunk=8, max_step_tokens=64, clock=FakeClock(), reuse=reuse)
    hit, miss = s.add(list(range(20)), max_new=2), s.add([9] * 20, max_new=2)
    plan = s.schedule()
    assert [(q, start, n) for q, start, n in plan.prefill] == [(hit, 8, 8), (miss, 0, 8)]
    assert reused == {hit.id: 8, miss.id: 0}


def test_lookahead_takes_the_rows_prefill_leaves_and_the_pages_there_are() -> None:
    """Speculative decoding's proposals: each decoding sequence asks (`lookahead`); prefill and admission come
    first, proposals get the rows left in order, each within the KV room it can grow to, and nobody is preempted
    for one."""
    from rlx.serving.pages import PagedKv, PagePool

    kv = PagedKv(PagePool(num_pages=6, page_size=4), max_seqs=3, max_context=16)
    asks = {}
    s = Scheduler(kv, chunk=4, max_step_tokens=8, clock=FakeClock(), split_chunks=True,
                  lookahead=lambda seq: asks[seq.id])
    a, b = s.add([1] * 3, max_new=8), s.add([2] * 3, max_new=8)
    asks.update({a.id: 5, b.id: 5})
    _run(s, s.schedule())  # both prompts in (6 of 8 rows); nobody decodes yet: no proposals
    plan = s.schedule()
    assert plan.decode == [a, b] and plan.drafts == [5, 1]  # 8 rows: 2 decode rows, 5 + 1 proposals
    assert len(kv.pages(a.slot)) == 3 and len(kv.pages(b.slot)) == 2  # a grew to 3 + 1 + 5 = 9 tokens
    kv.truncate(a.slot, a.filled + 1)  # (as the engine does after verifying: back to the tokens kept)
    kv.truncate(b.slot, b.filled + 1)
    c = s.add([3] * 10, max_new=2)
    asks[c.id] = 0
    plan = s.schedule()  # c is admitted (3 of the 4 free pages), its first chunk takes 4 of the 6 rows left
    assert plan.prefill == [(c, 0, 4)] and plan.drafts == [2, 0] and kv.free_pages == 0  # a took the last page
    s.prefilled(c, 4)
    asks.update({a.id: 0, b.id: 4})
    plan = s.schedule()  # 2 rows left for b's proposals, but no page to grow into: none, and nobody preempted
    assert plan.prefill == [(c, 4, 4)] and plan.drafts == [0, 0] and not plan.preempted
    assert len(kv.pages(b.slot)) == 1


def test_prefill_first_keeps_a_bursts_steps_full_and_every_decoder_gets_a_row_within_max_stall() -> None:
    """`max_stall` (the paged engine's policy): 16 prompts of 29 tokens submitted at once over 16-row steps all
    get their first token within 32 steps (decode rows first: 74), the burst takes 95 steps (the rows need at
    least 92; decode rows first: 137, 64 of them not full), no decoding sequence waits more than `max_stall`
    steps for a row, and every page comes back."""
    from rlx.serving.pages import PagedKv, PagePool

    def burst(max_stall):
        kv = PagedKv(PagePool(num_pages=128, page_size=16), max_seqs=16, max_context=128)
        clock = FakeClock()
        s = Scheduler(kv, chunk=16, max_step_tokens=16, clock=clock, split_chunks=True, max_stall=max_stall)
        seqs = [s.add([i + 1] * 29, max_new=64) for i in range(16)]
        rows, gaps = [], [0]
        while not s.idle:
            plan = s.schedule()
            rows.append(len(plan.decode) + sum(n for _, _, n in plan.prefill))
            assert rows[-1] <= 16
            gaps += [q.stalled for q in s.running if q.state is State.DECODE and q not in plan.decode]
            _run(s, plan)
            clock.now += 1
            for q in [q for q in s.running if len(q.generated) >= q.max_new]:
                s.finish(q, "length")
        assert [len(q.generated) for q in seqs] == [64] * 16 and kv.used_pages == 0
        # the step (from 1) of the last first token
        return rows, max(q.first_token_at for q in seqs) - 100 + 1, max(gaps)

    rows, last_first_token, longest_stall = burst(max_stall=4)
    assert len(rows) == 95 and sum(r < 16 for r in rows) == 6
    assert last_first_token == 32 and longest_stall == 4
    rows, last_first_token, longest_stall = burst(max_stall=None)  # decode rows first
    assert len(rows) == 137 and sum(r < 16 for r in rows) == 64 and last_first_token == 74 and longest_stall == 0


@pytest.mark.parametrize("max_stall", [None, 4])
def test_the_steady_plan_is_the_general_plan(max_stall) -> None:
    """The one-pass plan of the common case (`Scheduler._steady`: nobody waits, everyone decodes) equals the
    general path's, step for step, over a paged store of few pages (sequences grow across pages, run out and are
    preempted) with bursts of arrivals and ends in between: the same decode rows, prefill chunks, preemptions,
    stall counts and block tables; the steady plan is taken in many steps, some right after sequences stalled."""
    import numpy as np

    from rlx.serving.pages import PagedKv, PagePool

    def make():
        kv = PagedKv(PagePool(num_pages=28, page_size=4), max_seqs=6, max_context=64)
        return Scheduler(kv, chunk=4, max_step_tokens=6, clock=FakeClock(), split_chunks=True, max_stall=max_stall)

    fast, general = make(), make()
    general._steady = lambda: None
    real, counts = fast._steady, {"steady": 0, "after_stalls": 0}

    def counted():
        stalled = any(q.stalled for q in fast.running)
        plan = real()
        if plan is not None and not plan.empty:
            counts["steady"] += 1
            counts["after_stalls"] += stalled
        return plan

    fast._steady = counted
    rng = np.random.default_rng(1)
    steps = preempted = 0
    for step in range(400):
        if step % 80 < 12 and rng.random() < 0.6:  # a burst every 80 steps
            prompt, max_new = rng.integers(1, 50, int(rng.integers(1, 12))).tolist(), int(rng.integers(4, 40))
            for s in (fast, general):
                s.add(prompt, max_new)
        plans = [s.schedule() for s in (fast, general)]
        a, b = ([[q.id for q in p.decode], [(q.id, st, n) for q, st, n in p.prefill], [q.id for q in p.preempted]]
                for p in plans)
        assert a == b
        assert [q.stalled for q in fast.running] == [q.stalled for q in general.running]
        np.testing.assert_array_equal(fast.kv.tables, general.kv.tables)
        for s, plan in zip((fast, general), plans):
            _run(s, plan, token=step)
            for q in [q for q in s.running if len(q.generated) >= q.max_new]:
                s.finish(q, "length")
        steps += not plans[0].empty
        preempted += len(plans[0].preempted)
    assert steps > 200 and counts["steady"] > steps // 3 and preempted > 0
    assert counts["after_stalls"] > 0 or max_stall is None

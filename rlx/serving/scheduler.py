"""Iteration-level scheduling: which sequences decode, which prefill a chunk, who is admitted or preempted.

Every engine iteration asks `Scheduler.schedule()` for a `Plan`: one decode row for each running
sequence whose prompt is in the cache, plus prefill chunks of admitted sequences under a token
budget (`max_step_tokens`, a decode row costing one token). Prefill goes in chunks aligned to
`chunk` tokens (so a sequence's chunks are the same whatever else runs: its results do not depend
on the load). Waiting sequences are admitted first come, first served while a slot and their tokens
fit the `KvStore`; when the running sequences' next tokens do not fit, the newest is preempted:
its storage is freed and it goes back to the front of the queue, to be recomputed (prompt plus
what it generated) when there is room again. The scheduler holds no model: it is tested with a
fake clock and a `SlotKv` alone. With `split_chunks` (a runner whose rows are computed alike in
any step: `PagedRunner`) a chunk may be cut to what the budget leaves after the decode rows, so a
waiting prompt makes progress in every step that has room. With `max_stall` prefill comes first and
decoding sequences fill the rows left, one that went `max_stall` steps without a row first: a burst's
prompts all start early and decode together in full steps, and no decoding sequence waits more than
`max_stall` steps for a row. With `lookahead` (speculative decoding) a
decoding sequence may ask for rows and KV room for tokens proposed after its own: what the rows left
after prefill and admission allow, and the pages, grant (`Plan.drafts`; nobody is preempted for them).

>>> from rlx.serving.kv import SlotKv
>>> s = Scheduler(SlotKv(slots=2, max_context=16), chunk=4, max_step_tokens=6, clock=lambda: 0.0)
>>> a = s.add([1, 2, 3, 4, 5, 6], max_new=2)
>>> plan = s.schedule(); [(q.id, start, n) for q, start, n in plan.prefill], plan.decode
([(0, 0, 4)], [])
>>> s.prefilled(a, 4); [(q.id, start, n) for q, start, n in s.schedule().prefill]
[(0, 4, 2)]
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rlx.errors import RlxError
from rlx.serving.kv import KvStore


class State(Enum):
    WAITING = "waiting"
    PREFILL = "prefill"  # admitted, its context partly in the cache
    DECODE = "decode"  # its whole context but the last token in the cache
    DONE = "done"


@dataclass(eq=False)
class Seq:
    """One sequence: its prompt, what it generated, and where it stands.

    `context` (prompt + generated) is what the model has seen or must see: while decoding, the
    cache holds all of it but the last token, which the next decode row feeds; `filled` counts the
    context tokens in the cache.
    """

    id: int
    prompt: list[int]
    max_new: int
    arrival: float
    generated: list[int] = field(default_factory=list)
    state: State = State.WAITING
    slot: int | None = None
    filled: int = 0
    preemptions: int = 0
    stalled: int = 0  # steps in a row this sequence decoded no token though it could (`max_stall`)
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    payload: Any = None  # the engine's per-request state (sampler, detokenizer, sink)

    @property
    def context(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def length(self) -> int:
        """len(context), without building it (the engine asks every step, for every row)."""
        return len(self.prompt) + len(self.generated)

    @property
    def last(self) -> int:
        """context[-1]: the token a decode row feeds."""
        return self.generated[-1] if self.generated else self.prompt[-1]


@dataclass(frozen=True)
class Plan:
    """One iteration's work: decode rows, then prefill chunks `(seq, start, n_tokens)`; who was preempted."""

    decode: list[Seq]
    prefill: list[tuple[Seq, int, int]]
    preempted: list[Seq]
    #: tokens each decode row's sequence may verify after its own (speculative decoding), in `decode`'s order
    drafts: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


class QueueFull(RlxError):
    """More sequences waiting than the scheduler's `max_waiting`."""


class Scheduler:
    """Admission, chunked prefill and preemption over a `KvStore` (see the module docstring)."""

    def __init__(self, kv: KvStore, *, chunk: int, max_step_tokens: int, max_waiting: int = 256,
                 clock: Callable[[], float], reuse: Callable[[Seq], int] | None = None,
                 split_chunks: bool = False, lookahead: Callable[[Seq], int] | None = None,
                 max_stall: int | None = None) -> None:
        if chunk < 1 or max_step_tokens < 1 or max_waiting < 0:
            raise RlxError(f"chunk and max_step_tokens must be >= 1 and max_waiting >= 0, got {chunk}, "
                           f"{max_step_tokens}, {max_waiting}")
        if max_stall is not None and max_stall < 0:
            raise RlxError(f"max_stall must be None or >= 0, got {max_stall!r}")
        self.kv, self.chunk, self.max_step_tokens, self.max_waiting = kv, chunk, max_step_tokens, max_waiting
        self.clock = clock
        self.split_chunks = split_chunks
        # at admission: how many context tokens are already in the new slot (a prefix cache hit; a multiple
        # of `chunk`, below the context's length)
        self.reuse = reuse
        # how many proposed tokens a decoding sequence would verify after its own this step (0: none)
        self.lookahead = lookahead
        # None: every decoding sequence's row comes first, prefill takes the rows left. A number: prefill and
        # admission come first (so a burst's prompts all start early and decode together in full steps) and
        # decoding sequences fill the rows left, but one that went `max_stall` steps without a row takes its
        # row before any prefill
        self.max_stall = max_stall
        self.waiting: deque[Seq] = deque()
        self._stalls = False  # some sequence may have `stalled` > 0 (since the last step that gave all a row)
        self.running: list[Seq] = []  # admission order: the last is the newest
        self._ids = itertools.count()

    def add(self, prompt: Sequence[int], max_new: int, payload: Any = None) -> Seq:
        """Queue a sequence; `QueueFull` past `max_waiting` waiting ones."""
        if len(self.waiting) >= self.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting (the queue holds {self.max_waiting})")
        seq = Seq(next(self._ids), list(prompt), max_new, self.clock(), payload=payload)
        self.waiting.append(seq)
        return seq

    def schedule(self) -> Plan:
        plan = self._steady()
        if plan is not None:
            return plan
        preempted: list[Seq] = []
        decode = [s for s in self.running if s.state is State.DECODE]
        # each decoding sequence needs room for one more token; else the newest goes back to the queue
        while decode:
            short = self._short(decode)
            if short is None:
                break
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            decode = [s for s in decode if s is not victim]
        ready = decode
        if self.max_stall is not None:  # prefill first: only the decoding sequences due a row go before it
            decode = [s for s in ready if s.stalled >= self.max_stall]
        budget = self.max_step_tokens - len(decode)
        prefill: list[tuple[Seq, int, int]] = []
        for seq in [s for s in self.running if s.state is State.PREFILL]:
            budget = self._chunk(seq, budget, prefill, decode)
        while self.waiting and budget > 0 and not preempted:
            seq = self.waiting[0]
            slot = self.kv.allocate(seq.length)
            if slot is None:
                break
            self.waiting.popleft()
            seq.state, seq.slot, seq.filled = State.PREFILL, slot, 0
            if self.reuse is not None:
                seq.filled = self.reuse(seq)
            self.running.append(seq)
            budget = self._chunk(seq, budget, prefill, decode)
        if self.max_stall is not None:
            decode, budget = self._fill(ready, decode, budget)
        drafts: list[int] = []
        if self.lookahead is not None:
            for seq in decode:
                drafts.append(self._draft(seq, budget))
                budget -= drafts[-1]
        return Plan(decode, prefill, preempted, drafts)

    def _steady(self) -> Plan | None:
        """The common case in one pass, or None: nobody waits, every running sequence decodes and they all fit the
        step (no lookahead), each grown by its next token (over a store that tells its `capacity`). The plan is
        `schedule`'s for that state: every sequence a decode row in admission order, none stalled. None as soon as
        one is not decoding or cannot grow (the general path then grows the same sequences again: a no-op)."""
        kv, running = self.kv, self.running
        capacity = getattr(kv, "capacity", None)
        if capacity is None or self.waiting or self.lookahead is not None or len(running) > self.max_step_tokens:
            return None
        decoding = State.DECODE
        for s in running:
            if s.state is not decoding or (s.filled >= capacity[s.slot] and not kv.grow(s.slot, s.filled + 1)):
                return None
        if self._stalls:  # someone went without a row since the last full step
            for s in running:
                s.stalled = 0
            self._stalls = False
        return Plan(list(running), [], [], [])

    def _short(self, decode: list[Seq]) -> Seq | None:
        """The first of `decode` whose storage cannot grow by its next token (the others grown), or None. A store
        that tells how many tokens each slot holds room for (`PagedKv.capacity`) is asked to grow only the slots
        at the end of their room (a sequence's every `page_size` tokens)."""
        kv = self.kv
        capacity = getattr(kv, "capacity", None)
        if capacity is None:
            return next((s for s in decode if not kv.grow(s.slot, s.filled + 1)), None)
        return next((s for s in decode if s.filled >= capacity[s.slot] and not kv.grow(s.slot, s.filled + 1)), None)

    def _fill(self, ready: list[Seq], due: list[Seq], budget: int) -> tuple[list[Seq], int]:
        """Prefill first: the rows left go to the other decoding sequences, the longest stalled first; the step's
        decode rows (in admission order) and the budget left. Whoever got no row has waited one more step."""
        chosen = set(due)  # a Seq hashes by identity (eq=False)
        if len(ready) - len(chosen) <= budget:  # every ready sequence gets its row: none waits
            for seq in ready:
                seq.stalled = 0
            self._stalls = False
            return list(ready), budget - (len(ready) - len(chosen))
        for seq in sorted((s for s in ready if s not in chosen), key=lambda s: -s.stalled)[:max(budget, 0)]:
            chosen.add(seq)
            budget -= 1
        for seq in ready:
            seq.stalled = 0 if seq in chosen else seq.stalled + 1
        self._stalls = True
        return [s for s in ready if s in chosen], budget

    def _draft(self, seq: Seq, budget: int) -> int:
        """The proposed tokens `seq` may verify: what it asks, within the rows left and the KV room it can get."""
        want = min(self.lookahead(seq), budget)
        while want > 0 and not self.kv.grow(seq.slot, seq.filled + 1 + want):
            want -= 1
        return max(want, 0)

    def _chunk(self, seq: Seq, budget: int, prefill: list[tuple[Seq, int, int]], decode: list[Seq]) -> int:
        """Plan `seq`'s next aligned chunk if the budget allows (or nothing else runs); the budget left."""
        n = min(self.chunk - seq.filled % self.chunk, seq.length - seq.filled)
        if self.split_chunks and budget > 0:
            n = min(n, budget)
        if n <= budget or not (decode or prefill):
            prefill.append((seq, seq.filled, n))
            return budget - n
        return budget

    def prefilled(self, seq: Seq, n: int) -> None:
        """`n` more context tokens of `seq` are in the cache; once all are, it decodes."""
        seq.filled += n
        if seq.filled >= seq.length:
            seq.state = State.DECODE

    def decoded(self, seq: Seq, kept: int = 0) -> None:
        """`seq`'s decode row ran: its last context token is now in the cache, and the `kept` proposed tokens
        verified after it (speculative decoding; the caller appends them)."""
        seq.filled += 1 + kept

    def append(self, seq: Seq, token: int) -> None:
        """`seq` generated `token` (the output of its last prefill chunk or decode row)."""
        now = self.clock()
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.last_token_at = now
        seq.generated.append(token)

    def finish(self, seq: Seq, reason: str) -> None:
        """`seq` ends (stop, length, cancel, error): its storage is freed, it leaves the queue."""
        if seq.state is State.DONE:
            return
        if seq.slot is not None:
            self.kv.free(seq.slot)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.state, seq.slot, seq.finish_reason = State.DONE, None, reason

    def _preempt(self, seq: Seq) -> None:
        self.kv.free(seq.slot)
        self.running.remove(seq)
        seq.state, seq.slot, seq.filled, seq.stalled = State.WAITING, None, 0, 0
        seq.preemptions += 1
        self.waiting.appendleft(seq)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

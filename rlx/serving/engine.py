"""`Engine`: continuous batching over a `Runner`, streaming each request's tokens as they come.

Requests are `submit`ted (from any thread) with their `SamplingParams`; a worker thread loops:
ask the `Scheduler` for a plan, run its decode rows as one batched step and its prefill chunks,
sample each sequence's next token with its own sampler, and hand each request its `Event`s
(token, text, logprobs; a last one with the finish reason). A request that is cancelled, or
whose step raised, ends alone: its slot is freed and the others go on. `step()` runs one
iteration by hand (no thread), which is how the scheduler's tests drive it. A request may name a
LoRA adapter the runner has loaded (`submit(..., adapter=)`): a decode step then mixes rows of
different adapters and none; the prefix cache (K/V depend on the adapter) serves base requests only.

Over a paged runner (`PagedRunner`: `runner.paged`) the KV store is the runner's `PagedKv` (pages
freed when a sequence ends), every iteration is one model call (calls of 16 rows past 16 sequences, see
`PagedRunner`) — the decode rows and the prefill chunks together under the step's row budget — and the
prefix cache shares full pages by reference count instead of copying K/V (a shared page is copied only if a
sequence writes into it).

Speculative decoding (`speculative=`: "prompt_lookup", a draft `CausalLM` or a drafter; paged runners only):
a decoding sequence's drafter proposes up to k tokens (`AdaptiveK`, within the rows and pages the
scheduler grants after prefill) and its row in the step becomes k+1 rows — its last token and the
proposals at the next positions. The greedy or accept/reject rule of `rlx.models.speculative` keeps a
prefix of them plus one token of the target's; the pages of the rejected tail go back to the pool. Each
row's arithmetic is that of a one-row step (`PagedRunner`), so greedy tokens are those of plain decoding.

Pipelined steps (`feedback=True`, paged runners whose model has token feedback): a decode step is planned and
launched before the step in flight lands, its rows' tokens taken on the device from the ones that step stores for
their slots (`_step_pipelined`), so on a GPU the host lands one step and plans the next while the device runs.

>>> from rlx.models.decoder_config import DecoderConfig
>>> from rlx.models.causal_lm import random_tensors
>>> from rlx.models.llama import random_specs
>>> from rlx.serving.runner import CausalLMRunner
>>> cfg = DecoderConfig(arch="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
...                     num_kv_heads=2, head_dim=8, ffn_size=48, n_rot=8, context_length=64, eos_id=-1)
>>> runner = CausalLMRunner.build(cfg, random_tensors(random_specs(cfg)), device="reference", slots=2,
...                               max_context=32, chunk=8)
>>> with Engine(runner) as engine:
...     done = engine.generate([5, 6, 7], SamplingParams(max_tokens=4))
>>> len(done.token_ids), done.finish_reason
(4, 'length')
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.errors import RlxError
from rlx.models import speculative as spec
from rlx.models.sampling import Sampler
from rlx.serving.kv import SlotKv
from rlx.serving.pages import PagedKv
from rlx.serving.prefix import PrefixCache
from rlx.serving.runner import PagedRunner, Runner
from rlx.serving.scheduler import Plan, Scheduler, Seq, State
from rlx.serving.text import StopText, takes_skip


@dataclass(frozen=True)
class SamplingParams:
    """How one request generates: at most `max_tokens` new tokens, greedy at temperature 0, stop strings,
    and `logprobs` (the chosen token's log-probability, with the `top_logprobs` best alternatives)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RlxError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not 0 <= self.top_logprobs <= 20:
            raise RlxError(f"top_logprobs must be in 0..20, got {self.top_logprobs!r}")
        Sampler(self.temperature, self.top_k, self.top_p, self.seed)  # its checks

    @property
    def needs_logits(self) -> bool:
        return self.temperature != 0 or self.logprobs


@dataclass(frozen=True)
class Event:
    """A request's next token (`token_id`, the `text` it completes, `logprob`, `top_logprobs` as
    (id, logprob) pairs) or, last, its end: `finish_reason` ("stop", "length", "cancelled" or "error",
    with `error`) and any text held back until then (`token_id` None)."""

    token_id: int | None
    text: str
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class Completion:
    """What `Engine.generate` returns: every token and the text, why it ended, and token counts."""

    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    events: list[Event] = field(default_factory=list)
    #: speculative decoding's counts (`Request.timings`); empty without it
    timings: dict[str, float] = field(default_factory=dict)


#: over a paged runner, the steps a decoding sequence may go without a row while prompts' prefill takes the rows
#: first (`Scheduler`'s `max_stall`): a burst of 16 prompts of ~29 tokens then runs in ~95 steps of 16 rows
#: rather than 137 (64 of them with 1 to 14 rows), and a token comes at least every 5 steps
MAX_STALL = 4


class EngineClosed(RlxError):
    """The engine is shutting down (or shut down) and takes no new requests."""


class Observer:
    """What the engine reports as it runs (the server's metrics implement it); the default ignores it all."""

    def first_token(self, seconds: float) -> None: ...

    def inter_token(self, seconds: float) -> None: ...

    def tokens(self, n: int) -> None: ...

    def prefix_hit(self, tokens: int) -> None: ...

    def speculated(self, proposed: int, accepted: int, produced: int) -> None:
        """One sequence's decode step under speculative decoding: tokens proposed, kept, and produced."""


class Request:
    """A submitted request: iterate it for its `Event`s (blocking), or give `submit` a `sink` instead."""

    def __init__(self, engine: Engine, seq: Seq) -> None:
        self._engine, self._seq = engine, seq
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()

    @property
    def id(self) -> int:
        return self._seq.id

    def cancel(self) -> None:
        """End this request now: its slot is freed at the next iteration (a last event says "cancelled")."""
        self._engine.cancel(self)

    @property
    def timings(self) -> dict[str, float]:
        """Speculative decoding's counts so far (as `Generation.timings`: steps, draft and accepted tokens,
        acceptance rate, tokens per step); empty without speculation."""
        job: _Job = self._seq.payload
        return job.stats.timings() if job.stats is not None else {}

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self._queue.get()
            yield event
            if event.finish_reason is not None:
                return


@dataclass
class _Job:
    """The engine's state of one sequence (its `Seq.payload`)."""

    params: SamplingParams
    sampler: Sampler
    text: StopText
    sink: Callable[[Event], None]
    adapter: str | None = None
    cancelled: bool = False
    # speculative decoding: the sequence's drafter, proposal length and counts (None: plain decoding)
    drafter: spec.Drafter | None = None
    k: spec.AdaptiveK | None = None
    stats: spec.SpecStats | None = None


@dataclass
class _Launch:
    """One paged step: its plan, rows `(slot, token, position)`, output rows, `(sequence, tokens it fed)` in row
    order, the drafts it verifies, whether it returns logits; `call`: the running call (overlap)."""

    plan: Plan
    rows: np.ndarray  # [rows, 3] int64
    outputs: list[int]
    ends: list[tuple[Seq, int]]
    drafts: list[tuple[list[int], np.ndarray | None]] | None
    logits: bool
    call: Future | None = None
    #: token feedback (`Engine(feedback=True)`): the runner's `(src, dst)` slots (None: a step of logits or drafts)
    feedback: tuple[np.ndarray, np.ndarray] | None = None
    #: token feedback: the launched step (`PendingStep`)
    pending: Any = None


def feedback_default(runner: Any, fits: bool) -> bool:
    """Whether an engine pipelines its steps with token feedback when not told (`Engine(feedback=None)`): where it
    `fits` (a paged runner with a token-feedback model, no speculation, no overlap) and the model runs on CUDA,
    whose launches return before the step ends; a CPU step runs at once, so there it would only add work.

    >>> feedback_default(type("R", (), {"lm": type("M", (), {"device": "cuda"})()})(), True)
    True
    >>> feedback_default(type("R", (), {"lm": type("M", (), {"device": "cpu"})()})(), True)
    False
    """
    return fits and getattr(getattr(runner, "lm", None), "device", None) == "cuda"


class Engine:
    """Continuous batching over `runner` (see the module docstring).

    `token_budget`: KV tokens among all slots (default: every slot full; over a paged runner `kv_pages`
    instead: the pages the engine may use, at most the runner's pool, default all); `max_step_tokens`: tokens one
    iteration computes (decode rows plus prefill chunks); `max_waiting`: the queue's bound (`QueueFull`
    past it); `prefix_cache_bytes`: memory for the K/V of prompt blocks reused across requests
    (`PrefixCache`; 0, or a runner that cannot copy K/V, turns it off); `clock`: seconds, for
    first-token and inter-token times; `speculative`: a drafter (see the module docstring), `max_draft`
    the most tokens it proposes a step; `max_stall` (paged runners without speculation): the steps a decoding
    sequence may go without a row while prompts' prefill takes the rows first (`MAX_STALL`; None: decode rows
    always first); `overlap` (paged runners without speculation): hand out a step's tokens while the next step
    runs (see `_step_overlapped`; off by default: on CUDA it measured slower, docs/perf-h100.md); `feedback`
    (paged runners with token feedback, without speculative decoding or overlap): pipelined steps whose tokens
    are fed back on the device (see `_step_pipelined`); None: on where it applies on CUDA (`feedback_default`: 64
    streams on an H200 45-48k tok/s against 33-42k, docs/perf-h100.md), off on the CPU (its steps run at once).
    """

    def __init__(self, runner: Runner, *, token_budget: int | None = None, max_step_tokens: int | None = None,
                 max_waiting: int = 256, chunk: int | None = None, prefix_cache_bytes: int = 0,
                 observer: Observer | None = None, clock: Callable[[], float] = time.monotonic,
                 kv_pages: int | None = None, speculative: Any = None, max_draft: int = spec.AdaptiveK.k_max,
                 max_stall: int | None = MAX_STALL, overlap: bool = False, feedback: bool | None = None) -> None:
        self.runner = runner
        self.paged = bool(getattr(runner, "paged", False))
        chunk = chunk or getattr(runner, "chunk", 64)
        self.prefix: PrefixCache | None
        if self.paged:
            paged: PagedRunner = runner  # type: ignore[assignment]
            if token_budget is not None:
                raise RlxError("a paged runner's KV budget is its kv_pages, not token_budget")
            self.kv = paged.kv_store(reclaim=self._reclaim, pages=kv_pages)
            # prefix caching of full pages, shared (a block is one page: the ids, kept with a reference each)
            self.prefix = (PrefixCache(paged.page_size, prefix_cache_bytes,
                                       sizeof=lambda pages: len(pages) * paged.page_bytes,
                                       on_evict=self.kv.pool.release) if prefix_cache_bytes > 0 else None)
            max_step_tokens = min(max_step_tokens or paged.max_rows, paged.max_rows)
        else:
            self.kv = SlotKv(runner.slots, runner.max_context, token_budget)
            # prefix caching where the runner can copy K/V blocks (blocks of one prefill chunk)
            self.prefix = (PrefixCache(chunk, prefix_cache_bytes)
                           if prefix_cache_bytes > 0 and getattr(runner, "copies_kv", False) else None)
        reuse = None if self.prefix is None else self._share if self.paged else self._reuse
        self.drafter: spec.Drafter | None = None
        if speculative is not None:
            if not self.paged:  # its verify rows need the one-row arithmetic of the paged runner's steps
                raise RlxError("speculative decoding in the engine needs a paged runner (rlxc serve --kv-layout paged)")
            if max_draft < 1:
                raise RlxError(f"max_draft must be >= 1, got {max_draft!r}")
            self.drafter = spec.make_drafter(speculative, runner)
        self.max_draft = max_draft
        self.scheduler = Scheduler(self.kv, chunk=chunk, max_step_tokens=max_step_tokens or max(chunk, runner.slots),
                                   max_waiting=max_waiting, clock=clock, reuse=reuse, split_chunks=self.paged,
                                   lookahead=self._lookahead if self.drafter is not None else None,
                                   # paged steps are one call of any mix of rows: prefill first keeps them full
                                   # (a decoding sequence waits at most max_stall steps for a row)
                                   max_stall=max_stall if self.paged and self.drafter is None else None)
        self.observer = observer or Observer()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._requests: dict[int, Request] = {}
        self._cancels = False  # a request was cancelled since the last plan (`_plan` drops it)
        self._logit_seqs = 0  # sequences not ended that sample or want logprobs (none: no step returns logits)
        self._skip_special = takes_skip(runner.tokenizer)  # StopText's, asked once (inspect is slow)
        self.step_errors = 0  # steps that raised (their requests failed)
        self.preemptions = 0  # sequences sent back to the queue to be recomputed
        if overlap and (not self.paged or self.drafter is not None):
            raise RlxError("overlap takes a paged runner without speculative decoding")
        self.overlap = overlap
        #: overlap: the step launched and not yet landed (its plan, what each sequence fed, the running call)
        self._pending: _Launch | None = None
        #: overlap: what a landed step has left to hand out (token and finish events), run after the next launch
        self._deferred: list[Callable[[], None]] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlx-step") if overlap else None
        fits = self.paged and self.drafter is None and not overlap and getattr(runner, "token_feedback", False)
        if feedback and not fits:
            raise RlxError("feedback takes a paged runner whose model has token feedback, without speculative "
                           "decoding or overlap")
        self.feedback = feedback_default(runner, bool(fits)) if feedback is None else feedback
        #: feedback: steps launched ahead of the last step's landing (planned with its tokens still on the device)
        self.ahead_steps = 0
        #: plain greedy decode rows land in one loop (`_land_tokens`); False: one by one through `_next` (the
        #: general path, which the tests hold the fast one to)
        self.fast_landing = True

    # ── requests ──────────────────────────────────────────────────────

    def submit(self, prompt: Sequence[int], params: SamplingParams, sink: Callable[[Event], None] | None = None,
               *, adapter: str | None = None) -> Request:
        """Queue a request (token ids); its events go to `sink` (called on the engine's thread) or to the
        returned `Request`'s iterator; `adapter`: a LoRA adapter of the runner's (None: the base model).
        `EngineClosed` while shutting down, `QueueFull` past `max_waiting`."""
        if adapter is not None and adapter not in getattr(self.runner, "adapters", ()):
            raise RlxError(f"no adapter named {adapter!r} is loaded (loaded: "
                           f"{sorted(getattr(self.runner, 'adapters', ()))})")
        ids = [int(t) for t in prompt]
        if not ids or min(ids) < 0 or max(ids) >= self.runner.vocab_size:
            raise RlxError(f"the prompt must be a non-empty list of token ids in [0, {self.runner.vocab_size})")
        if len(ids) + params.max_tokens > self.runner.max_context:
            raise RlxError(f"the prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens}) is over the "
                           f"context of {self.runner.max_context} tokens")
        with self._lock:
            if self._closing:
                raise EngineClosed("the engine is shutting down")
            text = StopText(self.runner.tokenizer, params.stop, self._skip_special)
            job = _Job(params, Sampler(params.temperature, params.top_k, params.top_p, params.seed), text,
                       sink or (lambda e: None), adapter)
            if self.drafter is not None:
                # a draft model keeps a KV cache per sequence; prompt lookup (stateless) is shared
                job.drafter = (spec.DraftModel(self.drafter.lm) if isinstance(self.drafter, spec.DraftModel)
                               else self.drafter)
                job.k, job.stats = spec.AdaptiveK(k=min(4, self.max_draft), k_max=self.max_draft), spec.SpecStats()
            seq = self.scheduler.add(ids, params.max_tokens, job)
            self._logit_seqs += params.needs_logits
            request = Request(self, seq)
            if sink is None:
                job.sink = request._queue.put
            self._requests[seq.id] = request
            self._lock.notify_all()
        return request

    def cancel(self, request: Request) -> None:
        with self._lock:
            request._seq.payload.cancelled = True
            self._cancels = True
            self._lock.notify_all()

    def generate(self, prompt: Sequence[int], params: SamplingParams, *, adapter: str | None = None) -> Completion:
        """Submit and wait (the engine's thread must run, or another thread call `step`)."""
        request = self.submit(prompt, params, adapter=adapter)
        events = list(request) if self._thread is not None else self._drive(request)
        tokens = [e.token_id for e in events if e.token_id is not None]
        last = events[-1]
        if last.finish_reason == "error":
            raise RlxError(f"generation failed: {last.error}")
        return Completion(tokens, "".join(e.text for e in events), last.finish_reason, len(prompt), events,
                          request.timings)

    def _drive(self, request: Request) -> list[Event]:
        events: list[Event] = []
        while not events or events[-1].finish_reason is None:
            self.step()
            while True:
                try:
                    events.append(request._queue.get_nowait())
                except queue.Empty:
                    break
        return events

    # ── the loop ──────────────────────────────────────────────────────

    def start(self) -> Engine:
        """Run iterations on a worker thread until `stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rlx-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Take no new requests; with `drain`, finish those running and waiting, else cancel them; then end
        the worker thread."""
        with self._lock:
            self._closing = True
            if not drain:
                for request in self._requests.values():
                    request._seq.payload.cancelled = True
                self._cancels = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(drain=exc[0] is None)

    @property
    def closing(self) -> bool:
        return self._closing

    def stats(self) -> dict[str, int]:
        """Running and waiting sequences, KV tokens used and free, and over a paged runner KV pages used (by
        sequences), cached (held only by the prefix cache) and free."""
        with self._lock:
            s = self.scheduler
            out = {"running": len(s.running), "waiting": len(s.waiting), "kv_used_tokens": self.kv.used_tokens,
                   "kv_free_tokens": self.kv.free_tokens, "kv_used_slots": self.kv.used_slots}
            if self.paged:
                out.update(kv_used_pages=self.kv.used_pages, kv_cached_pages=self.kv.cached_pages,
                           kv_free_pages=self.kv.free_pages)
            return out

    def _loop(self) -> None:
        while True:
            with self._lock:
                while self.scheduler.idle and self._pending is None and not self._closing:
                    self._lock.wait()
                if self.scheduler.idle and self._pending is None and self._closing:
                    return
            try:
                self.step()
            except Exception as exc:  # outside a guarded part (planning, bookkeeping): fail what is in flight
                self.step_errors += 1
                with self._lock:
                    for seq in [*self.scheduler.running, *self.scheduler.waiting]:
                        self._finish(seq, "error", f"{type(exc).__name__}: {exc}")

    def step(self) -> Plan:
        """One iteration: drop cancelled requests, plan, run the plan, hand out the tokens."""
        if self.overlap:
            return self._step_overlapped()
        if self.feedback:
            return self._step_pipelined()
        plan = self._plan()
        if self.paged:
            seqs = [*plan.decode, *(seq for seq, _, _ in plan.prefill)]
            if seqs:
                self._guarded(seqs, self._mixed, plan)
            return plan
        if plan.decode:
            self._guarded(plan.decode, self._decode, plan.decode)
        for seq, start, n in plan.prefill:
            if seq.state is State.PREFILL:
                self._guarded([seq], self._prefill, seq, start, n)
        return plan

    def _step_overlapped(self) -> Plan:
        """One iteration that overlaps the host with the device (`overlap=True`): land the step that was
        launched (each sequence's next token appended: the input of the next step, as are the finishes a token
        id decides: a stop id, the length), plan and launch the next step, and only then hand out the landed
        step's events (text, stop strings, logprobs, timings) while it runs. A sequence whose text stops (or
        that is cancelled) meanwhile is in the running step: that row's output is dropped when it lands, and
        its pages, freed now, are planned again only after. Tokens and events are those of `step` without
        overlap."""
        if self._pending is None:  # nothing in flight: plan and launch a step first
            self._pending = self._plan_and_launch()
            if self._pending is None:
                return Plan([], [], [])
        launch, self._pending = self._pending, None
        deferred: list[Callable[[], None]] = []
        try:
            out = launch.call.result()
        except Exception as exc:  # a fault in the step fails its requests only
            self.step_errors += 1
            with self._lock:
                for seq, _ in launch.ends:
                    self._finish(seq, "error", f"{type(exc).__name__}: {exc}")
        else:
            self._deferred = deferred
            try:
                self._guarded([s for s, _ in launch.ends], self._land, launch, out)
            finally:
                self._deferred = None
        self._pending = self._plan_and_launch()
        with self._lock:
            for hand_out in deferred:
                hand_out()
        return launch.plan

    def _step_pipelined(self) -> Plan:
        """One iteration with device-side token feedback (`feedback=True`): the step in flight (or, with none, one
        planned and launched now from what the host knows) gets a successor launched before it lands, where the
        plan allows (`_ahead`): its decode rows take their tokens from the ones the step in flight stores on the
        device (the runner's `feedback`), so the GPU runs it while the host lands the step before (its tokens,
        events, stop strings) and plans the next. A sequence that the landed step ends (a stop id or text, a cancel)
        had a row in the successor: that row's token is dropped when it lands. Its pages, freed at once, are written
        by that row only, and every later step that could give them to another sequence runs after it on the
        device: the new holder writes each position before attending to it. Anything else — prefill, admissions,
        preemption, logits (sampling, logprobs), a cancel — waits for a step boundary: the next step is planned
        after the landing. Tokens and events are those of `step` without feedback."""
        launch, self._pending = self._pending, None
        if launch is None:
            plan = self._plan()
            if plan.empty:
                return plan
            try:
                launch = self._rows(plan)
                self._start(launch)
            except Exception as exc:  # a fault in the step fails its requests only
                self._fail([*plan.decode, *(seq for seq, _, _ in plan.prefill)], exc)
                return plan
        try:
            self._pending = self._ahead(launch)
        except Exception as exc:  # planning it failed (its launch's failures end its sequences only, in _ahead)
            self._fail(list(launch.plan.decode), exc)
        try:
            out = launch.pending.result()
        except Exception as exc:
            self._fail([s for s, _ in launch.ends], exc)
        else:
            self._guarded([s for s, _ in launch.ends], self._land, launch, out)
        return launch.plan

    def _fail(self, seqs: list[Seq], exc: Exception) -> None:
        self.step_errors += 1
        with self._lock:
            for seq in seqs:
                self._finish(seq, "error", f"{type(exc).__name__}: {exc}")

    def _start(self, launch: _Launch) -> None:
        """Launch a step's call on the runner (`PagedRunner.launch`), with its token feedback."""
        launch.pending = self.runner.launch(self.kv.tables, launch.rows, launch.outputs, launch.logits,
                                            launch.feedback)

    def _ahead(self, launch: _Launch) -> _Launch | None:
        """The step after `launch` (launched, not landed), started now, or None where it must wait for `launch` to
        land: `launch` fed every running sequence a decode row (no prefill, drafts or logits), nobody waits, no
        cancel is pending, and each sequence it does not end by length has room for one more token. The step's
        rows are those sequences in order, one position on, each token from the one `launch` stores for its slot."""
        if launch.feedback is None or launch.plan.prefill or launch.logits:
            return None
        decode = State.DECODE
        with self._lock:
            scheduler = self.scheduler
            if scheduler.waiting or self._cancels:
                return None
            live = [s for s in launch.plan.decode if s.state is decode]
            if len(live) != len(scheduler.running):
                return None  # someone is prefilling or waits for a row: plan after the landing
            max_context, kv = self.runner.max_context, self.kv
            seqs = [s for s in live if len(s.generated) + 1 < s.max_new and s.length + 1 <= max_context]
            if not seqs:
                return None
            capacity = kv.capacity
            for s in seqs:  # room for the token this step feeds (position filled + 1)
                if s.filled + 2 > capacity[s.slot] and not kv.grow(s.slot, s.filled + 2):
                    return None
            slots = [s.slot for s in seqs]
            positions = [s.filled + 1 for s in seqs]
            table = np.array([slots, [0] * len(seqs), positions], dtype=np.int64).T
            if not _rows_writable(kv, table, [(s, s.filled + 1, 1) for s in seqs]):  # copy-on-write, as `_rows`
                return None
            src = np.asarray(slots, dtype=np.int32)
            ahead = _Launch(Plan(seqs, [], []), table, list(range(len(seqs))), [(s, 1) for s in seqs], None, False,
                            feedback=(src, src))
        try:
            self._start(ahead)
        except Exception as exc:  # a fault in the step fails its requests only (they end when this one lands)
            self._fail(seqs, exc)
            return None
        self.ahead_steps += 1
        return ahead

    def settle(self) -> None:
        """Land the step in flight, if any (overlap: one is launched before the last step's events go out)."""
        while self._pending is not None:
            self.step()

    def _plan(self) -> Plan:
        """Drop cancelled requests, then the scheduler's plan of this iteration."""
        with self._lock:
            if self._cancels:  # only after a cancel: a look at every sequence
                self._cancels = False
                for seq in [*self.scheduler.running, *self.scheduler.waiting]:
                    if seq.payload.cancelled:
                        self._finish(seq, "cancelled")
            plan = self.scheduler.schedule()
            self.preemptions += len(plan.preempted)
        return plan

    def _plan_and_launch(self) -> _Launch | None:
        """Plan (`_plan`), and start the plan's call on the step thread (None: nothing to run)."""
        plan = self._plan()
        seqs = [*plan.decode, *(seq for seq, _, _ in plan.prefill)]
        if not seqs:
            return None
        try:
            launch = self._rows(plan)
        except Exception as exc:
            self.step_errors += 1
            with self._lock:
                for seq in seqs:
                    self._finish(seq, "error", f"{type(exc).__name__}: {exc}")
            return None
        # the tables as planned: sequences ending while the step runs free pages in the live ones
        tables, started = self.kv.tables.copy(), threading.Event()

        def call() -> np.ndarray:
            started.set()
            return self.runner.run(tables, launch.rows, launch.outputs, launch.logits)

        launch.call = self._pool.submit(call)
        # Wait until the step thread runs: it holds the GIL from then through the call's Python part (well under
        # the interpreter's 5 ms switch interval) and releases it in the compiled call, so this thread's hand-out
        # runs beside the device, not before the launch.
        started.wait()
        return launch

    def _guarded(self, seqs: list[Seq], fn: Callable[..., None], *args: Any) -> None:
        """Run one part of an iteration; if it raises, its sequences end with the error, the rest go on."""
        try:
            fn(*args)
        except Exception as exc:  # a fault in one step fails that step's requests only
            self.step_errors += 1
            message = f"{type(exc).__name__}: {exc}"
            with self._lock:
                for seq in seqs:
                    self._finish(seq, "error", message)

    def _decode(self, seqs: list[Seq]) -> None:
        logits = any(s.payload.params.needs_logits for s in seqs)
        adapters = [s.payload.adapter for s in seqs]
        lora = {"adapters": adapters} if any(a is not None for a in adapters) else {}
        out = self.runner.decode([s.slot for s in seqs], [s.last for s in seqs], logits, **lora)
        with self._lock:
            for i, seq in enumerate(seqs):
                self.scheduler.decoded(seq)
                self._next(seq, out[i], logits)

    def _prefill(self, seq: Seq, start: int, n: int) -> None:
        last = start + n == seq.length
        logits = last and seq.payload.params.needs_logits
        adapter = seq.payload.adapter
        lora = {"adapter": adapter} if adapter is not None else {}
        out = self.runner.prefill(seq.slot, seq.context[start:start + n], start, logits, **lora)
        with self._lock:
            self.scheduler.prefilled(seq, n)
            if self.prefix is not None:
                self._keep_block(seq, start, n)
            if last:
                self._next(seq, out, logits)

    def _mixed(self, plan: Plan) -> None:
        """A paged runner's iteration as one call: a row per decoding sequence, a row per token of each prefill
        chunk; the output rows are the decode rows and the last row of each chunk that ends its context."""
        launch = self._rows(plan)
        out = self.runner.run(self.kv.tables, launch.rows, launch.outputs, launch.logits)
        self._land(launch, out)

    def _rows(self, plan: Plan) -> _Launch:
        """`plan`'s rows, output rows and what each sequence feeds; pages made writable (copy-on-write)."""
        drafts = self._propose(plan) if self.drafter is not None else None
        # the rows as three columns (slots, tokens, positions): lists of ints to one array, not a tuple a row
        if drafts is None:  # plain decoding: a row per sequence (the bookkeeping of 64 rows is a GPU step's share)
            decode = plan.decode
            slots = [seq.slot for seq in decode]
            tokens = [g[-1] if (g := seq.generated) else seq.prompt[-1] for seq in decode]  # Seq.last
            positions = [seq.filled for seq in decode]
            outputs = list(range(len(decode)))
            ends = [(seq, 1) for seq in decode]  # (sequence, tokens it fed), in row order
        else:
            slots, tokens, positions, outputs, ends = [], [], [], [], []
            for seq, (proposed, _) in zip(plan.decode, drafts):
                fed = [seq.last, *proposed]  # the last token, then the proposals at the next positions
                slots.extend([seq.slot] * len(fed))
                tokens.extend(fed)
                positions.extend(range(seq.filled, seq.filled + len(fed)))
                outputs.extend(range(len(slots) - len(fed), len(slots)))
                ends.append((seq, len(fed)))
        for seq, start, n in plan.prefill:
            ctx = seq.context
            slots.extend([seq.slot] * n)
            tokens.extend(ctx[start:start + n])
            positions.extend(range(start, start + n))
            if start + n == len(ctx):
                outputs.append(len(slots) - 1)
            ends.append((seq, n))
        table = np.array([slots, tokens, positions], dtype=np.int64).T  # [rows, 3]: (slot, token, position) a row
        kv: PagedKv = self.kv
        with self._lock:
            # copy-on-write: no row writes into a page another holder shares
            if not _rows_writable(kv, table, [(seq, seq.filled, n) for seq, n in ends]):
                raise RlxError("no free KV page for a copy of a shared page")
        logits = self._logit_seqs > 0 and any(s.payload.params.needs_logits for s, _ in ends)
        feedback = None
        if self.feedback and drafts is None and not logits:  # every output row stores its token for its slot
            src = np.full(len(table), -1, np.int32)
            feedback = (src, table[outputs, 0].astype(np.int32))
        return _Launch(plan, table, outputs, ends, drafts, logits, feedback=feedback)

    def _land(self, launch: _Launch, out: np.ndarray) -> None:
        """A step's outputs: each sequence's next token (or verified proposals), its prefill progress."""
        plan, ends, drafts, logits = launch.plan, launch.ends, launch.drafts, launch.logits
        with self._lock:
            k = 0
            if drafts is None and not logits and self._deferred is None and self.fast_landing:
                k = len(plan.decode)  # the common case, one token id a decode row: _land_tokens, at once
                self._land_tokens(plan.decode, np.asarray(out[:k]).reshape(k).astype(np.int64, copy=False).tolist())
            for i, seq in enumerate(plan.decode if k == 0 else ()):  # decode rows first, in row order
                n = ends[i][1]
                if seq.state is State.DONE:  # overlap: it ended (stop text, cancel) while this step ran
                    k += n
                    continue
                proposed, q = drafts[i] if drafts is not None else ((), None)
                if proposed:
                    self._verify(seq, out[k:k + n], proposed, q, logits)
                elif drafts is None:  # plain decoding: the row's output is the sequence's next token
                    self.scheduler.decoded(seq)
                    self._next(seq, out[k], logits)
                else:
                    before = len(seq.generated)
                    self.scheduler.decoded(seq)
                    self.kv.truncate(seq.slot, seq.filled)  # pages granted for proposals that never came
                    self._next(seq, out[k], logits)
                    self._count(seq, 0, 0, len(seq.generated) - before)
                k += n
            for seq, n in ends[len(plan.decode):]:  # then the prefill chunks
                if seq.state is State.DONE:  # overlap: it ended while this step ran (its output row dropped)
                    k += int(seq.filled + n >= seq.length)
                    continue
                start = seq.filled
                self.scheduler.prefilled(seq, n)
                if self.prefix is not None:
                    self._keep_pages(seq, start, n)
                if seq.state is State.DECODE:  # its prompt is in: the chunk's last row is its first token
                    self._next(seq, out[k], logits)
                    k += 1

    def _land_tokens(self, seqs: list[Seq], tokens: list[int]) -> None:
        """Plain greedy decode rows (no logits, no drafts, no overlap): each sequence's next token `tokens[i]`, as
        `_next` would take it one by one (`scheduler.decoded`, `_emit`, `_hand_out`), in one loop: one clock
        reading for the step, the observer's hooks only where it overrides them (`tokens` once, with the count),
        events built without the frozen dataclass's per-field `__setattr__`. Under the engine's lock."""
        now = self.scheduler.clock()
        stop_ids, max_context = self.runner.stop_ids, self.runner.max_context
        observer = self.observer
        kind = type(observer)
        timed = kind.first_token is not Observer.first_token or kind.inter_token is not Observer.inter_token
        done, new_event, token_fields = State.DONE, Event.__new__, _TOKEN_FIELDS
        handed = 0
        for seq, token in zip(seqs, tokens):
            if seq.state is done:
                continue
            seq.filled += 1  # scheduler.decoded
            job: _Job = seq.payload
            if job.cancelled:
                self._finish(seq, "cancelled")
                continue
            if token in stop_ids:
                self._finish(seq, "stop")
                continue
            before = seq.last_token_at  # scheduler.append, at the step's time (the first token sets both)
            if before is None:
                seq.first_token_at = now
            seq.last_token_at = now
            generated = seq.generated
            generated.append(token)
            if timed:
                if before is None:
                    observer.first_token(now - seq.arrival)
                else:
                    observer.inter_token(now - before)
            handed += 1
            text = job.text
            event = new_event(Event)  # Event(token, text.push(token)), its dict filled at once (_TOKEN_FIELDS)
            fields = event.__dict__
            fields.update(token_fields)
            fields["token_id"], fields["text"] = token, text.push(token)
            job.sink(event)
            if text.stopped:
                self._finish(seq, "stop")
            elif len(generated) >= seq.max_new or len(seq.prompt) + len(generated) > max_context:
                self._finish(seq, "length")
        if handed and kind.tokens is not Observer.tokens:
            observer.tokens(handed)

    def _lookahead(self, seq: Seq) -> int:
        """How many tokens `seq`'s drafter would propose this step: its `AdaptiveK` within what `seq` may still
        generate (the step yields one token more than it keeps) and the context."""
        job: _Job = seq.payload
        room = min(seq.max_new - len(seq.generated), self.runner.max_context - seq.filled) - 1
        return min(job.k.proposal(), room) if job.k is not None and room > 0 and not job.cancelled else 0

    def _propose(self, plan: Plan) -> list[tuple[list[int], np.ndarray | None]]:
        """Each decode row's proposed tokens (at most what the plan grants) and, when sampled, their
        distributions; nothing for plain decoding."""
        out: list[tuple[list[int], np.ndarray | None]] = []
        for seq, granted in zip(plan.decode, plan.drafts or [0] * len(plan.decode)):
            job: _Job = seq.payload
            if granted == 0 or job.drafter is None:
                out.append(([], None))
                continue
            proposed, q = job.drafter.propose(seq.context, granted, job.sampler)
            proposed = [int(t) for t in proposed[:granted]]
            out.append((proposed, None if q is None or not proposed else q[:len(proposed)]))
        return out

    def _verify(self, seq: Seq, out: np.ndarray, proposed: list[int], q: np.ndarray | None, is_logits: bool) -> None:
        """`seq`'s k+1 verify rows ran: keep the proposals the target agrees with (greedy) or accepts (sampling)
        and one token of its own; the rejected tail's pages go back to the pool; stream what was kept."""
        job: _Job = seq.payload
        if job.cancelled:
            self._finish(seq, "cancelled")
            return
        rows = np.asarray(out, dtype=np.float32) if is_logits else None
        if rows is not None:
            kept, token = spec.accept(rows, proposed, q, job.sampler)
        else:  # greedy without logprobs: the runner gave each row's argmax
            kept, token = spec.accept_greedy(np.asarray(out), proposed)
        self.scheduler.decoded(seq, kept)
        self.kv.truncate(seq.slot, seq.filled)  # the cache holds the context but its last token
        before = len(seq.generated)
        for i, t in enumerate([*proposed[:kept], token]):
            if not self._emit(seq, t, None if rows is None else rows[i]):
                break
        self._count(seq, len(proposed), kept, len(seq.generated) - before)

    def _count(self, seq: Seq, proposed: int, kept: int, produced: int) -> None:
        """Speculative decoding's counts of `seq`'s decode step (nothing for plain decoding)."""
        job: _Job = seq.payload
        if job.stats is None:
            return
        job.stats.step(proposed, kept, job.k)
        job.stats.produced = len(seq.generated)
        self.observer.speculated(proposed, kept, produced)

    def _share(self, seq: Seq) -> int:
        """At admission (paged): the cached pages `seq`'s context starts with become its first pages, shared
        (at least its last token is left to prefill, for its logits); how many tokens that is."""
        page = self.prefix.block
        usable = (len(seq.context) - 1) // page * page
        blocks = self.prefix.match(seq.context[:usable]) if usable else []
        if blocks:
            self.kv.adopt(seq.slot, [p for pages in blocks for p in pages])
            self.observer.prefix_hit(len(blocks) * page)
        return len(blocks) * page

    def _keep_pages(self, seq: Seq, start: int, n: int) -> None:
        """After a prefill chunk (paged): each page it filled goes into the prefix cache, which holds it too."""
        page = self.prefix.block
        held = self.kv.pages(seq.slot)
        for i in range(start // page, (start + n) // page):
            if self.prefix.store(seq.context, i, (held[i],)):
                self.kv.pool.share([held[i]])

    def _reclaim(self, pages: int) -> None:
        """Pages ran short: drop least recently used prefix pages until `pages` more are free (or none is cached)."""
        if self.prefix is None:
            return
        target = self.kv.pool.free + pages
        while self.kv.pool.free < target and self.prefix.evict():
            pass

    def _reuse(self, seq: Seq) -> int:
        """At admission: copy the cached blocks `seq`'s context starts with into its slot (at least its last
        token is left to prefill, for its logits); how many tokens that is."""
        if seq.payload.adapter is not None:  # its K/V are the adapter's: the cache holds the base model's
            return 0
        block = self.prefix.block
        usable = (len(seq.context) - 1) // block * block
        blocks = self.prefix.match(seq.context[:usable]) if usable else []
        for i, kv in enumerate(blocks):
            self.runner.write_kv(seq.slot, i * block, kv)
        if blocks:
            self.observer.prefix_hit(len(blocks) * block)
        return len(blocks) * block

    def _keep_block(self, seq: Seq, start: int, n: int) -> None:
        """After a prefill chunk: a full aligned block goes into the prefix cache."""
        block = self.prefix.block
        if n == block and start % block == 0 and seq.payload.adapter is None:
            self.prefix.store(seq.context, start // block, self.runner.read_kv(seq.slot, start, n))

    def _next(self, seq: Seq, out: np.ndarray, is_logits: bool) -> None:
        """`seq`'s next token from its step's output: sample, stream, and end it if it is done."""
        job: _Job = seq.payload
        if job.cancelled:
            self._finish(seq, "cancelled")
            return
        row = np.asarray(out, dtype=np.float32) if is_logits else None
        token = int(job.sampler.pick(row[None, :])[0]) if row is not None else int(out)
        self._emit(seq, token, row)

    def _emit(self, seq: Seq, token: int, row: np.ndarray | None) -> bool:
        """Hand out `seq`'s next `token` (`row`: the logits it was chosen from, for logprobs); False when it
        ended `seq` (a stop token or text, its length)."""
        if token in self.runner.stop_ids:
            self._finish(seq, "stop")
            return False
        before = seq.last_token_at
        self.scheduler.append(seq, token)
        if self._deferred is not None:  # overlap: the token is the next step's input now, its event later
            self._deferred.append(lambda: self._hand_out(seq, token, row, before))
            if len(seq.generated) >= seq.max_new or seq.length > self.runner.max_context:
                self._finish(seq, "length")  # not in the next step; "stop" if its text stops here (_hand_out)
            return seq.state is not State.DONE
        self._hand_out(seq, token, row, before)
        if seq.state is State.DONE:
            return False
        if len(seq.generated) >= seq.max_new or seq.length > self.runner.max_context:
            self._finish(seq, "length")
        return seq.state is not State.DONE

    def _hand_out(self, seq: Seq, token: int, row: np.ndarray | None, before: float | None) -> None:
        """`seq`'s event for `token` (timings, logprobs, text); a stop text ends it."""
        job: _Job = seq.payload
        if before is None:
            self.observer.first_token(seq.first_token_at - seq.arrival)
        else:
            self.observer.inter_token(seq.last_token_at - before)
        self.observer.tokens(1)
        logprob, top = _logprobs(row, token, job.params) if job.params.logprobs and row is not None else (None, ())
        job.sink(Event(token, job.text.push(token), logprob, top))
        if job.text.stopped:
            if seq.state is State.DONE and seq.finish_reason == "length":  # overlap: ended at its length too
                seq.finish_reason = "stop"
            self._finish(seq, "stop")

    def _finish(self, seq: Seq, reason: str, error: str | None = None) -> None:
        if seq.state is State.DONE:
            return
        self.scheduler.finish(seq, reason)
        self._logit_seqs -= seq.payload.params.needs_logits
        request = self._requests.pop(seq.id, None)
        if self._deferred is not None:  # overlap: after the events of the tokens before it
            self._deferred.append(lambda: self._notify_finish(seq, request, error))
        else:
            self._notify_finish(seq, request, error)

    def _notify_finish(self, seq: Seq, request: Request | None, error: str | None) -> None:
        job: _Job = seq.payload
        reason = seq.finish_reason
        tail = job.text.flush() if reason in ("stop", "length") else ""
        if request is not None:
            job.sink(Event(None, tail, finish_reason=reason, error=error))


def _rows_writable(kv: PagedKv, table: np.ndarray, spans: list[tuple[Seq, int, int]]) -> bool:
    """Whether the rows of `table` ([rows, 3]: slot, token, position) may write their pages, each page another
    holder shares copied first (`PagedKv.writable`) for each `(sequence, first position, count)` of `spans`; False
    where no page is free for a copy. Past a few sequences the pages the rows write are looked up at once, and
    asked a sequence at a time only when one of them is shared."""
    if len(spans) > 4 and not (kv.pool.refs[kv.tables[table[:, 0], table[:, 2] // kv.page_size]] > 1).any():
        return True
    return all(kv.writable(seq.slot, first, first + n) for seq, first, n in spans)


#: an `Event` of a token without logprobs, its fields to copy into a new one's dict (`Engine._land_tokens`: a frozen
#: dataclass's `__init__` sets each field through `object.__setattr__`, three times slower; the same object after)
_TOKEN_FIELDS = {"token_id": None, "text": "", "logprob": None, "top_logprobs": (), "finish_reason": None,
                 "error": None}


def _logprobs(row: np.ndarray, token: int, params: SamplingParams) -> tuple[float, tuple[tuple[int, float], ...]]:
    """log-softmax of the raw logits: the chosen token's, and the `top_logprobs` best (id, logprob)."""
    x = row.astype(np.float64)
    lse = float(x.max() + math.log(np.exp(x - x.max()).sum()))
    top = np.argsort(-x, kind="stable")[:params.top_logprobs]
    return float(x[token] - lse), tuple((int(i), float(x[i] - lse)) for i in top)

"""The server's Prometheus metrics (`GET /metrics`), on a registry of its own (no process-global state).

>>> m = Metrics(lambda: {"running": 1, "waiting": 0, "kv_used_tokens": 5, "kv_free_tokens": 27,
...                      "kv_used_slots": 1})
>>> m.first_token(0.25); m.tokens(3)
>>> text = m.render().decode()
>>> "rlx_running_sequences 1.0" in text, "rlx_generated_tokens_total 3.0" in text
(True, True)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rlx.serving.engine import Observer

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: tokens one sequence's decode step yields under speculative decoding: 1 (nothing kept) .. 1 + the most proposed
_TOKENS_PER_STEP_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)


class Metrics(Observer):
    """Engine gauges read at scrape time from `stats` (`Engine.stats`), token counters, latency histograms."""

    def __init__(self, stats: Callable[[], dict[str, int]], window_s: float = 10.0) -> None:
        self.registry = r = CollectorRegistry()
        self._stats = stats
        for key, name, doc in (("running", "rlx_running_sequences", "sequences admitted (prefilling or decoding)"),
                               ("waiting", "rlx_waiting_sequences", "sequences queued for a slot"),
                               ("kv_used_tokens", "rlx_kv_used_tokens", "KV cache tokens held by sequences"),
                               ("kv_free_tokens", "rlx_kv_free_tokens", "KV cache tokens free"),
                               ("kv_used_slots", "rlx_kv_used_slots", "KV cache slots held by sequences")):
            Gauge(name, doc, registry=r).set_function(lambda key=key: self._stats()[key])
        present = stats()
        for key, name, doc in (("kv_used_pages", "rlx_kv_used_pages", "KV pages held by sequences"),
                               ("kv_free_pages", "rlx_kv_free_pages", "KV pages free"),
                               ("kv_cached_pages", "rlx_kv_cached_pages",
                                "KV pages held only by the prefix cache (freed when pages run short)")):
            if key in present:  # a paged engine's
                Gauge(name, doc, registry=r).set_function(lambda key=key: self._stats()[key])
        self._tokens = Counter("rlx_generated_tokens", "tokens generated", registry=r)
        self._prefix = Counter("rlx_prefix_cache_hit_tokens", "prompt tokens whose K/V came from the prefix cache",
                               registry=r)
        Gauge("rlx_tokens_per_second", f"tokens generated a second over the last {window_s:g} s",
              registry=r).set_function(self.tokens_per_second)
        self._ttft = Histogram("rlx_time_to_first_token_seconds", "arrival to first token", registry=r,
                               buckets=_LATENCY_BUCKETS)
        self._itl = Histogram("rlx_inter_token_latency_seconds", "time between a sequence's tokens", registry=r,
                              buckets=_LATENCY_BUCKETS)
        self._drafted = Counter("rlx_speculative_draft_tokens", "tokens proposed by the speculative drafter",
                                registry=r)
        self._accepted = Counter("rlx_speculative_accepted_tokens", "proposed tokens the target kept", registry=r)
        Gauge("rlx_speculative_acceptance_rate", "accepted / proposed tokens since the server started",
              registry=r).set_function(self.acceptance_rate)
        self._per_step = Histogram("rlx_speculative_tokens_per_step",
                                   "tokens a sequence's decode step yielded under speculative decoding", registry=r,
                                   buckets=_TOKENS_PER_STEP_BUCKETS)
        self.requests = Counter("rlx_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self._window_s = window_s
        self._recent: deque[tuple[float, int]] = deque()
        self._spec_counts = [0, 0]  # proposed, accepted (the acceptance-rate gauge's)
        self._lock = threading.Lock()

    def first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def inter_token(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def tokens(self, n: int) -> None:
        self._tokens.inc(n)
        with self._lock:
            self._recent.append((time.monotonic(), n))

    def prefix_hit(self, tokens: int) -> None:
        self._prefix.inc(tokens)

    def speculated(self, proposed: int, accepted: int, produced: int) -> None:
        self._drafted.inc(proposed)
        self._accepted.inc(accepted)
        self._per_step.observe(produced)
        with self._lock:
            self._spec_counts[0] += proposed
            self._spec_counts[1] += accepted

    def acceptance_rate(self) -> float:
        with self._lock:
            proposed, accepted = self._spec_counts
        return accepted / proposed if proposed else 0.0

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - self._window_s:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / self._window_s

    def render(self) -> bytes:
        return generate_latest(self.registry)

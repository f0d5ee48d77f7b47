"""Timing helpers shared by the benchmarks: per-call time of a function, and peers timed round-robin.

Peers run one after another with a pause between them, so the previous peer's thread pool (OpenBLAS
workers spin ~0.1 s after a call, OpenMP teams too) has gone idle and does not steal the cores from
whoever runs next; medians over the rounds are reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], min_seconds: float = 0.05,
          clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of fn, from one sample of enough back-to-back calls to last min_seconds.

    `clock=time.process_time` counts this process's CPU time instead of wall time: on a shared
    machine a single-threaded peer is then not charged for the time it waits to be scheduled."""
    n = 1
    while True:
        t0 = clock()
        for _ in range(n):
            fn()
        dt = clock() - t0
        if dt >= min_seconds:
            return dt / n
        n = max(n * 2, int(n * min_seconds / max(dt, 1e-9)) + 1)


def round_robin(peers: dict[str, Callable[[], object]], rounds: int, settle: float = 0.2,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds per call of each peer over `rounds`, the peers alternating, `settle` s apart."""
    for fn in peers.values():  # warm up: first calls fault pages in and spin up thread pools
        fn()
        fn()
    samples: dict[str, list[float]] = {k: [] for k in peers}
    for _ in range(rounds):
        for name, fn in peers.items():
            time.sleep(settle)
            samples[name].append(timed(fn, clock=clock))
    return {k: statistics.median(v) for k, v in samples.items()}

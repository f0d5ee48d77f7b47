"""run_async and pipeline (rlx/runtime/pipelined.py): results as `run` gives them, in order, the feeder running
ahead of the caller, errors raised in the caller's loop, and no per-call allocation in steady state."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest

import rlx
from rlx.errors import ExecutionError

ROWS = rlx.Dim.dynamic("rows", max=128)


@pytest.fixture(scope="module")
def compiled():
    def f(t):
        x = t.input("x", [ROWS, 128])
        return {"y": (x @ t.param("w", [128, 128])).tanh(), "s": x.sum()}
    cg = rlx.Session().compile(rlx.trace("piped", f), num_threads=1)
    cg.set_param("w", np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32) * 0.1)
    return cg


def _feeds(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1 + (7 * i) % 128, 128)).astype(np.float32)} for i in range(n)]


def test_run_async_gives_runs_outputs(compiled) -> None:
    feeds = _feeds(4)
    futures = [compiled.run_async(**f) for f in feeds]
    for fut, feed in zip(futures, feeds):
        for got, want in zip(fut.result(timeout=60), compiled.run(**feed)):
            np.testing.assert_array_equal(got, want)
    bad = compiled.run_async(x=np.ones((3, 5), np.float32))
    with pytest.raises(ExecutionError, match="must have shape"):
        bad.result(timeout=60)


@pytest.mark.parametrize(("depth", "runners"), [(1, 1), (3, 1), (3, 3)])
def test_pipeline_outputs_in_order(compiled, depth: int, runners: int) -> None:
    """In input order, also when several runners finish out of order (each on its own pooled context)."""
    feeds = _feeds(9)
    got = [[a.copy() for a in outs] for outs in compiled.pipeline(iter(feeds), depth=depth, runners=runners)]
    assert len(got) == len(feeds) and compiled.max_contexts >= runners  # a context per runner
    for outs, feed in zip(got, feeds):
        for a, b in zip(outs, compiled.run(**feed)):
            np.testing.assert_array_equal(a, b)


def test_the_feeder_prepares_ahead_while_the_caller_holds_an_item(compiled) -> None:
    asked = [threading.Event() for _ in range(4)]

    def items():
        for i, feed in enumerate(_feeds(4)):
            asked[i].set()
            yield feed

    for i, _ in enumerate(compiled.pipeline(items(), depth=2)):
        if i == 0:  # while the caller still holds item 0, items 1 and 2 are fetched (and run) meanwhile
            assert asked[2].wait(timeout=60)


@pytest.mark.parametrize("runners", [1, 2])
def test_errors_reach_the_callers_loop_in_order(compiled, runners: int) -> None:
    feeds = _feeds(3)
    feeds[1] = {"x": np.ones((2, 7), np.float32)}
    seen = 0
    with pytest.raises(ExecutionError, match="must have shape"):
        for _ in compiled.pipeline(feeds, runners=runners):
            seen += 1
    assert seen == 1

    def broken():
        yield _feeds(1)[0]
        raise ValueError("the caller's preparation failed")

    with pytest.raises(ValueError, match="preparation failed"):
        list(compiled.pipeline(broken()))
    with pytest.raises(ExecutionError, match="depth must be an int >= 1"):
        next(compiled.pipeline(feeds, depth=0))
    with pytest.raises(ExecutionError, match=r"runners must be an int in 1..depth \(2\)"):
        next(compiled.pipeline(feeds, runners=3))


def test_stopping_early_stops_the_threads(compiled) -> None:
    before = threading.active_count()
    stream = compiled.pipeline(iter(_feeds(50)), depth=2)
    next(stream)
    stream.close()
    assert threading.active_count() == before


def test_no_allocation_per_call_in_steady_state(compiled) -> None:
    feed = {"x": np.ones((128, 128), np.float32)}  # outputs of 64 KiB a call: an allocation would show
    out_bytes = 128 * 128 * 4

    def measure(calls) -> tuple[int, int]:
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            calls()
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return current - start, peak - start

    # the measurement sees a plain run's output allocation ...
    _, run_peak = measure(lambda: [compiled.run(**feed) for _ in range(20)])
    assert run_peak >= out_bytes
    # ... and a pipeline in steady state (after warm-up) holds no new buffer per call and grows nothing
    tracemalloc.start()
    try:
        stream = compiled.pipeline(feed for _ in range(60))
        for i, _ in enumerate(stream):
            if i == 10:
                start = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - start < out_bytes // 4, f"steady-state peak grew {peak - start} bytes"
    assert current - start < 16 * 1024, f"steady state kept {current - start} bytes"

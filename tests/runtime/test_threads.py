"""`CompiledGraph.run` from many threads at once: the context pool, set_param while runs are in
flight, per-context errors, and a ThreadSanitizer run of the generated code."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable

import numpy as np
import pytest
from cpu_helpers import sanitizer_env, session

import rlx
from rlx.ir import ops as O

THREADS = 8
CALLS = 500


def _graph(max_batch: int = 8) -> rlx.Graph:
    """Small, but every run uses the arena (matmul, gelu, layer norm) and the scratch (attention)."""
    batch = rlx.Dim.dynamic("batch", max=max_batch)
    g = rlx.Graph("pooled")
    x = g.input("x", [batch, 8, 32])
    w = g.param("w", [32, 32])
    b = g.param("b", [32])
    gamma = g.param("gamma", [32])
    h = g.add(O.FusedMatMulBiasAct("gelu"), [x, w, b])
    n = g.layer_norm(g.add_(h, x), gamma, b)
    a = g.attention(n, n, h, num_heads=4, head_dim=8)
    g.set_outputs({"a": a, "s": g.reduce("sum", n, [2])})
    return g


def _params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": (rng.standard_normal((32, 32)) * 0.2).astype(np.float32),
            "b": rng.standard_normal(32).astype(np.float32),
            "gamma": rng.standard_normal(32).astype(np.float32)}


@pytest.fixture(scope="module")
def pooled():
    cg = session().compile(_graph(), opt_level=2)
    for k, v in _params(0).items():
        cg.set_param(k, v)
    rng = np.random.default_rng(1)
    # Batch sizes 1..8 in a scrambled order: threads running side by side use different sizes.
    feeds = [rng.standard_normal((1 + (7 * i) % 8, 8, 32)).astype(np.float32) for i in range(40)]
    return cg, feeds


def _run_threads(n: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            start.wait()
            work(i)
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want))


def test_concurrent_runs_are_bit_equal_to_single_threaded_runs(pooled):
    cg, feeds = pooled
    cg.num_threads = 2  # each run also forks an OpenMP team
    cg.max_contexts = 3  # fewer contexts than threads: callers wait for one and reuse it
    want = [cg.run(x=x) for x in feeds]  # single-threaded, one at a time
    bad: list[tuple[int, int]] = []
    counts = [0] * THREADS

    def work(i: int) -> None:
        for j in range(CALLS):
            k = (i * 5 + j) % len(feeds)
            if not _same(cg.run(x=feeds[k]), want[k]):
                bad.append((i, j))
            counts[i] += 1

    _run_threads(THREADS, work)
    assert counts == [CALLS] * THREADS
    assert not bad, f"{len(bad)} of {THREADS * CALLS} concurrent runs differ from the single-threaded run"
    assert 2 <= cg.num_contexts <= 3


def test_run_slots_is_thread_safe_too(pooled):
    cg, feeds = pooled
    cg.max_contexts = 4
    want = [cg.run(x=x) for x in feeds]
    bad: list[int] = []

    def work(i: int) -> None:
        for j in range(100):
            k = (i * 3 + j) % len(feeds)
            outs = [np.empty_like(w) for w in want[k]]
            cg.run_slots([feeds[k]], outs)
            if not _same(outs, want[k]):
                bad.append(j)

    _run_threads(4, work)
    assert not bad


def test_set_param_reaches_every_pooled_context(pooled):
    cg, feeds = pooled
    cg.max_contexts = 4
    p0, p1 = _params(0), _params(5)
    want0 = [cg.run(x=x) for x in feeds[:8]]
    for k, v in p1.items():
        cg.set_param(k, v)
    want1 = [cg.run(x=x) for x in feeds[:8]]
    assert not _same(want0[0], want1[0])
    for params, want in ((p0, want0), (p1, want1), (p0, want0)):
        _grow_pool(cg, 4)
        for k, v in params.items():
            cg.set_param(k, v)
        assert cg.num_contexts == 1  # clones holding the old values were dropped
        stale: list[int] = []

        def work(i: int, want: list = want, stale: list = stale) -> None:
            for j in range(40):
                k = (i + j) % 8
                if not _same(cg.run(x=feeds[k]), want[k]):
                    stale.append(k)

        _run_threads(4, work)
        assert not stale, "a pooled context computed with params that were replaced"


def _grow_pool(cg: rlx.CompiledGraph, n: int) -> None:
    """Make the pool hold `n` contexts, as `n` overlapping runs would (white-box: runs are too short to
    overlap reliably on a loaded machine)."""
    with contextlib.ExitStack() as stack:
        for _ in range(n):
            stack.enter_context(cg._pool.checkout())
    assert cg.num_contexts == n


def test_set_param_while_runs_are_in_flight():
    """set_param waits for the runs in flight and keeps new ones out: with one param, every run
    computes with exactly one of the values, never a half-copied weight."""
    g = rlx.Graph("one_param")
    x = g.input("x", [rlx.Dim.dynamic("n", max=64), 16])
    w = g.param("w", [16, 16])
    g.set_outputs([g.softmax(g.matmul(x, w))])
    cg = session().compile(g)
    cg.max_contexts = 4
    rng = np.random.default_rng(3)
    ws = [rng.standard_normal((16, 16)).astype(np.float32) for _ in range(2)]
    xs = [rng.standard_normal((n, 16)).astype(np.float32) for n in (1, 17, 64)]
    want = []
    for wv in ws:
        cg.set_param("w", wv)
        want.append([cg.run(x=xv)[0] for xv in xs])
    stop = threading.Event()
    torn: list[int] = []

    def runner(i: int) -> None:
        j = 0
        while not stop.is_set():
            k = (i + j) % len(xs)
            got = cg.run(x=xs[k])[0]
            if not (np.array_equal(got, want[0][k]) or np.array_equal(got, want[1][k])):
                torn.append(k)
            j += 1

    workers = [threading.Thread(target=runner, args=(i,)) for i in range(4)]
    for t in workers:
        t.start()
    for flip in range(40):
        cg.set_param("w", ws[flip % 2])
    stop.set()
    for t in workers:
        t.join()
    assert not torn
    _run_threads(4, lambda i: [np.testing.assert_array_equal(cg.run(x=xs[k])[0], want[1][k]) for k in range(3)])


def test_errors_are_read_from_the_failing_context():
    g = rlx.Graph("lookup")
    ids = g.input("ids", [rlx.Dim.dynamic("n", max=32)], "i32")
    g.set_outputs([g.gather(g.param("t", [10, 4]), ids)])
    cg = session().compile(g)
    cg.set_param("t", np.arange(40, dtype=np.float32).reshape(10, 4))
    cg.max_contexts = 4
    wrong: list[str] = []

    def work(i: int) -> None:
        for j in range(100):
            n = 1 + (i + j) % 32
            good = np.arange(n, dtype=np.int32) % 10
            if (i + j) % 3 == 0:
                bad = good.copy()
                bad[-1] = 10 + i
                try:
                    cg.run(ids=bad)
                except rlx.ExecutionError as exc:
                    if f"gather index {10 + i}" not in str(exc):
                        wrong.append(str(exc))
                else:
                    wrong.append("no error")
            elif not np.array_equal(cg.run(ids=good)[0], np.arange(40, dtype=np.float32).reshape(10, 4)[good]):
                wrong.append("bad output")

    _run_threads(4, work)
    assert not wrong, wrong[:3]


def test_pool_bound_and_thread_count_are_checked(pooled):
    cg, feeds = pooled
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(rlx.ExecutionError, match="max_contexts must be an int >= 1"):
            cg.max_contexts = bad
    cg.max_contexts = 2
    _run_threads(6, lambda i: [cg.run(x=feeds[i]) for _ in range(30)])
    assert cg.num_contexts <= 2
    cg.max_contexts = 1  # drops the idle clone
    assert (cg.max_contexts, cg.num_contexts) == (1, 1)
    cg.max_contexts = 4
    _run_threads(4, lambda i: [cg.run(x=feeds[i]) for _ in range(30)])
    cg.num_threads = 1  # applies to every pooled context
    want = cg.run(x=feeds[0])
    _run_threads(4, lambda i: [np.testing.assert_array_equal(cg.run(x=feeds[0])[1], want[1]) for _ in range(20)])
    assert cg.num_threads == 1
    default = session().compile(_graph())
    assert default.max_contexts == (os.cpu_count() or 1)
    assert session().compile(_graph()).clone().max_contexts == default.max_contexts


TSAN_SCRIPT = textwrap.dedent("""
    import sys, threading, numpy as np, rlx
    from rlx.ir import ops as O
    from rlx.runtime.abi import ffi

    batch = rlx.Dim.dynamic("batch", max=8)
    g = rlx.Graph("tsan")
    x = g.input("x", [batch, 8, 32])
    w = g.param("w", [32, 32]); b = g.param("b", [32])
    h = g.add(O.FusedMatMulBiasAct("gelu"), [x, w, b])
    g.set_outputs([g.attention(h, h, h, num_heads=4, head_dim=8), g.reduce("sum", h, [2])])
    cg = rlx.Session().compile(g, num_threads=1)  # one thread per run: libgomp is not TSan-aware
    rng = np.random.default_rng(0)
    cg.set_param("w", rng.standard_normal((32, 32)).astype(np.float32))
    cg.set_param("b", rng.standard_normal(32).astype(np.float32))
    feeds = [rng.standard_normal((1 + i % 8, 8, 32)).astype(np.float32) for i in range(8)]
    want = [cg.run(x=f) for f in feeds]
    bad = []

    def pooled(i):
        for j in range(40):
            k = (i + j) % 8
            if not all(np.array_equal(a, b) for a, b in zip(cg.run(x=feeds[k]), want[k])):
                bad.append(k)

    def shared(i):  # the negative control: two threads on ONE context, as before the pool
        lib, ctx = cg._lib, cg._ctx
        f = feeds[7 - i]
        outs = [np.empty(o.shape, np.float32) for o in want[7 - i]]
        sym = ffi.new("int64_t[]", [f.shape[0]])
        ins = ffi.new("void *[]", [ffi.from_buffer(f)])
        outp = ffi.new("void *[]", [ffi.from_buffer(o, require_writable=True) for o in outs])
        start.wait()  # both threads enter the loop together, even on a loaded machine
        for _ in range(200):
            lib.rlx_run(ctx, sym, ins, outp)

    target = pooled if sys.argv[1] == "pooled" else shared
    start = threading.Barrier(2)
    threads = [threading.Thread(target=target, args=(i,)) for i in range(4 if target is pooled else 2)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not bad, bad
    print("TSAN-DONE", cg.num_contexts)
""")


def test_pooled_runs_are_threadsanitizer_clean():
    """The generated code under -fsanitize=thread, driven by 4 Python threads through the pool.

    The same script sharing one context between two threads (the bug the pool fixes) is the
    control: TSan must report that race, or the clean run would prove nothing.
    """
    # Only the generated library is instrumented; the interpreter, numpy and BLAS are not.
    env = sanitizer_env("thread", {"TSAN_OPTIONS": "report_signal_unsafe=0:halt_on_error=0:exitcode=66"})
    runs = {}
    for mode in ("pooled", "shared"):
        runs[mode] = subprocess.run([sys.executable, "-c", TSAN_SCRIPT, mode], env=env, capture_output=True,
                                    text=True, timeout=300)
    control = runs["shared"]
    if "ThreadSanitizer: data race" not in control.stderr:
        pytest.fail("TSan did not catch two threads sharing one context; the check is not working:\n"
                    + control.stderr[-3000:])
    pooled = runs["pooled"]
    assert pooled.returncode == 0 and "TSAN-DONE" in pooled.stdout, pooled.stderr[-6000:]
    assert "ThreadSanitizer" not in pooled.stderr, pooled.stderr[-6000:]
    assert int(pooled.stdout.split()[-1]) > 1  # the runs really overlapped on several contexts

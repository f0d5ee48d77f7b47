"""`launch(fn, nprocs=N)`: run `fn(rank)` on N ranks and join them, with no hang on a failure.

Each rank gets a `Rank` (its `rank`, the `world`, and what its collectives need)
and calls `rank.attach(compiled)` on every compiled graph with collective ops:

- CPU: the ranks share one POSIX shared-memory region, created by the launcher
  and mapped by each rank (`rlx.runtime.transport`); `attach` opens this rank's
  shared-memory transport on it.
- CUDA: the launcher creates the NCCL unique id (`ncclGetUniqueId`, the
  `nvidia-nccl-cu12` wheel's libnccl) and hands it to every rank; `attach` makes
  the graph's NCCL communicator for this rank on GPU `rank`.

Ranks are processes (spawned: a fresh interpreter each, so no OpenMP or CUDA
state is inherited) or, with `threads=True`, threads of this process (cheap,
for tests: compiled runs release the GIL). `fn` and its `args` must pickle for
processes (a module-level function). Results come back in rank order.

Failure: an exception in a rank raises `RankError` here naming the rank, with
its traceback; the launcher raises the shared abort flag so ranks waiting at a
collective fail at once, and ranks still running after `grace_s` are
terminated. A rank that dies without reporting (a crash, a kill) is found by
its exit code; nothing waits longer than `timeout_s`.

>>> import numpy as np, rlx
>>> from rlx.ir.ops import AllReduce
>>> def rank_sum(rank):
...     g = rlx.Graph("sum")
...     g.set_outputs([g.add(AllReduce(world=rank.world), [g.input("x", [2])])])
...     cg = rank.attach(rlx.Session().compile(g, num_threads=1))
...     return cg.run(x=np.full(2, rank.rank + 1.0, np.float32))[0].tolist()
>>> launch(rank_sum, nprocs=2, threads=True)
[[3.0, 3.0], [3.0, 3.0]]
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlx.errors import ExecutionError

#: Default bound on a whole launch, and on one collective's wait for the other ranks.
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0
DEVICES = ("cpu", "cuda")


class RankError(ExecutionError):
    """A rank failed (raised, crashed or timed out); `rank` names it, the message carries its traceback."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(message)
        self.rank = rank


@dataclass
class Rank:
    """What one rank's `fn` receives: its rank, the world, and `attach` for graphs with collectives."""

    rank: int
    world: int
    device: str = "cpu"
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    #: CPU: the shared-memory segment's name and size (processes) or the region itself (threads).
    region_name: str | None = None
    region_bytes: int = 0
    #: CUDA: the NCCL unique id the launcher made (128 bytes).
    nccl_id: bytes | None = None
    _region: Any = field(default=None, repr=False)
    _transports: list = field(default_factory=list, repr=False)

    def region(self) -> Any:
        """The shared-memory region of this launch (mapped on first use in a rank process)."""
        if self._region is None:
            from rlx.runtime.transport import ShmRegion

            if self.region_name is None:
                raise ExecutionError("this launch has no shared-memory region (device is not cpu)")
            self._region = ShmRegion.attach(self.region_name, self.world, self.region_bytes)
        return self._region

    def attach(self, compiled: Any) -> Any:
        """Give `compiled` (a graph with collectives) this rank's transport; returns it."""
        if self.device == "cuda":
            from rlx.runtime.nccl import attach_nccl

            attach_nccl(compiled, self.nccl_id, self.rank, self.world)  # the context owns its communicator
        else:
            from rlx.runtime.transport import attach_shm

            self._transports.append(attach_shm(compiled, self.region(), self.rank,
                                               timeout_s=self.collective_timeout_s))
        return compiled

    def abort(self) -> None:
        """Make every rank's pending and later collectives fail (this rank is giving up)."""
        if self.device == "cpu" and (self._region is not None or self.region_name is not None):
            self.region().abort()


def local_ranks(world: int, *, slot_bytes: int | None = None,
                collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S) -> list[Rank]:
    """`world` CPU ranks over one shared-memory region of this process, for callers that drive the
    ranks from their own threads (a benchmark timing one step of every rank); `launch` does that
    for a function. Each rank's runs must go on its own thread: a collective waits for the others."""
    from rlx.runtime.transport import DEFAULT_SLOT_BYTES, ShmRegion

    region = ShmRegion.local(world, slot_bytes or DEFAULT_SLOT_BYTES)
    return [Rank(r, world, "cpu", collective_timeout_s, None, region.nbytes, None, region) for r in range(world)]


def launch(fn: Callable[..., Any], nprocs: int, *, args: Sequence[Any] = (), device: str = "cpu",
           threads: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
           collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S, slot_bytes: int | None = None,
           grace_s: float = 5.0) -> list[Any]:
    """Run `fn(rank, *args)` on `nprocs` ranks; their results in rank order (see the module docstring)."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ExecutionError(f"nprocs must be a positive int, got {nprocs!r}")
    if device not in DEVICES:
        raise ExecutionError(f"unknown device {device!r}; expected one of {DEVICES}")
    if not callable(fn):
        raise ExecutionError(f"fn must be callable, got {type(fn).__name__}")
    if device == "cuda" and threads:
        raise ExecutionError("device='cuda' runs one process per GPU; threads=True is for CPU ranks")
    from rlx.runtime.transport import DEFAULT_SLOT_BYTES, ShmRegion

    region = nccl_id = None
    if device == "cuda":
        from rlx.runtime.nccl import check_gpus, unique_id

        check_gpus(nprocs)
        nccl_id = unique_id()
    elif threads:
        region = ShmRegion.local(nprocs, slot_bytes or DEFAULT_SLOT_BYTES)
    else:
        region = ShmRegion.create(nprocs, slot_bytes or DEFAULT_SLOT_BYTES)
    ranks = [Rank(r, nprocs, device, collective_timeout_s, region.name if region is not None else None,
                  region.nbytes if region is not None else 0, nccl_id) for r in range(nprocs)]
    try:
        if threads:
            for rk in ranks:
                rk._region = region
            return _run_threads(fn, ranks, tuple(args), region, timeout_s)
        return _run_processes(fn, ranks, tuple(args), region, timeout_s, grace_s)
    finally:
        if region is not None:
            region.close()


def _failure(rank: int, world: int, exc: BaseException) -> tuple[str, str]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"rank {rank} of {world} failed: {type(exc).__name__}: {exc}", tb


def _raise_first(errors: list[tuple[int, str, str]], world: int) -> None:
    # The first failure is the cause; "abandoned" collectives on other ranks are its consequence.
    errors.sort(key=lambda e: ("abandoned" in e[1] or "another rank failed" in e[1], e[0]))
    rank, message, tb = errors[0]
    others = ", ".join(str(e[0]) for e in errors[1:])
    raise RankError(rank, f"{message}" + (f" (ranks {others} failed too)" if others else "")
                    + f"\n--- rank {rank} traceback ---\n{tb}")


def _run_threads(fn: Callable, ranks: list[Rank], args: tuple, region: Any, timeout_s: float) -> list[Any]:
    results: list[Any] = [None] * len(ranks)
    errors: list[tuple[int, str, str]] = []

    def body(rk: Rank) -> None:
        try:
            results[rk.rank] = fn(rk, *args)
        except BaseException as exc:  # reported to the caller with the rank named
            errors.append((rk.rank, *_failure(rk.rank, rk.world, exc)))
            region.abort()

    workers = [threading.Thread(target=body, args=(rk,), name=f"rlx-rank-{rk.rank}", daemon=True) for rk in ranks]
    for t in workers:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in workers:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [i for i, t in enumerate(workers) if t.is_alive()]
    if stuck:
        region.abort()  # a thread cannot be killed: release its collectives and report
        for t in workers:
            t.join(5.0)
        errors.extend((r, f"rank {r} of {len(ranks)} did not finish within {timeout_s:.0f} s", "") for r in stuck)
    if errors:
        _raise_first(errors, len(ranks))
    return results


def _rank_main(fn: Callable, rk: Rank, args: tuple, out: Any) -> None:
    """A rank process: run fn, report ("ok", rank, result) or ("error", rank, message, traceback)."""
    try:
        if rk.device == "cuda":  # one process per GPU: rank r's graphs are made on GPU r
            from rlx.runtime.nccl import select_device

            select_device(rk.rank)
        result = fn(rk, *args)
    except BaseException as exc:
        rk.abort()
        out.put(("error", rk.rank, *_failure(rk.rank, rk.world, exc)))
        return
    try:
        out.put(("ok", rk.rank, result))
    except Exception as exc:  # an unpicklable result
        out.put(("error", rk.rank, *_failure(rk.rank, rk.world, exc)))


def _run_processes(fn: Callable, ranks: list[Rank], args: tuple, region: Any, timeout_s: float,
                   grace_s: float) -> list[Any]:
    try:  # a spawned rank receives fn and args pickled: say so before starting anything
        pickle.dumps((fn, args))
    except Exception as exc:
        raise ExecutionError(f"launch runs ranks as processes, which receive fn and args pickled, and they do not "
                             f"pickle ({type(exc).__name__}: {exc}); use a module-level function, or threads=True"
                             ) from None
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(fn, rk, args, out), name=f"rlx-rank-{rk.rank}", daemon=True)
             for rk in ranks]
    for p in procs:
        p.start()
    world = len(ranks)
    results: list[Any] = [None] * world
    done: set[int] = set()
    errors: list[tuple[int, str, str]] = []
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    try:
        while len(done) < world:
            try:
                msg = out.get(timeout=0.1)
            except queue.Empty:
                msg = None
            if msg is not None:
                done.add(msg[1])
                if msg[0] == "ok":
                    results[msg[1]] = msg[2]
                else:
                    errors.append((msg[1], msg[2], msg[3]))
            now = time.monotonic()
            for r, p in enumerate(procs):  # died without a word (crash, kill, os._exit)
                if r not in done and p.exitcode is not None and out.empty():
                    done.add(r)
                    errors.append((r, f"rank {r} of {world} exited with code {p.exitcode} without a result", ""))
            if errors and failed_at is None:
                failed_at = now
                if region is not None:
                    region.abort()
            if failed_at is not None and now - failed_at > grace_s:
                break  # the others had their chance to report
            if now > deadline:
                if region is not None:
                    region.abort()
                errors.extend((r, f"rank {r} of {world} did not finish within {timeout_s:.0f} s", "")
                              for r in range(world) if r not in done)
                break
    finally:
        for p in procs:
            p.join(0.5 if errors else 5.0)
            if p.is_alive():
                p.terminate()
                p.join(5.0)
        out.close()
    if errors:
        _raise_first(errors, world)
    return results


__all__ = ["Rank", "RankError", "launch", "local_ranks"]

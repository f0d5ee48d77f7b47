"""`LocalTransport`: N ranks as threads of one process, exchanging arrays through shared memory.

The meaning of the collective ops (`all_reduce`, `all_gather`, `reduce_scatter`)
needs every rank's value. `run_ranks(world, fn)` runs `fn(rank)` on `world`
threads, each bound to one shared `LocalTransport`; the reference evaluator of a
collective op asks `current()` for the calling thread's transport and rank. A
collective is a rendezvous: every rank posts its array into a shared slot,
waits at a barrier, computes the result from all slots (in rank order, so every
rank gets bit-identical values), and waits again before the slots are reused.

A rank that fails aborts the barrier, so the others raise instead of waiting
forever; `run_ranks` re-raises the first rank's error.

>>> import numpy as np
>>> def fn(rank):
...     return current().all_reduce(np.array([rank + 1.0]), "sum")
>>> [r.tolist() for r in run_ranks(3, fn)]
[[6.0], [6.0], [6.0]]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from rlx.errors import ExecutionError

T = TypeVar("T")
#: Reductions the collectives support.
COLLECTIVE_REDUCES = ("sum", "max")
_TIMEOUT_S = 120.0
_bound = threading.local()


@dataclass(frozen=True)
class RankHandle:
    """What a rank's thread sees: the transport and its own rank; collectives are its methods."""

    transport: LocalTransport
    rank: int

    @property
    def world(self) -> int:
        return self.transport.world

    def all_reduce(self, x: np.ndarray, reduce: str) -> np.ndarray:
        return _reduce(self.transport.exchange(self.rank, x), reduce)

    def all_gather(self, x: np.ndarray, axis: int) -> np.ndarray:
        return np.concatenate(self.transport.exchange(self.rank, x), axis=axis)

    def reduce_scatter(self, x: np.ndarray, reduce: str, axis: int) -> np.ndarray:
        total = _reduce(self.transport.exchange(self.rank, x), reduce)
        return np.split(total, self.world, axis=axis)[self.rank]


class LocalTransport:
    """Shared slots and a barrier for `world` ranks running as threads of this process."""

    def __init__(self, world: int) -> None:
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ExecutionError(f"world size must be a positive int, got {world!r}")
        self.world = world
        self._slots: list[Any] = [None] * world
        self._barrier = threading.Barrier(world, timeout=_TIMEOUT_S)

    def exchange(self, rank: int, x: np.ndarray) -> list[np.ndarray]:
        """Post `x` as `rank`'s value and return every rank's value (rank order) once all have posted."""
        self._slots[rank] = np.asarray(x)
        self._wait()
        values = list(self._slots)
        shapes = {v.shape for v in values}
        self._wait()  # nobody overwrites a slot before every rank has read them all
        if len(shapes) != 1:
            raise ExecutionError(f"collective inputs differ in shape across ranks: {sorted(shapes)}")
        return values

    def abort(self) -> None:
        self._barrier.abort()

    def _wait(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise ExecutionError("a collective was abandoned: another rank failed or did not reach it "
                                 f"within {_TIMEOUT_S:.0f} s") from None


def _reduce(values: Sequence[np.ndarray], reduce: str) -> np.ndarray:
    if reduce not in COLLECTIVE_REDUCES:
        raise ExecutionError(f"unknown collective reduction {reduce!r}; expected one of {COLLECTIVE_REDUCES}")
    out = np.array(values[0], copy=True)
    for v in values[1:]:  # rank order: every rank computes the same bits
        out = out + v if reduce == "sum" else np.maximum(out, v)
    return out


def current() -> RankHandle:
    """The calling thread's rank (inside `run_ranks`); `ExecutionError` outside one."""
    handle = getattr(_bound, "handle", None)
    if handle is None:
        raise ExecutionError("a collective op ran outside a multi-rank run; run the graph with "
                             "rlx.reference.run_ranks (or rlx.ir.transport.run_ranks)")
    return handle


def run_ranks(world: int, fn: Callable[[int], T]) -> list[T]:
    """Run `fn(rank)` for every rank on its own thread over one `LocalTransport`; results in rank order."""
    transport = LocalTransport(world)
    results: list[Any] = [None] * world
    errors: list[tuple[int, BaseException]] = []

    def body(rank: int) -> None:
        _bound.handle = RankHandle(transport, rank)
        try:
            results[rank] = fn(rank)
        except BaseException as exc:
            errors.append((rank, exc))
            transport.abort()
        finally:
            _bound.handle = None

    threads = [threading.Thread(target=body, args=(r,), name=f"rlx-rank-{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        # The first failure is the cause; the others are the abandoned barriers it left behind.
        first = next((e for e in errors if "abandoned" not in str(e[1])), errors[0])
        raise first[1]
    return results

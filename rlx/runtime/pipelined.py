"""Pipelined runs of a compiled graph: `run_async` and `pipeline` (`CompiledGraph.run_async` / `.pipeline`).

`run_async(**inputs)` hands one run to the graph's own worker thread and returns a
`concurrent.futures.Future` of its outputs, so the caller prepares the next inputs meanwhile (the run
releases the GIL).

`pipeline(inputs_iterable, depth, runners)` overlaps three stages on a stream of inputs, on threads:

1. a feeder pulls the next item from `inputs_iterable` (where the caller's own preparation runs:
   tokenizing, reading, ...) and copies it into a free slot's input buffers;
2. `runners` runner threads each run the graph on a filled slot, writing its output buffers (each run
   takes its own pooled context: on CUDA its own stream, so two small batches share the GPU; one
   runner on the CPU, where one run takes every core). `max_contexts` is raised to `runners` if lower
   (a CUDA graph keeps one context by default: the second is a clone, params copied on the device);
3. the caller's loop receives the slots' outputs, in input order, while the next items are fed and run.

Up to `depth` items are in flight between the stages (fed, running, or run and not yet received),
besides the one the caller holds. Each slot owns input and output buffers sized for the graph's largest
dims, allocated once; a slot's arrays (views of the shapes of the item) are made once per shape, so a
steady stream of one shape allocates nothing per call. The yielded output arrays are the slot's buffers:
they hold the item's outputs until the next item is requested (copy what you keep). Outputs come in the
order of the inputs; an error in preparing or running an item is raised in the caller's loop, and
stopping the loop early stops the threads.

On CUDA the threads overlap the host side (preparation, the blocking run with its copies) and, with two
runners, two runs on their contexts' streams; each slot's input and output arrays are pinned host memory
(`CudaGraph.host_empty`), so a run's copies in and out go by DMA straight from and to them.

>>> import numpy as np, rlx
>>> g = rlx.Graph("sq")
>>> g.set_outputs([g.mul(*[g.input("x", [rlx.Dim.dynamic("n", 8)])] * 2)])
>>> cg = rlx.Session().compile(g)
>>> cg.run_async(x=np.arange(3, dtype=np.float32)).result()[0].tolist()
[0.0, 1.0, 4.0]
>>> [out[0].tolist() for out in cg.pipeline({"x": np.full(n, n, np.float32)} for n in (1, 2))]
[[1.0], [4.0, 4.0]]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from rlx.errors import ExecutionError
from rlx.ir.dtype import DType
from rlx.runtime.abi import ffi
from rlx.runtime.conversions import _to_input_dtype

#: How long a stage waits on a queue before checking whether the pipeline was stopped (seconds).
_POLL = 0.1


def async_executor(owner: Any) -> ThreadPoolExecutor:
    """The one-thread executor of `owner`'s `run_async` (made on first use, kept with the graph)."""
    with _EXECUTOR_LOCK:
        pool = getattr(owner, "_async_pool", None)
        if pool is None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlx-run-async")
            owner._async_pool = pool
        return pool


_EXECUTOR_LOCK = threading.Lock()


def run_async(compiled: Any, inputs: Mapping[str, Any]) -> Future:
    """`compiled.run(inputs)` on the graph's worker thread."""
    return async_executor(compiled).submit(compiled.run, dict(inputs))


class _Slot:
    """One item's buffers: inputs and outputs at the graph's largest dims, and their views per shape."""

    def __init__(self, compiled: Any) -> None:
        lib = compiled._library
        bounds = dict(lib.symbols)
        # pinned host memory on CUDA (`CudaGraph.host_empty`), plain arrays elsewhere
        self.inputs = [compiled.host_empty(t.concrete(bounds), t.dtype.np) for t in lib.inputs]
        self.outputs = [compiled.host_empty(t.concrete(bounds), t.dtype.np) for t in lib.outputs]
        #: the shapes of the item this slot holds -> (symbol values, input views, output views, cffi buffers)
        self.views: dict[tuple, tuple[list[int], list[np.ndarray], list[np.ndarray], list[Any]]] = {}
        self.key: tuple = ()
        self.seq = 0
        self.error: BaseException | None = None

    def bind(self, compiled: Any, shapes: tuple) -> None:
        """Make (once per shape) and select the views of `shapes` (the item's input shapes)."""
        self.key = shapes
        if shapes in self.views:
            return
        lib = compiled._library
        ins = [buf.reshape(-1)[:int(np.prod(s))].reshape(s) for buf, s in zip(self.inputs, shapes)]
        symbols = compiled._bind_symbols(ins)
        outs = []
        for buf, t in zip(self.outputs, lib.outputs):
            s = t.concrete(symbols)
            outs.append(buf.reshape(-1)[:int(np.prod(s))].reshape(s))
        keep = [ffi.from_buffer(a) for a in ins] + [ffi.from_buffer(a, require_writable=True) for a in outs]
        self.views[shapes] = ([symbols[n] for n in compiled._sym_order], ins, outs, keep)


def _fill(compiled: Any, slot: _Slot, item: Mapping[str, Any]) -> None:
    """Copy one item's inputs into `slot` (the dtype rules of `run`)."""
    lib = compiled._library
    if not isinstance(item, Mapping):
        raise ExecutionError(f"pipeline items must be dicts of named inputs, got {type(item).__name__}")
    missing = [t.name for t in lib.inputs if t.name not in item]
    unknown = [k for k in item if k not in compiled._inputs]
    if missing or unknown:
        raise ExecutionError(f"pipeline item: missing inputs {missing}, unknown inputs {unknown}")
    values = []
    for t in lib.inputs:
        v = item[t.name]
        if t.state:
            raise ExecutionError(f"pipeline cannot take state input {t.name!r} (it is updated in place); use run")
        if not (isinstance(v, np.ndarray) and v.dtype == t.dtype.np and t.dtype is not DType.BF16):
            v = _to_input_dtype(t.name, v, t.dtype)
        values.append(v)
    slot.bind(compiled, tuple(v.shape for v in values))
    for view, v in zip(slot.views[slot.key][1], values):
        np.copyto(view, v, casting="no")


def default_runners(compiled: Any) -> int:
    """Runner threads by default: 1 on the CPU (one run takes every core), 2 on CUDA (two pooled contexts, two
    streams: a small batch's kernels leave room on the GPU for the next one's)."""
    return 2 if str(compiled.manifest.get("target", "cpu")) == "cuda" else 1


def pipeline(compiled: Any, items: Iterable[Mapping[str, Any]], depth: int = 2,
             runners: int | None = None) -> Iterator[list[np.ndarray]]:
    """The outputs of `compiled` on each item of `items`, in order, with the stages overlapped (module doc)."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ExecutionError(f"pipeline depth must be an int >= 1, got {depth!r}")
    runners = default_runners(compiled) if runners is None else runners
    if isinstance(runners, bool) or not isinstance(runners, int) or not 1 <= runners <= depth:
        raise ExecutionError(f"pipeline runners must be an int in 1..depth ({depth}), got {runners!r}")
    if compiled.max_contexts < runners:  # each runner runs on its own context (CUDA: 1 by default)
        compiled.max_contexts = runners
    slots = [_Slot(compiled) for _ in range(depth + 1)]  # `depth` in flight and the one the caller holds
    free: queue.Queue[_Slot] = queue.Queue()
    for s in slots:
        free.put(s)
    fed: queue.Queue[_Slot | None] = queue.Queue()
    done: queue.Queue[_Slot | None] = queue.Queue()
    stop = threading.Event()
    ahead = threading.Semaphore(depth)  # items fed but not yet handed to the caller

    def take(q: queue.Queue) -> Any:
        while not stop.is_set():
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                continue
        return None

    def acquire() -> bool:
        while not stop.is_set():
            if ahead.acquire(timeout=_POLL):
                return True
        return False

    def feeder() -> None:
        seq = 0
        try:
            for item in items:
                if not acquire():
                    return
                slot = take(free)
                if slot is None:
                    return
                slot.seq, seq = seq, seq + 1
                try:
                    _fill(compiled, slot, item)
                except BaseException as exc:  # handed to the caller's loop in order
                    slot.error = exc
                fed.put(slot)
                if slot.error is not None:
                    return
        except BaseException as exc:  # the iterable itself failed
            slot = take(free)
            if slot is not None:
                slot.seq, slot.error = seq, exc
                fed.put(slot)
            return
        for _ in range(runners):
            fed.put(None)

    def runner() -> None:
        while True:
            slot = take(fed)
            if slot is None:
                done.put(None)
                return
            if slot.error is None:
                sym_values, _, _, keep = slot.views[slot.key]
                try:
                    compiled._run_buffers(sym_values, keep, len(slot.inputs))
                except BaseException as exc:  # handed to the caller's loop in order
                    slot.error = exc
            done.put(slot)

    threads = [threading.Thread(target=feeder, name="rlx-pipeline-feed", daemon=True)]
    threads += [threading.Thread(target=runner, name=f"rlx-pipeline-run{i}", daemon=True) for i in range(runners)]
    for t in threads:
        t.start()
    held: _Slot | None = None
    finished: dict[int, _Slot] = {}  # run out of order (several runners), waiting for their turn
    ended, want = 0, 0
    try:
        while True:
            if held is not None:
                free.put(held)
                held = None
            while want not in finished and ended < runners:
                slot = take(done)
                if slot is None:
                    if stop.is_set():
                        return
                    ended += 1
                else:
                    finished[slot.seq] = slot
            if want not in finished:
                return
            slot = finished.pop(want)
            want += 1
            ahead.release()  # received: the feeder may prepare another item while the caller reads this one
            if slot.error is not None:
                raise slot.error
            held = slot
            yield slot.views[slot.key][2]
    finally:
        stop.set()
        for t in threads:
            t.join()

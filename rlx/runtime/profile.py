"""Time spans of a profiled build: read them, summarize them, write them as chrome-trace JSON.

A profiled library (`Session(profile=True)` or `RLX_PROFILE=1`; see
`templates/cpu/kernels/profile.h`) records, on every run, one span per kernel
(thread -1: the calling thread, around the kernel's function) and one per
OpenMP thread of each profiled parallel region. `CompiledGraph.trace()`
returns them as `Span`s; `chrome_trace(spans)` is the JSON document Perfetto
(ui.perfetto.dev) and chrome://tracing open; `top_ops(spans)` sums kernel
time per op.

>>> spans = [Span(run=1, kernel=0, node=3, kind="matmul", name="", op="matmul", shape="f32[2,2]",
...               thread=-1, start_ns=1000, end_ns=3000, flops=16, bytes=48)]
>>> doc = chrome_trace(spans, name="g")
>>> [e["ph"] for e in doc["traceEvents"]]
['M', 'M', 'X']
>>> top_ops(spans)[0].share
1.0

`busy`: the op's threads' time over the time their parallel region held them (here thread 1 waited half
the kernel for thread 0):

>>> spans += [Span(1, 0, 3, "matmul", "", "matmul", "f32[2,2]", t, 1000, end, 16, 48)
...           for t, end in ((0, 3000), (1, 2000))]
>>> top_ops(spans)[0].busy
0.75
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx.errors import ExecutionError
from rlx.runtime.abi import ffi

#: Thread id of the kernel track in chrome traces (OpenMP thread i is track i + 1).
KERNEL_TRACK = 0


@dataclass(frozen=True)
class Span:
    """One timed interval: a kernel on the calling thread (`thread == -1`) or one OpenMP thread's share of it."""

    run: int
    kernel: int
    node: int
    kind: str
    name: str
    op: str
    shape: str
    thread: int
    start_ns: int
    end_ns: int
    flops: int
    bytes: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def label(self) -> str:
        """`%node kind (source name)`, as the generated code's comments name the op."""
        return f"%{self.node} {self.kind}" + (f" ({self.name})" if self.name else "")


def profile_info(lib: Any) -> dict | None:
    """The kernel table of a profiled library (None when the library was not built profiled)."""
    try:
        fn = lib.rlx_profile_info
    except AttributeError:
        return None
    return json.loads(ffi.string(fn()).decode("utf-8"))


def read_spans(lib: Any, ctx: Any, info: dict) -> list[Span]:
    """The spans context `ctx` holds, oldest first."""
    fields = len(info["fields"])
    cap = 1 << 14
    buf = ffi.new("int64_t[]", cap * fields)
    n = lib.rlx_profile_read(ctx, buf, cap)
    kernels = info["kernels"]
    out = []
    for i in range(n):
        t0, t1, k, thread, run, flops, nbytes = (buf[i * fields + j] for j in range(7))
        meta = kernels[k]
        out.append(Span(run=run, kernel=k, node=meta["node"], kind=meta["kind"], name=meta["name"], op=meta["op"],
                        shape=meta["shape"], thread=thread, start_ns=t0, end_ns=t1, flops=flops, bytes=nbytes))
    return out


def chrome_trace(spans: Sequence[Span], *, name: str = "rlx") -> dict:
    """The chrome-trace JSON document of `spans` ("X" complete events, times in microseconds).

    Kernel spans go on track 0 ("kernels"), OpenMP thread i's spans on track i + 1; every event's
    args carry the node id, op, shape, FLOPs and bytes (the report colours nodes from them).
    """
    origin = min((s.start_ns for s in spans), default=0)
    threads = sorted({s.thread for s in spans if s.thread >= 0})
    events: list[dict] = [{"ph": "M", "pid": 1, "tid": KERNEL_TRACK, "name": "process_name",
                           "args": {"name": f"rlx: {name}"}},
                          {"ph": "M", "pid": 1, "tid": KERNEL_TRACK, "name": "thread_name",
                           "args": {"name": "kernels"}}]
    events += [{"ph": "M", "pid": 1, "tid": t + 1, "name": "thread_name", "args": {"name": f"omp thread {t}"}}
               for t in threads]
    for s in sorted(spans, key=lambda s: (s.start_ns, s.thread)):
        args = {"node": s.node, "kind": s.kind, "op": s.op, "shape": s.shape, "run": s.run}
        if s.name:
            args["name"] = s.name
        if s.thread < 0:
            args.update(flops=s.flops, bytes=s.bytes)
        events.append({"ph": "X", "pid": 1, "tid": KERNEL_TRACK if s.thread < 0 else s.thread + 1,
                       "name": s.label, "cat": s.kind, "ts": (s.start_ns - origin) / 1e3,
                       "dur": s.duration_ns / 1e3, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"graph": name, "source": "rlx"}}


def save_chrome_trace(spans: Sequence[Span], path: str | Path, *, name: str = "rlx") -> Path:
    """Write `chrome_trace(spans)` to `path`."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(spans, name=name)))
    return path


@dataclass(frozen=True)
class OpTime:
    """Total kernel time of one op over the traced runs."""

    node: int
    label: str
    shape: str
    calls: int
    seconds: float
    share: float
    flops: int
    bytes: int
    #: Share of its parallel regions' thread time the op's OpenMP threads spent in their work (each thread's
    #: span over the kernel's span, summed); None for an op with no per-thread spans. Below 1: threads waited
    #: at the region's end for a slower one (imbalance, or a thread off its core), rather than all running slow.
    busy: float | None = None

    @property
    def flop_rate(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else 0.0

    @property
    def byte_rate(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


def top_ops(spans: Iterable[Span]) -> list[OpTime]:
    """Kernel time per op (kernel spans only), largest first, with its share of all kernel time and how busy
    its threads were (`OpTime.busy`, from the per-thread spans)."""
    spans = list(spans)
    acc: dict[int, list] = {}
    calls: dict[tuple[int, int], Span] = {}
    for s in spans:
        if s.thread >= 0:
            continue
        calls[(s.run, s.kernel)] = s
        row = acc.setdefault(s.kernel, [s, 0, 0, 0, 0])
        row[1] += 1
        row[2] += s.duration_ns
        row[3] += s.flops
        row[4] += s.bytes
    worked: dict[int, list[int]] = {}  # kernel -> [threads' span time, threads x their kernel call's time]
    for s in spans:
        call = calls.get((s.run, s.kernel)) if s.thread >= 0 else None
        if call is not None:
            w = worked.setdefault(s.kernel, [0, 0])
            w[0] += s.duration_ns
            w[1] += call.duration_ns
    total = sum(r[2] for r in acc.values()) or 1
    rows = [OpTime(node=s.node, label=s.label, shape=s.shape, calls=c, seconds=ns / 1e9, share=ns / total,
                   flops=f, bytes=b, busy=_busy(worked.get(s.kernel))) for s, c, ns, f, b in acc.values()]
    return sorted(rows, key=lambda r: -r.seconds)


def _busy(worked: list[int] | None) -> float | None:
    return worked[0] / worked[1] if worked and worked[1] > 0 else None


def format_top_ops(rows: Sequence[OpTime], limit: int = 15) -> str:
    """The `rlxc bench --profile` table."""
    lines = [f"{'op':<52} {'calls':>6} {'time ms':>9} {'share':>6} {'GFLOP/s':>9} {'GB/s':>8} {'busy':>6}"]
    for r in rows[:limit]:
        label = r.label if len(r.label) <= 52 else r.label[:49] + "..."
        busy = "-" if r.busy is None else f"{r.busy * 100:.0f}%"
        lines.append(f"{label:<52} {r.calls:>6} {r.seconds * 1e3:>9.3f} {r.share * 100:>5.1f}% "
                     f"{r.flop_rate / 1e9:>9.2f} {r.byte_rate / 1e9:>8.2f} {busy:>6}")
    if len(rows) > limit:
        rest = rows[limit:]
        lines.append(f"{'(' + str(len(rest)) + ' more ops)':<52} {'':>6} {sum(r.seconds for r in rest) * 1e3:>9.3f} "
                     f"{sum(r.share for r in rest) * 100:>5.1f}%")
    return "\n".join(lines)


def not_profiled(name: str) -> ExecutionError:
    return ExecutionError(f"{name!r} was not built profiled: compile it with Session(profile=True) "
                          "or RLX_PROFILE=1 to record a trace")


__all__ = ["OpTime", "Span", "chrome_trace", "format_top_ops", "profile_info", "read_spans", "save_chrome_trace",
           "top_ops"]

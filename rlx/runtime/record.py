"""Recording a compiled graph's calls (`RLX_RECORD=dir`) and replaying them (`rlxc replay dir`).

What a user attaches to a bug report: with `RLX_RECORD` set, `Session.compile` gives the compiled graph a
`Recorder`, and each `run` writes its inputs and outputs (bounded: the first `RLX_RECORD_MAX_CALLS` calls,
and no more than `RLX_RECORD_MAX_BYTES` in all). A recording is one directory per compiled program,
``<dir>/<graph name>-<source digest[:12]>/``:

- ``graph.json``: the MIR graph as compiled (`Graph.to_json`), and ``meta.json``: the device, target,
  precision, opt level and source digest it was compiled with, and how many calls were left out;
- ``params-<k>.npz``: the params as set when a recorded call ran (a new snapshot only after `set_param`);
- ``call-<n>.npz`` with ``call-<n>.json``: call n's inputs (``in:<name>``) and outputs (``out:<name>``),
  in the graph's dtypes (bf16 as its uint16 bits), and which params snapshot it ran with.

`replay(dir, compile)` recompiles the graph (`compile` picks the target), sets each snapshot's params,
reruns every call and compares its outputs with the recorded ones; it stops at the first mismatch.

>>> import numpy as np, rlx, tempfile
>>> g = rlx.Graph("twice")
>>> g.set_outputs([g.mul(g.input("x", [3]), g.param("a", [3]))])
>>> cg = rlx.Session().compile(g)
>>> cg.set_param("a", np.full(3, 2, np.float32))
>>> root = tempfile.mkdtemp()
>>> cg.record_to(Recorder.start(root, g.to_json(), {"device": "cpu"}, max_calls=4, max_bytes=1 << 20))
>>> _ = cg.run(x=np.arange(3, dtype=np.float32))
>>> result = replay(recordings(root)[0], lambda graph: rlx.Session().compile(graph))
>>> result.calls, result.mismatch is None
(1, True)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ExecutionError, RlxError
from rlx.ir.dtype import DType, bf16_to_f32

#: The format of a recording (meta.json's "format"); replay refuses others.
RECORD_FORMAT = 1


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    tmp.replace(path)


class Recorder:
    """Writes the calls of one compiled program into its recording directory (thread-safe, bounded)."""

    def __init__(self, directory: Path, meta: dict, max_calls: int, max_bytes: int) -> None:
        self.directory = directory
        self.meta = meta
        self.max_calls = max_calls
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._calls = 0
        self._bytes = 0
        self._params_version = -1
        self._params_file = ""

    @staticmethod
    def start(root: str | Path, graph_json: str, meta: Mapping[str, Any], *, max_calls: int,
              max_bytes: int) -> Recorder:
        """A recorder writing under `root` for the graph `graph_json`, compiled as `meta` says."""
        graph = json.loads(graph_json)
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(graph.get("name", "graph")))[:60]
        digest = str(meta.get("source_digest", "")) or "unknown"
        directory = Path(root) / f"{name or 'graph'}-{digest[:12]}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "graph.json").write_text(graph_json)
        except OSError as exc:
            raise RlxError(f"RLX_RECORD: cannot write a recording under {str(root)!r}: {exc}") from None
        existing = sorted(directory.glob("call-*.json"))
        rec = Recorder(directory, {"format": RECORD_FORMAT, **meta, "skipped_calls": 0}, max_calls, max_bytes)
        rec._calls = len(existing)  # a second process compiling the same program appends, within the bounds
        rec._bytes = sum(p.stat().st_size for p in directory.glob("*.npz"))
        _write_json(directory / "meta.json", rec.meta)
        return rec

    def record(self, inputs: Mapping[str, tuple[np.ndarray, DType]], outputs: Mapping[str, tuple[np.ndarray, DType]],
               params: Callable[[], tuple[int, Mapping[str, tuple[np.ndarray, DType]]]]) -> None:
        """Write one call (`params()` gives the params' version and (array, dtype) by name), unless a bound is
        reached."""
        with self._lock:
            size = sum(a.nbytes for a, _ in (*inputs.values(), *outputs.values()))
            version, arrays = params()
            if version != self._params_version:
                size += sum(a.nbytes for a, _ in arrays.values())
            if self._calls >= self.max_calls or self._bytes + size > self.max_bytes:
                self.meta["skipped_calls"] += 1
                _write_json(self.directory / "meta.json", self.meta)
                return
            if version != self._params_version:
                self._params_file = f"params-{self._calls:05d}.npz"
                np.savez(self.directory / self._params_file, **{k: a for k, (a, _) in arrays.items()})
                _write_json((self.directory / self._params_file).with_suffix(".json"),
                            {k: d.value for k, (_, d) in arrays.items()})
                self._params_version = version
            n = self._calls
            stem = f"call-{n:05d}"
            np.savez(self.directory / f"{stem}.npz", **{f"in:{k}": a for k, (a, _) in inputs.items()},
                     **{f"out:{k}": a for k, (a, _) in outputs.items()})
            _write_json(self.directory / f"{stem}.json", {
                "call": n, "params": self._params_file,
                "inputs": {k: d.value for k, (_, d) in inputs.items()},
                "outputs": {k: d.value for k, (_, d) in outputs.items()}})
            self._calls += 1
            self._bytes += size


def recordings(root: str | Path) -> list[Path]:
    """The recording directories in `root` (`root` itself when it is one), sorted."""
    root = Path(root)
    if (root / "graph.json").is_file():
        return [root]
    found = sorted(p.parent for p in root.glob("*/graph.json"))
    if not found:
        raise RlxError(f"{str(root)!r} holds no RLX recording (a directory with graph.json, written by RLX_RECORD)")
    return found


@dataclass(frozen=True)
class Mismatch:
    """The first output of a replay that differs from its recording."""

    call: int
    output: str
    detail: str

    def __str__(self) -> str:
        return f"call {self.call}, output {self.output!r}: {self.detail}"


@dataclass(frozen=True)
class ReplayResult:
    """How many calls were replayed, and the first mismatch (None: every output matched)."""

    directory: Path
    calls: int
    mismatch: Mismatch | None


def _as_values(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """Recorded values as numbers (bf16 bits widened to f32)."""
    return bf16_to_f32(arr) if dtype is DType.BF16 else arr


def _tolerance(dtype: DType, rtol: float | None, atol: float | None) -> tuple[float, float]:
    base = {DType.F16: (2e-3, 2e-3), DType.BF16: (1.6e-2, 1.6e-2), DType.F32: (1e-4, 1e-5), DType.F64: (1e-9, 1e-12)}
    r, a = base.get(dtype, (0.0, 0.0))
    return (r if rtol is None else rtol, a if atol is None else atol)


def compare(got: np.ndarray, want: np.ndarray, dtype: DType, *, rtol: float | None = None,
            atol: float | None = None) -> str | None:
    """None when `got` matches the recorded `want` (floats within the dtype's tolerance, others exactly), else
    what differs."""
    if got.shape != want.shape:
        return f"shape {got.shape}, recorded {want.shape}"
    if not dtype.is_float:
        bad = np.argwhere(got != want)
        if len(bad) == 0:
            return None
        i = tuple(int(v) for v in bad[0])
        return f"{len(bad)} elements differ; first at {list(i)}: {got[i]!r}, recorded {want[i]!r}"
    r, a = _tolerance(dtype, rtol, atol)
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    close = np.isclose(g64, w64, rtol=r, atol=a, equal_nan=True)
    if close.all():
        return None
    i = tuple(int(v) for v in np.argwhere(~close)[0])
    err = np.abs(g64 - w64)[~close]
    return (f"{int((~close).sum())} of {got.size} elements differ beyond rtol={r:g}, atol={a:g}; first at "
            f"{list(i)}: {g64[i]!r}, recorded {w64[i]!r} (largest difference {float(np.nanmax(err)):g})")


def replay(directory: str | Path, compile: Callable[[Any], Any], *, rtol: float | None = None,
           atol: float | None = None) -> ReplayResult:
    """Recompile the recording's graph with `compile(graph)` and rerun its calls; stop at the first mismatch."""
    from rlx.ir.graph import Graph

    directory = Path(directory)
    meta = json.loads((directory / "meta.json").read_text())
    if meta.get("format") != RECORD_FORMAT:
        raise RlxError(f"{str(directory)!r}: recording format {meta.get('format')!r}, this rlx reads {RECORD_FORMAT}")
    graph = Graph.from_json((directory / "graph.json").read_text())
    compiled = compile(graph)
    params_file = ""
    calls = sorted(directory.glob("call-*.json"))
    for path in calls:
        info = json.loads(path.read_text())
        if info["params"] and info["params"] != params_file:
            dtypes = json.loads((directory / info["params"]).with_suffix(".json").read_text())
            with np.load(directory / info["params"]) as snap:
                for name in snap.files:
                    compiled.set_param(name, _as_values(snap[name], DType(dtypes[name])))
            params_file = info["params"]
        with np.load(path.with_suffix(".npz")) as data:
            feed = {k: _as_values(data[f"in:{k}"], DType(d)) for k, d in info["inputs"].items()}
            want = {k: (data[f"out:{k}"], DType(d)) for k, d in info["outputs"].items()}
        try:
            got = compiled.run(feed)
        except ExecutionError as exc:
            return ReplayResult(directory, info["call"], Mismatch(info["call"], "*", f"the run failed: {exc}"))
        for name, out in zip(compiled.output_names, got):
            arr, dtype = want[name]
            values = np.asarray(out, dtype=np.float32) if dtype is DType.BF16 else np.asarray(out)
            problem = compare(values, _as_values(arr, dtype), dtype, rtol=rtol, atol=atol)
            if problem is not None:
                return ReplayResult(directory, info["call"] + 1, Mismatch(info["call"], name, problem))
    return ReplayResult(directory, len(calls), None)


def named(names: Sequence[str], arrays: Sequence[np.ndarray], dtypes: Sequence[DType]) -> dict:
    """name -> (array, dtype) for a recorder."""
    return {n: (a, d) for n, a, d in zip(names, arrays, dtypes)}

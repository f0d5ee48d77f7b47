"""Vision models exported to ONNX on the CPU: rlx vs ONNX Runtime, in one process.

    python benchmarks/onnx_models.py [--threads 2] [--rounds 5] [--passes 4] [--cases resnet18x1,...]

Each case is a model of `tests/frontends/conv_models.py` (torchvision's ResNet-18 and
MobileNetV3-small written in plain torch, random weights, batch-norm statistics randomized)
exported by `torch.onnx.export` at 224x224 with a dynamic batch, then run by

- onnxruntime: an `InferenceSession` with default session options (all graph optimizations,
  its NCHWc conv kernels) and `intra_op_num_threads = --threads`;
- rlx: `rlx.from_onnx(...)` compiled by `Session(Device.CPU)` with `num_threads = --threads`.

Both peers live in this process and take turns in blocks (`--passes` blocks of `--rounds` timed
runs each, the peers alternating, a pause between blocks so ORT's spinning threads settle); each
block starts with one untimed run. The outputs are checked against each other before timing (max abs
error <= 1e-4 x max |out|). Printed: the median time of every peer, and rlx's time over ORT's.
`--profile` builds rlx profiled instead and prints its kernel time per class (a conv's window, stride
and algorithm, else the op kind) and its top ops over `--rounds` runs (no ORT timing; `--nodes`: every kernel's
median instead of the top ops); `--ort-profile` prints
ONNX Runtime's own per-node kernel times (`enable_profiling`, medians over `--rounds` runs after one), node by node
with its output shape, then per op type, for setting RLX's per-op times beside them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "frontends"))

CASES = {"resnet18x1": ("resnet18", 1), "resnet18x8": ("resnet18", 8),
         "mobilenet_v3_smallx1": ("mobilenet_v3_small", 1)}


def peers(model: str, batch: int, threads: int, profile: bool = False
          ) -> tuple[dict[str, Callable[[], np.ndarray]], str, object]:
    import onnxruntime as ort
    import torch
    from conv_models import build, export

    import rlx

    data = export(build(model), torch.randn(1, 3, 224, 224))
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    graph, params = rlx.from_onnx(data, max_dims={"batch": max(batch, 8)})
    t0 = time.perf_counter()
    cg = rlx.Session(rlx.Device.CPU, profile=profile).compile(graph, num_threads=threads)
    compile_s = time.perf_counter() - t0
    for name, value in params.items():
        cg.set_param(name, value)
    runs = {"onnxruntime": lambda: sess.run(None, {"x": x})[0], "rlx": lambda: cg.run(x=x)[0]}
    want, got = runs["onnxruntime"](), runs["rlx"]()
    err = float(np.abs(got - want).max())
    if err > 1e-4 * float(np.abs(want).max()):
        raise SystemExit(f"{model} batch {batch}: rlx differs from onnxruntime by {err}")
    return runs, f"compile {compile_s:.1f} s (cache hit if fast), max abs diff {err:.2e}", cg


def op_class(lir, node: int, kind: str) -> str:
    """A kernel's class for the profile: a conv's window, stride and `ConvPlan` algorithm, else its op kind."""
    from rlx.ir.decisions_conv import ConvPlan

    plan = next((d for d in lir.decided(ConvPlan) if d.node == node), None)
    if plan is None:
        return kind
    n = lir.graph.node(node)
    window = lir.graph.node(n.inputs[1]).shape.static_dims[2:]
    shape = "depthwise " if plan.algorithm == "depthwise" else ""
    stride = n.op.geometry(len(window))[0][0]
    return f"conv {shape}{'x'.join(map(str, window))} s{stride} ({plan.algorithm})"


def print_profile(case: str, run: Callable[[], np.ndarray], compiled, rounds: int, nodes: bool = False) -> None:
    """Kernel ms per run by class (a conv's window, stride and algorithm, else the op kind), then the top
    ops, over `rounds` runs of a profiled build; with `nodes`, every kernel's median in schedule order instead of
    the top ops (and the sum of the medians)."""
    from collections import Counter, defaultdict

    from rlx.runtime.profile import format_top_ops, top_ops

    run()
    compiled.trace(clear=True)
    for _ in range(rounds):
        run()
    spans = [s for s in compiled.trace(clear=True) if s.thread < 0]
    per: dict[str, float] = defaultdict(float)
    ops: Counter[str] = Counter()
    for s in spans:
        cls = op_class(compiled.lir, s.node, s.kind)
        per[cls] += s.duration_ns / 1e6 / rounds
        ops[cls] += 1
    total = sum(per.values())
    print(f"\n{case}: kernel ms per run by class ({rounds} runs)")
    for cls, ms in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {cls:<36}{ops[cls] // rounds:>4} ops{ms:>9.3f} ms{100 * ms / total:>6.1f}%")
    print(f"  {'all kernels':<44}{total:>9.3f} ms")
    if not nodes:
        print(format_top_ops(top_ops(spans), limit=25))
        return
    each: dict[int, list[float]] = defaultdict(list)
    for s in spans:
        each[s.node].append(s.duration_ns / 1e3)
    graph = compiled.lir.graph
    for nid in (n for n in compiled.lir.schedule if n in each):
        node = graph.node(nid)
        act = getattr(node.op, "activation", None)
        print(f"  %{nid:<5}{op_class(compiled.lir, nid, node.kind):<36}{statistics.median(each[nid]):>9.1f} us  "
              f"{graph.node(node.inputs[0]).shape} -> {node.shape}{' ' + act if act else ''}")
    print(f"  {'sum of the medians':<41}{sum(statistics.median(v) for v in each.values()) / 1e3:>9.3f} ms")


def print_ort_profile(case: str, model: str, batch: int, threads: int, rounds: int) -> None:
    """ONNX Runtime's per-node kernel time (its own profiler, default session options), median over `rounds`
    runs after one: node by node in execution order, then summed per op type."""
    import json
    import tempfile
    from collections import defaultdict

    import onnxruntime as ort
    import torch
    from conv_models import build, export

    data = export(build(model), torch.randn(1, 3, 224, 224))
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        for _ in range(rounds + 1):
            sess.run(None, {"x": x})
        events = json.loads(Path(sess.end_profiling()).read_text())
    times: dict[str, list[float]] = defaultdict(list)
    info: dict[str, tuple[str, str]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            times[name].append(e["dur"])
            info[name] = (e["args"].get("op_name", "?"), str(e["args"].get("output_type_shape", "")))
    per_op: dict[str, float] = defaultdict(float)
    print(f"\n{case}: onnxruntime kernel us per node (median of {rounds} runs)")
    for name, ds in times.items():
        us = statistics.median(ds[1:] or ds)
        per_op[info[name][0]] += us
        print(f"  {info[name][0]:<20}{us:>9.1f}  {name[-60:]}  {info[name][1][:60]}")
    for op, us in sorted(per_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:<20}{us:>9.1f} us")
    print(f"  {'all nodes':<20}{sum(per_op.values()):>9.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="timed runs per peer per block")
    ap.add_argument("--passes", type=int, default=4, help="blocks per peer (peers alternate)")
    ap.add_argument("--pause", type=float, default=0.5, help="seconds between blocks")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--profile", action="store_true", help="rlx's per-op kernel times (a profiled build)")
    ap.add_argument("--ort-profile", action="store_true", help="onnxruntime's per-node kernel times (its profiler)")
    ap.add_argument("--nodes", action="store_true", help="with --profile: every kernel's median, in schedule order")
    args = ap.parse_args()
    rows = []
    for case in args.cases.split(","):
        model, batch = CASES[case]
        if args.ort_profile:
            print_ort_profile(case, model, batch, args.threads, args.rounds)
            continue
        runs, note, compiled = peers(model, batch, args.threads, args.profile)
        if args.profile:
            print_profile(case, runs["rlx"], compiled, args.rounds, args.nodes)
            continue
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.passes):
            for name, run in runs.items():
                run()
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - t0)
                time.sleep(args.pause)
        med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        rows.append((case, med["onnxruntime"], med["rlx"], med["rlx"] / med["onnxruntime"]))
        print(f"{case}: {note}", flush=True)
    if args.profile or args.ort_profile:
        return
    print(f"\n{args.threads} threads, 224x224, median of {args.passes} x {args.rounds} runs per peer")
    print(f"{'case':<24}{'onnxruntime ms':>16}{'rlx ms':>12}{'rlx / ort':>12}")
    for case, ort_ms, rlx_ms, ratio in rows:
        print(f"{case:<24}{ort_ms:>16.2f}{rlx_ms:>12.2f}{ratio:>12.2f}")


if __name__ == "__main__":
    main()

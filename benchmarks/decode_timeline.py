"""Where a one-row decode step's GPU time goes, kernel by kernel, on the graph-replayed step (CUPTI).

    python benchmarks/decode_timeline.py [--shape llama3-8b] [--weights bf16|q4_k|q8_0|...] [--precision bf16]
                                         [--steps 20] [--layer 16] [--tp 2] [--json out.json]

Builds `CausalLM` on CUDA with random weights of `--shape` (benchmarks/llm_cuda.py's shapes and weights), prefills
32 tokens, runs a few greedy one-token steps (the step's CUDA graph captured), then records `--steps` more under
`torch.profiler` (CUPTI: each kernel's start and end inside the replayed graph). Kernels of a step overlap under
programmatic dependent launch (a kernel starts, loads its weights and waits while the one before drains), so each
kernel's *own* time is counted from the later of its start and the end of everything launched before it, to its
end; the time between one kernel's end and the next one's start with nothing running is *idle*. A step's own times
and idle add up to its span (first kernel's start to last one's end). Printed:

- per kernel kind (name with template arguments, grid): launches a step, own µs a step (median over steps), share
  of the span, and for the decode GEMVs the bytes of weights they read as GB/s of own time when `--shape` is known;
- one layer's launches in order (`--layer`: the kernels between that layer's attention and the next one's), with
  each kernel's start, end, own time and the idle before it, µs from the first one's start;
- the step's span, its idle, and the decode tok/s its span alone would give (no host time between steps).

With `--tp N` every rank (one process per GPU, `rlx.distributed.launch`) records its own steps and prints its own
tables: a rank's all-reduce kernel's own time includes its wait for the slower rank.

Needs PyTorch with CUDA (the profiler only; RLX runs on its own). Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def kind_of(event: dict) -> str:
    """A kernel's kind: its name with template arguments but no parameter list, and its grid.

    >>> kind_of({"name": "void rlx_dgemv<float, true>(float const*, int)", "args": {"grid": [264, 1, 1]}})
    'rlx_dgemv<float, true> g264x1x1'
    >>> kind_of({"name": "Memcpy HtoD (Pageable -> Device)", "args": {}})
    'Memcpy HtoD'
    """
    name = re.sub(r"^void\s+", "", event["name"])
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first "(" outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    base = name[:cut].strip()
    grid = event.get("args", {}).get("grid")
    return f"{base} g{'x'.join(str(g) for g in grid)}" if grid else base


def own_times(acts: list[dict]) -> tuple[list[float], list[float]]:
    """Each activity's own time and the idle before it (µs), activities sorted by start.

    >>> own_times([{"ts": 0, "dur": 10}, {"ts": 5, "dur": 10}, {"ts": 20, "dur": 2}])
    ([10, 5, 2], [0, 0, 5])
    """
    owns, idles, end = [], [], None
    for e in acts:
        start, stop = e["ts"], e["ts"] + e["dur"]
        if end is None:
            owns.append(e["dur"])
            idles.append(0)
            end = stop
            continue
        idles.append(max(0, start - end))
        owns.append(max(0, stop - max(start, end)))
        end = max(end, stop)
    return owns, idles


def split_steps(acts: list[dict], steps: int) -> list[list[dict]]:
    """The activities cut into `steps` runs at the `steps - 1` longest idle gaps (the host's time between two
    replays of the step's graph), keeping the runs of the most common length (a replay launches the same kernels).

    >>> [len(r) for r in split_steps([{"ts": t, "dur": 1} for t in (0, 1, 2, 50, 51, 52, 99, 100, 101)], 3)]
    [3, 3, 3]
    """
    gaps, end = [], None
    for i, e in enumerate(acts):
        if end is not None:
            gaps.append((e["ts"] - end, i))
        end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    cuts = sorted(i for _, i in sorted(gaps, reverse=True)[:steps - 1])
    runs = [acts[a:b] for a, b in zip([0, *cuts], [*cuts, len(acts)])]
    common = statistics.mode(len(r) for r in runs)
    return [r for r in runs if len(r) == common]


def build_lm(shape: str, weights: str, precision: str, act: str, context: int, tp: int = 1, rank=None):
    """`CausalLM` of `shape` with random `weights` on CUDA, or `rank`'s share of it (a `launch` rank) at `tp` > 1."""
    import llm_cuda

    from rlx.models.causal_lm import CausalLM
    from rlx.models.decoder_config import DecoderConfig

    config = DecoderConfig(**llm_cuda.SHAPES[shape])
    tensors = llm_cuda.rlx_tensors(config, weights=weights)
    opts = {"precision": precision, "quant_act": act, "max_context": context, "prefill_chunk": 32}
    if tp == 1:
        return config, CausalLM(config, tensors, device="cuda", **opts)
    from rlx.distributed.tp_decoder import shard_decoder

    return config, shard_decoder(config, tensors, tp=tp, **opts).load(rank, device="cuda")


def record_steps(lm, config, steps: int) -> list[list[dict]]:
    """Prefill 32 tokens, warm the one-token step's graph, then the kernels of `steps` greedy steps (CUPTI)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cache = lm.new_cache()
    prompt = np.random.default_rng(1).integers(3, config.vocab_size, (1, 32))
    token = int(lm.step_greedy(prompt, cache, [31])[0])
    for _ in range(6):  # the one-token step's graph captured and warm
        token = int(lm.step_greedy(np.array([[token]]), cache, [0])[0])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            token = int(lm.step_greedy(np.array([[token]]), cache, [0])[0])
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    acts = sorted((e for e in trace["traceEvents"]
                   if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                  key=lambda e: e["ts"])
    return split_steps(acts, steps)


def report(steps: list[list[dict]], title: str, layer: int) -> list[str]:
    """The printed table: kernels by kind (own time a step), then one layer's launches in order."""
    lines = []
    spans, idle_sums = [], []
    own_by_pos: list[list[float]] = [[] for _ in steps[0]]
    for step in steps:
        owns, idles = own_times(step)
        spans.append(step[-1]["ts"] + step[-1]["dur"] - step[0]["ts"])
        idle_sums.append(sum(idles))
        for i, o in enumerate(owns):
            own_by_pos[i].append(o)
    span = statistics.median(spans)
    kinds: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e, owns in zip(steps[0], own_by_pos):
        row = kinds[kind_of(e)]
        row[0] += 1
        row[1] += statistics.median(owns)
    lines.append(f"{title}: {len(steps[0])} activities a step, span {span:.1f} us (median of {len(steps)}), idle "
                 f"{statistics.median(idle_sums):.1f} us; {1e6 / span:.1f} tok/s from the span alone")
    lines.append(f"{'launches':>8} {'own us':>9} {'share':>6}  kernel")
    for kind, (count, own) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{count:>8} {own:>9.1f} {100 * own / span:>5.1f}%  {kind[:140]}")

    step = steps[len(steps) // 2]
    att = [i for i, e in enumerate(step) if "kv_decode" in e["name"] or "attention" in e["name"].lower()]
    if len(att) > layer + 1:
        i0, i1 = att[layer], att[layer + 1]
        owns, idles = own_times(step)
        t0 = step[i0]["ts"]
        lines.append(f"layer {layer}: {i1 - i0} launches, {step[i1]['ts'] - t0:.1f} us from its attention's start "
                     f"to the next one's")
        lines.append(f"{'start':>8} {'end':>8} {'own':>7} {'idle':>6}  kernel")
        for i in range(i0, i1 + 1):
            e = step[i]
            lines.append(f"{e['ts'] - t0:>8.1f} {e['ts'] + e['dur'] - t0:>8.1f} {owns[i]:>7.1f} {idles[i]:>6.1f}  "
                         f"{kind_of(e)[:120]}")
    return lines


def _rank_report(rank, tp: int, shape: str, weights: str, precision: str, act: str, steps: int,
                 layer: int) -> list[str]:
    """One tensor-parallel rank's table (`launch` runs it in rank `rank`'s process, on its GPU; the spawned process
    runs this file's top level again, which puts benchmarks/ on the path for llm_cuda)."""
    config, lm = build_lm(shape, weights, precision, act, 32 + steps + 16, tp, rank)
    title = f"{shape}, {weights} weights, {precision}, tp={tp} rank {rank.rank}"
    return report(record_steps(lm, config, steps), title, layer)


def main(argv: list[str] | None = None) -> int:
    import llm_cuda

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(llm_cuda.SHAPES))
    ap.add_argument("--weights", default="bf16")
    ap.add_argument("--precision", default=None, help="default: bf16 for --weights bf16, else f16")
    ap.add_argument("--act", default="f32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layer", type=int, default=16)
    ap.add_argument("--tp", type=int, default=1, help="ranks (one process per GPU, NCCL): each rank's table")
    ap.add_argument("--json", default=None, help="write the step's activities here (tp=1)")
    args = ap.parse_args(argv)
    precision = args.precision or ("bf16" if args.weights == "bf16" else "f16")
    if args.tp > 1:
        from rlx.distributed import launch
        from rlx.runtime.nccl import gpu_count

        if gpu_count() < args.tp:
            print(f"tp={args.tp} skipped: {gpu_count()} GPU(s) visible")
            return 0
        tables = launch(_rank_report, nprocs=args.tp, device="cuda",
                        args=(args.tp, args.shape, args.weights, precision, args.act, args.steps, args.layer))
        for lines in tables:
            print("\n".join(lines))
        return 0
    config, lm = build_lm(args.shape, args.weights, precision, args.act, 32 + args.steps + 16)
    steps = record_steps(lm, config, args.steps)
    if args.json:
        Path(args.json).write_text(json.dumps(steps[len(steps) // 2]))
    print("\n".join(report(steps, f"{args.shape}, {args.weights} weights, {precision}", args.layer)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

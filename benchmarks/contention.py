"""MiniLM embeddings with and without a competing CPU-bound process: RLX and ONNX Runtime side by side.

    python benchmarks/contention.py [--threads N] [--rounds R] [--passes P] [--cases 1x16,8x128]
                                    [--rlx-waits 200000,passive] [--peers rlx,onnxruntime]

Each peer (built by `benchmarks/minilm.py`'s helpers: RLX's `SentenceEmbedder` on the packaged
all-MiniLM-L6-v2 weights, ONNX Runtime on the same model exported through torch) lives in its own
process and is timed quiet, then while a busy-loop process pinned to one core competes for the CPU,
alternating in `--passes` rounds so background load is spread over both phases and every peer.
RLX is run once per OpenMP wait policy in `--rlx-waits` (`RLX_OMP_WAIT`: a number is a GOMP_SPINCOUNT,
RLX's default 200000; `passive` sleeps at once; `default` leaves libgomp's own spin-then-sleep policy), to
show what the policy buys. The table gives median, p90 and max per phase, loaded/quiet of the
medians and p90s, and the slowest loaded call over the quiet median ("worst"); a competing process
on one of N cores should cost about N/(N-1) at most, never the 10-50x of threads spinning against a
descheduled peer. Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import minilm  # the sibling benchmark: peers, token batches


def busy_loop(core: int | None) -> None:
    """The competing process: one core's worth of pure CPU work, forever."""
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    x = 0
    while True:
        x += 1


class Hog:
    """A busy-loop process pinned to the last core while in a `with` block."""

    def __init__(self, core: int | None) -> None:
        self.core = core
        self.proc: multiprocessing.process.BaseProcess | None = None

    def __enter__(self) -> Hog:
        self.proc = multiprocessing.get_context("spawn").Process(target=busy_loop, args=(self.core,), daemon=True)
        self.proc.start()
        time.sleep(0.5)  # let it start spinning and the scheduler notice it
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.join(10)
        time.sleep(0.5)


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=int(os.environ.get("RLX_NUM_THREADS") or os.cpu_count() or 1))
    ap.add_argument("--rounds", type=int, default=30, help="timed runs per case, peer and phase (default 30)")
    ap.add_argument("--passes", type=int, default=3, help="quiet/loaded alternations the rounds are split into")
    ap.add_argument("--cases", default="1x16,8x128", help="batch x seq list (default 1x16,8x128)")
    ap.add_argument("--rlx-waits", default="200000,passive",
                    help="RLX_OMP_WAIT values to run RLX with (default 200000,passive)")
    ap.add_argument("--peers", default="rlx,onnxruntime", help="rlx and/or onnxruntime")
    ap.add_argument("--model", default=None, help="BERT directory (default: the packaged all-MiniLM-L6-v2)")
    args = ap.parse_args(argv)
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    wanted = [p for p in args.peers.split(",") if p]
    if set(wanted) - {"rlx", "onnxruntime"}:
        ap.error("--peers takes rlx and/or onnxruntime")
    os.environ["RLX_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    user_policy = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}

    from rlx.models.embedder import default_model_dir

    model_dir = Path(args.model) if args.model else default_model_dir()
    cores = os.cpu_count() or 1
    hog_core = cores - 1 if cores > 1 else None
    print(f"model: {model_dir}")
    print(f"threads per peer: {args.threads} of {cores} cores; competing process: a busy loop pinned to core "
          f"{hog_core}; {args.rounds} timed calls per case, peer and phase in {args.passes} alternations")
    if user_policy:
        print(f"note: {user_policy} is set in the environment, so every RLX variant runs with it")

    peers: list[tuple[str, minilm.Peer]] = []
    for name in wanted:
        variants = [w for w in args.rlx_waits.split(",") if w] if name == "rlx" else [None]
        for wait in variants:
            label = f"rlx (RLX_OMP_WAIT={wait})" if wait else name
            saved = os.environ.get("RLX_OMP_WAIT")
            if wait:
                os.environ["RLX_OMP_WAIT"] = wait  # read by the worker when it loads its first library
            try:
                peer = minilm.Peer(name, model_dir, args.threads, cases)
            finally:
                if saved is None:
                    os.environ.pop("RLX_OMP_WAIT", None)
                else:
                    os.environ["RLX_OMP_WAIT"] = saved
            if peer.error:
                hint = " (the export needs torch)" if name == "onnxruntime" else ""
                print(f"{label}: {peer.error}{hint}")
            else:
                print(f"{label}: set up in {peer.setup_s:.1f} s")
                peers.append((label, peer))
    if not peers:
        print("no peer could run")
        return 1

    per_block = max(1, -(-args.rounds // args.passes))
    times: dict[tuple[str, tuple[int, int], str], list[float]] = {}
    for case in cases:
        for _ in range(args.passes):
            for phase in ("quiet", "loaded"):
                hog = Hog(hog_core) if phase == "loaded" else None
                if hog:
                    hog.__enter__()
                try:
                    for label, peer in peers:
                        time.sleep(0.2)
                        samples, _ = peer.time(case, per_block)
                        times.setdefault((label, case, phase), []).extend(samples)
                finally:
                    if hog:
                        hog.__exit__()
    for _, peer in peers:
        peer.close()

    for case in cases:
        batch, seq = case
        print()
        print(f"batch {batch} x seq {seq} (ms; ratios loaded/quiet; worst = slowest loaded call / quiet median)")
        head = ("peer", "quiet med", "p90", "max", "loaded med", "p90", "max", "med x", "p90 x", "worst x")
        print("  {:<28} {:>9} {:>7} {:>7} {:>10} {:>7} {:>7} {:>6} {:>6} {:>7}".format(*head))
        for label, _ in peers:
            q, ld = times[(label, case, "quiet")], times[(label, case, "loaded")]
            qm, lm = statistics.median(q), statistics.median(ld)
            q90, l90 = _quantile(q, 0.9), _quantile(ld, 0.9)
            print(f"  {label:<28} {qm * 1e3:>9.2f} {q90 * 1e3:>7.2f} {max(q) * 1e3:>7.2f} {lm * 1e3:>10.2f} "
                  f"{l90 * 1e3:>7.2f} {max(ld) * 1e3:>7.2f} {lm / qm:>6.2f} {l90 / q90:>6.2f} "
                  f"{max(ld) / qm:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

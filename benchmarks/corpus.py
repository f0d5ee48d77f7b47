"""Corpus embedding throughput: one process vs Ray Data with N workers, and each worker's startup.

    python benchmarks/corpus.py [--sentences 2000] [--workers 2] [--rounds 3] [--batch 32] [--model DIR]

Both peers embed the same generated sentences (5 to 40 words) with the same
compiled model — all-MiniLM-L6-v2 by default — shipped as an embedder bundle
(`rlx.distributed.save_bundle`):

- `single`: `BundledEmbedder.embed` in this process, all cores (RLX's default thread count);
- `ray`: `rlx.distributed.embed_dataset` on a local cluster `ray.init(num_cpus=workers)`,
  one actor per worker, each at one thread. The cluster is started and one
  warm-up pass run before the timed rounds; each round's pass starts its actor
  pool afresh, so its time includes the actors' startup (bundle unpack +
  `rlx.load` + tokenizer, no compile), which is also reported on its own, as
  each actor measured it, and as the time to a pass's first result.

Peers take turns in rounds with a pause between them; medians of the rounds
and the ratio are printed. On a small shared machine the numbers move with
other load: read the ratio, run it again.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

WORDS = [
    "the", "a", "man", "woman", "child", "dog", "cat", "eats", "reads", "rides", "carries", "food",
    "bread", "horse", "bike", "book", "baby", "on", "in", "with", "quickly", "slowly", "red", "blue",
    "big", "small", "street", "park", "river", "morning", "evening", "house", "garden", "music",
]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 41)))) + "." for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="sentences per compiled run (the graph's batch bound)")
    ap.add_argument("--ray-batch", type=int, default=256, help="rows per Ray Data batch")
    ap.add_argument("--model", default=None, help="HF BERT directory (default: packaged all-MiniLM-L6-v2)")
    args = ap.parse_args()

    import os

    import ray

    from rlx.distributed import embed_dataset
    from rlx.distributed.bundle import BundledEmbedder, pack_bundle, save_bundle
    from rlx.models.embedder import SentenceEmbedder

    texts = sentences(args.sentences)
    with tempfile.TemporaryDirectory() as tmp:
        emb = SentenceEmbedder.from_pretrained(args.model, max_seq=128, max_batch=args.batch)
        bundle = save_bundle(emb, tmp)
        model = BundledEmbedder.load(bundle)

        # Startup of one worker, in a fresh process: import rlx + load the bundle (no compile).
        code = ("import time; t0 = time.perf_counter(); from rlx.distributed.bundle import BundledEmbedder; "
                f"m = BundledEmbedder.load({str(bundle)!r}); t1 = time.perf_counter(); "
                "print(f'{t1 - t0:.4f}')")
        fresh = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                      text=True).stdout) for _ in range(3)]

        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
        packed = ray.put(pack_bundle(bundle))  # in the object store once; actors fetch it

        def ray_pass() -> tuple[float, float, np.ndarray]:
            ds = ray.data.from_items(rows, override_num_blocks=4 * args.workers)
            out = embed_dataset(ds, model=packed, batch_size=args.ray_batch, workers=args.workers, num_threads=1)
            t0 = time.perf_counter()
            first = None
            startups = []
            n = 0
            for batch in out.iter_batches(batch_format="numpy", batch_size=None):
                first = first if first is not None else time.perf_counter() - t0
                startups.extend(np.unique(batch["_rlx_startup_s"]).tolist())
                n += len(batch["id"])
            assert n == len(texts)
            return time.perf_counter() - t0, first, np.unique(startups)

        model.embed(texts[:64])  # warm-up: arena, BLAS threads
        _, first_fresh, _ = ray_pass()  # warm-up: Ray workers started, modules imported
        single, ray_s, actor_startup, first_result = [], [], [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            model.embed(texts)
            single.append(time.perf_counter() - t0)
            time.sleep(1.0)
            total, first, starts = ray_pass()
            ray_s.append(total)
            first_result.append(first)
            actor_startup.extend(starts.tolist())
            time.sleep(1.0)
        ray.shutdown()

    n = len(texts)
    s_single, s_ray = statistics.median(single), statistics.median(ray_s)
    print(f"model: {args.model or 'all-MiniLM-L6-v2 (packaged)'}, {n} sentences of 5-40 words, "
          f"batch {args.batch}, {os.cpu_count()} cores, median of {args.rounds} rounds")
    print(f"single process (all cores):      {n / s_single:8.1f} sentences/s  ({s_single:.2f} s)")
    print(f"ray, {args.workers} workers x 1 thread:      {n / s_ray:8.1f} sentences/s  ({s_ray:.2f} s, "
          f"actor startup included)")
    print(f"ratio ray / single:              {s_single / s_ray:8.2f}x")
    print(f"worker startup, fresh process (import rlx + load bundle): median {statistics.median(fresh) * 1e3:.0f} ms")
    print(f"worker startup, inside a Ray actor (unpack + load):       median "
          f"{statistics.median(actor_startup) * 1e3:.0f} ms over {len(actor_startup)} actors")
    print(f"ray: first result after {statistics.median(first_result):.2f} s (first ever pass: {first_fresh:.2f} s)")


if __name__ == "__main__":
    main()

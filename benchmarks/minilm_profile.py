"""Where one MiniLM f32 CPU call's kernel time goes, by part: a profiled build, medians over calls (no peers).

    python benchmarks/minilm_profile.py [--case 8x128] [--calls 20] [--threads N]

Builds the packaged all-MiniLM-L6-v2 embedder with `Session(profile=True)` (RLX_PROFILE=1), runs `--calls`
calls after 3 warm-up calls, and prints per call (the median over calls) the kernel time of: the FFN
up-projections with their erf GELU epilogue (`up`), the FFN down-projections (`down`: the same FLOPs without
an activation, so `up - down` is what the GELU costs), the query / key / value / attention-output GEMMs
(`qkvo`), the attentions (`attn`) and everything else (`other`: norms, gather, pooling), and the call's wall
time. To compare two versions of rlx, run it from each tree in turn (alternating processes, each with its own
RLX_CACHE_DIR): docs/architecture.md ("CPU encoder (MiniLM f32)") records such runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

PARTS = ("up", "down", "qkvo", "attn", "other")


def part(kind: str, name: str) -> str:
    """Which part of the call a kernel span belongs to, from its op kind and source name.

    >>> part("fused_matmul_bias_act", "encoder.layer.0.intermediate.dense")
    'up'
    >>> part("fused_matmul_bias_act", "encoder.layer.0.output.dense"), part("attention", "")
    ('down', 'attn')
    >>> part("fused_matmul_bias_act", "encoder.layer.0.attention.output.dense"), part("gather", "")
    ('qkvo', 'other')
    """
    if kind == "attention":
        return "attn"
    if kind != "fused_matmul_bias_act":
        return "other"
    if ".intermediate." in name:
        return "up"
    if name.endswith(".output.dense") and ".attention." not in name:
        return "down"
    return "qkvo"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="8x128", help="batch x seq (default 8x128)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("RLX_NUM_THREADS") or os.cpu_count() or 1))
    args = ap.parse_args(argv)
    os.environ["RLX_NUM_THREADS"] = str(args.threads)
    os.environ["RLX_PROFILE"] = "1"

    from minilm import token_batch  # benchmarks/minilm.py (a script's own folder is on sys.path)

    from rlx.models import SentenceEmbedder
    from rlx.models import bert as B
    from rlx.models.bert import bert_inputs
    from rlx.models.embedder import default_model_dir

    batch, seq = (int(v) for v in args.case.split("x"))
    model_dir = default_model_dir()
    config = B.load_config(model_dir)
    emb = SentenceEmbedder(config, B.load_weights(model_dir, config), None, device="cpu", max_seq=seq,
                           max_batch=batch, precision="f32")
    runner = emb.runner("embeddings")
    compiled = runner.compiled
    inputs = bert_inputs(*token_batch(batch, seq, config.vocab_size))
    for _ in range(3):
        runner.run(inputs)
    compiled.trace(clear=True)
    walls = []
    for _ in range(args.calls):
        t0 = time.perf_counter()
        runner.run(inputs)
        walls.append(time.perf_counter() - t0)
    per_run: dict[int, dict[str, float]] = defaultdict(lambda: dict.fromkeys(PARTS, 0.0))
    for span in compiled.trace():
        if span.thread == -1:  # the kernel's own span (the others are its OpenMP threads')
            per_run[span.run][part(span.kind, span.name)] += span.duration_ns / 1e6
    runs = list(per_run.values())

    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    gelu = statistics.median(r["up"] - r["down"] for r in runs)
    cells = "  ".join(f"{key} {median(key):.2f}" for key in PARTS)
    import rlx

    print(f"{batch}x{seq}, {args.threads} threads, {len(runs)} calls, medians in ms: {cells}  up-down {gelu:.2f}  "
          f"kernels {statistics.median(sum(r.values()) for r in runs):.2f}  wall {statistics.median(walls) * 1e3:.2f}"
          f"  (rlx of {os.path.dirname(os.path.dirname(rlx.__file__))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

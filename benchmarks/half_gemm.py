"""One linear layer on the CPU with its weights stored f32, bf16 or f16: rlx against itself.

    python benchmarks/half_gemm.py [--threads N] [--rounds R] [--rows 16,1024] [--target cpu|cpu:avx512|...]

y = x @ W + b with x f32 [rows, K], W a param [K, N] stored in each precision (rlx.codegen.cpu.half:
bf16 on vdpbf16ps where the build has AVX512_BF16, f16 widened into the f32 kernel), for the two
FFN shapes of MiniLM (384 -> 1536 and 1536 -> 384). The peers are compiled graphs in this one
process, timed round-robin with a pause between samples (benchmarks/timing.py); medians and the
ratio to the f32 weights are printed, with each result's largest difference from the f32 one
relative to max |y| (bf16 rounds the activations too, f16 only the weights).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import numpy as np
import timing  # benchmarks/timing.py (a script's own folder is on sys.path)

PRECISIONS = ("f32", "bf16", "f16")
SHAPES = ((384, 1536), (1536, 384))


def _compiled(rows: int, k: int, n: int, dtype: str, threads: int, target: str) -> object:
    import rlx
    from rlx.config import Config
    from rlx.ir.dtype import BFLOAT16

    g = rlx.Graph(f"linear_{dtype}")
    y = g.matmul(g.input("x", [rows, k]), g.param("w", [k, n], dtype))
    g.set_outputs([g.add_(y, g.param("b", [n]))])
    config = dataclasses.replace(Config.from_env(), num_threads=threads, cpu_target=target)
    cg = rlx.Session(rlx.Device.CPU, config).compile(g)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k)
    cg.set_param("w", w.astype({"f32": np.float32, "bf16": BFLOAT16, "f16": np.float16}[dtype]))
    cg.set_param("b", rng.standard_normal(n).astype(np.float32))
    return cg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--rows", default="16,1024", help="comma list of row counts (default 16,1024)")
    ap.add_argument("--target", default="native", help="cpu target: native (default) or an -march value")
    args = ap.parse_args()
    print(f"threads {args.threads}, rounds {args.rounds}, target {args.target}; medians, ratio to f32 weights")
    for rows in (int(r) for r in args.rows.split(",")):
        for k, n in SHAPES:
            x = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
            graphs = {d: _compiled(rows, k, n, d, args.threads, args.target) for d in PRECISIONS}
            outs = {d: cg.run(x=x)[0] for d, cg in graphs.items()}
            times = timing.round_robin({d: (lambda cg=cg, x=x: cg.run(x=x)) for d, cg in graphs.items()}, args.rounds)
            flops = 2.0 * rows * k * n
            print(f"{rows} x {k} -> {n}:")
            scale = float(np.abs(outs["f32"]).max())
            for d in PRECISIONS:
                t = times[d]
                diff = float(np.abs(outs[d] - outs["f32"]).max()) / scale
                print(f"  {d:<5} {t * 1e6:9.1f} us   x{t / times['f32']:5.2f}   {flops / t / 1e9:7.1f} GFLOP/s"
                      f"   max|y - y_f32| / max|y| {diff:.1e}")


if __name__ == "__main__":
    main()

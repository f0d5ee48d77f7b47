"""Decode-shaped sparse MoE block on the CPU: time follows top_k (the experts read), not num_experts.

    python benchmarks/moe_decode.py [--threads N] [--rounds R] [--hidden 512] [--inter 256] [--quant q8_0]

One token through `rlx.models.moe.moe_block` (router, top-k SwiGLU experts through `moe_matmul`, the
weighted sum), compiled for the CPU for each top_k in 1, 2, 4, 8 and num_experts 16 and 64 (random
weights; f32 experts unless `--quant`). Each call takes the next of 64 random inputs, so the router picks
other experts from call to call and their weights come from memory, as in decoding. A 1-row graph is decided
GEMV-only (`MoeExpertPlan`): each call reads the chosen experts' matrices and no others, so the time
grows with top_k and stays flat from 16 to 64 experts (4x the weights). Medians over round-robin rounds
(benchmarks/timing.py); also the megabytes of expert weights a call reads and the model holds.
Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os

import numpy as np
import timing  # benchmarks/timing.py (a script's own folder is on sys.path)

TOP_KS = (1, 2, 4, 8)
EXPERTS = (16, 64)
INPUTS = 64


def _block(experts: int, top_k: int, hidden: int, inter: int, quant: str | None, threads: int):
    import rlx
    from rlx.models.moe import MoeConfig, moe_block, param_shapes, quantize_experts

    cfg = MoeConfig(hidden_size=hidden, num_experts=experts, top_k=top_k, intermediate_size=inter, normalize=True,
                    quant=quant)
    g = rlx.Graph(f"moe_e{experts}_k{top_k}")
    g.set_outputs([moe_block(g, g.input("x", [1, hidden]), cfg, "mlp")])
    cg = rlx.Session(rlx.Device.CPU).compile(g, num_threads=threads)
    rng = np.random.default_rng(experts * 100 + top_k)
    expert_bytes = 0
    # the f32 matrices (param_shapes of the unquantized config), quantized where the block stores blocks
    for name, (shape, _) in param_shapes(dataclasses.replace(cfg, quant=None), "mlp").items():
        value = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if quant is not None and ".experts." in name:
            value = quantize_experts(value, quant)
        if ".experts." in name:
            expert_bytes += value.nbytes
        cg.set_param(name, value)
    xs = [rng.standard_normal((1, hidden)).astype(np.float32) for _ in range(INPUTS)]
    feed = itertools.cycle(xs)
    return (lambda: cg.run({"x": next(feed)})), expert_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--quant", default=None, help="expert block format (q8_0); default f32 experts")
    args = ap.parse_args()
    if args.quant not in (None, "q8_0"):
        raise SystemExit("--quant takes q8_0 (or nothing for f32 experts)")
    peers, held = {}, {}
    for experts, top_k in itertools.product(EXPERTS, TOP_KS):
        peers[(experts, top_k)], held[experts] = _block(experts, top_k, args.hidden, args.inter, args.quant,
                                                        args.threads)
    times = timing.round_robin({f"{e}/{k}": fn for (e, k), fn in peers.items()}, args.rounds)
    kind = args.quant or "f32"
    print(f"MoE block, 1 token: hidden {args.hidden}, expert FFN {args.inter}, {kind} experts, "
          f"threads {args.threads}, medians of {args.rounds} rounds")
    print(f"experts held: {held[16] / 2**20:.1f} MiB (16 experts), {held[64] / 2**20:.1f} MiB (64 experts)")
    print(f"{'top_k':>5} {'read/call MiB':>13} {'16 experts us':>14} {'64 experts us':>14} {'64/16':>6}")
    for top_k in TOP_KS:
        read = held[16] / 16 * top_k / 2**20
        t16, t64 = times[f"16/{top_k}"] * 1e6, times[f"64/{top_k}"] * 1e6
        print(f"{top_k:>5} {read:>13.2f} {t16:>14.1f} {t64:>14.1f} {t64 / t16:>6.2f}")


if __name__ == "__main__":
    main()

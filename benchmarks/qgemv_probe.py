"""The one-row decode GEMVs of a Llama-3-8B layer alone on an NVIDIA GPU, for several walks (`gemv_walk`).

    python benchmarks/qgemv_probe.py [--walks auto,occ,occ4] [--weights q4_k] [--iters 200] [--repeats 5]
                                     [--shapes qkv,out,gateup,down] [--dry-run]

Each shape is its own graph, one decode row (M = 1), f16 compute, random `--weights` blocks, shaped as the 8B
decoder's fused GEMVs (`DecodeGemv`):

| shape | GEMV | weights |
|---|---|---|
| `qkv` | RMSNorm + Q/K/V, 6144 x 4096 | 3 members |
| `out` | attention output + residual, 4096 x 4096 | 1 member |
| `gateup` | RMSNorm + gate/up + SwiGLU, 2 x 14336 x 4096 | 2 members |
| `down` | down + residual, 4096 x 14336 | 1 member |

Every walk (`auto` = the register walk rlx_qgemv_xr at these K; `occ` / `occ4` = rlx_qgemv_occ with 2 / 4 weight
rows an item; `rows` = the older walk) is built from the same LIR and run on the same device tensors. Time per
call is the CUPTI duration of the GEMV kernel alone (`rlx_qgemv*`; the graph's other kernels and copies left out),
summed over `--iters` calls; the median of `--repeats` blocks, walks interleaved. GB/s = the weight bytes over that
time (4.8 TB/s is the H200's HBM). `max rel` compares each walk's outputs with the first walk's. `--dry-run` only
prints each build's DecodeGemv decisions (no GPU needed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlx.ir import quant as Q
from rlx.ir.graph import Graph

HIDDEN, FFN, KV = 4096, 14336, 1024  # Llama-3-8B: 32 heads of 128, 8 KV heads
SHAPES = {"qkv": (HIDDEN, ((HIDDEN, "q"), (KV, "k"), (KV, "v"))), "out": (HIDDEN, ((HIDDEN, "o"),)),
          "gateup": (HIDDEN, ((FFN, "gate"), (FFN, "up"))), "down": (FFN, ((HIDDEN, "down"),))}


def shape_graph(shape: str, fmt: str) -> Graph:
    """The GEMV of `shape` with what the decoder puts around it (a norm before, a residual or SwiGLU after)."""
    k, members = SHAPES[shape]
    g = Graph(f"gemv_{shape}")
    x = g.input("x", [1, k])

    def dm(h, n: int, name: str):
        return g.dequant_matmul(h, g.param(name, [n, Q.row_bytes(fmt, k)], "u8"), quant=fmt)

    if shape == "qkv":
        h = g.rms_norm(x, g.param("norm", [k]), eps=1e-5)
        g.set_outputs([dm(h, n, name) for n, name in members])
    elif shape == "gateup":
        h = g.rms_norm(x, g.param("norm", [k]), eps=1e-5)
        ffn = g.mul(g.activation("silu", dm(h, *members[0])), dm(h, *members[1]))
        g.set_outputs([g.rms_norm(ffn, g.param("post", [FFN]), eps=1e-5)])  # a consumer as the decoder's
    else:
        r = g.input("r", [1, members[0][0]])
        s = g.add_(dm(x, *members[0]), r)
        # two consumers, as the decoder's residual stream has (the next norm and the next residual add)
        g.set_outputs([g.rms_norm(s, g.param("post", [members[0][0]]), eps=1e-5), g.add_(s, r)])
    return g


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--walks", default="auto,occ,occ4")
    ap.add_argument("--weights", default="q4_k")
    ap.add_argument("--shapes", default="qkv,out,gateup,down")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()

    from rlx.config import Config
    from rlx.driver import Device, Session
    from rlx.ir.decisions_cuda import DecodeGemv
    from rlx.pipeline.cuda import CudaStages, compile_cuda

    walks = args.walks.split(",")
    shapes = args.shapes.split(",")
    rng = np.random.default_rng(0)
    rows = []
    for shape in shapes:
        k, members = SHAPES[shape]
        graph = shape_graph(shape, args.weights)
        lir = Session(Device.CUDA).lower(graph)
        for walk in walks:
            opts = {} if walk == "auto" else {"gemv_walk": walk}
            arch = "sm_90" if args.dry_run else None  # a dry run needs no GPU to pick the arch from
            decided = CudaStages(Config.from_env(), precision="f16", arch=arch, **opts).decide(lir)
            print(f"{shape} {walk}: " + "; ".join(d.describe() for d in decided.decided(DecodeGemv)))
        if args.dry_run:
            continue
        import torch
        from minilm_cuda import kernel_ms  # benchmarks/minilm_cuda.py (a script's own folder is on sys.path)

        params = {name: Q.random_blocks(rng, n, k, args.weights) for n, name in members}
        if shape in ("qkv", "gateup"):
            params["norm"] = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
        if shape != "qkv":
            params["post"] = np.ones(FFN if shape == "gateup" else members[0][0], np.float32)
        wbytes = sum(p.nbytes for name, p in params.items() if name not in ("norm", "post"))
        feeds = {"x": torch.randn(1, k, device="cuda")}
        if shape in ("out", "down"):
            feeds["r"] = torch.randn(1, members[0][0], device="cuda")
        fns, outs = {}, {}
        for walk in walks:
            opts = {} if walk == "auto" else {"gemv_walk": walk}
            cg = compile_cuda(lir, Config.from_env(), precision="f16", **opts)
            for name, p in params.items():
                cg.set_param(name, p)
            first = cg.run_device(feeds)  # the outputs' shapes and types, then buffers bound once (no allocation
            bound = {n: torch.empty(tuple(o.shape), dtype=torch.from_numpy(np.empty(0, o.dtype)).dtype, device="cuda")
                     for n, o in zip(cg.output_names, first)}  # in the timed calls)
            fns[walk] = cg.bind_device(feeds, outputs=bound)
            fns[walk]()
            outs[walk] = [t.float().clone() for t in bound.values()]
        torch.cuda.synchronize()
        times: dict[str, list[float]] = {w: [] for w in walks}
        names: dict[str, str] = {}
        for _ in range(args.repeats):
            for walk, fn in fns.items():
                fn()
                _, events = kernel_ms(fn, args.iters)
                gemv = [e for e in events if "rlx_qgemv" in e.key]
                names[walk] = ", ".join(sorted({e.key.split("(")[0].replace("void ", "")[:80] for e in gemv}))
                times[walk].append(sum(e.device_time_total for e in gemv) / args.iters)
        first = outs[walks[0]]
        for walk in walks:
            rel = max(float((a - b).abs().max() / (b.abs().max() + 1e-30)) for a, b in zip(outs[walk], first))
            us = statistics.median(times[walk])
            rows.append((shape, walk, us, wbytes / us / 1e3, rel, names[walk]))
    if rows:
        print(f"\nµs of the GEMV kernel per call (CUPTI, median of {args.repeats} blocks of {args.iters} calls), "
              f"{args.weights}, f16, one row")
        print("| shape | walk | µs | GB/s | of 4.8 TB/s | max rel vs first | kernel |")
        print("|---|---|---|---|---|---|---|")
        for shape, walk, us, gbs, rel, name in rows:
            print(f"| {shape} | {walk} | {us:.1f} | {gbs:.0f} | {gbs / 4800:.1%} | {rel:.1e} | {name} |")
        total = {w: sum(r[2] for r in rows if r[1] == w) for w in walks}
        print("one layer's four GEMVs: " + "  ".join(f"{w} {t:.1f} µs" for w, t in total.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The one-row decode GEMVs of a Llama-3-8B layer on an NVIDIA GPU, each timed alone, for several walks (`gemv_walk`).

    python benchmarks/qgemv_probe.py [--walks auto,occ,occ4,occp] [--weights q4_k] [--act f32] [--iters 100]
                                     [--repeats 5] [--dry-run]

One graph, one decode row (M = 1), f16 compute, random `--weights` blocks: a layer's four fused GEMVs
(`DecodeGemv`) with what the decoder puts around them, in the decoder's order:

| GEMV | weights | epilogue |
|---|---|---|
| `qkv`: RMSNorm + Q/K/V | 6144 x 4096 (3 members) | - |
| `out`: attention output | 4096 x 4096 | + residual |
| `gateup`: RMSNorm + gate/up | 2 x 14336 x 4096 | SwiGLU |
| `down` | 4096 x 14336 | + residual |
| `head` (`--weights bf16` only) | 128256 x 4096 | RMSNorm (the final one) before it |

Every walk (`auto` / `xreg` = the register walk rlx_qgemv_xr at these K; `occ` / `occ4` = rlx_qgemv_occ with 2 / 4
weight rows an item, `occp` with 2 and each warp's next item prefetched into L2; `rows` = the older walk) is built
from the same LIR (one build each) and run on the same device tensors. A walk may name its activations after a colon:
`occ4:q8` is the same walk over `dequant_matmul(act="q8")` projections (int8 activations: rlx_qgemv_occ with
ACT = 1 quantizes x in registers; `rows:q8` the older int8 walk), e.g. `--walks occ4,occ4:q8,occ8:q8,occ:q8`;
`--act` is the activations of the walks that name none (f32 by default; q8_0, q4_0, q4_1 and q4_k weights; a
q8 walk's `max rel` against an f32 first walk is the quantization's difference).
A GEMV's time is the CUPTI duration of its kernel (`rlx_qgemv*` launches of a call, in launch order: the graph's
other kernels and copies are left out), summed over `--iters` calls; the median of `--repeats` blocks, walks
interleaved. The builds have programmatic dependent launch off (`pdl=False`): a kernel's span is then its own work,
not also its wait for the kernel before (as in ncu; the decoder's steps overlap them). GB/s = the GEMV's weight
bytes over its time
(4.8 TB/s: the H200's HBM). `max rel` compares a walk's outputs with the first walk's. `--dry-run` prints each
build's DecodeGemv decisions only (no GPU needed).

`--weights bf16`: float weights (f32 params `[K, N]` stored in f16, as a bf16 decoder's are) and the dense GEMV
`rlx_dgemv` (`DecodeGemv` walk "dense"); the walks are then its tile widths and K splits over blocks: `auto` (both
chosen per launch), `t<cols>` (`dense_tile`: 8 .. 512 columns, splits chosen), `s<n>` (`dense_split`: `s1` no split,
today's single kernel with its tile chosen as before the split existed; `s4` 4 splits, tile chosen) or both
(`t128s4`), e.g. `--weights bf16 --walks s1,auto,t128s8,t256s16,t512s8`; a split GEMV is two kernels (rlx_dgemv, then
rlx_dgemv_reduce) and its µs is their span, from the first's start to the second's end (the gap between them
included). The bf16 walks time a fifth GEMV, the vocabulary head with the final norm (8B: 128256 x 4096, 1.05 GB of
f16 weights). A `torch.mv` line (cuBLAS's GEMV on the same shapes, f16 `[N, K]` weights, 4 copies cycled so none is
L2-resident, CUDA events) is printed beside them.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlx.ir import quant as Q
from rlx.ir.graph import Graph

HIDDEN, FFN, KV, VOCAB = 4096, 14336, 1024, 128256  # Llama-3-8B: 32 heads of 128, 8 KV heads
#: (GEMV, its weights as (name, rows, K)), in launch order
GEMVS = (("qkv", (("wq", HIDDEN, HIDDEN), ("wk", KV, HIDDEN), ("wv", KV, HIDDEN))),
         ("out", (("wo", HIDDEN, HIDDEN),)),
         ("gateup", (("wgate", FFN, HIDDEN), ("wup", FFN, HIDDEN))),
         ("down", (("wdown", HIDDEN, FFN),)))
#: the vocabulary head after the final norm (bf16 walks only: a dense GEMV of its own)
HEAD = ("head", (("whead", VOCAB, HIDDEN),))


def layer_graph(fmt: str, act: str = "f32", head: bool = False) -> Graph:
    """x -> norm -> Q/K/V (outputs); a = the attention's stand-in input -> output projection + x = h;
    h -> norm -> gate/up -> SwiGLU -> down + h = y; y -> a norm and an add (two consumers, as a residual stream); with
    `head` (float weights) the norm's output goes through the vocabulary head (its only reader: the head's GEMV takes
    the norm in). `act`: the quantized projections' activations ("f32" or "q8")."""
    g = Graph("gemv_probe")
    x, a = g.input("x", [1, HIDDEN]), g.input("a", [1, HIDDEN])

    def dm(h, name: str, n: int, k: int):
        if fmt == "bf16":  # a float weight as a decoder holds it: [K, N], stored in the build's precision
            return g.matmul(h, g.param(name, [k, n]))
        return g.dequant_matmul(h, g.param(name, [n, Q.row_bytes(fmt, k)], "u8"), quant=fmt, act=act)

    hn = g.rms_norm(x, g.param("attn_norm", [HIDDEN]), eps=1e-5)
    qkv = [dm(hn, *w) for w in GEMVS[0][1]]
    h = g.add_(x, dm(a, *GEMVS[1][1][0]))
    fn = g.rms_norm(h, g.param("ffn_norm", [HIDDEN]), eps=1e-5)
    ffn = g.mul(g.activation("silu", dm(fn, *GEMVS[2][1][0])), dm(fn, *GEMVS[2][1][1]))
    y = g.add_(h, dm(ffn, *GEMVS[3][1][0]))
    out = g.rms_norm(y, g.param("out_norm", [HIDDEN]), eps=1e-5)
    g.set_outputs([*qkv, dm(out, *HEAD[1][0]) if head else out, g.add_(y, x)])
    return g


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--walks", default="auto,occ,occ4,occp")
    ap.add_argument("--weights", default="q4_k")
    ap.add_argument("--act", default="f32", choices=("f32", "q8"))
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()

    from rlx.config import Config
    from rlx.driver import Device, Session
    from rlx.ir.decisions_cuda import DecodeGemv
    from rlx.pipeline.cuda import CudaStages, compile_cuda

    walks = args.walks.split(",")
    dense = args.weights == "bf16"
    gemvs = (*GEMVS, HEAD) if dense else GEMVS

    def act_of(walk: str) -> str:  # "occ4:q8" -> "q8"
        act = walk.partition(":")[2] or args.act
        if act not in ("f32", "q8") or (dense and act != "f32"):
            raise SystemExit(f"walk {walk!r}: activations f32 or q8 (q8: quantized weights only)")
        return act

    def options(walk: str) -> dict:
        walk = walk.partition(":")[0]
        if walk == "auto":
            return {}
        if not dense:
            return {"gemv_walk": walk}
        m = re.fullmatch(r"(?:t(\d+))?(?:s(\d+))?", walk)  # t<tile columns> and / or s<K splits>
        if m is None or not walk:
            raise SystemExit(f"walk {walk!r}: bf16 walks are auto, t<cols>, s<splits> or t<cols>s<splits>")
        return {**({"dense_tile": int(m[1])} if m[1] else {}), **({"dense_split": int(m[2])} if m[2] else {})}

    lirs = {act: Session(Device.CUDA).lower(layer_graph(args.weights, act, dense))
            for act in {act_of(w) for w in walks}}
    for walk in walks:
        opts = options(walk)
        arch = "sm_90" if args.dry_run else None  # a dry run needs no GPU to pick the arch from
        decided = CudaStages(Config.from_env(), precision="f16", arch=arch, **opts).decide(lirs[act_of(walk)])
        for d in decided.decided(DecodeGemv):
            print(f"{walk}: {d.describe()}")
    if args.dry_run:
        return 0

    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    rng = np.random.default_rng(0)
    if dense:
        params = {name: 0.02 * rng.standard_normal((k, n), dtype=np.float32) for _, ws in gemvs for name, n, k in ws}
        wbytes = {gemv: sum(params[name].nbytes // 2 for name, _, _ in ws) for gemv, ws in gemvs}  # stored in f16
    else:
        params = {name: Q.random_blocks(rng, n, k, args.weights) for _, ws in GEMVS for name, n, k in ws}
        wbytes = {gemv: sum(params[name].nbytes for name, _, _ in ws) for gemv, ws in GEMVS}
    for name in ("attn_norm", "ffn_norm", "out_norm"):
        params[name] = (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    feeds = {"x": torch.randn(1, HIDDEN, device="cuda"), "a": torch.randn(1, HIDDEN, device="cuda")}
    fns, outs, kernels = {}, {}, {}
    for walk in walks:
        opts = options(walk)
        cg = compile_cuda(lirs[act_of(walk)], Config.from_env(), precision="f16", pdl=False, **opts)
        print(f"{walk}: built in {cg.build_seconds:.1f} s", flush=True)
        for name, p in params.items():
            cg.set_param(name, p)
        first = cg.run_device(feeds)  # the outputs' shapes and types; then buffers bound once (none allocated in
        bound = {n: torch.empty(tuple(o.shape), dtype=torch.from_numpy(np.empty(0, o.dtype)).dtype, device="cuda")
                 for n, o in zip(cg.output_names, first)}  # the timed calls)
        fns[walk] = cg.bind_device(feeds, outputs=bound)
        fns[walk]()
        outs[walk] = [t.float().clone() for t in bound.values()]

    def gemv_us(fn) -> list[float]:  # µs of each GEMV of a call, in launch order
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                fn()
            torch.cuda.synchronize()
        kernel = "rlx_dgemv" if dense else "rlx_qgemv"
        evs = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA and kernel in e.name),
                     key=lambda e: e.time_range.start)
        # a K-split dense GEMV's rlx_dgemv_reduce joins the rlx_dgemv before it: a GEMV's span is first start to
        # last end
        spans: list[list] = []
        for e in evs:
            if "rlx_dgemv_reduce" in e.name and spans:
                spans[-1].append(e)
            else:
                spans.append([e])
        if len(spans) != len(gemvs) * args.iters:
            raise SystemExit(f"expected {len(gemvs)} GEMV launches a call, saw {len(spans) / args.iters:g}: "
                             + ", ".join(sorted({e.name[:60] for e in evs})))
        for i, sp in enumerate(spans[:len(gemvs)]):
            name = sp[0].name.split("(")[0].replace("void ", "")[:70]
            kernels.setdefault(fn, {})[gemvs[i][0]] = name + (f" + reduce ({sp[-1].time_range.elapsed_us():.1f} "
                                                              "µs)" if len(sp) > 1 else "")

        def span(sp: list) -> float:
            return sp[-1].time_range.end - sp[0].time_range.start if len(sp) > 1 else sp[0].time_range.elapsed_us()

        return [sum(span(spans[j]) for j in range(i, len(spans), len(gemvs))) / args.iters
                for i in range(len(gemvs))]

    times: dict[str, list[list[float]]] = {w: [] for w in walks}
    for _ in range(args.repeats):
        for walk in walks:
            times[walk].append(gemv_us(fns[walk]))
    print(f"\nµs of each GEMV kernel per call (CUPTI, median of {args.repeats} blocks of {args.iters} calls), "
          f"{args.weights} weights, f16, one row, {torch.cuda.get_device_name()}")
    print("| GEMV | walk | µs | GB/s | of 4.8 TB/s | max rel vs first | kernel |")
    print("|---|---|---|---|---|---|---|")
    total = {}
    for i, (gemv, _) in enumerate(gemvs):
        for walk in walks:
            us = statistics.median(t[i] for t in times[walk])
            total[walk] = total.get(walk, 0.0) + us
            rel = max(float((a - b).abs().max() / (b.abs().max() + 1e-30))
                      for a, b in zip(outs[walk], outs[walks[0]]))
            gbs = wbytes[gemv] / us / 1e3
            print(f"| {gemv} | {walk} | {us:.1f} | {gbs:.0f} | {gbs / 4800:.1%} | {rel:.1e} "
                  f"| {kernels[fns[walk]][gemv]} |")
    layer = sum(wbytes.values())
    print(("one layer's four GEMVs and the head: " if dense else "one layer's four GEMVs: ") + "  ".join(
        f"{w} {t:.1f} µs ({layer / t / 1e3:.0f} GB/s)" for w, t in total.items()))
    if dense:
        mv_total = 0.0
        for gemv, ws in gemvs:
            rows, k = sum(n for _, n, _ in ws), ws[0][2]
            copies = [torch.randn(rows, k, device="cuda", dtype=torch.float16) for _ in range(4)]
            xv = torch.randn(k, device="cuda", dtype=torch.float16)
            blocks = []
            for _ in range(args.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for i in range(args.iters):
                    torch.mv(copies[i % 4], xv)
                end.record()
                torch.cuda.synchronize()
                blocks.append(start.elapsed_time(end) * 1e3 / args.iters)
            us = statistics.median(blocks)
            mv_total += us
            print(f"| {gemv} | torch.mv | {us:.1f} | {wbytes[gemv] / us / 1e3:.0f} | "
                  f"{wbytes[gemv] / us / 1e3 / 4800:.1%} | - | cuBLAS ({rows} x {k}, CUDA events) |")
        print(f"torch.mv, the same four: {mv_total:.1f} µs ({layer / mv_total / 1e3:.0f} GB/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

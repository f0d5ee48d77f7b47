"""Encoder attention alone on an NVIDIA GPU: rlx's short-KV kernels vs PyTorch SDPA's fused backends.

    python benchmarks/attention_cuda.py [--cases 128x128,8x128,1x16,128x128p] [--variants short2,short1,...]
                                        [--precision f16] [--heads 12] [--head-dim 32] [--iters 50]

MiniLM's attention shape by default (12 heads of 32, f16, a key padding mask): q, k and v are [batch, seq,
heads * head_dim] tensors on the device, read in place by every peer (torch's as [batch, heads, seq, head_dim]
views). A case `BxS` pads one sentence to half its length (as benchmarks/minilm_cuda.py does); `BxSp` pads
every sentence to a random length in [S/4, S] (the key-mask path of rlx's kernels runs in every block).

Peers, all in this process on the same tensors:

| peer | what |
| --- | --- |
| `short2` | rlx, default CudaTarget: rlx_attn_short2 (64-key chunks, 8 warps per block at most) |
| `short2_bk32` / `short2_w4` | rlx_attn_short2 with `attn_bk=32` / `attn_warps=4` (they combine: `short2_bk32_w4`) |
| `short2p` | rlx with `attn_pipe=True`: rlx_attn_short2p, persistent blocks with two stages (options combine too) |
| `short1` | rlx with `short_attention_v1=True`: the first short-KV kernel, rlx_attn_short |
| `fa` | rlx with `short_attention=False`: the tiled rlx_attn_fa |
| `cudnn` / `efficient` | `F.scaled_dot_product_attention` with the boolean key mask on that backend alone |
| `flash` | SDPA's flash backend, which takes no mask: run without one (less work than the others) |

Time per call is the sum of the kernel durations CUPTI records (`torch.profiler`) over `--iters` calls,
divided by the calls, memory copies left out (rlx's graph is the attention kernel alone, between the copies
of its inputs into the graph's buffers and of its output out; torch's may add a small mask kernel, counted).
Each rlx output is checked against torch's math backend in float32 on the same (rounded) inputs: `max err`
is the largest absolute difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilm_cuda import kernel_ms  # benchmarks/minilm_cuda.py (a script's own folder is on sys.path)

from rlx.ir.graph import Graph
from rlx.ir.shape import Dim


def variant_options(name: str) -> dict:
    """CudaTarget options of an rlx peer name (`short2_bk64_w4` -> attn_bk=64, attn_warps=4)."""
    parts = name.split("_")
    base = {"short2": {}, "short2p": {"attn_pipe": True}, "short1": {"short_attention_v1": True},
            "fa": {"short_attention": False}}
    if parts[0] not in base:
        raise SystemExit(f"unknown rlx variant {name!r}")
    opts = dict(base[parts[0]])
    for p in parts[1:]:
        if p.startswith("bk"):
            opts["attn_bk"] = int(p[2:])
        elif p.startswith("w"):
            opts["attn_warps"] = int(p[1:])
        else:
            raise SystemExit(f"unknown option {p!r} in {name!r}")
    return opts


def attention_graph(batch: int, seq: int, heads: int, head_dim: int, dtype: str) -> Graph:
    g = Graph("attention_bench")
    s = Dim.dynamic("seq", max=seq)
    b = Dim.dynamic("batch", max=batch)
    q, k, v = (g.input(n, [b, s, heads * head_dim], dtype) for n in ("q", "k", "v"))
    m = g.input("m", [b, s], "i64")
    g.set_outputs([g.attention(q, k, v, num_heads=heads, head_dim=head_dim, mask="padding", mask_input=m)])
    return g


def kernel_us(fn, iters: int, show: str = "") -> float:
    """µs of GPU kernels per call of `fn` (CUPTI, every kernel; no memory copies: `bind_device` copies the
    inputs into the graph's own buffers and the output out, which is not attention's work)."""
    fn()
    _, events = kernel_ms(fn, iters)
    if show:
        for e in sorted(events, key=lambda e: -e.device_time_total)[:4]:
            print(f"    {show}: {e.device_time_total / iters:8.1f} us  x{e.count // iters} {e.key[:100]}")
    return sum(e.device_time_total for e in events if not e.key.startswith(("Memcpy", "Memset"))) / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="128x128,128x128p,8x128,1x16")
    ap.add_argument("--variants", default="short2,short1")
    ap.add_argument("--torch", default="cudnn,efficient,flash")
    ap.add_argument("--precision", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3, help="profiled blocks per peer (median), peers interleaved")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from rlx.config import Config
    from rlx.driver import Device, Session
    from rlx.pipeline.cuda import compile_cuda

    H, D = args.heads, args.head_dim
    tdt = torch.float16 if args.precision == "f16" else torch.bfloat16
    cases = [(c, *(int(x) for x in c.rstrip("p").split("x")), c.endswith("p")) for c in args.cases.split(",")]
    graph = attention_graph(max(c[1] for c in cases), max(c[2] for c in cases), H, D, args.precision)
    lir = Session(Device.CUDA).lower(graph)
    variants = args.variants.split(",")
    builds = {}
    for name in variants:
        builds[name] = compile_cuda(lir, Config.from_env(), precision=args.precision, **variant_options(name))
        kern = [ln for ln in builds[name].source.splitlines()
                if "rlx_attn_" in ln and ("<<<" in ln or "launch_pdl" in ln)]
        print(f"{name}: {variant_options(name)} built in {builds[name].build_seconds:.1f} s"
              + (f"; launch: {kern[0].strip()[:140]}" if kern else ""))
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "flash": SDPBackend.FLASH_ATTENTION}
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}  {args.precision}, {H} heads x {D}")
    rows = []
    for case, B, S, padded in cases:
        gen = torch.Generator().manual_seed(B * 1000 + S)
        q, k, v = (torch.randn(B, S, H * D, generator=gen).to(dev, tdt) for _ in range(3))
        mask = torch.ones(B, S, dtype=torch.int64)
        if padded:
            lens = torch.randint(S // 4, S + 1, (B,), generator=gen)
            mask = (torch.arange(S)[None, :] < lens[:, None]).to(torch.int64)
        elif B > 1:
            mask[-1, S // 2:] = 0
        mask = mask.to(dev)
        keep = mask.bool()[:, None, None, :]  # [B, 1, 1, S]: True = visible key

        def heads(t, B=B, S=S):
            return t.view(B, S, H, D).transpose(1, 2)

        qkv = (heads(q), heads(k), heads(v))  # [B, H, S, D] views
        want = F.scaled_dot_product_attention(*(t.float() for t in qkv), attn_mask=keep)
        want = want.transpose(1, 2).reshape(B, S, H * D)
        fns, err = {}, {}
        for name, cg in builds.items():
            out = torch.empty(B, S, H * D, dtype=tdt, device=dev)
            fns[name] = cg.bind_device({"q": q, "k": k, "v": v, "m": mask}, outputs={cg.output_names[0]: out})
            fns[name]()
            torch.cuda.synchronize()
            err[name] = (out.float() - want).abs().max().item()
        notes = []
        for name in args.torch.split(","):
            m = None if name == "flash" else keep
            if name == "flash" and not bool(mask.all()):
                notes.append("flash: no mask (the others mask the padded keys)")

            def call(name=name, m=m, qkv=qkv):
                with sdpa_kernel([backends[name]]):
                    return F.scaled_dot_product_attention(*qkv, attn_mask=m)
            try:
                got = call()
                torch.cuda.synchronize()
            except RuntimeError as e:  # a backend that does not take this case
                notes.append(f"{name}: {str(e).splitlines()[0][:100]}")
                continue
            fns[name] = call
            if m is not None:
                err[name] = (got.transpose(1, 2).reshape(B, S, H * D).float() - want).abs().max().item()
        times: dict[str, list[float]] = {n: [] for n in fns}
        for r in range(args.repeats):
            for n, fn in fns.items():  # the first case's first block lists its kernels
                times[n].append(kernel_us(fn, args.iters, n if r == 0 and case == cases[0][0] else ""))
        med = {n: statistics.median(t) for n, t in times.items()}
        ref = med.get("cudnn")
        for n in fns:
            rows.append((case, n, med[n], ref, err.get(n)))
        print(f"  {case}: " + "  ".join(f"{n} {t:.1f}" for n, t in med.items()) + " us"
              + "".join(f"\n    note {x}" for x in notes))

    print()
    print(f"µs of kernels per call (CUPTI, median of {args.repeats} blocks of {args.iters} calls); "
          "x cuDNN: cuDNN's time / the peer's (> 1: faster than cuDNN); max err vs float32 math.")
    print("| case | peer | µs per call | x 6 layers | x cuDNN | max err |")
    print("|---|---|---|---|---|---|")
    for case, n, t, ref, e in rows:
        ratio = f"{ref / t:.2f}" if ref else "-"
        print(f"| {case} | {n} | {t:.1f} | {6 * t:.0f} | {ratio} | {'-' if e is None else f'{e:.2e}'} |")
    bad = [(case, n, e) for case, n, _, _, e in rows if e is not None and not np.isfinite(e)]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

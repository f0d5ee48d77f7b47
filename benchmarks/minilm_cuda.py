"""all-MiniLM-L6-v2-shaped sentence embeddings on an NVIDIA GPU: rlx vs PyTorch eager and torch.compile.

    python benchmarks/minilm_cuda.py [--rounds R] [--cases 1x16,8x128,128x128] [--precisions f32,f16]
                                     [--peers rlx,rlx_host,eager,compile] [--weights random|DIR]

Every peer runs the same computation (BERT encoder + masked mean pooling + L2 normalization) from the
same weights on the same token batch, in this one process, on device-resident inputs. rlx peers:
`rlx` runs through `bind_device` (torch tensors checked once, then each call is one C call: the
static-buffer serving loop), `rlx_device` through `run_device` (the same, re-validating its arguments
in Python every call), `rlx_host` through `run` from numpy (host copies in and out included). PyTorch
runs the plain-torch BERT of `rlx.models.torch_bert` moved to the GPU (eager, and `torch.compile`
default mode), reading the same torch tensors. Each call is timed on the host and includes
the device synchronization (rlx's run returns after its stream synchronizes; the torch peers are
followed by `torch.cuda.synchronize()`). Peers run round-robin, one call each per round; the median is
reported, and ratios are peer time / rlx time (> 1: rlx is faster). f32 runs without TF32 in both.

Weights: random weights of MiniLM-L6's shape by default (seeded), or a HF model directory.
Also reported: rlx's cold build time (empty cache: lower, optimize, render, nvcc) and warm load time
(cache hit: lower, hash, dlopen, context) plus the time to upload the weights.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlx.models.bert import BertConfig, bert_inputs, build_bert, load_config, load_weights, random_weights

MINILM = BertConfig(vocab_size=30522, hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536,
                    max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu")


def token_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones_like(ids)
    if batch > 1:
        mask[-1, seq // 2:] = 0  # one padded sentence
    return ids, mask


def profile(fns: dict, prec: str, case: str, iters: int = 20) -> None:
    """Per-kernel device time of each peer over `iters` calls (CUPTI sees kernels of every library)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for name, fn in fns.items():
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(e.device_time_total for e in events) / iters
        print(f"--- profile {name} {prec} {case}: {total / 1e3:.3f} ms of kernels per call")
        for e in sorted(events, key=lambda e: -e.device_time_total)[:14]:
            print(f"    {e.device_time_total / iters:9.1f} us  x{e.count // iters:<3d} {e.key[:110]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--cases", default="1x16,8x128,128x128")
    ap.add_argument("--precisions", default="f32,f16")
    ap.add_argument("--peers", default="rlx,rlx_device,rlx_host,eager,compile")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--profile", default="", help="BxS[,BxS]: print per-kernel CUDA time of each peer there")
    args = ap.parse_args()

    import torch

    from rlx.driver import Device, Session
    from rlx.models.torch_bert import TorchBert

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    precisions = args.precisions.split(",")
    peers = args.peers.split(",")
    if args.weights == "random":
        cfg, weights, wdesc = MINILM, random_weights(MINILM, seed=0, scale=0.05), "random (MiniLM-L6 shapes, seed 0)"
    else:
        cfg = load_config(args.weights)
        weights, wdesc = load_weights(args.weights, cfg), args.weights
    max_batch = max(b for b, _ in cases)
    max_seq = max(s for _, s in cases)
    graph = build_bert(cfg, max_batch=max_batch, max_seq=max_seq, output="embeddings")
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}  weights: {wdesc}")
    print(f"graph: {len(graph.nodes)} MIR nodes, dynamic batch<={max_batch}, seq<={max_seq}")

    cold_dir = tempfile.mkdtemp(prefix="rlx-cold-cache-")
    builds: dict[str, object] = {}
    for prec in precisions:
        os.environ["RLX_CACHE_DIR"] = cold_dir
        t0 = time.perf_counter()
        cg = Session(Device.CUDA, precision=prec).compile(graph)
        cold, nvcc_s = time.perf_counter() - t0, cg.build_seconds
        t0 = time.perf_counter()
        cg = Session(Device.CUDA, precision=prec).compile(graph)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        for name, value in weights.items():
            cg.set_param(name, value)
        upload = time.perf_counter() - t0
        assert cg.cache_hit
        print(f"rlx {prec}: cold build {cold:.2f} s (render + nvcc + cache publish {nvcc_s:.2f} s of it), "
              f"warm load {warm * 1e3:.1f} ms (cache hit), weight upload {upload * 1e3:.1f} ms")
        builds[prec] = cg

    tb = TorchBert(cfg, weights)
    rows = []
    for prec in precisions:
        tdtype = torch.float32 if prec == "f32" else torch.float16
        module = tb.module(pooled=True).to(dev, tdtype)
        compiled = torch.compile(module, dynamic=False) if "compile" in peers else None
        ref32 = tb.module(pooled=True).to(dev, torch.float32)
        cg = builds[prec]
        for batch, seq in cases:
            ids, mask = token_batch(batch, seq, cfg.vocab_size)
            feed = bert_inputs(ids, mask)
            dfeed = {k: torch.from_numpy(v).to(dev) for k, v in feed.items()}
            out = torch.empty((batch, cfg.hidden_size), dtype=torch.float32, device=dev)
            t_ids, t_mask = dfeed["input_ids"], dfeed["attention_mask"]
            fns = {}
            if "rlx" in peers:
                fns["rlx"] = cg.bind_device(dfeed, outputs={"embeddings": out})
            if "rlx_device" in peers:
                fns["rlx_device"] = lambda dfeed=dfeed, out=out, cg=cg: cg.run_device(dfeed,
                                                                                    outputs={"embeddings": out})
            if "rlx_host" in peers:
                fns["rlx_host"] = lambda feed=feed, cg=cg: cg.run(feed)
            with torch.inference_mode():
                if "eager" in peers:
                    fns["eager"] = lambda m=module, a=t_ids, b=t_mask: (m(a, b), torch.cuda.synchronize())
                if compiled is not None:
                    t0 = time.perf_counter()
                    compiled(t_ids, t_mask)
                    torch.cuda.synchronize()
                    print(f"torch.compile {prec} {batch}x{seq}: first call {time.perf_counter() - t0:.1f} s")
                    fns["compile"] = lambda m=compiled, a=t_ids, b=t_mask: (m(a, b), torch.cuda.synchronize())
                # correctness: rlx vs torch float32 eager (same weights, same tokens)
                want = ref32(t_ids, t_mask).float()
                cg.run_device(dfeed, outputs={"embeddings": out})
                cos = torch.nn.functional.cosine_similarity(out, want, dim=1).min().item()
                for fn in fns.values():
                    fn()
                    fn()
                times: dict[str, list[float]] = {k: [] for k in fns}
                for _ in range(args.rounds):
                    for k, fn in fns.items():
                        t0 = time.perf_counter()
                        fn()
                        times[k].append(time.perf_counter() - t0)
                if f"{batch}x{seq}" in args.profile.split(","):
                    profile(fns, prec, f"{batch}x{seq}")
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            rows.append((prec, batch, seq, med, cos))
            print(f"  {prec} {batch}x{seq}: " + "  ".join(f"{k} {v:.3f} ms" for k, v in med.items())
                  + f"  min cos(rlx, torch f32) {cos:.6f}")

    names = [p for p in ("rlx", "rlx_device", "rlx_host", "eager", "compile") if p in peers]
    print()
    print("| precision | batch x seq | " + " | ".join(f"{n} ms" for n in names)
          + " | eager/rlx | compile/rlx | rlx/compile | min cos vs torch f32 |")
    print("|---|---|" + "---|" * (len(names) + 4))
    for prec, batch, seq, med, cos in rows:
        r = med.get("rlx")
        eg = f"{med['eager'] / r:.2f}" if r and "eager" in med else "-"
        cp = f"{med['compile'] / r:.2f}" if r and "compile" in med else "-"
        rc = f"{r / med['compile']:.2f}" if r and "compile" in med else "-"
        print(f"| {prec} | {batch}x{seq} | " + " | ".join(f"{med[n]:.3f}" for n in names)
              + f" | {eg} | {cp} | {rc} | {cos:.6f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""all-MiniLM-L6-v2-shaped sentence embeddings on an NVIDIA GPU: rlx vs PyTorch (eager, SDPA, torch.compile).

    python benchmarks/minilm_cuda.py [--rounds R] [--cases 1x16,8x128,128x128] [--precisions f32,f16]
                                     [--peers rlx,rlx_base,eager,sdpa,sdpa_flash,compile_ro,compile_ma,ort]
                                     [--weights random|DIR] [--profile BxS]

Every peer runs the same computation (BERT encoder + masked mean pooling + L2 normalization) from the
same weights on the same token batch, in this one process, on device-resident inputs. Peers:

| peer | what |
| --- | --- |
| `rlx` | `bind_device` (torch tensors checked once, then each call is one C call replaying a CUDA graph) |
| `rlx_mma` | `rlx` built with `fused_act_gemm=True`: the erf-GELU GEMM on rlx_gemm_mma, bias + GELU in its epilogue |
| `rlx_fa` | `rlx` built with `short_attention=False`: the tiled attention kernel instead of the short-KV one |
| `rlx_short1` | `rlx` built with `short_attention_v1=True`: the first short-KV kernel, rlx_attn_short |
| `rlx_pipe` | `rlx` built with `attn_pipe=True`: rlx_attn_short2p, the persistent double-buffered rlx_attn_short2 |
| `rlx_bk32` | `rlx` built with `attn_bk=32`: rlx_attn_short2 in 32-key chunks (4 blocks of 8 warps per SM) |
| `rlx_nosmall` | `rlx` built with `small_gemm=False`: every GEMM on cuBLASLt, also at a few rows |
| `rlx_nopdl` | `rlx` built with `pdl=False`: plain launches (CUPTI's kernel times are each kernel's own) |
| `rlx_base` | `rlx` built with `small_gemm=False, pdl=False`: no programmatic dependent launch either |
| `rlx_nopool` | `rlx` built with `pool_tail=False`: the pooling tail (masked mean, L2 norm) as ~9 kernels, not one |
| `rlx_poolnorm` | `rlx` built with `pool_norm=True`: the last LayerNorm inside the pooling kernel (seq <= 64) |
| `rlx_nogather` | `rlx` built with `gather_region=False`: the embedding lookups as gather kernels before the sum |
| `rlx_noio` | `rlx` built with `io_graph=False`: input / output copies and the flag read as separate operations |
| `rlx_nohold` | `rlx` planned without `hold_norm_inputs`: the LayerNorm before each FFN1 as its own kernel |
| `rlx_before` | `rlx_nopool`, `rlx_noio` and `rlx_nohold` in one build |
| `rlx_start` | `rlx_before`, `rlx_nocutlass`, `rlx_short1`, `rlx_nogather` in one: main at 22:00 UTC 2026-11-23 |
| `rlx_device` / `rlx_host` | `run_device` (re-validating its arguments every call) / `run` from numpy (host copies) |
| `eager` | the plain-torch BERT of `rlx.models.torch_bert` (matmul, softmax, matmul attention) |
| `sdpa` | the same with `F.scaled_dot_product_attention` and the padding mask (PyTorch picks its fused kernel) |
| `sdpa_flash` | SDPA restricted to the flash backend; flash takes no mask, so only cases without padding run it |
| `compile` | `torch.compile` default mode (SDPA attention), no CUDA graphs: mostly Python launch overhead |
| `compile_ro` | `torch.compile(mode="reduce-overhead")`: Inductor kernels replayed as CUDA graphs |
| `compile_ma` | `torch.compile(mode="max-autotune")`: autotuned GEMM templates, CUDA graphs |
| `ort` | ONNX Runtime, CUDA execution provider, the model exported in the precision (needs onnxruntime-gpu) |

Two times per peer and case: host wall time per call (median over rounds, including the device
synchronization: rlx's run returns after its stream synchronizes; torch peers are followed by
`torch.cuda.synchronize()`), and kernel time per call: the sum of the GPU kernel durations that CUPTI
records (`torch.profiler`, every library's kernels, CUDA-graph replays included) over 20 calls (a kernel
launched with programmatic dependent launch starts early, so its time includes its wait for the kernel before:
then only the wall time means what it says). % of
peak is the model's FLOPs (GEMMs and attention's two products, 2 per multiply-add) over kernel time,
against `--peak` TFLOP/s (H100 SXM dense f16/bf16 with f32 accumulation: 989.5). Peers run round-robin,
one call each per round; ratios are peer time / rlx time (> 1: rlx is faster). f32 runs without TF32.

Weights: random weights of MiniLM-L6's shape by default (seeded), or a HF model directory.
Also reported: rlx's cold build time (empty cache: lower, optimize, render, nvcc) and warm load time
(cache hit: lower, hash, dlopen, context) plus the time to upload the weights.
"""

from __future__ import annotations

import argparse
import functools
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


#: rlx built with other CudaTarget options, peers of the default build (same graph, weights and tokens).
VARIANTS = {"rlx_mma": dict(fused_act_gemm=True), "rlx_fa": dict(short_attention=False),
            "rlx_short1": dict(short_attention_v1=True), "rlx_pipe": dict(attn_pipe=True),
            "rlx_bk32": dict(attn_bk=32),
            "rlx_nosmall": dict(small_gemm=False), "rlx_nopdl": dict(pdl=False),
            "rlx_base": dict(small_gemm=False, pdl=False), "rlx_nopool": dict(pool_tail=False),
            "rlx_poolnorm": dict(pool_norm=True), "rlx_nogather": dict(gather_region=False),
            "rlx_nocutlass": dict(cutlass_gemm=False),
            "rlx_noio": dict(io_graph=False), "rlx_nohold": dict(plan=dict(hold_norm_inputs=False)),
            "rlx_before": dict(pool_tail=False, io_graph=False, plan=dict(hold_norm_inputs=False)),
            "rlx_start": dict(pool_tail=False, io_graph=False, plan=dict(hold_norm_inputs=False), cutlass_gemm=False,
                              short_attention_v1=True, gather_region=False)}


def variant_lir(graph, options: dict) -> tuple:
    """(the LIR, the CudaTarget options) of a VARIANTS entry: its `plan` options replan the graph."""
    from rlx.driver import Device, Session, lower_to_lir, to_mir

    options = dict(options)
    plan = options.pop("plan", None)
    if plan is None:
        return Session(Device.CUDA).lower(graph), options
    return lower_to_lir(to_mir(graph), backend="cuda", **plan), options


def token_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones_like(ids)
    if batch > 1:
        mask[-1, seq // 2:] = 0  # one padded sentence
    return ids, mask


def kernel_ms(fn, iters: int = 20) -> tuple[float, list]:
    """(ms of GPU kernels per call, the profiler's per-kernel averages): CUPTI sees every library's kernels."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    return sum(e.device_time_total for e in events) / iters / 1e3, events


def print_profile(name: str, prec: str, case: str, events: list, iters: int = 20) -> None:
    total = sum(e.device_time_total for e in events) / iters
    print(f"--- profile {name} {prec} {case}: {total / 1e3:.3f} ms of kernels per call")
    for e in sorted(events, key=lambda e: -e.device_time_total)[:14]:
        print(f"    {e.device_time_total / iters:9.1f} us  x{e.count // iters:<3d} {e.key[:110]}")


def call_torch(module, ids, mask, ctx=None):
    """One call of a torch peer, then a device synchronization; returns its output.

    A CUDA-graph peer's output lives in memory the next replay of any such peer overwrites: the
    caller clones it before calling another peer.
    """
    import torch

    if ctx is None:
        out = module(ids, mask)
    else:
        with ctx():
            out = module(ids, mask)
    torch.cuda.synchronize()
    return out


def ort_session(module, t_ids, t_mask, path: Path):
    """An ONNX Runtime session on the CUDA execution provider, or the reason there is none."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None, "this onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu is not installed)"
    import torch

    torch.onnx.export(module, (t_ids, t_mask), str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["embeddings"], opset_version=17, dynamo=False)
    sess = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
    if sess.get_providers()[0] != "CUDAExecutionProvider":
        return None, f"onnxruntime fell back to {sess.get_providers()}"
    return sess, ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--cases", default="1x16,8x128,128x128")
    ap.add_argument("--precisions", default="f32,f16")
    ap.add_argument("--peers", default="rlx,eager,sdpa,sdpa_flash,compile_ro,compile_ma,ort")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--peak", type=float, default=989.5, help="dense f16 TFLOP/s of the GPU, for %% of peak")
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
              f"warm load {warm * 1e3:.1f} ms (cache hit), weight upload {upload * 1e3:.1f} ms, "
              f"GEMM {cg.manifest.get('gemm')}, arch {cg.manifest.get('arch')}")
        builds[prec] = cg
        for variant, options in VARIANTS.items():
            if variant not in peers:
                continue
            from rlx.config import Config
            from rlx.pipeline.cuda import compile_cuda

            vlir, voptions = variant_lir(graph, options)
            vg = compile_cuda(vlir, Config.from_env(), precision=prec, **voptions)
            for name, value in weights.items():
                vg.set_param(name, value)
            builds[f"{prec}_{variant}"] = vg

    tb = TorchBert(cfg, weights)
    compile_modes = {"compile": None, "compile_ro": "reduce-overhead", "compile_ma": "max-autotune"}
    rows = []
    for prec in precisions:
        tdtype = torch.float32 if prec == "f32" else torch.float16
        eager = tb.module(pooled=True).to(dev, tdtype)
        sdpa = tb.module(pooled=True, attention="sdpa").to(dev, tdtype)
        unmasked = tb.module(pooled=True, attention="sdpa_unmasked").to(dev, tdtype)
        ref32 = tb.module(pooled=True).to(dev, torch.float32)
        cg = builds[prec]
        for batch, seq in cases:
            ids, mask = token_batch(batch, seq, cfg.vocab_size)
            feed = bert_inputs(ids, mask)
            dfeed = {k: torch.from_numpy(v).to(dev) for k, v in feed.items()}
            out = torch.empty((batch, cfg.hidden_size), dtype=torch.float32, device=dev)
            t_ids, t_mask = dfeed["input_ids"], dfeed["attention_mask"]
            fns, notes = {}, []
            if "rlx" in peers:
                fns["rlx"] = cg.bind_device(dfeed, outputs={"embeddings": out})
            variant_out = {}
            for variant in VARIANTS:
                if variant in peers:
                    variant_out[variant] = torch.empty_like(out)
                    fns[variant] = builds[f"{prec}_{variant}"].bind_device(
                        dfeed, outputs={"embeddings": variant_out[variant]})
            if "rlx_device" in peers:
                fns["rlx_device"] = lambda dfeed=dfeed, out=out, cg=cg: cg.run_device(dfeed,
                                                                                    outputs={"embeddings": out})
            if "rlx_host" in peers:
                fns["rlx_host"] = lambda feed=feed, cg=cg: cg.run(feed)
            with torch.inference_mode():
                def torch_peer(name, m, ctx=None, a=t_ids, b=t_mask):
                    return functools.partial(call_torch, m, a, b, ctx)

                if "eager" in peers:
                    fns["eager"] = torch_peer("eager", eager)
                if "sdpa" in peers:
                    fns["sdpa"] = torch_peer("sdpa", sdpa)
                if "sdpa_flash" in peers:
                    from torch.nn.attention import SDPBackend, sdpa_kernel

                    if prec == "f32":
                        notes.append("sdpa_flash: flash attention has no f32 kernel")
                    elif not mask.all():
                        notes.append("sdpa_flash: flash takes no mask and this batch is padded")
                    else:
                        fns["sdpa_flash"] = torch_peer("sdpa_flash", unmasked,
                                                       lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION]))
                for name, mode in compile_modes.items():
                    if name not in peers:
                        continue
                    torch._dynamo.reset()
                    compiled = torch.compile(sdpa, mode=mode, dynamic=False)
                    t0 = time.perf_counter()
                    for _ in range(3):  # reduce-overhead records its CUDA graph on a later call
                        compiled(t_ids, t_mask)
                    torch.cuda.synchronize()
                    print(f"torch.compile({mode or 'default'}) {prec} {batch}x{seq}: first calls "
                          f"{time.perf_counter() - t0:.1f} s")
                    fns[name] = torch_peer(name, compiled)
                if "ort" in peers:
                    sess, why = ort_session(sdpa if prec != "f32" else eager, t_ids, t_mask,
                                            Path(cold_dir) / f"minilm_{prec}_{batch}x{seq}.onnx")
                    if sess is None:
                        notes.append(f"ort: {why}")
                    else:
                        binding = sess.io_binding()
                        for nm, t in (("input_ids", t_ids), ("attention_mask", t_mask)):
                            binding.bind_input(nm, "cuda", 0, np.int64, tuple(t.shape), t.data_ptr())
                        ort_out = torch.empty((batch, cfg.hidden_size), dtype=tdtype, device=dev)
                        binding.bind_output("embeddings", "cuda", 0, np.float32 if prec == "f32" else np.float16,
                                            tuple(ort_out.shape), ort_out.data_ptr())
                        fns["ort"] = lambda s=sess, b=binding, o=ort_out: (s.run_with_iobinding(b), o)[1]
                # correctness: every peer vs torch float32 eager (same weights, same tokens)
                want = ref32(t_ids, t_mask).float()
                cg.run_device(dfeed, outputs={"embeddings": out})
                for fn in fns.values():
                    fn()
                    fn()
                cos = {"rlx": torch.nn.functional.cosine_similarity(out, want, dim=1).min().item()}
                for variant, vout in variant_out.items():
                    cos[variant] = torch.nn.functional.cosine_similarity(vout, want, dim=1).min().item()
                for name, fn in fns.items():
                    if not name.startswith("rlx"):  # each torch / ORT peer's output, cloned at once
                        got = fn().float().clone()
                        cos[name] = torch.nn.functional.cosine_similarity(got, want, dim=1).min().item()
                times: dict[str, list[float]] = {k: [] for k in fns}
                for _ in range(args.rounds):
                    for k, fn in fns.items():
                        t0 = time.perf_counter()
                        fn()
                        times[k].append(time.perf_counter() - t0)
                kern: dict[str, float] = {}
                for k, fn in fns.items():
                    kern[k], events = kernel_ms(fn)
                    if f"{batch}x{seq}" in args.profile.split(","):
                        print_profile(k, prec, f"{batch}x{seq}", events)
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            flops = float(cfg.flops(batch, seq))
            rows.append((prec, batch, seq, med, kern, cos, flops))
            print(f"  {prec} {batch}x{seq} ({flops / 1e9:.1f} GFLOP): "
                  + "  ".join(f"{k} {v:.3f}/{kern[k]:.3f} ms" for k, v in med.items()) + "  (wall/kernel)")
            print("    min cos vs torch f32: " + "  ".join(f"{k} {v:.6f}" for k, v in cos.items()))
            for n in notes:
                print(f"    skipped {n}")
            torch._dynamo.reset()

    names = [p for p in ("rlx", *VARIANTS, "rlx_device", "rlx_host", "eager", "sdpa", "sdpa_flash", "compile",
                         "compile_ro", "compile_ma", "ort") if p in peers]
    print()
    print(f"Wall: host ms per call (median of {args.rounds}); kernel: ms of GPU kernels per call (CUPTI); "
          f"% peak: FLOPs / kernel time / {args.peak:g} TFLOP/s; x: peer / rlx (> 1: rlx faster).")
    print("| prec | batch x seq | peer | wall ms | kernel ms | % f16 peak | wall x | kernel x | min cos |")
    print("|---|---|---|---|---|---|---|---|---|")
    for prec, batch, seq, med, kern, cos, flops in rows:
        for n in names:
            if n not in med:
                continue
            pct = flops / (kern[n] * 1e-3) / (args.peak * 1e12) * 100
            wx = f"{med[n] / med['rlx']:.2f}" if "rlx" in med else "-"
            kx = f"{kern[n] / kern['rlx']:.2f}" if "rlx" in kern else "-"
            c = f"{cos[n]:.6f}" if n in cos else "-"
            print(f"| {prec} | {batch}x{seq} | {n} | {med[n]:.3f} | {kern[n]:.3f} | {pct:.1f} | {wx} | {kx} | {c} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A LLaMA-style decoder on an NVIDIA GPU: RLX (GGUF blocks or bf16) against PyTorch/transformers.

    python benchmarks/llm_cuda.py [--shape smollm2|llama3-8b] [--weights q4_1|q4_k|q8_0|bf16] [--act f32|q8]
                                  [--prompt-tokens 32] [--new-tokens 128] [--rounds 3] [--precision f16]
                                  [--peers rlx,hf_eager,hf_static] [--profile | --host-split]
                                  [--batches 1,8,32,64] [--context 32,4096,16384 [--kv-dtype f16]]

`--shape llama3-8b` is Llama-3-8B's shape (32 layers, hidden 4096, 32/8 heads, FFN 14336, vocab 128256,
untied head); the table then also prints the bytes of weights a decode step reads and the tok/s bound
that the GPU's memory bandwidth sets (`--hbm-tbps`, by default the datasheet figure of the GPU found:
H100 SXM 3.35 TB/s, H200 4.8), and the GPU memory each peer holds. `--batches` instead times RLX's decode
steps of B rows each (B sequences at the same length, greedy): aggregate tokens/s per B and the ms a step takes,
beside which kernel path the step's projections took (the fused decode GEMV up to `DecodeGemv.max_rows` rows,
then in f16 / bf16 the tensor-core rlx_qmma up to `QuantMma.max_rows`, the dequantize + GEMM path beyond: the
switch-overs the LIR records). `--weights bf16`: every matrix bf16, stored in the build's precision as the matmuls
read it ([K, N]); one-row steps run the dense GEMV `rlx_dgemv` (`DecodeGemv` walk "dense", with the norm, residual and
SwiGLU inside: four launches a layer as with GGUF blocks; `RLX_DENSE_GEMV=0` keeps their cuBLASLt GEMMs), larger
steps the GEMMs.

The weights are random but shaped like SmolLM2-135M-Instruct (30 layers, hidden 576, 9/3 heads,
FFN 1536, vocab 49152, tied embeddings): RLX gets them as GGUF Q4_1 blocks (token embedding Q8_0)
like the real file, transformers as an f16 `LlamaForCausalLM` (the GGUF loaded dequantized to f16 is
what it would run). Batch 1, greedy. RLX: one prefill step of the prompt, then one step per token
(KV cache resident on the device, the greedy token's argmax computed there: 4 bytes come back a
step). transformers: `generate` with
its dynamic cache (eager) and with `cache_implementation="static"` (which compiles the decode step
with torch.compile), timed after a warm-up that includes compilation. Tokens/s = new tokens / time
of the whole generation (prefill included) for every peer, plus RLX's decode-only rate.
`--context N[,N...]`: RLX only, decode tok/s after N tokens of context (a random prompt of N tokens prefilled in
chunks of --prompt-tokens, then --new-tokens greedy steps timed), one build sized for the largest N; each row's
ratio to the first context's rate is printed.
RLX's decode steps are launched as `CausalLM.generate` launches them on CUDA: each before the last one's token has
reached the host, fed on the device from the slot that step stored it in (`launch_ahead`); `--host-fed` times them one
at a time instead (each step's inputs from the host after the last one's token arrived).
`--act q8`: RLX quantizes the activations of its q8_0 / q4_0 / q4_1 projections to int8 per block of 32 (CausalLM's
`quant_act`; integer dot products on the GPU, kernels/quant_q8.cuh); q4_k projections keep f32 activations.
Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "smollm2": dict(arch="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                    head_dim=64, ffn_size=1536, rms_eps=1e-5, rope_base=100000.0, rope_variant="interleaved",
                    n_rot=64, context_length=2048, tie_embeddings=True, bos_id=1, eos_id=2),
    "llama3-8b": dict(arch="llama", vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32,
                      num_kv_heads=8, head_dim=128, ffn_size=14336, rms_eps=1e-5, rope_base=500000.0,
                      rope_variant="interleaved", n_rot=128, context_length=8192, tie_embeddings=False,
                      bos_id=128000, eos_id=128001),
}
SHAPE = SHAPES["smollm2"]
#: memory bandwidth by GPU name (datasheet, SXM parts), for the bound a decode step's weight bytes set
HBM_TBPS = {"H100": 3.35, "H200": 4.8}


def rlx_tensors(config, seed: int = 0, weights: str = "q4_1") -> dict:
    """Random weights of `config`'s shape: every matrix in `weights` (a GGUF block format, or bf16 as raw
    bits: one random matrix a shape, the layers' alike); with a block format the token embedding is Q8_0, as in
    SmolLM2's file."""
    from rlx.ir.quant import random_blocks
    from rlx.models.llama import WeightSpec, random_specs

    rng = np.random.default_rng(seed)
    out = {}
    dense: dict[tuple[int, ...], np.ndarray] = {}  # bf16: one random matrix a shape, shared by the layers
    for name, spec in random_specs(config).items():
        if len(spec.shape) == 1:
            out[name] = (spec, np.ones(spec.shape, np.float32))
            continue
        if weights == "bf16":
            # random bits, not normal floats: 15 GB of the 8B shape took 149 s of an H200 host's time that way; a
            # random sign and mantissa, the exponent 2^-6 or 2^-5 (|w| 0.016..0.06); each matrix its own device
            # buffer all the same, so the bytes a step reads do not change
            if spec.shape not in dense:
                raw = rng.integers(0, 1 << 16, size=spec.shape, dtype=np.uint16)
                dense[spec.shape] = (raw & 0x807F) | ((((raw >> 7) & 1) + 121) << 7)
            out[name] = (WeightSpec("bf16", spec.shape), dense[spec.shape])
            continue
        fmt = "q8_0" if name == "token_embd.weight" else weights
        out[name] = (WeightSpec(fmt, spec.shape), random_blocks(rng, spec.shape[0], spec.shape[1], fmt, scale=0.02))
    return out


def weight_bytes_per_token(tensors: dict) -> int:
    """Bytes of weights one decode row reads: every matrix but the token embedding (one row of it is read),
    plus the embedding when it is also the output head (tied)."""
    total = sum(data.nbytes for name, (spec, data) in tensors.items() if name != "token_embd.weight")
    if "output.weight" not in tensors:
        total += tensors["token_embd.weight"][1].nbytes
    return total


def gpu_memory_used() -> float:
    """GiB of the GPU's memory in use (every context on it), through PyTorch when it is installed."""
    try:
        import torch
    except ImportError:
        return float("nan")
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def bench_rlx(args, config, tensors) -> dict[str, float]:
    from rlx.models.causal_lm import CausalLM

    before = gpu_memory_used()
    t0 = time.perf_counter()
    lm = CausalLM(config, tensors, device="cuda", precision=args.precision, quant_act=args.act,
                  max_context=args.prompt_tokens + args.new_tokens + 8, prefill_chunk=args.prompt_tokens)
    build = time.perf_counter() - t0
    prompt = np.random.default_rng(1).integers(3, config.vocab_size, (1, args.prompt_tokens))

    cache = lm.new_cache()

    slot, placeholder = np.zeros(1, np.int32), np.zeros((1, 1), np.int32)

    def once() -> tuple[float, float]:
        cache.reset()
        t0 = time.perf_counter()
        token = int(lm.step_greedy(prompt, cache, [args.prompt_tokens - 1])[0])
        t1 = time.perf_counter()
        if args.host_fed:  # one step at a time: each waits for the last one's token to reach the host
            for _ in range(args.new_tokens - 1):
                token = int(lm.step_greedy(np.array([[token]]), cache, [0])[0])
        elif args.new_tokens > 1:  # as `generate` runs on CUDA: each step launched before the last one's token is
            # taken, fed on the device from the slot that step stored it in (`CausalLM.launch_ahead`)
            pending = lm.launch_greedy(np.array([[token]]), cache, [0], token_dst=slot)
            for _ in range(args.new_tokens - 2):
                after = lm.launch_greedy(placeholder, cache, [0], token_src=slot, token_dst=slot)
                token = int(pending.result()[0])
                pending = after
            token = int(pending.result()[0])
        t2 = time.perf_counter()
        return t2 - t0, t2 - t1

    once()  # warm-up: CUDA graphs captured for the prefill and decode shapes
    totals, decodes = zip(*(once() for _ in range(args.rounds)))
    gib = gpu_memory_used() - before
    return {"build_s": build, "total": statistics.median(totals), "decode": statistics.median(decodes),
            "gpu_gib": gib}


def bench_batches(args, config, tensors, batches: list[int]) -> None:
    """Aggregate decode tokens/s at each batch size (B rows a step)."""
    from rlx.models.causal_lm import CausalLM
    from rlx.opt.lowering_cuda import DECODE_GEMV_ROWS, QUANT_MMA_FORMATS, QUANT_MMA_MAX_ROWS, QUANT_MMA_MIN_ROWS

    rows = [r for kmax, r in DECODE_GEMV_ROWS if config.hidden_size <= kmax][:1]
    switch = rows[0] if rows else 0
    if args.weights == "bf16":  # float projections: the dense GEMV takes one-row steps only (DecodeGemv walk "dense")
        switch = 1
    # the FFN weights' QuantMma rows (the decision the LIR records for each projection)
    mma = args.precision in ("f16", "bf16") and args.weights in QUANT_MMA_FORMATS
    mma_max = next(r for least, r in QUANT_MMA_MAX_ROWS if config.hidden_size * config.ffn_size >= least) if mma else 0
    lm = CausalLM(config, tensors, device="cuda", precision=args.precision, quant_act=args.act, max_batch=max(batches),
                  max_context=args.prompt_tokens + args.new_tokens + 8, prefill_chunk=args.prompt_tokens)
    rng = np.random.default_rng(1)
    print(f"{args.shape}-shaped decoder, {args.weights} weights, precision {args.precision}: decode steps of B rows "
          f"after a {args.prompt_tokens}-token prompt each, {args.new_tokens} steps, {args.rounds} rounds (medians); "
          f"fused decode GEMV up to {switch} row(s) (K = {config.hidden_size}), "
          + (f"the tensor-core rlx_qmma from {QUANT_MMA_MIN_ROWS} to {mma_max} rows (the FFN's QuantMma), "
             if mma else "a warp-per-row GEMV up to 8, ") + "dequantize + GEMM beyond")
    print(f"{'rows B':>6} {'ms/step':>9} {'tok/s':>10} {'vs B=1':>7} {'projections':>12}")
    base = None
    def once(b: int, cache, prompt: np.ndarray) -> float:
        cache.reset()
        tokens = lm.step_greedy(prompt, cache, [i * args.prompt_tokens + args.prompt_tokens - 1 for i in range(b)])
        t0 = time.perf_counter()
        for _ in range(args.new_tokens):
            tokens = lm.step_greedy(tokens[:, None], cache, list(range(b)))
        return (time.perf_counter() - t0) / args.new_tokens

    for b in batches:
        cache = lm.new_cache()
        prompt = rng.integers(3, config.vocab_size, (b, args.prompt_tokens))
        once(b, cache, prompt)  # captures the step's CUDA graph
        step = statistics.median(once(b, cache, prompt) for _ in range(args.rounds))
        rate = b / step
        base = base or rate
        path = ("fused GEMV" if b <= switch else "qmma" if QUANT_MMA_MIN_ROWS <= b <= mma_max
                else "GEMV" if b <= 8 and args.weights != "bf16" else "GEMM")
        print(f"{b:>6} {step * 1e3:9.3f} {rate:10.1f} {rate / base:7.2f} {path:>12}")


def bench_context(args, config) -> None:
    """Decode tok/s of RLX at each context of --context (one build, a cache of the largest context)."""
    from rlx.models.causal_lm import CausalLM

    contexts = [int(c) for c in args.context.split(",")]
    t0 = time.perf_counter()
    lm = CausalLM(config, rlx_tensors(config, weights=args.weights), device="cuda", precision=args.precision,
                  quant_act=args.act, max_context=max(contexts) + args.new_tokens + 8, prefill_chunk=args.prompt_tokens,
                  kv_dtype=args.kv_dtype)
    build = time.perf_counter() - t0
    cache = lm.new_cache()
    rng = np.random.default_rng(1)
    rates = []
    for n in contexts:
        def decode(n: int) -> float:
            cache.reset()
            prompt = rng.integers(3, config.vocab_size, (1, n))
            for at in range(0, n, args.prompt_tokens):
                chunk = prompt[:, at:at + args.prompt_tokens]
                token = int(lm.step_greedy(chunk, cache, [chunk.shape[1] - 1])[0])
            t1 = time.perf_counter()
            for _ in range(args.new_tokens - 1):
                token = int(lm.step_greedy(np.array([[token]]), cache, [0])[0])
            return time.perf_counter() - t1

        decode(n)  # warm-up: CUDA graphs captured for this context's step shapes
        rates.append((args.new_tokens - 1) / statistics.median(decode(n) for _ in range(args.rounds)))
    c = config
    print(f"decoder of {c.num_layers} layers, hidden {c.hidden_size}, {c.num_heads}/{c.num_kv_heads} heads of "
          f"{c.head_dim}, batch 1, rlx precision {args.precision}, KV cache {lm.kv_dtype}, build {build:.1f} s, "
          f"{args.new_tokens} new tokens, {args.rounds} rounds (medians)")
    print(f"{'context':>8} {'decode tok/s':>13} {'vs first':>9}")
    for n, rate in zip(contexts, rates):
        print(f"{n:>8} {rate:13.1f} {rate / rates[0]:9.2f}")


def profile_rlx(args, config) -> None:
    """Where a decode step's time goes: kernel times of a profiled build (eager launches, one event pair per
    kernel), then the host-side split of one graph-replayed step (`host_split`)."""
    import os

    from rlx.models.causal_lm import CausalLM
    from rlx.runtime.profile import format_top_ops, top_ops

    tensors = rlx_tensors(config, weights=args.weights)
    prompt = np.random.default_rng(1).integers(3, config.vocab_size, (1, args.prompt_tokens))
    os.environ["RLX_PROFILE"] = "1"
    try:
        lm = CausalLM(config, tensors, device="cuda", precision=args.precision, quant_act=args.act,
                      max_context=args.prompt_tokens + args.new_tokens + 8, prefill_chunk=args.prompt_tokens)
    finally:
        del os.environ["RLX_PROFILE"]
    cache = lm.new_cache()
    token = int(lm.step(prompt, cache, [args.prompt_tokens - 1])[0].argmax())
    for _ in range(4):
        token = int(lm.step(np.array([[token]]), cache, [0])[0].argmax())
    lm._compiled.trace(clear=True)
    steps = 16
    for _ in range(steps):
        token = int(lm.step(np.array([[token]]), cache, [0])[0].argmax())
    spans = lm._compiled.trace()
    kernels = [s for s in spans if s.thread < 0]
    print(f"profiled decode: {len(kernels) / steps:.0f} kernel spans per step, "
          f"{sum(s.duration_ns for s in kernels) / steps / 1e3:.1f} us kernel time per step")
    by_kind: dict[str, list[float]] = {}
    for s in kernels:
        row = by_kind.setdefault(s.kind, [0, 0.0])
        row[0] += 1
        row[1] += s.duration_ns
    print(f"{'op kind':<22} {'kernels/step':>12} {'us/step':>9}")
    for kind, (count, ns) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"{kind:<22} {count / steps:>12.0f} {ns / steps / 1e3:>9.1f}")
    print(format_top_ops(top_ops(spans), limit=8))
    host_split(args, config, tensors, prompt)


def host_split(args, config, tensors, prompt) -> None:
    """The host-side split of one graph-replayed greedy decode step: the bound step (inputs in, replay, token
    out) against the whole `lm.step_greedy` (plus the Python around it)."""
    from rlx.models.causal_lm import CausalLM

    lm = CausalLM(config, tensors, device="cuda", precision=args.precision, quant_act=args.act,
                  max_context=args.prompt_tokens + args.new_tokens + 8, prefill_chunk=args.prompt_tokens)
    cache = lm.new_cache()
    token = int(lm.step_greedy(prompt, cache, [args.prompt_tokens - 1])[0])
    for _ in range(4):
        token = int(lm.step_greedy(np.array([[token]]), cache, [0])[0])
    # the bound host-fed step of a one-token greedy step: inputs in (one transfer), graph replay, token out
    tokens_at = lm._cuda_names[0].index("tokens")  # the key: (cache, output, shapes of the host inputs)
    step = next(v for k, v in lm._bound.items() if k[2][tokens_at] == (1, 1))
    n = 64
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t1 = time.perf_counter()
    for _ in range(n):
        int(lm.step_greedy(np.array([[token]]), cache, [0])[0])
        cache.lengths[:] -= 1
    t2 = time.perf_counter()
    run, whole = (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6
    print(f"host-fed decode step (greedy): inputs in + graph replay + token out {run:.0f} us, "
          f"whole lm.step_greedy {whole:.0f} us (Python around it {whole - run:.0f} us)")


def bench_hf(args, config, static: bool) -> dict[str, float]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                     intermediate_size=config.ffn_size, num_hidden_layers=config.num_layers,
                     num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
                     head_dim=config.head_dim, rms_norm_eps=config.rms_eps, rope_theta=config.rope_base,
                     max_position_embeddings=config.context_length, tie_word_embeddings=config.tie_embeddings,
                     bos_token_id=config.bos_id, eos_token_id=config.eos_id)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.weights == "bf16" else torch.float16
    before = gpu_memory_used()
    with torch.device("cuda"):  # initialized on the GPU: an 8B model's f32 init on the host takes minutes
        model = LlamaForCausalLM._from_config(hf, torch_dtype=dtype).eval()
    ids = torch.randint(3, config.vocab_size, (1, args.prompt_tokens), device="cuda")
    kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
              pad_token_id=0)
    if static:
        kw["cache_implementation"] = "static"

    def once() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    once()
    once()  # warm-up (static: torch.compile of the decode step)
    warm = time.perf_counter() - t0
    total = statistics.median(once() for _ in range(args.rounds))
    gib = gpu_memory_used() - before
    bytes_per_token = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                          if "embed_tokens" not in n or config.tie_embeddings)
    return {"build_s": warm, "total": total, "gpu_gib": gib, "bytes": bytes_per_token}


def hbm_tbps(args) -> float:
    if args.hbm_tbps:
        return args.hbm_tbps
    try:
        import torch

        name = torch.cuda.get_device_name()
    except (ImportError, RuntimeError):
        return float("nan")
    return next((tbps for key, tbps in HBM_TBPS.items() if key in name), float("nan"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    p.add_argument("--weights", choices=("q4_1", "q4_k", "q8_0", "bf16"), default="q4_1")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--precision", default="f16")
    p.add_argument("--act", choices=("f32", "q8"), default="f32",
                   help="RLX's quant_act: q8 = int8 activations for the q8_0/q4_0/q4_1 matmuls (q4_k takes f32)")
    p.add_argument("--peers", default="rlx,hf_eager,hf_static")
    p.add_argument("--pause", type=float, default=1.0)
    p.add_argument("--hbm-tbps", type=float, default=0.0, help="memory bandwidth for the bound (default: by GPU)")
    p.add_argument("--batches", default="", help="time decode steps of these row counts instead (e.g. 1,8,32,64)")
    p.add_argument("--profile", action="store_true", help="print where a decode step's time goes, then exit")
    p.add_argument("--host-fed", action="store_true",
                   help="time RLX's decode one step at a time (each waiting for the last token on the host) instead "
                        "of launched ahead as `generate` runs it")
    p.add_argument("--host-split", action="store_true",
                   help="print only the host-side split of a decode step (no profiled build), then exit")
    p.add_argument("--context", default="",
                   help="comma-separated context lengths: RLX decode tok/s after each many tokens, then exit")
    p.add_argument("--kv-dtype", default=None, help="with --context: the KV cache dtype (f32, f16, bf16, f8e4m3fn)")
    args = p.parse_args(argv)
    from rlx.models.decoder_config import DecoderConfig

    config = DecoderConfig(**SHAPES[args.shape])
    if args.profile:
        profile_rlx(args, config)
        return 0
    if args.context:
        bench_context(args, config)
        return 0
    if args.batches:
        bench_batches(args, config, rlx_tensors(config, weights=args.weights),
                      [int(b) for b in args.batches.split(",")])
        return 0
    if args.host_split:
        host_split(args, config, rlx_tensors(config, weights=args.weights),
                   np.random.default_rng(1).integers(3, config.vocab_size, (1, args.prompt_tokens)))
        return 0
    results = {}
    rlx_bytes = 0
    for peer in args.peers.split(","):
        time.sleep(args.pause)
        try:
            if peer == "rlx":
                tensors = rlx_tensors(config, weights=args.weights)
                rlx_bytes = weight_bytes_per_token(tensors)
                results[peer] = bench_rlx(args, config, tensors)
                results[peer]["bytes"] = rlx_bytes
                del tensors
            else:
                results[peer] = bench_hf(args, config, static=peer == "hf_static")
                import torch

                torch.cuda.empty_cache()  # the model is gone: give its memory back before the next peer
        except ImportError as exc:
            print(f"skipping {peer}: {exc}")
    tbps = hbm_tbps(args)
    print(f"{args.shape}-shaped decoder, batch 1, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, "
          f"{args.rounds} rounds (medians); rlx weights {args.weights}, precision {args.precision}, act {args.act}; "
          f"bound at {tbps} TB/s")
    print(f"{'peer':<10} {'warm-up s':>9} {'GPU GiB':>8} {'total ms':>9} {'tokens/s':>9} {'decode tok/s':>13} "
          f"{'GB/token':>9} {'bound tok/s':>11} {'of bound':>9}")
    for peer, r in results.items():
        rate = (args.new_tokens - 1) / r["decode"] if "decode" in r else args.new_tokens / r["total"]
        dec = f"{rate:13.1f}" if "decode" in r else f"{'':>13}"
        bound = tbps * 1e12 / r["bytes"]
        print(f"{peer:<10} {r['build_s']:9.2f} {r['gpu_gib']:8.2f} {r['total'] * 1e3:9.1f} "
              f"{args.new_tokens / r['total']:9.1f} {dec} {r['bytes'] / 1e9:9.2f} {bound:11.1f} "
              f"{rate / bound:9.1%}")
    if "rlx" in results:
        for peer in results:
            if peer != "rlx":
                print(f"rlx / {peer}: {results[peer]['total'] / results['rlx']['total']:.2f}x tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

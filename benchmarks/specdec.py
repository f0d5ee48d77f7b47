"""Speculative decoding on SmolLM2 (CPU): prompt lookup and a draft model against plain greedy decoding.

    python benchmarks/specdec.py [--new-tokens N] [--rounds R] [--threads T] [--tasks echo,free]
                                 [--modes plain,prompt_lookup,draft] [--pause S]

Two tasks, the packaged SmolLM2-135M-Instruct Q4_1 GGUF, greedy:

- `echo`: the model repeats a ~300-token Python snippet with one name changed (what prompt lookup is
  for: editing code, quoting);
- `free`: a story from a one-line request (nothing to look up: adaptive k must not lose).

Modes: `plain` (one token a step), `prompt_lookup` (no model), `draft` (a 2-layer random draft model
with the target's vocabulary: it checks correctness, not speed; its proposals are nearly always
rejected — a trained draft of the same family, e.g. a 2-layer distillation, keeps most of them).

Every mode must produce plain greedy's tokens (checked, printed). Modes alternate within each round,
with a pause between them; the table gives median decode tokens/s (new tokens after the first, over
the time after the first), its ratio to plain, acceptance and tokens per target step, and the load
average before and after. Timings only: nothing here asserts but token equality.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import random_specs

SNIPPET = '''def moving_average(values, window):
    """The mean of each run of `window` values: out[i] = mean(values[i:i + window])."""
    if window < 1 or window > len(values):
        raise ValueError(f"window must be in 1..{len(values)}, got {window}")
    total = sum(values[:window])
    out = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        out.append(total / window)
    return out


def exponential_average(values, alpha):
    """Each value blended into the running average with weight `alpha`."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    average = values[0]
    out = [average]
    for value in values[1:]:
        average = alpha * value + (1 - alpha) * average
        out.append(average)
    return out


def crossings(fast, slow):
    """Indices where the fast average crosses the slow one."""
    found = []
    for i in range(1, min(len(fast), len(slow))):
        before = fast[i - 1] - slow[i - 1]
        after = fast[i] - slow[i]
        if before < 0 <= after or before > 0 >= after:
            found.append(i)
    return found
'''

TASKS = {
    "echo": (f"Original:\n```python\n{SNIPPET}```\nThe same code with `values` renamed to `prices`:\n```python\n",
             False),
    "free": ("Write a short story about a lighthouse keeper who finds a message in a bottle.", True),
}


def random_draft(target: CausalLM) -> CausalLM:
    c = target.config
    cfg = DecoderConfig(arch="llama", vocab_size=c.vocab_size, hidden_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, ffn_size=128, rms_eps=1e-5, rope_base=10000.0,
                        rope_variant="interleaved", n_rot=16, context_length=target.max_context,
                        tie_embeddings=True, bos_id=c.bos_id, eos_id=c.eos_id)
    return CausalLM(cfg, random_tensors(random_specs(cfg, "q8_0"), seed=1), device="cpu",
                    max_context=target.max_context, prefill_chunk=target.prefill_chunk)


def timed(lm: CausalLM, ids: list[int], n: int, speculative: object) -> tuple[float, list[int], dict[str, float]]:
    """(decode tokens/s after the first token, the tokens, the stream's timings)."""
    stream = lm.stream(ids, n, speculative=speculative)
    first = None
    tokens = []
    for event in stream:
        if event.token_id < 0:
            continue
        if first is None:
            first = time.perf_counter()
        tokens.append(event.token_id)
    end = time.perf_counter()
    rate = (len(tokens) - 1) / (end - first) if first is not None and len(tokens) > 1 else 0.0
    return rate, tokens, stream.timings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--tasks", default="echo,free")
    p.add_argument("--modes", default="plain,prompt_lookup,draft")
    p.add_argument("--pause", type=float, default=1.0, help="seconds between modes")
    args = p.parse_args()
    lm = CausalLM.from_gguf(max_context=1024, prefill_chunk=256, threads=args.threads)
    modes = args.modes.split(",")
    drafters = {"plain": None, "prompt_lookup": "prompt_lookup"}
    if "draft" in modes:
        drafters["draft"] = random_draft(lm)
    print(f"SmolLM2-135M-Instruct Q4_1, CPU, {args.new_tokens} new tokens, greedy, {args.rounds} rounds, "
          f"threads {lm._compiled.num_threads if lm._compiled is not None else '-'}")
    print("| task | mode | decode tok/s (median) | vs plain | acceptance | tokens/step | same tokens "
          "| load before/after |")
    print("|---|---|---|---|---|---|---|---|")
    for task in args.tasks.split(","):
        prompt, chat = TASKS[task]
        ids = lm.encode_prompt(prompt, chat=chat)
        for mode in modes:  # warm: compile-time bindings, caches
            timed(lm, ids, 8, drafters[mode])
        rates: dict[str, list[float]] = {m: [] for m in modes}
        timings: dict[str, dict[str, float]] = {}
        tokens: dict[str, list[int]] = {}
        load0 = os.getloadavg()[0]
        for _ in range(args.rounds):
            for mode in modes:
                rate, toks, t = timed(lm, ids, args.new_tokens, drafters[mode])
                rates[mode].append(rate)
                timings[mode], tokens[mode] = t, toks
                time.sleep(args.pause)
        load1 = os.getloadavg()[0]
        base = statistics.median(rates["plain"]) if "plain" in rates else float("nan")
        for mode in modes:
            med = statistics.median(rates[mode])
            t = timings[mode]
            acc = f"{t['acceptance_rate']:.0%}" if t else "-"
            per = f"{t['tokens_per_step']:.2f}" if t else "1.00"
            same = "yes" if tokens[mode] == tokens.get("plain", tokens[mode]) else "NO"
            print(f"| {task} ({len(ids)} prompt tokens) | {mode} | {med:.1f} | {med / base:.2f}x | {acc} | {per} | "
                  f"{same} | {load0:.2f} / {load1:.2f} |")
    print(f"(script: {Path(__file__).name}; ratios are of medians within one process, modes alternating)")


if __name__ == "__main__":
    main()

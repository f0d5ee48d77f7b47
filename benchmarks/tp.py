"""Tensor parallelism: tp=2 against tp=1 — decoder decode tokens/s and MiniLM (128, 128) latency.

    python benchmarks/tp.py [--rounds 3] [--quick] [--processes] [--skip-minilm] [--skip-decoder] [--skip-cuda]
                            [--cuda-shape llama3-8b --weights q4_k --tp 2,4 --precision f16 --all-reduce p2p,nccl]

CPU: every peer runs in this process. tp=1 is one compiled graph (with 2 OpenMP threads, and with
1); tp=2 is the sharded graph twice, one rank per thread of this process with 1 OpenMP thread each,
the ranks meeting in the shared-memory transport (`rlx.distributed.local_ranks`); one tp=2 call
hands one step to both rank threads and waits for both. Peers alternate in blocks with a pause
between them (`timing.round_robin`), medians of `--rounds`, and the ratios to tp=1 are printed.
On a machine with 2 cores, tp=2 and tp=1 use the same cores: tp=2 can only win where one graph
does not keep both cores busy (decode's small GEMVs), and pays a rendezvous per all-reduce.

CUDA: needs 2 GPUs (one process per GPU, NCCL; `launch(device="cuda")`); with fewer it prints
why it is skipped. There tp=1 and tp=2 cannot share a process: each launch times its own decode
loop (same rounds and step count) and the ratio is printed with that caveat. `--cuda-shape llama3-8b`
decodes Llama-3-8B's shape (benchmarks/llm_cuda.py's random blocks, `--weights`) instead, at every tp of
`--tp` that the visible GPUs allow; each rank makes the same random tensors itself (seeded) and keeps its
shard, so no weights cross process boundaries. Each decode loop is timed twice: host-fed (each step waited for
before the next is launched) and launched ahead (each step launched while the one before runs, its token fed on
the device: what `generate` does on CUDA at any tp).

Models: a random LLaMA-style decoder (q8_0 weights; `--quick` shrinks it) and the MiniLM-L6
architecture (hidden 384, 12 heads, 6 layers) with random weights — the speed of a shape does not
depend on the values. Timings only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import round_robin

PROMPT = 32


def decoder_model(quick: bool):
    from rlx.ir.quant import quantize
    from rlx.models.causal_lm import random_tensors
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import WeightSpec, random_specs

    if quick:
        cfg = DecoderConfig(arch="llama", vocab_size=4096, hidden_size=256, num_layers=4, num_heads=8,
                            num_kv_heads=4, head_dim=32, ffn_size=768, rms_eps=1e-5, rope_base=10000.0,
                            rope_variant="interleaved", n_rot=32, context_length=256, tie_embeddings=True,
                            bos_id=1, eos_id=-1)
    else:  # ~0.2B params, the width of a 1B-class model with fewer layers
        cfg = DecoderConfig(arch="llama", vocab_size=16384, hidden_size=1024, num_layers=8, num_heads=16,
                            num_kv_heads=8, head_dim=64, ffn_size=2816, rms_eps=1e-5, rope_base=10000.0,
                            rope_variant="interleaved", n_rot=64, context_length=256, tie_embeddings=True,
                            bos_id=1, eos_id=-1)
    tensors = random_tensors(random_specs(cfg), seed=0)
    q8 = {name: (WeightSpec("q8_0", spec.shape), quantize(data, "q8_0")) if len(spec.shape) == 2 else (spec, data)
          for name, (spec, data) in tensors.items()}
    return cfg, q8


class DecodeStep:
    """One decode step at a fixed position (the cache is rewound each call): what a token costs."""

    def __init__(self, lm) -> None:
        self.lm = lm
        self.cache = lm.new_cache()
        lm.step(np.arange(1, PROMPT + 1)[None, :] % lm.config.vocab_size, self.cache, [PROMPT - 1])
        self.token = np.array([[7]])

    def __call__(self) -> np.ndarray:
        self.cache.lengths[:] = PROMPT
        return self.lm.step(self.token, self.cache, [0])


def bench_decoder(rounds: int, quick: bool) -> None:
    from rlx.distributed import local_ranks
    from rlx.distributed.tp import cosine
    from rlx.distributed.tp_decoder import shard_decoder
    from rlx.models.causal_lm import CausalLM

    cfg, tensors = decoder_model(quick)
    opts = {"max_context": 128, "prefill_chunk": PROMPT}
    t0 = time.perf_counter()
    tp1 = DecodeStep(CausalLM(cfg, tensors, threads=2, **opts))
    ranks = local_ranks(2)
    sharded = shard_decoder(cfg, tensors, tp=2, **opts)
    pool = ThreadPoolExecutor(2)
    steps = list(pool.map(lambda r: DecodeStep(sharded.load(r, threads=1)), ranks))  # prefill meets too
    print(f"decoder: hidden {cfg.hidden_size}, {cfg.num_layers} layers, {cfg.num_heads}/{cfg.num_kv_heads} heads, "
          f"ffn {cfg.ffn_size}, vocab {cfg.vocab_size}, q8_0; built in {time.perf_counter() - t0:.0f} s")

    def tp2() -> list[np.ndarray]:
        return list(pool.map(lambda s: s(), steps))

    def tp1_one_thread() -> np.ndarray:
        tp1.lm._compiled.num_threads = 1
        try:
            return tp1()
        finally:
            tp1.lm._compiled.num_threads = 2

    a, b = tp1(), tp2()
    print(f"  logits tp=2 vs tp=1: cosine {cosine(b[0], a):.6f}, argmax equal: {int(b[0].argmax()) == int(a.argmax())}")
    med = round_robin({"tp=1 (2 threads)": tp1, "tp=1 (1 thread)": tp1_one_thread, "tp=2 (2 ranks x 1 thread)": tp2},
                      rounds)
    base = med["tp=1 (2 threads)"]
    for name, s in med.items():
        print(f"  {name:28s} {s * 1e3:8.2f} ms/token  {1 / s:8.1f} tok/s  speed x{base / s:.2f} vs tp=1 (2 threads)")
    pool.shutdown()


def minilm_config():
    from rlx.models.bert import BertConfig

    return BertConfig(vocab_size=30522, hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536,
                      max_position_embeddings=512)


def bench_minilm(rounds: int, batch: int, seq: int) -> None:
    import rlx
    from rlx.distributed import local_ranks
    from rlx.distributed.tp import cosine, shard_bert
    from rlx.models.bert import bert_inputs, build_bert, random_weights

    cfg = minilm_config()
    weights = random_weights(cfg, seed=0)
    rng = np.random.default_rng(0)
    feed = bert_inputs(rng.integers(1000, cfg.vocab_size, size=(batch, seq)), np.ones((batch, seq), np.int64))
    t0 = time.perf_counter()
    one = rlx.Session().compile(build_bert(cfg, max_batch=batch, max_seq=seq), num_threads=2)
    for name in one.param_names:
        one.set_param(name, weights[name])
    sharded = shard_bert(cfg, weights, 2, max_batch=batch, max_seq=seq)
    ranks = local_ranks(2)
    pool = ThreadPoolExecutor(2)
    graphs = list(pool.map(lambda r: sharded.load(r, num_threads=1), ranks))
    print(f"MiniLM-L6 architecture ({batch}, {seq}): built in {time.perf_counter() - t0:.0f} s")

    def tp1() -> np.ndarray:
        return one.run(feed)[0]

    def tp2() -> list[np.ndarray]:
        return list(pool.map(lambda g: g.run(feed)[0], graphs))

    print(f"  embeddings tp=2 vs tp=1: cosine {cosine(tp2()[0], tp1()):.6f}")
    med = round_robin({"tp=1 (2 threads)": tp1, "tp=2 (2 ranks x 1 thread)": tp2}, rounds)
    base = med["tp=1 (2 threads)"]
    for name, s in med.items():
        print(f"  {name:28s} {s * 1e3:9.1f} ms  speed x{base / s:.2f} vs tp=1")
    pool.shutdown()


def _cpu_decode_rank(rank, sharded, cfg, tensors, threads: int, rounds: int, steps: int) -> list[float]:
    """Seconds per decode step on this rank, one sample per round (tp=1 when `sharded` is None)."""
    from rlx.models.causal_lm import CausalLM

    opts = {"max_context": 128, "prefill_chunk": PROMPT}
    lm = CausalLM(cfg, tensors, threads=threads, **opts) if sharded is None else sharded.load(rank, threads=threads)
    step = DecodeStep(lm)
    for _ in range(3):
        step()
    samples = []
    for _ in range(rounds):
        time.sleep(0.2)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        samples.append((time.perf_counter() - t0) / steps)
    return samples


def bench_decoder_processes(rounds: int, quick: bool) -> None:
    """The same decode step with ranks as processes (`launch`): no GIL shared by the ranks, but tp=1 and
    tp=2 then run in separate launches, alternated `rounds` times (one block each per launch)."""
    import statistics

    from rlx.distributed import launch
    from rlx.distributed.tp_decoder import shard_decoder

    cfg, tensors = decoder_model(quick)
    sharded = shard_decoder(cfg, tensors, tp=2, max_context=128, prefill_chunk=PROMPT)
    steps = 40 if quick else 10
    one: list[float] = []
    two: list[float] = []
    for _ in range(rounds):
        one += launch(_cpu_decode_rank, nprocs=1, args=(None, cfg, tensors, 2, 1, steps))[0]
        per_rank = launch(_cpu_decode_rank, nprocs=2, args=(sharded, cfg, tensors, 1, 1, steps))
        two.append(max(r[0] for r in per_rank))
    a, b = statistics.median(one), statistics.median(two)
    print("decoder decode, ranks as processes (separate launches alternated; medians)")
    print(f"  tp=1 (1 process x 2 threads)  {a * 1e3:8.2f} ms/token  {1 / a:8.1f} tok/s")
    print(f"  tp=2 (2 processes x 1 thread) {b * 1e3:8.2f} ms/token  {1 / b:8.1f} tok/s  speed x{a / b:.2f}")


# ── CUDA: one process per GPU ──────────────────────────────────────────────


def _cuda_model(shape: str, weights: str, quick: bool):
    if shape == "default":
        return decoder_model(quick)
    from llm_cuda import SHAPES, rlx_tensors

    from rlx.models.decoder_config import DecoderConfig

    cfg = DecoderConfig(**SHAPES[shape])
    return cfg, rlx_tensors(cfg, weights=weights)


def _cuda_decode_rank(rank, tp: int, shape: str, weights: str, quick: bool, precision: str, rounds: int,
                      steps: int) -> tuple[float, float]:
    """Median seconds per greedy decode step on this rank (the token's argmax computed on the GPU): each step waited
    for before the next is launched (host-fed), and each launched while the one before runs, its token fed on the
    device (as `generate` does on CUDA: `launch_ahead`)."""
    import statistics

    from rlx.distributed.tp_decoder import shard_decoder
    from rlx.models.causal_lm import CausalLM

    cfg, tensors = _cuda_model(shape, weights, quick)
    opts = {"max_context": 128, "prefill_chunk": PROMPT, "precision": precision}
    if tp == 1:
        lm = CausalLM(cfg, tensors, device="cuda", **opts)
    else:
        lm = shard_decoder(cfg, tensors, tp=tp, **opts).load(rank, device="cuda")
    del tensors
    cache = lm.new_cache()
    prompt = np.arange(1, PROMPT + 1)[None, :] % cfg.vocab_size
    lm.step_greedy(prompt, cache, [PROMPT - 1])
    token = np.array([[7]])
    slots, placeholder = np.zeros(1, np.int32), np.zeros((1, 1), np.int32)
    fed, ahead = [], []
    for _ in range(rounds + 1):  # the first round captures the steps' CUDA graphs
        t0 = time.perf_counter()
        for _ in range(steps):
            cache.lengths[:] = PROMPT
            lm.step_greedy(token, cache, [0])
        fed.append((time.perf_counter() - t0) / steps)
        t0 = time.perf_counter()
        cache.lengths[:] = PROMPT
        pending = lm.launch_greedy(token, cache, [0], token_dst=slots)
        for _ in range(steps - 1):
            cache.lengths[:] = PROMPT  # (the lengths grow at the launch: every step at the same position)
            taking, pending = pending, lm.launch_greedy(placeholder, cache, [0], token_src=slots, token_dst=slots)
            taking.result()
        pending.result()
        ahead.append((time.perf_counter() - t0) / steps)
    return statistics.median(fed[1:]), statistics.median(ahead[1:])


def bench_cuda(rounds: int, quick: bool, shape: str = "default", weights: str = "q4_k", tps: tuple[int, ...] = (2,),
               precision: str = "f16", all_reduce: tuple[str, ...] = ("p2p",)) -> None:
    import os

    from rlx.distributed import launch
    from rlx.runtime.nccl import gpu_count

    n = gpu_count()
    runnable = [tp for tp in tps if tp <= n]
    if not runnable:
        print(f"CUDA: skipped — {n} GPU(s) visible; tp={min(tps)} runs one process per GPU and needs {min(tps)}")
        return
    args = (shape, weights, quick, precision, rounds, 100)
    times = {"1": launch(_cuda_decode_rank, nprocs=1, device="cuda", args=(1, *args))[0]}
    for tp in runnable:
        for how in all_reduce:  # RLX_CUDA_P2P=0: every all-reduce through NCCL (the ranks inherit the variable)
            os.environ["RLX_CUDA_P2P"] = "1" if how == "p2p" else "0"
            ranks = launch(_cuda_decode_rank, nprocs=tp, device="cuda", args=(tp, *args))
            times[f"{tp} {how}"] = (max(r[0] for r in ranks), max(r[1] for r in ranks))
    os.environ.pop("RLX_CUDA_P2P", None)
    what = "random q8_0 decoder" if shape == "default" else f"{shape}-shaped decoder, {weights} weights"
    print(f"CUDA {what}, {precision}, greedy decode at {PROMPT} tokens of context "
          "(each launch its own processes: not interleaved in one process); all-reduces: p2p = one-shot through "
          "the peers' memory (AllReduceP2P), nccl = RLX_CUDA_P2P=0")
    print("  host-fed: each step waited for before the next is launched; ahead: launched while the one before "
          "runs, its token fed on the device (generate's loop on CUDA)")
    print(f"  {'tp':<9} {'ms/token':>9} {'tok/s':>8} {'vs tp=1':>8}   {'ahead ms':>9} {'tok/s':>8} {'vs tp=1':>8}")
    for tp, (fed, ahead) in times.items():
        print(f"  {tp:<9} {fed * 1e3:9.3f} {1 / fed:8.1f} {fed / times['1'][0]:8.2f}   {ahead * 1e3:9.3f} "
              f"{1 / ahead:8.1f} {ahead / times['1'][1]:8.2f}")
    skipped = [tp for tp in tps if tp > n]
    if skipped:
        print(f"  not run: tp={skipped} (only {n} GPUs visible)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a small decoder and MiniLM at (8, 128)")
    ap.add_argument("--skip-decoder", action="store_true")
    ap.add_argument("--skip-minilm", action="store_true")
    ap.add_argument("--skip-cuda", action="store_true")
    ap.add_argument("--cuda-shape", default="default", help="default (a ~0.2B q8_0 decoder) or llm_cuda.py's shapes")
    ap.add_argument("--weights", default="q4_k", help="block format of --cuda-shape's random weights")
    ap.add_argument("--tp", default="2", help="tensor-parallel degrees to compare with tp=1 on CUDA (e.g. 2,4)")
    ap.add_argument("--precision", default="f16", help="CUDA compute precision")
    ap.add_argument("--all-reduce", default="p2p", help="CUDA all-reduce paths to time at each tp: p2p, nccl or both")
    ap.add_argument("--processes", action="store_true", help="also the decoder with ranks as processes")
    args = ap.parse_args()
    import os

    # tp=2 needs both ranks on a core at every collective: other load on the machine hurts it most
    print(f"CPU cores: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} at the start")
    if not args.skip_decoder:
        bench_decoder(args.rounds, args.quick)
    if args.processes and not args.skip_decoder:
        bench_decoder_processes(args.rounds, args.quick)
    if not args.skip_minilm:
        bench_minilm(args.rounds, 8 if args.quick else 128, 128)
    if not args.skip_cuda:
        bench_cuda(args.rounds, args.quick, args.cuda_shape, args.weights,
                   tuple(int(t) for t in args.tp.split(",")), args.precision, tuple(args.all_reduce.split(",")))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

"""all-MiniLM-L6-v2 sentence embeddings on CPU: rlx vs PyTorch eager, torch.compile and ONNX Runtime.

    python benchmarks/minilm.py [--threads N] [--rounds R] [--passes P] [--cases 1x16,8x128,32x128] [--peers ...]
                                [--precision f32,bf16,f16,int8]

`--precision` adds rlx peers computing with weights stored in bf16 / f16
(`Session(Device.CPU, precision=...)`: bf16 GEMMs with vdpbf16ps where the CPU
has AVX512_BF16, f16 weights widened into the f32 GEMM's panels) and
int8 (`SentenceEmbedder(..., quantize="int8")`: every linear layer in int8,
weights per output channel, activations per row at run time), and with int8
the ONNX Runtime peer `onnxruntime-int8`: the same ONNX model after
`onnxruntime.quantization.quantize_dynamic` (int8 weights, activations
quantized at run time); each case then also prints rlx-int8's time over
onnxruntime-int8's.

Every peer runs the same computation (BERT encoder + masked mean pooling + L2
normalization, float32) from the same weights on the same token batch with the
same thread count, in this one process. The PyTorch peers run a plain-torch
BERT written from the same weights (`rlx.models.torch_bert`); ONNX Runtime
runs that model exported with `torch.onnx.export` (without PyTorch: built
from the same weights with `onnx.helper` by `benchmarks/minilm_onnx.py` and
checked against `rlx.reference` before timing), with ORT's default graph
optimizations, and additionally after ORT's BERT fusion optimizer
(`onnxruntime.transformers`, fused Attention / SkipLayerNorm / BiasGelu) when
that module is available. Each peer lives in its own worker process, so no
idle thread pool of another engine (OpenMP, OpenBLAS, ORT spin-waiting)
competes for the cores, and the peers take turns in interleaved blocks of runs
(`--passes`), so load from other processes on the machine is spread over all
of them; each block starts with `--warmup-ms` of untimed runs (the first runs
after the pause are slow for every engine); the median of all timed runs is
reported, and `paired`: the median over passes of the ratio of two peers'
blocks in the same pass. Nothing is installed: a peer whose package is missing
is listed as skipped. The BLAS sgemm peak is measured with the OpenBLAS that rlx links
(scipy-openblas32), on the thread count used for every peer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

Runner = Callable[[np.ndarray, np.ndarray], np.ndarray]


def token_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[CLS] random word-piece ids [SEP], every row `seq` long (no padding), and its mask."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return ids, np.ones_like(ids)


# ── BLAS peak ─────────────────────────────────────────────────────────


def sgemm_peak(threads: int, seconds: float = 1.0) -> tuple[float, str]:
    """Best sgemm GFLOP/s of the BLAS rlx links (scipy-openblas32) over a few shapes (square and BERT
    FFN-sized), `seconds` per shape: `rlx.toolchain.peak`, the probe `rlxc doctor` runs briefly."""
    from rlx.config import Config
    from rlx.toolchain.compiler import detect_toolchain
    from rlx.toolchain.peak import PEAK_SHAPES
    from rlx.toolchain.peak import sgemm_peak as probe

    blas = detect_toolchain(Config.from_env()).blas
    peak = probe(blas, threads, seconds * len(PEAK_SHAPES))
    if peak is None:
        raise SystemExit("no BLAS to measure the sgemm peak with (RLX_BLAS=none)")
    try:
        import scipy_openblas32

        config = scipy_openblas32.get_openblas_config() if blas.provider == "openblas32" else blas.identity()
    except ImportError:
        config = blas.identity()
    return peak.gflops, config


# ── peers (each built and timed inside its own worker process) ─────────

PEERS = ("rlx", "rlx-bf16", "rlx-f16", "rlx-int8", "torch", "torch.compile", "onnxruntime", "onnxruntime-int8",
         "onnxruntime-fused")
PRECISIONS = ("f32", "bf16", "f16", "int8")


def paired_ratio(peer_blocks: list[list[float]], rlx_blocks: list[list[float]]) -> float:
    """The median over passes of (the peer's median run / rlx's median run) within each pass: every ratio compares
    blocks run seconds apart, so a stretch of load elsewhere on the machine (which the whole-run medians give to
    whichever peer it fell on) moves numerator and denominator together.

    >>> round(paired_ratio([[2.0, 2.2], [4.0, 4.4]], [[1.0, 1.0], [2.1, 2.1]]), 3)  # the second pass: a slow minute
    2.05
    >>> paired_ratio([[3.0]], [[1.5]])
    2.0
    """
    ratios = [statistics.median(p) / statistics.median(r) for p, r in zip(peer_blocks, rlx_blocks, strict=True)]
    return statistics.median(ratios)


def _rlx(config: object, weights: dict, cases: list, precision: str = "f32") -> Runner:
    from rlx.models import SentenceEmbedder
    from rlx.models.bert import bert_inputs

    int8 = precision == "int8"
    emb = SentenceEmbedder(config, weights, None, device="cpu", max_seq=max(s for _, s in cases),
                           max_batch=max(b for b, _ in cases), precision="f32" if int8 else precision,
                           quantize="int8" if int8 else None)
    runner = emb.runner("embeddings")
    return lambda ids, mask: runner.run(bert_inputs(ids, mask))[0]


def _torch(config: object, weights: dict, threads: int, compiled: bool) -> Runner:
    import torch

    from rlx.models.torch_bert import TorchBert

    torch.set_num_threads(threads)
    module = TorchBert(config, weights).module()
    fn = torch.compile(module, dynamic=False) if compiled else module

    def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return fn(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()

    return run


def _export_onnx(config: object, weights: dict, path: Path) -> Path:
    """The embedder as ONNX: exported from the plain-torch BERT, or without PyTorch built from the weights."""
    try:
        import torch
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from minilm_onnx import check_against_reference, save_bert_onnx

        save_bert_onnx(config, weights, path)
        check_against_reference(path, config, weights)  # it must compute what rlx computes
        return path
    from rlx.models.torch_bert import TorchBert

    ids, mask = token_batch(2, 16, config.vocab_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(TorchBert(config, weights).module(), (torch.from_numpy(ids), torch.from_numpy(mask)),
                          str(path), input_names=["input_ids", "attention_mask"], output_names=["embeddings"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
                          opset_version=17, dynamo=False)
    return path


def _onnxruntime(config: object, weights: dict, threads: int, fused: bool, int8: bool = False) -> Runner:
    import onnxruntime as ort

    workdir = Path(tempfile.mkdtemp(prefix="rlx-bench-"))
    path = _export_onnx(config, weights, workdir / "minilm.onnx")
    if int8:
        # what ORT users reach for first: int8 weights, activations quantized per tensor at run time
        from onnxruntime.quantization import QuantType, quantize_dynamic

        qpath = workdir / "minilm_int8.onnx"
        quantize_dynamic(str(path), str(qpath), weight_type=QuantType.QInt8)
        path = qpath
    if fused:
        # ORT's offline BERT optimizer: fused Attention, SkipLayerNormalization, BiasGelu.
        from onnxruntime.transformers import optimizer

        model = optimizer.optimize_model(str(path), model_type="bert", num_heads=config.num_heads,
                                         hidden_size=config.hidden_size)
        if model.get_fused_operator_statistics().get("Attention", 0) != config.num_layers:
            raise RuntimeError(f"ORT fused {model.get_fused_operator_statistics()}, not every attention layer")
        path = workdir / "minilm_fused.onnx"
        model.save_model_to_file(str(path))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return lambda ids, mask: sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]


def _make_peer(name: str, model_dir: Path, threads: int, cases: list) -> Runner:
    from rlx.models import bert as B

    config = B.load_config(model_dir)
    weights = B.load_weights(model_dir, config)
    if name == "rlx" or name.startswith("rlx-"):
        return _rlx(config, weights, cases, precision=name.partition("-")[2] or "f32")
    if name in ("torch", "torch.compile"):
        return _torch(config, weights, threads, compiled=name == "torch.compile")
    return _onnxruntime(config, weights, threads, fused=name == "onnxruntime-fused", int8=name == "onnxruntime-int8")


def peer_worker(conn: object, name: str, model_dir: str, threads: int, cases: list) -> None:
    """Worker process of one peer: build it, then serve `("time", case, n, warm_s)` requests until `None`.

    Replies are `{"error": ...}` or `{"setup_s": ...}` once, then per request the
    `n` timings and the peer's output on that batch.
    """
    from rlx.models import bert as B

    vocab = B.load_config(model_dir).vocab_size
    t0 = time.perf_counter()
    try:
        run = _make_peer(name, Path(model_dir), threads, cases)
        for batch, seq in cases:  # warm-up: shape compilation, thread pools, first touch of buffers
            ids, mask = token_batch(batch, seq, vocab)
            run(ids, mask)
            run(ids, mask)
    except ImportError as exc:
        conn.send({"error": f"skipped ({exc.name or exc} is not installed)"})
        return
    except Exception as exc:  # the table says why a peer is missing rather than hiding it
        conn.send({"error": f"failed: {type(exc).__name__}: {str(exc)[:300]}"})
        return
    conn.send({"setup_s": time.perf_counter() - t0})
    while (msg := conn.recv()) is not None:
        _, (batch, seq), n, warm_s = msg
        ids, mask = token_batch(batch, seq, vocab)
        # Warm up for `warm_s` (at least one run) before the timed runs: after the pause between blocks the first
        # runs of every engine are slow (on this 2-vCPU guest the first 1x16 call after 0.3 s idle took 16-47 ms for
        # rlx, 24 for onnxruntime, against 1.6 / 2.6 steady, the next four 2-5 ms; no page faults), which a one-run
        # warm-up left in the block.
        t_warm = time.perf_counter()
        out = run(ids, mask)
        while time.perf_counter() - t_warm < warm_s:
            out = run(ids, mask)
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            run(ids, mask)
            samples.append(time.perf_counter() - t)
        conn.send((samples, np.asarray(out)))


class Peer:
    """A peer living in its own process, so no other engine's thread pool competes while it runs."""

    def __init__(self, name: str, model_dir: Path, threads: int, cases: list, *,
                 worker: Callable[..., None] | None = None, args: tuple = ()) -> None:
        """`worker(conn, *args)` (default: `peer_worker(conn, name, model_dir, threads, cases)`) serves the
        `("time", case, n, warm_s)` requests in the new process."""
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.name = name
        self.conn, child = ctx.Pipe()
        if worker is None:
            worker, args = peer_worker, (name, str(model_dir), threads, cases)
        self.proc = ctx.Process(target=worker, args=(child, *args), daemon=True)
        self.proc.start()
        reply = self.conn.recv() if self.conn.poll(900) else {"error": "failed: no reply within 900 s"}
        self.error = reply.get("error")
        self.setup_s = reply.get("setup_s", 0.0)
        if self.error:
            self.close()

    def time(self, case: object, n: int, warm_s: float = 0.0) -> tuple[list[float], np.ndarray]:
        self.conn.send(("time", case, n, warm_s))
        return self.conn.recv()

    def close(self) -> None:
        if self.proc.is_alive() and not self.error:
            self.conn.send(None)
        self.proc.join(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=int(os.environ.get("RLX_NUM_THREADS") or os.cpu_count() or 1))
    ap.add_argument("--rounds", type=int, default=30, help="timed runs per case and peer (default 30)")
    ap.add_argument("--passes", type=int, default=5, help="interleaved passes the rounds are split into (default 5)")
    ap.add_argument("--warmup-ms", type=float, default=100.0, help="untimed runs for this long (at least one) "
                    "before each block's timed runs (default 100)")
    ap.add_argument("--cases", default="1x16,8x128,32x128", help="batch x seq list (default 1x16,8x128,32x128)")
    ap.add_argument("--peers", default=None, help=f"comma list of {', '.join(PEERS)} (default: rlx at each "
                    "--precision, torch, torch.compile, onnxruntime, onnxruntime-int8 with int8, onnxruntime-fused)")
    ap.add_argument("--precision", default="f32", help=f"comma list of {', '.join(PRECISIONS)} for rlx (default f32)")
    ap.add_argument("--model", default=None, help="BERT directory (default: the packaged all-MiniLM-L6-v2)")
    args = ap.parse_args(argv)
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    precisions = [p for p in args.precision.split(",") if p]
    if set(precisions) - set(PRECISIONS):
        ap.error(f"unknown precisions {sorted(set(precisions) - set(PRECISIONS))}; choose from {PRECISIONS}")
    if args.peers is None:
        peers = [("rlx" if p == "f32" else f"rlx-{p}") for p in precisions]
        peers += ["torch", "torch.compile", "onnxruntime"] + (["onnxruntime-int8"] if "int8" in precisions else [])
        peers += ["onnxruntime-fused"]
    else:
        peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(PEERS)
    if unknown:
        ap.error(f"unknown peers {sorted(unknown)}; choose from {PEERS}")
    # One thread count for everyone, inherited by the worker processes: rlx reads RLX_NUM_THREADS,
    # torch and ONNX Runtime get it through their APIs.
    os.environ["RLX_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    from rlx.models import bert as B
    from rlx.models.embedder import default_model_dir

    model_dir = Path(args.model) if args.model else default_model_dir()
    config = B.load_config(model_dir)
    peak, blas = sgemm_peak(args.threads)
    print(f"model: {model_dir}")
    print(f"threads: {args.threads} (of {os.cpu_count()} cores); each peer in its own process, "
          f"{args.passes} interleaved passes, each block after {args.warmup_ms:g} ms of untimed runs")
    print(f"BLAS: {blas}" + (f" (OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']})"
                             if os.environ.get("OPENBLAS_CORETYPE") else ""))

    live: list[Peer] = []
    for name in peers:
        peer = Peer(name, model_dir, args.threads, cases)
        print(f"{name}: {peer.error}" if peer.error else f"{name}: set up in {peer.setup_s:.1f} s")
        if not peer.error:
            live.append(peer)
    if not live:
        print("no peer could run")
        return 1
    # Interleaved blocks: every pass gives each peer a block of runs, so load from other processes on the
    # machine is spread over all peers; a pause lets the previous peer's spinning threads go to sleep.
    blocks: dict[str, dict] = {p.name: {c: [] for c in cases} for p in live}  # each pass's block of runs
    outs: dict[str, dict] = {p.name: {} for p in live}  # each case's output (the last block's)
    per_block = max(1, -(-args.rounds // args.passes))
    loads: dict[tuple[int, int], list[float]] = {}
    for case in cases:
        loads[case] = [os.getloadavg()[0]]  # other processes' load: numbers are comparable only at low load
        for _ in range(args.passes):
            for peer in live:
                time.sleep(0.3)
                samples, outs[peer.name][case] = peer.time(case, per_block, args.warmup_ms / 1e3)
                blocks[peer.name][case].append(samples)
        loads[case].append(os.getloadavg()[0])
    for peer in live:
        peer.close()
    # Measured again after the peers: the best of both is the peak (a burst of load elsewhere lowers one).
    peak = max(peak, sgemm_peak(args.threads)[0])
    print(f"BLAS sgemm peak (best of 1024^3, 4096x1536x384, 4096x384x1536, before and after): {peak:.1f} GFLOP/s")
    runs = {name: {c: [t for block in by_case[c] for t in block] for c in cases} for name, by_case in blocks.items()}
    base_name = "torch" if "torch" in runs else next(iter(runs))
    for case in cases:
        batch, seq = case
        flops = config.flops(batch, seq)
        med = {name: statistics.median(r[case]) for name, r in runs.items()}
        print()
        print(f"batch {batch} x seq {seq}: {flops / 1e9:.2f} GFLOP per call (load average {loads[case][0]:.2f} "
              f"before, {loads[case][1]:.2f} after)")
        head = ("peer", "median ms", "best ms", "runs", "vs rlx", "paired", "GFLOP/s", "% peak", "best %",
                "max|diff|")
        print("  {:<18} {:>10} {:>8} {:>5} {:>8} {:>7} {:>9} {:>7} {:>7} {:>10}".format(*head))
        for name, r in runs.items():
            ratio = f"{med[name] / med['rlx']:.2f}x" if "rlx" in med else "-"
            paired = (f"{paired_ratio(blocks[name][case], blocks['rlx'][case]):.2f}x" if "rlx" in blocks
                      else "-")
            gf = flops / med[name] / 1e9
            best = min(r[case])
            diff = float(np.abs(outs[name][case] - outs[base_name][case]).max())
            print(f"  {name:<18} {med[name] * 1e3:>10.2f} {best * 1e3:>8.2f} {len(r[case]):>5} {ratio:>8} "
                  f"{paired:>7} {gf:>9.1f} {100 * gf / peak:>6.1f}% {100 * flops / best / 1e9 / peak:>6.1f}% "
                  f"{diff:>10.2e}")
        if "rlx-int8" in med and "onnxruntime-int8" in med:
            print(f"  rlx-int8 / onnxruntime-int8 = {med['rlx-int8'] / med['onnxruntime-int8']:.2f}x (< 1: rlx faster)")
    print()
    print(f"'vs rlx' = peer median / rlx median (> 1: rlx is faster); max|diff| = largest difference from "
          f"{base_name}'s embeddings")
    print("'paired' = the median over passes of the peer's block median / rlx's block median in the same pass: each "
          "ratio from runs seconds apart, so a slow minute of the machine moves both sides of it")
    print("'% peak' = the median run's GFLOP/s over the BLAS peak; 'best %' = the fastest run's: the peak is itself a "
          "best-of-runs figure, so on a machine whose speed varies from minute to minute 'best %' is the like-for-like "
          "ratio, '% peak' the typical one")
    return 0


if __name__ == "__main__":
    sys.exit(main())

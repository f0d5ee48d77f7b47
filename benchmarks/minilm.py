"""all-MiniLM-L6-v2 sentence embeddings on CPU: rlx vs PyTorch eager, torch.compile and ONNX Runtime.

    python benchmarks/minilm.py [--threads N] [--rounds R] [--cases 1x16,8x128,32x128] [--peers ...]

Every peer runs the same computation (BERT encoder + masked mean pooling + L2
normalization, float32) from the same weights on the same token batch with the
same thread count, in this one process. The PyTorch peers run a plain-torch
BERT written from the same weights (`rlx.models.torch_bert`); ONNX Runtime
runs that model exported with `torch.onnx.export`, with ORT's default graph
optimizations, and additionally after ORT's BERT fusion optimizer
(`onnxruntime.transformers`, fused Attention / SkipLayerNorm / BiasGelu) when
that module is available. Peers run round-robin (one call of each per round)
so that load from other processes hits them alike; the median of the rounds
is reported. Nothing is installed: a peer whose package is missing is listed
as skipped. The BLAS sgemm peak is measured with the OpenBLAS that rlx links
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
    """Best sgemm GFLOP/s of scipy-openblas32 over a few shapes (square and BERT FFN-sized)."""
    import cffi
    import scipy_openblas32

    ffi = cffi.FFI()
    ffi.cdef("void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int, const float *, int,"
             " float, float *, int); void scipy_openblas_set_num_threads(int);")
    lib = ffi.dlopen(str(Path(scipy_openblas32.get_lib_dir()) / "libscipy_openblas.so"))
    lib.scipy_openblas_set_num_threads(threads)
    best = 0.0
    for m, n, k in ((1024, 1024, 1024), (4096, 1536, 384), (4096, 384, 1536)):
        a = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)
        b = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
        c = np.empty((m, n), np.float32)
        pa, pb, pc = (ffi.cast("float *", x.ctypes.data) for x in (a, b, c))

        def call(pa=pa, pb=pb, pc=pc, m=m, n=n, k=k) -> None:
            lib.scipy_cblas_sgemm(101, 111, 111, m, n, k, 1.0, pa, k, pb, n, 0.0, pc, n)  # row-major, no trans

        call()
        times = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(times) < 3:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        np.testing.assert_allclose(c[:2, :2], a[:2] @ b[:, :2], rtol=1e-3, atol=1e-3)
        best = max(best, 2 * m * n * k / min(times) / 1e9)
    return best, scipy_openblas32.get_openblas_config()


# ── peers ─────────────────────────────────────────────────────────────


def rlx_peer(model_dir: Path, max_batch: int, max_seq: int) -> Runner:
    from rlx.models import SentenceEmbedder
    from rlx.models.bert import bert_inputs

    emb = SentenceEmbedder.from_pretrained(model_dir, device="cpu", max_seq=max_seq, max_batch=max_batch)
    runner = emb.runner("embeddings")

    def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return runner.run(bert_inputs(ids, mask))[0]

    return run


def torch_peers(torch_bert: object, threads: int, wanted: set[str]) -> dict[str, Runner | str]:
    import torch

    torch.set_num_threads(threads)
    module = torch_bert.module()
    out: dict[str, Runner | str] = {}

    def make(fn: Callable) -> Runner:
        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return fn(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()

        return run

    if "torch" in wanted:
        out["torch eager"] = make(module)
    if "torch.compile" in wanted:
        try:
            compiled = torch.compile(module, dynamic=False)
            out["torch.compile"] = make(compiled)
        except Exception as exc:  # report, don't hide: the table says why the peer is missing
            out["torch.compile"] = f"skipped: {type(exc).__name__}: {exc}"
    return out


def ort_peers(torch_bert: object, threads: int, workdir: Path, config: object) -> dict[str, Runner | str]:
    import onnxruntime as ort
    import torch

    path = workdir / "minilm.onnx"
    ids, mask = token_batch(2, 16, config.vocab_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch_bert.module(), (torch.from_numpy(ids), torch.from_numpy(mask)), str(path),
                          input_names=["input_ids", "attention_mask"], output_names=["embeddings"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
                          opset_version=17, dynamo=False)
    models = {"onnxruntime": path}
    try:
        from onnxruntime.transformers import optimizer

        fused = optimizer.optimize_model(str(path), model_type="bert", num_heads=config.num_heads,
                                         hidden_size=config.hidden_size)
        stats = fused.get_fused_operator_statistics()
        fused_path = workdir / "minilm_fused.onnx"
        fused.save_model_to_file(str(fused_path))
        models[f"onnxruntime fused (Attention x{stats.get('Attention', 0)})"] = fused_path
    except Exception as exc:
        models["onnxruntime fused"] = f"skipped: {type(exc).__name__}: {exc}"
    out: dict[str, Runner | str] = {}
    for name, p in models.items():
        if isinstance(p, str):
            out[name] = p
            continue
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])

        def run(ids: np.ndarray, mask: np.ndarray, sess=sess) -> np.ndarray:
            return sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]

        out[name] = run
    return out


# ── measurement ───────────────────────────────────────────────────────


def measure(peers: dict[str, Runner], ids: np.ndarray, mask: np.ndarray, rounds: int,
            budget_s: float) -> dict[str, list[float]]:
    """Round-robin timing: each round calls every peer once; stops at `rounds` or the time budget."""
    for run in peers.values():  # warm-up: compilation of shapes, thread pools, first-touch of buffers
        run(ids, mask)
        run(ids, mask)
    samples: dict[str, list[float]] = {name: [] for name in peers}
    end = time.perf_counter() + budget_s
    for r in range(rounds):
        for name, run in peers.items():
            t0 = time.perf_counter()
            run(ids, mask)
            samples[name].append(time.perf_counter() - t0)
        if r >= 4 and time.perf_counter() > end:
            break
    return samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=int(os.environ.get("RLX_NUM_THREADS") or os.cpu_count() or 1))
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per case (default 30)")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds per case before stopping early (default 20)")
    ap.add_argument("--cases", default="1x16,8x128,32x128", help="batch x seq list (default 1x16,8x128,32x128)")
    ap.add_argument("--peers", default="rlx,torch,torch.compile,onnxruntime",
                    help="comma list of rlx, torch, torch.compile, onnxruntime")
    ap.add_argument("--model", default=None, help="BERT directory (default: the packaged all-MiniLM-L6-v2)")
    args = ap.parse_args(argv)
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    wanted = set(args.peers.split(","))
    # One thread count for everyone: rlx reads RLX_NUM_THREADS when it compiles; OpenMP/BLAS pools
    # of the other peers are set through their own APIs below.
    os.environ["RLX_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    from rlx.models import bert as B
    from rlx.models.embedder import default_model_dir

    model_dir = Path(args.model) if args.model else default_model_dir()
    config = B.load_config(model_dir)
    weights = B.load_weights(model_dir, config)
    max_batch = max(b for b, _ in cases)
    max_seq = max(s for _, s in cases)

    peak, blas = sgemm_peak(args.threads)
    print(f"model: {model_dir}")
    print(f"threads: {args.threads} (of {os.cpu_count()} cores)   BLAS: {blas}")
    print(f"BLAS sgemm peak (best of 1024^3, 4096x1536x384, 4096x384x1536): {peak:.1f} GFLOP/s")

    peers: dict[str, Runner] = {}
    notes: list[str] = []
    if "rlx" in wanted:
        t0 = time.perf_counter()
        peers["rlx"] = rlx_peer(model_dir, max_batch, max_seq)
        notes.append(f"rlx: compile or cache load {time.perf_counter() - t0:.1f} s")
    tb = None
    try:
        import torch  # noqa: F401

        from rlx.models.torch_bert import TorchBert

        tb = TorchBert(config, weights)
    except ImportError:
        notes.append("torch peers: skipped (torch is not installed)")
    tmp = tempfile.TemporaryDirectory()
    extra: dict[str, Runner | str] = {}
    if tb is not None:
        extra.update(torch_peers(tb, args.threads, wanted))
        if "onnxruntime" in wanted:
            try:
                extra.update(ort_peers(tb, args.threads, Path(tmp.name), config))
            except ImportError as exc:
                notes.append(f"onnxruntime: skipped ({exc.name} is not installed)")
    for name, v in extra.items():
        if isinstance(v, str):
            notes.append(f"{name}: {v}")
        else:
            peers[name] = v
    for n in notes:
        print(n)
    if not peers:
        print("no peer could run")
        return 1

    for batch, seq in cases:
        ids, mask = token_batch(batch, seq, config.vocab_size)
        outs = {name: run(ids, mask) for name, run in peers.items()}
        base_name = "torch eager" if "torch eager" in outs else next(iter(outs))
        samples = measure(peers, ids, mask, args.rounds, args.budget)
        med = {name: statistics.median(v) for name, v in samples.items()}
        flops = config.flops(batch, seq)
        print()
        n_rounds = len(next(iter(samples.values())))
        print(f"batch {batch} x seq {seq}: {flops / 1e9:.2f} GFLOP per call, {n_rounds} rounds")
        print(f"  {'peer':<38} {'median ms':>10} {'vs rlx':>8} {'GFLOP/s':>9} {'% peak':>7} {'max|diff|':>10}")
        for name in peers:
            ratio = f"{med[name] / med['rlx']:.2f}x" if "rlx" in med else "-"
            gf = flops / med[name] / 1e9
            diff = float(np.abs(outs[name] - outs[base_name]).max())
            print(f"  {name:<38} {med[name] * 1e3:>10.2f} {ratio:>8} {gf:>9.1f} {100 * gf / peak:>6.1f}% {diff:>10.2e}")
    print()
    print(f"'vs rlx' = peer median / rlx median (> 1: rlx is faster); max|diff| against {base_name}'s embeddings")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU op blocks: rlx vs numpy vs PyTorch (when installed), against measured GEMM peaks.

    python benchmarks/cpu_ops.py [--threads N] [--rounds R] [--tokens T]

First the two GEMM peaks everything is compared with, measured in this run on the same
thread count (best GFLOP/s over 1024^3, 4096x1536x384 and 4096x384x1536):

- BLAS sgemm: the OpenBLAS rlx links, called directly through cffi (OPENBLAS_CORETYPE, if
  set, decides its kernels; the environment is left as the user set it).
- rlx GEMM: RLX's own packed-weight GEMM (x @ W with W a param, packed at set_param), run
  through a compiled graph, so it includes rlx_run's own overhead.

Then two blocks, float32, the same data for every peer, all in this one process:

- mlp: a transformer FFN, y = gelu_tanh(x @ W1 + b1) @ W2 + b2 + x, with x [T, 384],
  W1 [384, 1536], W2 [1536, 384]. Its FLOPs are the two GEMMs. "sgemm pair" is the same two
  GEMMs (no bias, activation or residual) called directly on the BLAS, the best any
  implementation built on that BLAS can do; "rlx GEMM pair" is the same two GEMMs through
  rlx's packed GEMM. rlx's time is reported as a % of each.
- eltwise: y = gelu_tanh(x * a + b) * sigmoid(x) + x over [T, 1536] with a, b rows. numpy
  makes ~12 passes over memory; rlx fuses the chain into one loop nest.

Peers run round-robin (one timed sample of each per round) so background load hits them
alike, with a pause before each sample so the previous peer's spinning thread pool has gone
idle; the median sample is reported. Nothing is installed: a missing peer is skipped.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable

import numpy as np
import timing  # benchmarks/timing.py (a script's own folder is on sys.path)


def _gelu_tanh_np(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x * x * x)))


def _sigmoid_np(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


SETTLE_SECONDS = 0.25


def round_robin(peers: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    return timing.round_robin(peers, rounds, SETTLE_SECONDS)


def blas_sgemm(threads: int) -> Callable[..., None] | None:
    """C = A @ B through the BLAS rlx links (cffi, no Python-side copies), or None without one."""
    import cffi

    from rlx.config import Config
    from rlx.toolchain.compiler import detect_toolchain

    blas = detect_toolchain(Config.from_env()).blas
    if not blas.enabled or not blas.library or not os.path.exists(blas.library):
        return None
    ffi = cffi.FFI()
    p = blas.prefix
    ffi.cdef(f"void {p}cblas_sgemm(int, int, int, int, int, int, float, const float *, int, const float *, int, "
             f"float, float *, int);" + (f"void {p}openblas_set_num_threads(int);" if blas.has_thread_api else ""))
    lib = ffi.dlopen(blas.library)
    set_threads = getattr(lib, f"{p}openblas_set_num_threads") if blas.has_thread_api else (lambda n: None)
    sgemm = getattr(lib, f"{p}cblas_sgemm")

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        # rlx pins this (process-wide) BLAS to one thread while it runs; the peak uses them all
        set_threads(threads)
        m, k = a.shape
        n = b.shape[1]
        sgemm(101, 111, 111, m, n, k, 1.0, ffi.from_buffer("float[]", a), k, ffi.from_buffer("float[]", b), n,
              0.0, ffi.from_buffer("float[]", c, require_writable=True), n)

    return run


PEAK_SHAPES = ((1024, 1024, 1024), (4096, 1536, 384), (4096, 384, 1536))


def _best_time(fn: Callable[[], object], seconds: float) -> float:
    fn()
    best = float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        best = min(best, timing.timed(fn, min_seconds=0.02))
    return best


def gemm_peaks(threads: int, seconds: float = 1.0) -> dict[str, float]:
    """Best GFLOP/s over PEAK_SHAPES of the BLAS sgemm and of rlx's packed GEMM (C = A @ W, W a param)."""
    import rlx

    sgemm = blas_sgemm(threads)
    peaks = {"BLAS sgemm": 0.0, "rlx GEMM": 0.0}
    rng = np.random.default_rng(2)
    for m, n, k in PEAK_SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        c = np.empty((m, n), np.float32)
        flops = 2.0 * m * n * k
        if sgemm is not None:
            t = _best_time(lambda a=a, w=w, c=c: sgemm(a, w, c), seconds)
            peaks["BLAS sgemm"] = max(peaks["BLAS sgemm"], flops / t / 1e9)
        g = rlx.Graph(f"gemm_{m}x{n}x{k}")
        g.set_outputs([g.matmul(g.input("a", [m, k]), g.param("w", [k, n]))])
        cg = rlx.Session(config=_config(threads)).compile(g)
        cg.set_param("w", w)
        cg.run_slots([a], [c])
        np.testing.assert_allclose(c[:2, :2], a[:2] @ w[:, :2], rtol=1e-3, atol=1e-3)
        t = _best_time(lambda cg=cg, a=a, c=c: cg.run_slots([a], [c]), seconds)
        peaks["rlx GEMM"] = max(peaks["rlx GEMM"], flops / t / 1e9)
        time.sleep(SETTLE_SECONDS)
    return peaks


def mlp_block(tokens: int, threads: int, rounds: int, torch: object | None) -> None:
    import rlx

    d, f = 384, 1536
    rng = np.random.default_rng(0)
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    w1 = (rng.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32)
    b1 = rng.standard_normal(f).astype(np.float32)
    w2 = (rng.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32)
    b2 = rng.standard_normal(d).astype(np.float32)

    g = rlx.Graph("mlp_block")
    xi = g.input("x", [tokens, d])
    h = g.activation("gelu_tanh", g.add_(g.matmul(xi, g.param("w1", [d, f])), g.param("b1", [f])))
    y = g.add_(g.add_(g.matmul(h, g.param("w2", [f, d])), g.param("b2", [d])), xi)
    g.set_outputs([y])
    cg = rlx.Session(config=_config(threads)).compile(g)
    for k, v in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)):
        cg.set_param(k, v)
    out = np.empty((tokens, d), np.float32)
    ref = rlx.reference.run(g, {"x": x}, {"w1": w1, "b1": b1, "w2": w2, "b2": b2})[0]
    cg.run_slots([x], [out])
    err = float(np.max(np.abs(out - ref)))

    peers: dict[str, Callable[[], object]] = {"rlx": lambda: cg.run_slots([x], [out])}
    peers["numpy"] = lambda: _gelu_tanh_np(x @ w1 + b1) @ w2 + b2 + x
    if torch is not None:
        tx, tw1, tb1, tw2, tb2 = (torch.from_numpy(a) for a in (x, w1, b1, w2, b2))

        def torch_mlp() -> object:
            with torch.inference_mode():
                return torch.nn.functional.gelu(tx @ tw1 + tb1, approximate="tanh") @ tw2 + tb2 + tx

        peers["torch"] = torch_mlp
    sgemm = blas_sgemm(threads)
    hbuf = np.empty((tokens, f), np.float32)
    ybuf = np.empty((tokens, d), np.float32)
    if sgemm is not None:

        def blas_pair() -> None:
            sgemm(x, w1, hbuf)
            sgemm(hbuf, w2, ybuf)

        peers["sgemm pair"] = blas_pair
    pair = rlx.Graph("gemm_pair")
    pi = pair.input("x", [tokens, d])
    pair.set_outputs([pair.matmul(pair.matmul(pi, pair.param("w1", [d, f])), pair.param("w2", [f, d]))])
    pair_cg = rlx.Session(config=_config(threads)).compile(pair)
    pair_cg.set_param("w1", w1)
    pair_cg.set_param("w2", w2)
    peers["rlx GEMM pair"] = lambda: pair_cg.run_slots([x], [ybuf])
    times = round_robin(peers, rounds)
    flops = 4.0 * tokens * d * f
    print(f"\nmlp block  x[{tokens},{d}] -> {f} -> {d}  ({flops / 1e9:.2f} GFLOP, rlx max |err| vs reference "
          f"{err:.1e})")
    _report(times, flops, base="rlx", peaks=("sgemm pair", "rlx GEMM pair"))


def eltwise_block(tokens: int, threads: int, rounds: int, torch: object | None) -> None:
    import rlx

    f = 1536
    rng = np.random.default_rng(1)
    x = rng.standard_normal((tokens, f)).astype(np.float32)
    a = rng.standard_normal(f).astype(np.float32)
    b = rng.standard_normal(f).astype(np.float32)
    g = rlx.Graph("eltwise_block")
    xi = g.input("x", [tokens, f])
    ai, bi = g.param("a", [f]), g.param("b", [f])
    y = g.add_(g.mul(g.activation("gelu_tanh", g.add_(g.mul(xi, ai), bi)), g.activation("sigmoid", xi)), xi)
    g.set_outputs([y])
    cg = rlx.Session(config=_config(threads)).compile(g)
    cg.set_param("a", a)
    cg.set_param("b", b)
    out = np.empty_like(x)
    cg.run_slots([x], [out])
    ref = rlx.reference.run(g, {"x": x}, {"a": a, "b": b})[0]
    err = float(np.max(np.abs(out - ref)))
    fused = cg.source.count("static int rlx_op_")
    peers: dict[str, Callable[[], object]] = {"rlx": lambda: cg.run_slots([x], [out])}
    peers["numpy"] = lambda: _gelu_tanh_np(x * a + b) * _sigmoid_np(x) + x
    if torch is not None:
        tx, ta, tb = (torch.from_numpy(v) for v in (x, a, b))

        def torch_elt() -> object:
            with torch.inference_mode():
                return torch.nn.functional.gelu(tx * ta + tb, approximate="tanh") * torch.sigmoid(tx) + tx

        peers["torch"] = torch_elt
    times = round_robin(peers, rounds)
    print(f"\neltwise block  [{tokens},{f}], 8 ops  (rlx: {fused} kernel(s); max |err| vs reference {err:.1e})")
    _report(times, None, base="rlx")


def _report(times: dict[str, float], flops: float | None, base: str, peaks: tuple[str, ...] = ()) -> None:
    for name, t in sorted(times.items(), key=lambda kv: kv[1]):
        line = f"  {name:<14} {t * 1e3:8.3f} ms   x{t / times[base]:5.2f} of rlx time"
        if flops:
            line += f"   {flops / t / 1e9:7.1f} GFLOP/s"
        for peak in peaks:
            if peak in times and name != peak:
                line += f"   {times[peak] / t * 100:5.1f}% of {peak}"
        print(line)


def _config(threads: int) -> object:
    import dataclasses

    from rlx.config import Config

    return dataclasses.replace(Config.from_env(), num_threads=threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    try:
        import torch

        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    print(f"threads {args.threads}, rounds {args.rounds}, torch "
          f"{torch.__version__ if torch else 'not installed (skipped)'}"
          + (f", OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']}" if os.environ.get("OPENBLAS_CORETYPE") else ""))
    peaks = gemm_peaks(args.threads)
    print("GEMM peaks, GFLOP/s (best of " + ", ".join("x".join(map(str, s)) for s in PEAK_SHAPES) + "): "
          + ", ".join(f"{k} {v:.1f}" if v else f"{k} n/a (no BLAS)" for k, v in peaks.items()))
    mlp_block(args.tokens, args.threads, args.rounds, torch)
    eltwise_block(args.tokens, args.threads, args.rounds, torch)


if __name__ == "__main__":
    main()

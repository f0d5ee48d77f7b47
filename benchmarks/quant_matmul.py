"""Quantized matmul (GGUF blocks): rlx `dequant_matmul` vs f32 matmuls on the dequantized weight.

    python benchmarks/quant_matmul.py [--threads N] [--rounds R] [--formats q4_1,q8_0] [--rows 1,256]
                                      [--clock wall|cpu]
                                      [--peers "rlx q,rlx q act8,rlx q act16,rlx f32,numpy f32"]

Y[M, N] = X[M, K] @ W^T for SmolLM2-135M's weight shapes (N x K: 576x576 attention,
1536x576 FFN up/gate, 576x1536 FFN down, 49152x576 vocabulary projection), W in a GGUF
block format, at M = 1 (decode: a GEMV, bound by reading the weight) and M = 256 (prefill:
a GEMM, bound by arithmetic). Peers, all in this process on the same data:

- rlx q: `dequant_matmul` on the raw blocks (the kernels read the 4/8-bit blocks), f32 activations;
- rlx q act8: the same with `act="q8"` (activations quantized to int8 per 32-block, integer block
  products with VNNI, as llama.cpp computes these matmuls);
- rlx q act16: `act="q16"` (int16 activations as two byte planes: two VNNI products per block pair;
  the CPU decoder's default);
- rlx f32: rlx's own packed f32 GEMM on the dequantized weight (a param, packed at set time);
- numpy f32: `x @ Wd.T` on the dequantized weight (numpy's BLAS).

"GB/s" is the weight bytes each peer must read per call (quantized or f32) over its time;
"GFLOP/s" counts 2*M*N*K. Peers run round-robin with a pause before each sample (so one
peer's spinning thread pool has gone idle before the next runs); medians are reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable

import numpy as np
import timing  # benchmarks/timing.py (a script's own folder is on sys.path)

SHAPES = ((576, 576), (1536, 576), (576, 1536), (49152, 576))  # (N, K)
ROWS = (1, 256)
SETTLE_SECONDS = 0.2


def round_robin(peers: dict[str, Callable[[], object]], rounds: int, clock: Callable[[], float]) -> dict[str, float]:
    return timing.round_robin(peers, rounds, SETTLE_SECONDS, clock=clock)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--formats", default="q4_1,q8_0")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="rows of X (M), comma-separated")
    ap.add_argument("--peers", default="rlx q,rlx q act8,rlx q act16,rlx f32,numpy f32")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: this process's CPU time (with --threads 1, for a machine shared with other work)")
    args = ap.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu measures one thread's work: use it with --threads 1")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rows = tuple(int(r) for r in args.rows.split(","))
    wanted = set(args.peers.split(","))

    import rlx
    from rlx.config import Config
    from rlx.driver import Session
    from rlx.ir import quant as Q

    session = Session(rlx.Device.CPU, dataclasses.replace(Config.from_env(), num_threads=args.threads))
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}, rounds {args.rounds}, {args.clock} clock, numpy {np.__version__}")
    print(f"{'format':<6} {'N x K':>11} {'M':>4}  {'peer':<10} {'time':>10} {'GB/s':>7} {'GFLOP/s':>8}  "
          "ratio (peer time / rlx q time)")
    for fmt in args.formats.split(","):
        for n, k in SHAPES:
            w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
            raw = Q.quantize(w, fmt)
            wd = Q.dequantize(raw, fmt, k)
            m_dim = rlx.Dim.dynamic("m", max(rows))
            gq = rlx.Graph("q")
            xq = gq.input("x", [m_dim, k])
            gq.set_outputs([gq.dequant_matmul(xq, gq.param("w", [n, raw.shape[1]], "u8"), quant=fmt)])
            cq = session.compile(gq)
            cq.set_param("w", raw)
            g8 = rlx.Graph("q8")
            x8 = g8.input("x", [m_dim, k])
            g8.set_outputs([g8.dequant_matmul(x8, g8.param("w", [n, raw.shape[1]], "u8"), quant=fmt, act="q8")])
            c8 = session.compile(g8)
            c8.set_param("w", raw)
            g16 = rlx.Graph("q16")
            x16 = g16.input("x", [m_dim, k])
            g16.set_outputs([g16.dequant_matmul(x16, g16.param("w", [n, raw.shape[1]], "u8"), quant=fmt, act="q16")])
            c16 = session.compile(g16)
            c16.set_param("w", raw)
            gf = rlx.Graph("f")
            xf = gf.input("x", [m_dim, k])
            gf.set_outputs([gf.matmul(xf, gf.param("w", [k, n]))])
            cf = session.compile(gf)
            cf.set_param("w", np.ascontiguousarray(wd.T))
            wdt = wd.T
            for m in rows:
                x = rng.standard_normal((m, k)).astype(np.float32)
                got, want = cq.run({"x": x})[0], x.astype(np.float64) @ wd.T.astype(np.float64)
                assert np.allclose(got, want, rtol=1e-3, atol=1e-3), "rlx dequant_matmul disagrees"
                feeds = {"x": x}
                peers = {"rlx q": lambda c=cq, f=feeds: c.run(f), "rlx q act8": lambda c=c8, f=feeds: c.run(f),
                         "rlx q act16": lambda c=c16, f=feeds: c.run(f),
                         "rlx f32": lambda c=cf, f=feeds: c.run(f), "numpy f32": lambda a=x, b=wdt: a @ b}
                peers = {name: fn for name, fn in peers.items() if name in wanted or name == "rlx q"}
                times = round_robin(peers, args.rounds, clock)
                wbytes = {"rlx q": raw.nbytes, "rlx q act8": raw.nbytes, "rlx q act16": raw.nbytes,
                          "rlx f32": wd.nbytes, "numpy f32": wd.nbytes}
                for name, t in times.items():
                    ratio = "" if name == "rlx q" else f"{t / times['rlx q']:5.2f}"
                    print(f"{fmt:<6} {f'{n}x{k}':>11} {m:>4}  {name:<11} {t * 1e3:8.3f}ms "
                          f"{wbytes[name] / t / 1e9:7.2f} {2 * m * n * k / t / 1e9:8.1f}  {ratio}", flush=True)


if __name__ == "__main__":
    main()

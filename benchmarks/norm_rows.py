"""The CPU's norm rows at MiniLM's shape: rlx's residual + LayerNorm and LayerNorm against numpy.

    python benchmarks/norm_rows.py [--threads N] [--rows 1024] [--width 384] [--rounds 9]

One graph per kind, compiled as written: `fused_residual_layer_norm(x, r, gamma, beta)` (BERT's "add &
norm", 12 a MiniLM call) and `layer_norm(x, gamma, beta)` (its embeddings' norm), over `rows` x `width`
float32 rows, run over fixed arrays (`bind_run`: no allocation per call). Each rlx row is also checked
against numpy in float64 (rtol 5e-7, atol 1e-6: tests/codegen/test_cpu_rows.py's bound). numpy's time is
its float32 pass (mean, var, normalize) as a reference point; rounds alternate the peers, the median of the
per-call times is printed (`timing.round_robin`). To compare two versions of rlx, run this script from each tree in turn
(alternating processes): docs/architecture.md ("CPU encoder") records such runs.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import timing  # benchmarks/timing.py (a script's own folder is on sys.path)


def _numpy_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=int(os.environ.get("RLX_NUM_THREADS") or os.cpu_count() or 1))
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    os.environ["RLX_NUM_THREADS"] = str(args.threads)

    import rlx
    from rlx.ir import ops as O

    m, n, eps = args.rows, args.width, 1e-12
    rng = np.random.default_rng(0)
    x, r = (rng.standard_normal((m, n)).astype(np.float32) for _ in range(2))
    gamma, beta = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    peers = {}
    for kind in ("residual_ln", "ln"):
        g = rlx.Graph(kind)
        xi = g.input("x", [m, n])
        gi, bi = g.param("gamma", [n]), g.param("beta", [n])
        if kind == "residual_ln":
            y = g.add(O.FusedResidualLayerNorm(eps), [xi, g.input("r", [m, n]), gi, bi])
            feed, x64 = {"x": x, "r": r}, x.astype(np.float64) + r.astype(np.float64)
        else:
            y = g.layer_norm(xi, gi, bi, eps=eps)
            feed, x64 = {"x": x}, x.astype(np.float64)
        g.set_outputs([y])
        cg = rlx.Session().compile(g, opt_level=0)
        cg.set_param("gamma", gamma)
        cg.set_param("beta", beta)
        out = np.empty((m, n), np.float32)
        peers[f"rlx {kind}"] = cg.bind_run(feed, [out])
        peers[f"rlx {kind}"]()
        want = _numpy_norm(x64, gamma.astype(np.float64), beta.astype(np.float64), eps)
        np.testing.assert_allclose(out, want, rtol=5e-7, atol=1e-6, err_msg=kind)
        src = x + r if kind == "residual_ln" else x
        peers[f"numpy {kind}"] = lambda src=src: _numpy_norm(src, gamma, beta, np.float32(eps))
    times = timing.round_robin(peers, args.rounds)
    print(f"{m} x {n} rows, {args.threads} threads (load average {os.getloadavg()[0]:.2f}), median of "
          f"{args.rounds} rounds; rlx checked against float64 numpy")
    for name, seconds in times.items():
        print(f"  {name:<18} {seconds * 1e6:9.1f} us a call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

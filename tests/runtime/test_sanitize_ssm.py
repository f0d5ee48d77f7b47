"""SSM kernels, scan loops (nested, reversed, with trajectories) and a scan's gradient graph under
AddressSanitizer, at several dynamic lengths, in a child Python with libasan preloaded."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from cpu_helpers import sanitizer_env

SCRIPT = textwrap.dedent("""
    import numpy as np, rlx

    rng = np.random.default_rng(0)
    seq = rlx.Dim.dynamic("seq", max=24)

    def model(t):
        x, dt = t.input("x", [2, seq, 20]), t.input("dt", [2, seq, 20])
        bc = t.input("bc", [2, seq, 16])
        u = t.depthwise_conv1d_causal(x, t.param("w", [20, 4]))
        y = t.selective_scan(u, dt, t.param("A", [20, 16]), bc, bc)
        q = t.input("q", [2, seq, 3, 16])
        o = t.gated_delta_net(q, q, q, t.input("g", [2, seq, 3]), t.input("beta", [2, seq, 3]))
        c0 = t.input("c0", [3, 16])

        def inner(c, row):  # a nested loop: two steps over the same row
            tr = c.tracer
            return tr.scan(lambda cc, r: (cc + r).tanh(), c, xs=[tr.concat([row.unsqueeze(0)] * 2, 0)])

        rows = q.permute(1, 0, 2, 3).narrow(1, 0, 1).reshape(seq, 3, 16)  # batch row 0, time-major
        traj = t.scan(inner, c0, xs=[rows], trajectory=True, reverse=True)
        return {"y": y, "o": o, "traj": traj, "loss": (y * y).mean() + (o * o).mean() + (traj * traj).mean()}

    g = rlx.trace("asan_ssm", model)
    dg = rlx.grad(g, wrt=["A", "w", "x", "q", "c0"], output="loss")
    params = {"w": rng.standard_normal((20, 4)).astype(np.float32),
              "A": -np.abs(rng.standard_normal((20, 16))).astype(np.float32)}
    for graph in (g, dg):
        for level in (0, 2):
            cg = rlx.Session().compile(graph, opt_level=level)
            for k, v in params.items():
                cg.set_param(k, v)
            for s in (1, 5, 24):
                feed = {"x": rng.standard_normal((2, s, 20)), "dt": rng.uniform(0.01, 0.3, (2, s, 20)),
                        "bc": rng.standard_normal((2, s, 16)), "q": rng.standard_normal((2, s, 3, 16)) * 0.3,
                        "g": -rng.uniform(0, 1, (2, s, 3)), "beta": rng.uniform(0, 1, (2, s, 3)),
                        "c0": rng.standard_normal((3, 16))}
                feed = {k: v.astype(np.float32) for k, v in feed.items()}
                got = cg.run(feed)
                want = rlx.reference.run(graph, feed, params)
                for a_, b_ in zip(got, want):
                    np.testing.assert_allclose(a_, b_, rtol=2e-3, atol=2e-4)
    print("ASAN-CLEAN")
""")


@pytest.mark.slow
def test_ssm_and_scan_code_is_asan_clean():
    env = sanitizer_env("address", {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1"})
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "ASAN-CLEAN" in proc.stdout, proc.stderr[-6000:]

"""Generated code under AddressSanitizer: every kernel family built with RLX_SANITIZE=address and
run at several dynamic lengths, in a child Python with libasan preloaded (ASan must be the first
library loaded). Any out-of-bounds access aborts the child with an ASan report."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from cpu_helpers import sanitizer_env

SCRIPT = textwrap.dedent("""
    import numpy as np, rlx
    from rlx.ir import ops as O

    rng = np.random.default_rng(0)
    seq = rlx.Dim.dynamic("seq", max=40)
    g = rlx.Graph("asan")
    x = g.input("x", [2, seq, 32])
    ids = g.input("ids", [2, seq], "i32")
    cos = g.input("cos", [seq, 4])
    sin = g.input("sin", [seq, 4])
    w = g.param("w", [32, 32])
    b = g.param("b", [32])
    gam = g.param("gamma", [32])
    table = g.param("table", [50, 32])
    h = g.add(O.FusedMatMulBiasAct("gelu"), [x, w, b])
    e = g.add_(g.gather(table, ids), h)
    n = g.add(O.FusedResidualLayerNorm(1e-5), [e, x, gam, b])
    r = g.rope(n, cos, sin, head_dim=8)
    a = g.attention(r, r, n, num_heads=4, head_dim=8, mask="causal")
    sw = g.add(O.FusedSwiGLU(), [a, w, w])
    t = g.transpose(g.reshape(sw, [2, seq, 4, 8]), [0, 2, 3, 1])
    red = g.reduce("max", t, [1, 3])
    cat = g.concat([g.narrow(a, 2, 3, 5), g.softmax(n, 1)], 2)
    g.set_outputs({"a": a, "red": red, "cat": cat, "rms": g.rms_norm(sw, gam), "ex": g.expand(b, [3, 32])})
    params = {"w": rng.standard_normal((32, 32)).astype(np.float32) * 0.2,
              "b": rng.standard_normal(32).astype(np.float32),
              "gamma": rng.standard_normal(32).astype(np.float32),
              "table": rng.standard_normal((50, 32)).astype(np.float32)}
    for level in (0, 2):
        cg = rlx.Session().compile(g, opt_level=level)
        for k, v in params.items():
            cg.set_param(k, v)
        for s in (1, 7, 40):
            ang = rng.uniform(0, 6, (s, 4))
            feed = {"x": rng.standard_normal((2, s, 32)).astype(np.float32),
                    "ids": rng.integers(0, 50, (2, s)).astype(np.int32),
                    "cos": np.cos(ang).astype(np.float32), "sin": np.sin(ang).astype(np.float32)}
            got = cg.run(feed)
            want = rlx.reference.run(g, feed, params)
            for a_, b_ in zip(got, want):
                np.testing.assert_allclose(a_, b_, rtol=1e-4, atol=1e-4)
        feed["ids"][1, 0] = 50
        try:
            cg.run(feed)
        except rlx.ExecutionError as exc:
            assert "gather index 50" in str(exc)
        else:
            raise AssertionError("bad gather index was not reported")
        twin = cg.clone()
        twin.num_threads = 1
        twin.run({**feed, "ids": np.zeros((2, 40), np.int32)})
    print("ASAN-CLEAN")
""")


def test_generated_code_is_asan_clean():
    env = sanitizer_env("address", {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1"})
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ASAN-CLEAN" in proc.stdout, proc.stderr[-6000:]

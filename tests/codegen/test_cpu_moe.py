"""CPU `moe_topk`, `moe_gate` and `moe_matmul` against the reference.

One graph holds the router (both normalizations) and `moe_matmul` for every expert weight kind (f32,
f16, bf16 and each GGUF block format), with one activation per token and one per chosen expert, over a
dynamic token count: 1 and 5 tokens take the GEMV path at run time, 100 tokens (300 pairs, two rounds
of 256) the grouped path. A second graph, decode-shaped, is decided GEMV-only; ids outside [0, E) give
NaN rows on both paths. Run as a script (`python test_cpu_moe.py`) it runs both paths on a few weight kinds and
prints MOE-OK: the ASan test runs it that way in a child process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_helpers import U32, assert_within, compile_graph, sanitizer_env  # noqa: E402

import rlx  # noqa: E402
from rlx.ir import quant as Q  # noqa: E402
from rlx.ir.decisions_moe import MoeExpertPlan  # noqa: E402
from rlx.ir.dtype import BFLOAT16  # noqa: E402
from rlx.reference import run as reference_run  # noqa: E402

E, K, N, TOP_K, MAXT = 6, 256, 24, 3, 100
KINDS = ("f32", "f16", "bf16", *sorted(Q.QUANT_FORMATS))


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    w = (rng.standard_normal((E, N, K)) * 0.1).astype(np.float32)
    out = {"w_f32": w, "w_f16": w.astype(np.float16), "w_bf16": w.astype(BFLOAT16)}
    for fmt in Q.QUANT_FORMATS:
        out[f"w_{fmt}"] = Q.random_blocks(rng, E * N, K, fmt).reshape(E, N, -1)
    return out


def _expert_f64(name: str, value: np.ndarray) -> np.ndarray:
    fmt = name[2:]
    if fmt in Q.QUANT_FORMATS:
        return Q.dequantize(value.reshape(E * N, -1), fmt, K).reshape(E, N, K).astype(np.float64)
    return value.astype(np.float64)


def _graph(tokens: rlx.Dim | int, params: dict[str, np.ndarray]) -> rlx.Graph:
    g = rlx.Graph("moe_ops")
    logits = g.input("logits", [tokens, E])
    x = g.input("x", [tokens, K])
    xk = g.input("x_per_pair", [tokens, TOP_K, K])
    ids, gate = g.moe_router(logits, top_k=TOP_K, normalize=True)
    _, raw = g.moe_router(logits, top_k=TOP_K, normalize=False)
    outs = {"ids": ids, "gate": gate, "gate_raw": raw}
    for name, value in params.items():
        fmt = name[2:]
        w = g.param(name, list(value.shape), "u8" if fmt in Q.QUANT_FORMATS else fmt)
        quant = fmt if fmt in Q.QUANT_FORMATS else None
        outs[f"y_{fmt}"] = g.moe_matmul(x, ids, w, quant=quant)
        if fmt in ("f32", "q8_0"):
            outs[f"yk_{fmt}"] = g.moe_matmul(xk, ids, w, quant=quant)
    g.set_outputs(outs)
    return g


@pytest.fixture(scope="module")
def moe_ops():
    params = _weights(np.random.default_rng(0))
    g = _graph(rlx.Dim.dynamic("t", MAXT), params)
    return g, params, compile_graph(g, params)


@pytest.mark.parametrize("tokens", [1, 5, MAXT])
def test_moe_ops_match_reference(moe_ops, tokens):
    g, params, cg = moe_ops
    rng = np.random.default_rng(tokens)
    inputs = {"logits": rng.standard_normal((tokens, E)).astype(np.float32),
              "x": rng.standard_normal((tokens, K)).astype(np.float32),
              "x_per_pair": rng.standard_normal((tokens, TOP_K, K)).astype(np.float32)}
    got = dict(zip(g.output_names, cg.run(inputs)))
    want = dict(zip(g.output_names, reference_run(g, inputs, params)))
    np.testing.assert_array_equal(got["ids"], want["ids"])
    for name in ("gate", "gate_raw"):
        np.testing.assert_allclose(got[name], want[name], rtol=4 * E * U32, atol=0)
    ids = want["ids"].astype(np.int64)
    for name, value in params.items():
        mag = np.abs(_expert_f64(name, value))[ids]  # [T, k, N, K]: |W| of each pair's expert
        for out, x in ((f"y_{name[2:]}", inputs["x"][:, None, :]), (f"yk_{name[2:]}", inputs["x_per_pair"])):
            if out in got:
                # an f32 accumulation of K products (Higham 3.5) plus the reference's final rounding
                bound = (K + 4) * U32 * np.einsum("tsnk,tsk->tsn", mag, np.abs(np.broadcast_to(
                    x, (tokens, TOP_K, K)).astype(np.float64)))
                assert_within(got[out], want[out], bound, f"{out}, {tokens} tokens")


def test_router_ties_and_order(moe_ops):
    """Largest first; equal logits go to the lower id, as the reference (and torch.topk on distinct values)."""
    g, _, cg = moe_ops
    logits = np.array([[0.5, 2.0, 2.0, -1.0, 2.0, 0.0], [3.0, -2.0, 1.0, 1.0, 5.0, 1.0]], dtype=np.float32)
    inputs = {"logits": logits, "x": np.zeros((2, K), np.float32), "x_per_pair": np.zeros((2, TOP_K, K), np.float32)}
    got = dict(zip(g.output_names, cg.run(inputs)))
    assert got["ids"].tolist() == [[1, 2, 4], [4, 0, 2]]
    np.testing.assert_allclose(got["gate"].sum(axis=1), 1.0, rtol=1e-6)


def test_decode_graph_is_gemv_and_bad_ids_give_nan():
    """A 1-token graph is decided GEMV-only (in the LIR); an id outside [0, E) makes a NaN row, never a read
    outside the weights, on the GEMV path and on the grouped one."""
    rng = np.random.default_rng(3)
    w = {"w": (rng.standard_normal((E, N, K)) * 0.1).astype(np.float32)}
    graphs = {}
    for name, tokens in (("decode", 1), ("prefill", rlx.Dim.dynamic("t", 32))):
        g = rlx.Graph(f"moe_{name}")
        y = g.moe_matmul(g.input("x", [tokens, K]), g.input("ids", [tokens, 2], "i32"), g.param("w", [E, N, K]))
        g.set_outputs([y])
        graphs[name] = (g, compile_graph(g, w))
    plans = {name: cg.lir.decided(MoeExpertPlan) for name, (_, cg) in graphs.items()}
    assert [p.path for p in plans["decode"]] == ["gemv"]
    assert [p.path for p in plans["prefill"]] == ["grouped"]
    # printed with the LIR (`rlxc inspect --stage lir`) and named in the generated C
    printed = {name: cg.lir.inspect() for name, (_, cg) in graphs.items()}
    assert "moe_matmul: one GEMV per chosen (token, expert) pair (steps of <= 16 pairs)" in printed["decode"]
    assert "pairs sorted by expert, 64 at a time, one GEMM per expert group" in printed["prefill"]
    for name, (g, cg) in graphs.items():
        t = 1 if name == "decode" else 20  # 40 pairs: the grouped path at run time
        ids = rng.integers(0, E, size=(t, 2)).astype(np.int32)
        ids[0, 1] = E
        ids[-1, 0] = -1
        x = rng.standard_normal((t, K)).astype(np.float32)
        got = cg.run({"x": x, "ids": ids})[0]
        want = reference_run(g, {"x": x, "ids": ids}, w)[0]
        bad = (ids < 0) | (ids >= E)
        assert np.isnan(got[bad]).all() and not np.isnan(got[~bad]).any(), name
        np.testing.assert_allclose(got[~bad], want[~bad], rtol=1e-5, atol=1e-4)


def test_is_asan_clean() -> None:
    env = sanitizer_env("address", {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1"}, HERE)
    proc = subprocess.run([sys.executable, str(Path(__file__))], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "MOE-OK" in proc.stdout, proc.stderr[-6000:]


def asan_check() -> None:
    """One build: the router, f32 / bf16 / q4_1 / q4_k experts, GEMV and grouped (two rounds) paths, a bad id."""
    rng = np.random.default_rng(11)
    e, k, n, top_k = 5, 256, 19, 2
    g = rlx.Graph("moe_asan")
    t = rlx.Dim.dynamic("t", 150)
    ids, gate = g.moe_router(g.input("logits", [t, e]), top_k=top_k, normalize=False)
    x, given = g.input("x", [t, k]), g.input("ids", [t, top_k], "i32")
    params = {"f32": (rng.standard_normal((e, n, k)) * 0.1).astype(np.float32)}
    params["bf16"] = params["f32"].astype(BFLOAT16)
    for fmt in ("q4_1", "q4_k"):
        params[fmt] = Q.random_blocks(rng, e * n, k, fmt).reshape(e, n, -1)
    outs = [ids, gate]
    for name, value in params.items():  # each kind once or twice: the router's ids, given ids (one bad)
        quant = name if name in Q.QUANT_FORMATS else None
        w = g.param(name, list(value.shape), "u8" if quant else name)
        outs += [g.moe_matmul(x, chosen, w, quant=quant) for chosen in
                 {"f32": (ids, given), "bf16": (given,), "q4_1": (ids,), "q4_k": (given,)}[name]]
    g.set_outputs(outs)
    cg = compile_graph(g, params)
    for tokens in (1, 150):
        bad = rng.integers(0, e, (tokens, top_k)).astype(np.int32)
        bad[0, 0] = e
        inputs = {"logits": rng.standard_normal((tokens, e)).astype(np.float32),
                  "x": rng.standard_normal((tokens, k)).astype(np.float32), "ids": bad}
        got, want = cg.run(inputs), reference_run(g, inputs, params)
        for i, (a, b) in enumerate(zip(got, want)):
            if a.dtype.kind == "f":
                # f32 sums of 256 products whose terms reach hundreds (random blocks): 1e-5 of the largest value
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.nanmax(np.abs(b)), equal_nan=True,
                                           err_msg=f"output {i}")
            else:
                np.testing.assert_array_equal(a, b)


if __name__ == "__main__":
    asan_check()
    print("MOE-OK")

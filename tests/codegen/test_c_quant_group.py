"""CPU decode GEMV groups (`QuantGemvGroup`, kernels/qgemv_group.h): Q/K/V-like projections of one
activation, and gate/up with their SwiGLU, as one pass in steps of <= 16 rows, against the reference,
with integer (q8/q16) and f32 activations; f32 groups give each row the same bits in any step.

Run as a script (`python test_c_quant_group.py`) it runs the checks with 2 threads and prints
GROUP-OK: the spinning-team test runs it that way in a child process (the team splits small
weights only when idle threads spin, a policy read once per process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_helpers import U32, assert_within, compile_graph  # noqa: E402
from test_cpu_quant import act_bound  # noqa: E402

import rlx  # noqa: E402
from rlx.ir import quant as Q  # noqa: E402
from rlx.ir.decisions_quant import QuantGemvGroup  # noqa: E402
from rlx.opt.lowering_quant_cpu import quant_gemv_groups  # noqa: E402
from rlx.opt.memplan import plan  # noqa: E402
from rlx.opt.pipeline import optimize  # noqa: E402
from rlx.reference import run as reference_run  # noqa: E402

K = 96  # 3 blocks: a pair and an odd last block
ROWS = (1, 3, 4, 6, 9, 20)  # the group's pass (<= 16 rows, 4 at a time), then every node's own kernel
WIDTHS = (37, 13, 11)  # odd: the team's split falls inside a member


def _qkv_graph(fmt: str, act: str) -> rlx.Graph:
    g = rlx.Graph(f"qkv_{fmt}_{act}")
    x = g.input("x", [rlx.Dim.dynamic("m", 24), K])
    h = g.mul(x, x)  # the activation comes from a kernel, as a norm's output does
    outs = {}
    for name, n in zip("qkv", WIDTHS):
        w = g.param(f"w{name}", [n, Q.row_bytes(fmt, K)], "u8")
        outs[name] = g.dequant_matmul(h, w, quant=fmt, act=act)
    g.set_outputs(outs)
    return g


def _swiglu_graph(fmt: str, act: str) -> rlx.Graph:
    g = rlx.Graph(f"swiglu_{fmt}_{act}")
    x = g.input("x", [rlx.Dim.dynamic("m", 24), K])
    gate, up = (g.dequant_matmul(x, g.param(n, [WIDTHS[0], Q.row_bytes(fmt, K)], "u8"), quant=fmt, act=act)
                for n in ("wg", "wu"))
    g.set_outputs({"y": g.mul(g.activation("silu", gate), up)})
    return g


def _weights(g: rlx.Graph, fmt: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {p.op.name: Q.random_blocks(rng, p.shape.dims[0].value, K, fmt) for p in g.params()}


CASES = [("q4_1", "q16"), ("q8_0", "q8"), ("q4_0", "q16"), ("q4_1", "f32"), ("q8_0", "f32")]


def test_groups_are_decided_in_the_lir() -> None:
    qkv = quant_gemv_groups(plan(optimize(_qkv_graph("q4_1", "q16"))))
    assert len(qkv) == 1 and len(qkv[0].members) == 3 and not qkv[0].swiglu
    ffn = quant_gemv_groups(plan(optimize(_swiglu_graph("q4_1", "q16"))))
    assert len(ffn) == 1 and len(ffn[0].members) == 2 and len(ffn[0].swiglu) == 1
    assert ffn[0].skipped() == ffn[0].members[1:] + ffn[0].swiglu
    # f32 activations are grouped too (the SwiGLU then reads gate and up where they were computed)
    f32 = quant_gemv_groups(plan(optimize(_swiglu_graph("q4_1", "f32"))))
    assert len(f32) == 1 and len(f32[0].swiglu) == 1
    assert "writing the SwiGLU" in ffn[0].describe() and isinstance(ffn[0], QuantGemvGroup)


def _grouped_runs(g: rlx.Graph, fmt: str, threads: int, seed: int,
                  kernel: str) -> Iterator[tuple[int, np.ndarray, dict[str, np.ndarray], Any]]:
    """Compile `g` on random `fmt` weights with `threads` threads, check that it calls `kernel`, then yield
    (rows, x, weights, compiled) for each row count in ROWS (x drawn after the weights from the same generator)."""
    rng = np.random.default_rng(seed)
    w = _weights(g, fmt, rng)
    cg = compile_graph(g, w, opt_level=2)
    cg.num_threads = threads
    assert kernel in (cg.source or "")
    for m in ROWS:
        yield m, rng.standard_normal((m, K)).astype(np.float32), w, cg


def _bound(x: np.ndarray, raw: np.ndarray, fmt: str, want: np.ndarray, act: str) -> np.ndarray:
    """The rounding bound of one product: `act_bound` for integer activations; for f32 the dot-product
    bound of test_cpu_quant (K + 4) u sum |x w|, + u |y| for the reference's own rounding."""
    if act != "f32":
        return act_bound(x, raw, fmt, K, want, act)
    terms = np.abs(x.astype(np.float64)) @ Q.abs_terms(raw, fmt, K).astype(np.float64).T
    return (K + 4) * U32 * terms + U32 * np.abs(want)


def _kernel(name: str, fmt: str, act: str) -> str:
    """The kernel unit's entry point (kernels/quant.h) a group of `fmt` weights with `act` activations calls."""
    return f"{name}_{fmt}_{act}("


def check_qkv(fmt: str, act: str, threads: int) -> None:
    g = _qkv_graph(fmt, act)
    for m, x, w, cg in _grouped_runs(g, fmt, threads, 5, _kernel("rlx_qgroup_rows", fmt, act)):
        got = dict(zip(g.output_names, cg.run({"x": x})))
        want = dict(zip(g.output_names, reference_run(g, {"x": x}, w)))
        h = x * x
        for name in "qkv":
            bound = _bound(h, w[f"w{name}"], fmt, want[name], act)
            assert_within(got[name], want[name], bound, f"{fmt} act={act} {name}, {m} rows, {threads} threads")


def check_swiglu(fmt: str, act: str, threads: int) -> None:
    g = _swiglu_graph(fmt, act)
    for m, x, w, cg in _grouped_runs(g, fmt, threads, 6, _kernel("rlx_qgroup_swiglu", fmt, act)):
        got = cg.run({"x": x})[0]
        want = reference_run(g, {"x": x}, w)[0]
        # gate and up as the reference computes them (the same activation quantization)
        gate, up = (reference_run(_single(fmt, act), {"x": x}, {"w": w[n]})[0] for n in ("wg", "wu"))
        bg, bu = (_bound(x, w[n], fmt, v, act) for n, v in (("wg", gate), ("wu", up)))
        silu = gate / (1.0 + np.exp(-gate.astype(np.float64)))
        # |d silu| <= 1.1 |d gate|; then silu's own evaluation and the product: a few roundings
        bound = 1.1 * bg * np.abs(up) + np.abs(silu) * bu + bg * bu * 1.1 + 8 * U32 * np.abs(want)
        assert_within(got, want, bound, f"{fmt} act={act} SwiGLU, {m} rows, {threads} threads")


def _single(fmt: str, act: str) -> rlx.Graph:
    g = rlx.Graph("one")
    x = g.input("x", [rlx.Dim.dynamic("m", 24), K])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [WIDTHS[0], Q.row_bytes(fmt, K)], "u8"), quant=fmt, act=act)])
    return g


@pytest.mark.parametrize("fmt,act", CASES)
def test_qkv_group_matches_reference(fmt: str, act: str) -> None:
    check_qkv(fmt, act, 1)


@pytest.mark.parametrize("fmt,act", CASES)
def test_swiglu_group_matches_reference(fmt: str, act: str) -> None:
    check_swiglu(fmt, act, 1)


@pytest.mark.parametrize("make", [_qkv_graph, _swiglu_graph], ids=["qkv", "swiglu"])
def test_f32_group_rows_do_not_depend_on_the_step(make) -> None:
    """Batch invariance: each row of a 16-row step has the bits it gets alone or at another place of a
    smaller step (the serving engine's and speculative decoding's requirement)."""
    g = make("q4_1", "f32")
    rng = np.random.default_rng(7)
    cg = compile_graph(g, _weights(g, "q4_1", rng), opt_level=2)
    x = rng.standard_normal((16, K)).astype(np.float32)
    whole = cg.run({"x": x})
    for lo, hi in ((0, 1), (5, 6), (3, 8), (11, 16)):
        part = cg.run({"x": x[lo:hi]})
        for a, b in zip(whole, part):
            np.testing.assert_array_equal(a[lo:hi], b, f"rows {lo}:{hi}")


def test_f32_swiglu_survives_its_output_taking_the_activation_buffer() -> None:
    """A real FFN: the activation comes from a kernel and dies at the up projection, so the memory plan
    gives the SwiGLU its buffer; the pass must not overwrite X while threads still read it."""
    width = 64
    g = rlx.Graph("ffn_f32")
    x = g.input("x", [rlx.Dim.dynamic("m", 24), K])
    h = g.mul(x, x)
    gate, up = (g.dequant_matmul(h, g.param(n, [width, Q.row_bytes("q4_1", K)], "u8"), quant="q4_1", act="f32")
                for n in ("wg", "wu"))
    y = g.mul(g.activation("silu", gate), up)
    g.set_outputs({"out": g.dequant_matmul(y, g.param("wd", [K, Q.row_bytes("q4_1", width)], "u8"), quant="q4_1",
                                           act="f32")})
    lir = plan(optimize(g))
    (group,) = quant_gemv_groups(lir)
    assert group.swiglu and lir.buffers[group.swiglu[0]].offset == lir.buffers[h].offset  # the hazard
    rng = np.random.default_rng(8)
    w = {"wg": Q.random_blocks(rng, width, K, "q4_1"), "wu": Q.random_blocks(rng, width, K, "q4_1"),
         "wd": Q.random_blocks(rng, K, width, "q4_1")}
    cg = compile_graph(g, w, opt_level=2)
    assert "rlx_qgroup_swiglu_q4_1_f32(" in (cg.source or "")
    wg, wu, wd = (np.abs(Q.abs_terms(w[n], "q4_1", k).astype(np.float64)) for n, k in
                  (("wg", K), ("wu", K), ("wd", width)))
    for m in (1, 5, 16):
        xv = rng.standard_normal((m, K)).astype(np.float32)
        got = cg.run({"x": xv})[0]
        want = reference_run(g, {"x": xv}, w)[0]
        hv = np.abs((xv * xv).astype(np.float64))
        gate_v, up_v = (hv @ Q.dequantize(w[n], "q4_1", K).astype(np.float64).T for n in ("wg", "wu"))
        bg, bu = ((K + 4) * U32 * (hv @ t.T) + U32 * np.abs(v) for t, v in ((wg, gate_v), (wu, up_v)))
        silu = gate_v / (1.0 + np.exp(-gate_v))
        by = 1.1 * bg * np.abs(up_v) + np.abs(silu) * bu + bg * bu * 1.1 + 8 * U32 * np.abs(silu * up_v)
        yv = np.abs(silu * up_v) + by
        bound = by @ wd.T + (width + 4) * U32 * (yv @ wd.T) + U32 * np.abs(want)
        assert_within(got, want, bound, f"FFN, {m} rows")


def test_spinning_team_splits_the_group() -> None:
    """2 threads that spin (OMP_WAIT_POLICY=active): the team splits the members' rows and the SwiGLU."""
    env = {**os.environ, "OMP_WAIT_POLICY": "active", "PYTHONPATH": os.pathsep.join(
        [str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(Path(__file__))], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "GROUP-OK" in r.stdout, r.stdout + r.stderr


if __name__ == "__main__":
    for fmt, act in CASES[:2] + CASES[3:4]:
        check_qkv(fmt, act, 2)
        check_swiglu(fmt, act, 2)
    print("GROUP-OK")

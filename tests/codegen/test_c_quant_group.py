"""CPU decode GEMV groups (`QuantGemvGroup`, kernels/qgemv_group.h): Q/K/V-like projections of one
activation, and gate/up with their SwiGLU, as one pass in steps of <= 16 rows, against the reference.

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


CASES = [("q4_1", "q16"), ("q8_0", "q8"), ("q4_0", "q16")]


def test_groups_are_decided_in_the_lir() -> None:
    qkv = quant_gemv_groups(plan(optimize(_qkv_graph("q4_1", "q16"))))
    assert len(qkv) == 1 and len(qkv[0].members) == 3 and not qkv[0].swiglu
    ffn = quant_gemv_groups(plan(optimize(_swiglu_graph("q4_1", "q16"))))
    assert len(ffn) == 1 and len(ffn[0].members) == 2 and len(ffn[0].swiglu) == 1
    assert ffn[0].skipped() == ffn[0].members[1:] + ffn[0].swiglu
    # f32 activations are not grouped (each GEMV reads X itself)
    assert quant_gemv_groups(plan(optimize(_qkv_graph("q4_1", "f32")))) == ()
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


def check_qkv(fmt: str, act: str, threads: int) -> None:
    g = _qkv_graph(fmt, act)
    for m, x, w, cg in _grouped_runs(g, fmt, threads, 5, "rlx_qgroup_rows("):
        got = dict(zip(g.output_names, cg.run({"x": x})))
        want = dict(zip(g.output_names, reference_run(g, {"x": x}, w)))
        h = x * x
        for name in "qkv":
            bound = act_bound(h, w[f"w{name}"], fmt, K, want[name], act)
            assert_within(got[name], want[name], bound, f"{fmt} act={act} {name}, {m} rows, {threads} threads")


def check_swiglu(fmt: str, act: str, threads: int) -> None:
    g = _swiglu_graph(fmt, act)
    for m, x, w, cg in _grouped_runs(g, fmt, threads, 6, "rlx_qgroup_swiglu("):
        got = cg.run({"x": x})[0]
        want = reference_run(g, {"x": x}, w)[0]
        # gate and up as the reference computes them (the same activation quantization)
        gate, up = (reference_run(_single(fmt, act), {"x": x}, {"w": w[n]})[0] for n in ("wg", "wu"))
        bg, bu = (act_bound(x, w[n], fmt, K, v, act) for n, v in (("wg", gate), ("wu", up)))
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


def test_spinning_team_splits_the_group() -> None:
    """2 threads that spin (OMP_WAIT_POLICY=active): the team splits the members' rows and the SwiGLU."""
    env = {**os.environ, "OMP_WAIT_POLICY": "active", "PYTHONPATH": os.pathsep.join(
        [str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(Path(__file__))], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "GROUP-OK" in r.stdout, r.stdout + r.stderr


if __name__ == "__main__":
    for fmt, act in CASES[:2]:
        check_qkv(fmt, act, 2)
        check_swiglu(fmt, act, 2)
    print("GROUP-OK")

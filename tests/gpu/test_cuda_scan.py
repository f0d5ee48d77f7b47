"""CUDA `scan` and the chunked / column-parallel SSM kernels against rlx.reference on a real GPU.

The scan cases run unoptimized (the body as written) and optimized (the body fused by the pipeline), each feed
twice: the first run is eager, the second replays the CUDA Graph captured for that length. `ssm_long` takes the
chunked selective scan (a sequence of hundreds over 6 channels), the chunked (WY) gated delta rule at state sizes
48 (from a given state) and 16, the column kernel at state size 128, and all of them at decode (one step).
Tolerances are those of tests/gpu/test_cuda_ops.py (storage precision: 2^-24, 2^-11, 2^-8).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx import reference
from rlx.driver import Device, Session
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.toolchain.cuda import visible_gpu_arch

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases", Path(__file__).parent / "cases.py")
cases = importlib.util.module_from_spec(_spec)
sys.modules["rlx_cuda_cases"] = cases
_spec.loader.exec_module(cases)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

U = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}


def _check(out: np.ndarray, ref: np.ndarray, precision: str, what: str) -> None:
    assert out.shape == ref.shape, f"{what}: shape {out.shape} vs {ref.shape}"
    o, r = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    rtol, l2 = (1e-5, 1e-5) if precision == "f32" else (20 * U[precision], 10 * U[precision])
    scale = max(cases.scale_of(r), 1e-30)
    err = np.abs(o - r)
    bound = rtol * np.abs(r) + rtol * scale
    worst = int(np.argmax(err - bound))
    assert np.all(err <= bound), (f"{what}: |out-ref| exceeds {rtol:.1e}*(|ref|+rms) at flat index {worst}: "
                                  f"out={o.flat[worst]!r} ref={r.flat[worst]!r} (rms {scale:.3g})")
    assert cases.rel_l2(o, r) <= l2, f"{what}: relative L2 error {cases.rel_l2(o, r):.2e} > {l2:.1e}"


def _run(name: str, precision: str, opt_level: int) -> None:
    case = cases.CASES[name]()
    cg = Session(Device.CUDA, precision=precision).compile(case.graph, opt_level=opt_level)
    for i, feed in enumerate(case.feeds):
        refs = reference.run(case.graph, feed, case.params)
        first = cg.run(feed)
        again = cg.run(feed)
        for k, (o, o2, r) in enumerate(zip(first, again, refs)):
            what = f"{name}[{precision}, O{opt_level}] feed {i} output {k}"
            _check(o, r, precision, what)
            np.testing.assert_array_equal(o, o2, err_msg=f"{what}: replay differs from the eager run")


@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", ["scan_loop", "scan_ssm_body"])
def test_scan_matches_the_reference(name: str, precision: str, opt_level: int) -> None:
    _run(name, precision, opt_level)


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
def test_chunked_and_column_parallel_ssm_kernels(precision: str) -> None:
    _run("ssm_long", precision, 0)


def test_gated_delta_net_state_input_is_updated_in_place_prefill_then_decode() -> None:
    """The carried state written back by the column kernel: prefill 300 tokens, then decode 1, equals one pass."""
    g = Graph("gdn_state")
    seq = Dim.dynamic("seq", max=400)
    q, k, v = (g.input(n, [2, seq, 3, 64]) for n in ("q", "k", "v"))
    gate, beta = g.input("g", [2, seq, 3]), g.input("beta", [2, seq, 3])
    state = g.state("s", [2, 3, 64, 64])
    g.set_outputs([g.gated_delta_net_carry(q, k, v, gate, beta, state)])
    cg = Session(Device.CUDA).compile(g)
    r = np.random.default_rng(5)

    def feed(n: int) -> dict[str, np.ndarray]:
        z = r.standard_normal((3, 2, n, 3, 64)).astype(np.float32)
        z[:2] /= np.linalg.norm(z[:2], axis=-1, keepdims=True)
        return {"q": z[0], "k": z[1], "v": z[2], "g": -np.abs(r.standard_normal((2, n, 3))).astype(np.float32) * 0.05,
                "beta": np.abs(r.standard_normal((2, n, 3))).astype(np.float32) * 0.5}

    s0 = (r.standard_normal((2, 3, 64, 64)) * 0.1).astype(np.float32)
    pre, dec = feed(300), feed(1)
    s_dev, s_ref = s0.copy(), s0.copy()
    for f in (pre, dec):
        out = cg.run({**f, "s": s_dev})[0]
        ref = reference.run(g, {**f, "s": s_ref})[0]
        _check(out, ref, "f32", "gdn output")
        _check(s_dev, s_ref, "f32", "gdn state")
    assert not np.allclose(s_dev, s0)


def test_mamba_training_step_runs_its_reverse_scans_on_the_gpu() -> None:
    """One Adam step of the Mamba-style classifier (rlx.examples.train): the gradient graph holds the scans
    autodiff made of the selective scan (a forward pair trajectory, a reverse scan over the body's vjp)."""
    from rlx.examples import train as T

    task = T.TASKS["mamba"]
    rng = np.random.default_rng(0)
    weights = task.init(rng)
    x, labels = task.data(rng, 4)
    graph = T.train_step_graph(task, 4, "adam")
    assert any(n.kind == "scan" for n in Session(Device.CUDA).lower(graph).graph.nodes)
    moments = {f"{k}_{n}": np.zeros_like(w) for n, w in weights.items() for k in ("m", "v")}
    feed = {"x": x, "y": np.eye(task.classes, dtype=np.float32)[labels], **weights, **moments,
            "lr": np.array([0.01], np.float32), "bc1": np.array([0.1], np.float32),
            "bc2": np.array([0.001], np.float32)}
    cg = Session(Device.CUDA).compile(graph)
    for k, (o, r) in enumerate(zip(cg.run(feed), reference.run(graph, feed))):
        _check(o, r, "f32", f"train step output {k} ({graph.output_names[k]})")

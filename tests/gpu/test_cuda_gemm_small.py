"""rlx_gemm_small (few-row GEMM, bias and activation in its epilogue, launched with PDL) against rlx.reference.

Row counts at and around its limits (RLX_GSM_MAX_M = 64 rows; 65 rows run cuBLASLt + the activation pass), a
partial row tile (37), partial column tiles (N = 72, 8), K = 48 / 144 / 1536 (its largest); f16 and bf16.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.config import Config
from rlx.driver import Device, Session
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.runtime.cuda_device import compile_cuda
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

U = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8}


def _graph() -> Graph:
    """gelu(x W1 + b1) -> relu(. W2) -> . W3 + b3 -> (. W4 [1536 -> 8]): K 48 / 144 / 72 / 1536."""
    g = Graph("small_gemm")
    x = g.input("x", [Dim.dynamic("m", max=200), 48])
    h = g.activation("gelu", g.add_(g.matmul(x, g.param("w1", [48, 144])), g.param("b1", [144])))
    r = g.activation("relu", g.matmul(h, g.param("w2", [144, 72])))
    o = g.add_(g.matmul(r, g.param("w3", [72, 1536])), g.param("b3", [1536]))
    z = g.matmul(o, g.param("w4", [1536, 8]))
    g.set_outputs([h, r, o, z])
    return g


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_small_gemm_matches_reference(precision: str) -> None:
    graph = _graph()
    rng = np.random.default_rng(11)
    params = {"w1": rng.standard_normal((48, 144)).astype(np.float32) * 0.3,
              "b1": rng.standard_normal(144).astype(np.float32) * 0.5,
              "w2": rng.standard_normal((144, 72)).astype(np.float32) * 0.15,
              "w3": rng.standard_normal((72, 1536)).astype(np.float32) * 0.2,
              "b3": rng.standard_normal(1536).astype(np.float32) * 0.5,
              "w4": rng.standard_normal((1536, 8)).astype(np.float32) * 0.05}
    cg = compile_cuda(Session(Device.CUDA).lower(graph), Config.from_env(), precision=precision)
    t = "__half" if precision == "f16" else "rlx_bf16"
    assert f"rlx_gemm_small<{t}, RLX_ACT_GELU, true>" in cg.source
    assert f"rlx_gemm_small<{t}, RLX_ACT_NONE, false>" in cg.source  # w4 (K = 1536); w3's K = 72 is not whole steps
    for name, value in params.items():
        cg.set_param(name, value)
    for m in (1, 16, 37, 64, 65, 200):
        feed = {"x": rng.standard_normal((m, 48)).astype(np.float32)}
        refs = reference.run(graph, feed, params)
        outs = cg.run(feed)
        again = cg.run(feed)  # the replay of the captured CUDA graph
        for k, (o, r, o2) in enumerate(zip(outs, refs, again)):
            o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
            assert np.all(np.isfinite(o)), f"m={m} output {k}: not finite"
            # three chained roundings of storage at most, K up to 1536: 20u elementwise (against the RMS),
            # 10u in L2, as for rlx_gemm_mma
            scale = float(np.sqrt(np.mean(r * r))) or 1e-30
            err = np.abs(o - r)
            rtol = 20 * U[precision]
            assert np.all(err <= rtol * (np.abs(r) + scale)), f"m={m} output {k}: max err {err.max():.3g}"
            assert np.linalg.norm(o - r) <= 10 * U[precision] * np.linalg.norm(r), f"m={m} output {k}"
            np.testing.assert_array_equal(o, np.asarray(o2, np.float64))

"""rlx_gemm_mma (tensor-core GEMM, bias and activation in its epilogue) against rlx.reference on a GPU.

Built with `CudaTarget(fused_act_gemm=True)`: the products whose activation cuBLASLt cannot fuse run on it.
Row counts pick each of its tile configurations (on an H100's 132 SMs: 128x128 from 8448 rows at N <= 256,
64x128 from 4225, 16x64 below), and K, N and M have partial tiles.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.config import Config
from rlx.driver import Device, Session
from rlx.ir.graph import Graph
from rlx.pipeline.cuda import compile_cuda
from tests.gpu.gemm_common import GPU_ONLY, U, gemm_chain, scaled_normal

pytestmark = GPU_ONLY


def _graph() -> Graph:
    """gelu(x W1 + b1) -> silu(. W2) -> sigmoid(. W3 + b3): K 40 / 136 / 64, N 136 / 64 / 8."""
    return gemm_chain("mma_gemm", 9000, 40, [(136, True, "gelu"), (64, False, "silu"), (8, True, "sigmoid")])


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_fused_epilogue_gemm_matches_reference(precision: str) -> None:
    graph = _graph()
    rng = np.random.default_rng(7)
    params = scaled_normal(rng, {"w1": ((40, 136), 0.3), "b1": ((136,), 0.5), "w2": ((136, 64), 0.15),
                                 "w3": ((64, 8), 0.2), "b3": ((8,), 0.5)})
    cg = compile_cuda(Session(Device.CUDA).lower(graph), Config.from_env(), precision=precision,
                      fused_act_gemm=True)
    src = cg.source
    for cfg in ("128, 128, 2, 4", "64, 128, 2, 4", "16, 64, 1, 4"):
        assert f"rlx_gemm_mma<{'__half' if precision == 'f16' else 'rlx_bf16'}, RLX_ACT_GELU, true, {cfg}>" in src
    assert "rlx_bias_act_vec<" not in src  # no separate activation pass
    for name, value in params.items():
        cg.set_param(name, value)
    for m in (8448, 5000, 37, 1):
        feed = {"x": rng.standard_normal((m, 40)).astype(np.float32)}
        refs = reference.run(graph, feed, params)
        outs = cg.run(feed)
        again = cg.run(feed)  # the replay of the captured CUDA graph
        for k, (o, r, o2) in enumerate(zip(outs, refs, again)):
            o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
            # three chained roundings of storage at most: 20u elementwise (against the RMS), 10u in L2
            scale = float(np.sqrt(np.mean(r * r))) or 1e-30
            err = np.abs(o - r)
            rtol = 20 * U[precision]
            assert np.all(err <= rtol * (np.abs(r) + scale)), f"m={m} output {k}: max err {err.max():.3g}"
            assert np.linalg.norm(o - r) <= 10 * U[precision] * np.linalg.norm(r), f"m={m} output {k}"
            np.testing.assert_array_equal(o, np.asarray(o2, np.float64))

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
from tests.gpu.gemm_common import GPU_ONLY, U, build_with_params, gemm_chain, norm_graph, scaled_normal

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


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_a_norm_before_an_mma_gemm_runs_in_every_step(precision: str) -> None:
    """layer_norm(x) feeds a GEMM with bias + erf GELU, which rlx_gemm_mma runs in every step: that kernel has no
    norm prologue, so the norm's own kernel runs for steps of few rows too (no NormInGemm decision; it once ran
    above 64 rows only, and the GEMM read an A nothing had written). Every output against the float64 reference,
    no worse than the build without small GEMMs and PDL (the norms' own kernels everywhere)."""
    graph = norm_graph()
    rng = np.random.default_rng(13)
    shapes = {"g1": (64,), "be1": (64,), "w1": (64, 128), "b1": (128,), "w2": (128, 64), "g2": (64,), "be2": (64,),
              "w3": (64, 64), "b3": (64,), "g3": (64,), "w4": (64, 32)}
    params = {k: (rng.standard_normal(v) * (0.2 if len(v) == 2 else 0.5) + (1.0 if k[0] == "g" else 0.0))
              .astype(np.float32) for k, v in shapes.items()}
    cg = build_with_params(graph, precision, params, fused_act_gemm=True)
    base = build_with_params(graph, precision, params, fused_act_gemm=True, small_gemm=False, pdl=False)
    assert "RLX_ACT_GELU, true, 16, 64, 1, 4>" in cg.source  # the GELU product on rlx_gemm_mma
    u = U[precision]
    for m in (1, 16, 64, 65):
        feed = {"x": rng.standard_normal((m, 64)).astype(np.float32)}
        refs = reference.run(graph, feed, params)
        for k, (o, b, r) in enumerate(zip(cg.run(feed), base.run(feed), refs)):
            o, b, r = (np.asarray(v, np.float64) for v in (o, b, r))
            assert np.all(np.isfinite(o)), f"m={m} output {k}: not finite"
            scale = float(np.sqrt(np.mean(r * r))) or 1e-30
            assert np.abs(o - r).max() <= 2 * np.abs(b - r).max() + 4 * u * scale, f"m={m} output {k}"

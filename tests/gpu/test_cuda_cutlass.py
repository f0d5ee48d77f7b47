"""The CUTLASS sm90 GEMM unit (bias + erf GELU / SiLU in a TMA + wgmma kernel's epilogue) against rlx.reference.

Runs on an sm_90 GPU with CUTLASS's headers installed (the nvidia-cutlass wheel, an optional dependency):
the products whose activation cuBLASLt cannot fuse run `rlx_cutlass_gemm_<dt>_<act>`, M is not a multiple of
the 128-row tile (TMA clips the last tile), N and K are multiples of 8 but not of the tile.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.config import Config
from rlx.driver import Device, Session
from rlx.ir.graph import Graph
from rlx.pipeline.cuda import compile_cuda
from rlx.toolchain.cuda import visible_gpu_arch
from rlx.toolchain.cuda_units import cutlass_for
from tests.gpu.gemm_common import GPU_ONLY, U, gemm_chain, scaled_normal

pytestmark = [*GPU_ONLY,
              pytest.mark.skipif(visible_gpu_arch() not in ("sm_90", "sm_90a"), reason="the CUTLASS GEMMs are sm_90"),
              pytest.mark.skipif(not cutlass_for().found, reason="CUTLASS headers not installed (nvidia-cutlass)")]


def _graph() -> Graph:
    """gelu(x W1 + b1) -> silu(. W2) -> . W3 + b3: K 64 / 1032 / 72, N 1032 / 72 / 24.

    At 9000 rows the first product's 256-row tiles cover an H100 twice (36 x 9 >= 264): the _m256 kernel; at
    fewer rows, and for the second product, the _m128 one."""
    return gemm_chain("cutlass_gemm", 9000, 64, [(1032, True, "gelu"), (72, False, "silu"), (24, True, None)])


_SHAPES = {"w1": ((64, 1032), 0.25), "b1": ((1032,), 0.5), "w2": ((1032, 72), 0.05), "w3": ((72, 24), 0.2),
           "b3": ((24,), 0.5)}


def _check(outs, refs, again, precision: str, m: int) -> None:
    for k, (o, r, o2) in enumerate(zip(outs, refs, again)):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        # three chained roundings of storage at most: 20u elementwise (against the RMS), 10u in L2
        scale = float(np.sqrt(np.mean(r * r))) or 1e-30
        err = np.abs(o - r)
        assert np.all(err <= 20 * U[precision] * (np.abs(r) + scale)), f"m={m} output {k}: max err {err.max():.3g}"
        assert np.linalg.norm(o - r) <= 10 * U[precision] * np.linalg.norm(r), f"m={m} output {k}"
        np.testing.assert_array_equal(o, np.asarray(o2, np.float64))


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_cutlass_gemm_matches_reference(precision: str) -> None:
    graph = _graph()
    rng = np.random.default_rng(11)
    params = scaled_normal(rng, _SHAPES)
    cg = compile_cuda(Session(Device.CUDA).lower(graph), Config.from_env(), precision=precision)
    src = cg.source
    assert f"rlx_cutlass_gemm_{precision}_gelu_m128)(" in src and f"rlx_cutlass_gemm_{precision}_silu_m128)(" in src
    assert "rlx_bias_act_vec<" not in src  # no separate activation pass
    for name, value in params.items():
        cg.set_param(name, value)
    for m in (9000, 4097, 129, 65, 37):  # partial 128-row tiles; 37 rows: rlx_gemm_small's steps
        feed = {"x": rng.standard_normal((m, 64)).astype(np.float32)}
        _check(cg.run(feed), reference.run(graph, feed, params), cg.run(feed), precision, m)


def test_off_matches_on() -> None:
    """CudaTarget(cutlass_gemm=False): cuBLASLt and the separate pass; both builds agree with the reference."""
    graph = _graph()
    rng = np.random.default_rng(5)
    params = scaled_normal(rng, _SHAPES)
    off = compile_cuda(Session(Device.CUDA).lower(graph), Config.from_env(), precision="f16", cutlass_gemm=False)
    assert "rlx_cutlass_gemm_" not in off.source and "rlx_bias_act_vec<__half, RLX_ACT_GELU" in off.source
    for name, value in params.items():
        off.set_param(name, value)
    feed = {"x": rng.standard_normal((3000, 64)).astype(np.float32)}
    _check(off.run(feed), reference.run(graph, feed, params), off.run(feed), "f16", 3000)

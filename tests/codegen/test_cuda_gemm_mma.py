"""rlx_gemm_mma (bias + activation in a tensor-core GEMM's epilogue): which products take it, and nvcc compiles it.

Runs without a GPU; tests/gpu/test_cuda_gemm_mma.py checks its numbers on one.
"""

from __future__ import annotations

import pytest

from rlx.codegen.cuda import CudaTarget
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from tests.gpu.gemm_common import forward, gemm_chain, nvcc_compiles, render


def _graph(n: int = 136) -> Graph:
    """gelu(x W1 + b1) (cuBLASLt cannot fuse erf GELU) then relu(. W2 + b2) (cuBLASLt's epilogue can)."""
    return gemm_chain("mma_rule", 512, 40, [(n, True, "gelu"), (64, True, "relu")], every_output=False)


def _launches(src: str, kernel: str) -> int:
    return forward(src).count(kernel + "<")


def test_only_unfusable_activations_move_to_the_mma_gemm() -> None:
    on = render(_graph(), precision=DType.F16, fused_act_gemm=True)
    assert _launches(on, "rlx_gemm_mma") == 3  # one GEMM, three tile configurations picked at run time
    assert "rlx_bias_act_vec<" not in forward(on)
    assert forward(on).count("rlx_lt_matmul(") == 1  # the relu product: fused by cuBLASLt's epilogue
    assert "RlxGemmMma<128, 128, 2, 4>::total" in on  # its shared-memory limit is raised at create
    off = render(_graph(), precision=DType.F16, cutlass_gemm=False)  # (on: the CUTLASS GEMM, test_cuda_cutlass.py)
    assert "rlx_gemm_mma" not in off and "rlx_bias_act_vec<__half, RLX_ACT_GELU" in off
    # f32, or N not a whole number of 16-byte chunks: cuBLASLt and the separate pass, as before
    for src in (render(_graph(), fused_act_gemm=True), render(_graph(n=132 + 2), precision=DType.F16,
                                                                 fused_act_gemm=True)):
        assert "rlx_gemm_mma" not in src
    assert "fused_act_gemm=1" in CudaTarget(fused_act_gemm=True).identity()
    assert "fused_act_gemm" not in CudaTarget().identity()


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_mma_gemm_compiles(precision: str, tmp_path) -> None:
    nvcc_compiles(render(_graph(), precision=DType.parse(precision), fused_act_gemm=True), tmp_path / "mma.cu")

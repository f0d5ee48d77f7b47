"""rlx_gemm_small (few-row GEMM, bias and activation in its epilogue) and programmatic dependent launch: which
products and kernels take them, and nvcc compiles the result. Runs without a GPU; tests/gpu/test_cuda_gemm_small.py
checks the numbers on one."""

from __future__ import annotations

import pytest

from rlx.codegen.cuda import CudaTarget, render_cuda
from rlx.errors import BuildError
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc


def _graph(k: int = 48) -> Graph:
    """gelu(x W1 + b1) (erf GELU: cuBLASLt needs a separate pass) then relu(. W2) with K = 144, N = 64."""
    g = Graph("small_rule")
    x = g.input("x", [Dim.dynamic("m", max=256), k])
    h = g.activation("gelu", g.add_(g.matmul(x, g.param("w1", [k, 144])), g.param("b1", [144])))
    r = g.activation("relu", g.matmul(h, g.param("w2", [144, 64])))
    g.set_outputs([r])
    return g


def _render(graph: Graph, **target) -> str:
    from rlx.driver import lower_to_lir, to_mir

    return render_cuda(lower_to_lir(to_mir(graph), 2, backend="cuda"), CudaTarget(**target), {"name": "m"})


def _forward(src: str) -> str:
    start = src.index("static int rlx_forward(")
    return src[start:src.index("\n}\n", start)]


def test_half_products_of_few_rows_take_the_small_gemm() -> None:
    src = _forward(_render(_graph(), precision=DType.F16))
    # both products: the small kernel for M <= RLX_GSM_MAX_M, cuBLASLt (+ the erf-GELU pass) above
    assert src.count("rlx_gemm_small<__half, RLX_ACT_GELU, true>") == 1
    assert src.count("rlx_gemm_small<__half, RLX_ACT_RELU, false>") == 1
    assert src.count("M <= RLX_GSM_MAX_M") == 2 and src.count("rlx_lt_matmul(") == 2


def test_the_small_gemm_is_not_taken_where_it_cannot_run() -> None:
    assert "rlx_gemm_small" not in _render(_graph())  # f32 stays on cuBLASLt
    assert "rlx_gemm_small" not in _render(_graph(), precision=DType.F16, small_gemm=False)
    # K = 40 is not whole 16-deep steps: only the second product (K = 144) takes it
    assert _forward(_render(_graph(k=40), precision=DType.BF16)).count("rlx_gemm_small<") == 1
    assert "small_gemm=0" in CudaTarget(small_gemm=False).identity()
    assert "small_gemm" not in CudaTarget().identity() and "pdl" not in CudaTarget().identity()


def test_pdl_launches_only_kernels_that_wait() -> None:
    on = _forward(_render(_graph(), precision=DType.F16))
    off = _forward(_render(_graph(), precision=DType.F16, pdl=False))
    assert on.count("rlx_launch_pdl(") >= 3 and "rlx_launch_pdl(" not in off
    assert "pdl=0" in CudaTarget(pdl=False).identity()


@pytest.mark.parametrize("precision", [DType.F16, DType.BF16])
def test_nvcc_compiles_small_gemm_and_pdl(precision: DType, tmp_path) -> None:
    try:
        path, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    cublas = find_cublas(path)
    if not cublas.found:
        pytest.skip("cublasLt.h is not installed")
    tc = NvccToolchain(path, text, "sm_90", cublas)
    src = tmp_path / "small.cu"
    src.write_text(_render(_graph(), precision=precision))
    tc.compile(src, src.with_suffix(".o"), "cublaslt", compile_only=True)

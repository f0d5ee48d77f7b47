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
    assert src.count("rlx_gemm_small<__half, RLX_ACT_GELU, true, 0, false, 1>") == 1
    assert src.count("rlx_gemm_small<__half, RLX_ACT_RELU, false, 0, false, 1>") == 1
    assert src.count("M <= RLX_GSM_MAX_M") == 2 and src.count("rlx_lt_matmul(") == 2


def test_the_small_gemm_is_not_taken_where_it_cannot_run() -> None:
    assert "rlx_gemm_small" not in _render(_graph())  # f32 stays on cuBLASLt
    assert "rlx_gemm_small" not in _render(_graph(), precision=DType.F16, small_gemm=False)
    # K = 40 is not whole 16-deep steps: only the second product (K = 144) takes it
    assert _forward(_render(_graph(k=40), precision=DType.BF16)).count("rlx_gemm_small<") == 1
    assert "small_gemm=0" in CudaTarget(small_gemm=False).identity()
    assert "small_gemm" not in CudaTarget().identity() and "pdl" not in CudaTarget().identity()


def _norm_graph(keep_s: bool = True) -> Graph:
    """layer_norm(x) -> GEMM; layer_norm(s + x) -> GEMM (s kept live or not); rms_norm(o) -> GEMM."""
    g = Graph("small_norm")
    x = g.input("x", [Dim.dynamic("m", max=200), 64])
    h1 = g.layer_norm(x, g.param("g1", [64]), g.param("be1", [64]), 1e-5)
    y1 = g.activation("gelu", g.add_(g.matmul(h1, g.param("w1", [64, 128])), g.param("b1", [128])))
    s = g.matmul(y1, g.param("w2", [128, 64]))
    h2 = g.layer_norm(g.add_(s, x), g.param("g2", [64]), g.param("be2", [64]), 1e-5)
    y2 = g.add_(g.matmul(h2, g.param("w3", [64, 64])), g.param("b3", [64]))
    o = g.add_(g.add_(y2, h2), s) if keep_s else g.add_(y2, h2)
    h3 = g.rms_norm(o, g.param("g3", [64]), 1e-6)
    y3 = g.matmul(h3, g.param("w4", [64, 32]))
    g.set_outputs([y1, o, y3])
    return g


def test_norms_before_small_gemms_move_into_their_prologue() -> None:
    src = _forward(_render(_norm_graph(), precision=DType.F16))
    for norm in ("1, false, 1", "1, true, 1", "2, false, 1"):  # layer norm, + residual, RMS norm
        assert src.count(f", {norm}>, dim3(") == 1
    # each norm's own kernel runs only in steps the small GEMM does not take
    assert src.count("if (S[0] > 64) {  /* (a step of <= 64 rows: done in the prologue of") == 3
    # the GEMM after the residual norm may write where the residual lived (s dies there): its blocks would race
    racy = _forward(_render(_norm_graph(keep_s=False), precision=DType.F16))
    assert ", 1, true, 1>, dim3(" not in racy and racy.count("done in the prologue of") == 2
    assert "done in the prologue" not in _forward(_render(_norm_graph(), precision=DType.F16, small_gemm=False))


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


def test_only_weights_are_read_before_the_pdl_wait() -> None:
    g = Graph("small_early")
    x = g.input("x", [Dim.dynamic("m", max=64), 32])
    w = g.input("w", [32, 16])  # an input, not a param: the kernel before may still be writing it
    y = g.add_(g.matmul(x, w), g.param("b", [16]))
    g.set_outputs([g.matmul(y, g.param("w2", [16, 16]))])
    src = _forward(_render(g, precision=DType.F16))
    # the first product: B after the wait, its bias before (bit 1); the second: both before (bits 0 and 1)
    assert "(int)M, (int)N, (int)K, (__half *)nullptr, (__half *)nullptr, (__half *)nullptr, (__half *)nullptr, " \
           "(__half *)nullptr, 0.0f, 2)" in src
    assert src.count("0.0f, 3)") == 1

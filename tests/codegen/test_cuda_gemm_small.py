"""rlx_gemm_small (few-row GEMM, bias and activation in its epilogue) and programmatic dependent launch: which
products and kernels take them, and nvcc compiles the result. Runs without a GPU; tests/gpu/test_cuda_gemm_small.py
checks the numbers on one."""

from __future__ import annotations

import pytest

from rlx.codegen.cuda import CudaTarget
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from tests.gpu.gemm_common import forward, gemm_chain, norm_graph, nvcc_compiles, render


def _graph(k: int = 48) -> Graph:
    """gelu(x W1 + b1) (erf GELU: cuBLASLt needs a separate pass) then relu(. W2) with K = 144, N = 64."""
    return gemm_chain("small_rule", 256, k, [(144, True, "gelu"), (64, False, "relu")], every_output=False)


def test_half_products_of_few_rows_take_the_small_gemm() -> None:
    src = forward(render(_graph(), precision=DType.F16))
    # both products: the small kernel for M <= RLX_GSM_MAX_M, cuBLASLt (+ the erf-GELU pass) above
    assert src.count("rlx_gemm_small<__half, RLX_ACT_GELU, true, 0, false, 1>") == 1
    assert src.count("rlx_gemm_small<__half, RLX_ACT_RELU, false, 0, false, 1>") == 1
    assert src.count("M <= RLX_GSM_MAX_M") == 2
    assert src.count("rlx_lt_matmul(") + src.count("rlx_cutlass_gemm_f16_gelu_m128)(") == 2  # (gelu: CUTLASS)


def test_the_small_gemm_is_not_taken_where_it_cannot_run() -> None:
    assert "rlx_gemm_small" not in render(_graph())  # f32 stays on cuBLASLt
    assert "rlx_gemm_small" not in render(_graph(), precision=DType.F16, small_gemm=False)
    # K = 40 is not whole 16-deep steps: only the second product (K = 144) takes it
    assert forward(render(_graph(k=40), precision=DType.BF16)).count("rlx_gemm_small<") == 1
    assert "small_gemm=0" in CudaTarget(small_gemm=False).identity()
    assert "small_gemm" not in CudaTarget().identity() and "pdl" not in CudaTarget().identity()


def test_norms_before_small_gemms_move_into_their_prologue() -> None:
    src = forward(render(norm_graph(), precision=DType.F16))
    for norm in ("1, false, 1", "1, true, 1", "2, false, 1"):  # layer norm, + residual, RMS norm
        assert src.count(f", {norm}>, dim3(") == 1
    # each norm's own kernel runs only in steps the small GEMM does not take
    assert src.count("if (S[0] > 64) {  /* (a step of <= 64 rows: done in the prologue of") == 3
    # planned without the hold, the GEMM after the residual norm may write where the residual lived (s dies
    # there): its blocks would race, so the norm keeps its kernel
    racy = forward(render(norm_graph(keep_s=False), hold=False, precision=DType.F16))
    assert ", 1, true, 1>, dim3(" not in racy and racy.count("done in the prologue of") == 2
    # the CUDA plan holds s through that GEMM (memplan's hold_norm_inputs): the norm moves into its prologue
    held = forward(render(norm_graph(keep_s=False), precision=DType.F16))
    assert held.count(", 1, true, 1>, dim3(") == 1 and held.count("done in the prologue of") == 3
    assert "done in the prologue" not in forward(render(norm_graph(), precision=DType.F16, small_gemm=False))


def test_pdl_launches_only_kernels_that_wait() -> None:
    # (without the CUTLASS GEMM: its erf-GELU pass is a third PDL launch)
    on = forward(render(_graph(), precision=DType.F16, cutlass_gemm=False))
    off = forward(render(_graph(), precision=DType.F16, pdl=False, cutlass_gemm=False))
    assert on.count("rlx_launch_pdl(") >= 3 and "rlx_launch_pdl(" not in off
    assert "pdl=0" in CudaTarget(pdl=False).identity()


@pytest.mark.parametrize("precision", [DType.F16, DType.BF16])
def test_nvcc_compiles_small_gemm_and_pdl(precision: DType, tmp_path) -> None:
    nvcc_compiles(render(_graph(), precision=precision), tmp_path / "small.cu")


def test_only_weights_are_read_before_the_pdl_wait() -> None:
    g = Graph("small_early")
    x = g.input("x", [Dim.dynamic("m", max=64), 32])
    w = g.input("w", [32, 16])  # an input, not a param: the kernel before may still be writing it
    y = g.add_(g.matmul(x, w), g.param("b", [16]))
    g.set_outputs([g.matmul(y, g.param("w2", [16, 16]))])
    src = forward(render(g, precision=DType.F16))
    # the first product: B after the wait, its bias before (bit 1); the second: both before (bits 0 and 1)
    assert "(int)M, (int)N, (int)K, (__half *)nullptr, (__half *)nullptr, (__half *)nullptr, (__half *)nullptr, " \
           "(__half *)nullptr, 0.0f, 2, (__half *)nullptr, (__half *)nullptr, RlxGsmMembers{})" in src  # (no addend,
    # no B2, no siblings)
    assert src.count("0.0f, 3, (__half *)nullptr, (__half *)nullptr, RlxGsmMembers{})") == 1


def test_the_small_gemm_keeps_to_what_the_arch_lets_a_block_opt_into() -> None:
    """rlx_gemm_small's shared memory grows with K (64 K + 8448 bytes): on sm_90 / sm_80 it takes K up to 1536 (107 KB),
    on the 99 KB parts (sm_86, sm_89, sm_120) up to 1440, and the limit raised at load is the arch's largest K's, so a
    consumer GPU never sees a request past its opt-in limit (the load would fail) or a launch it cannot run."""
    from rlx.opt.lowering_cuda_kernels import small_gemm_kmax

    assert [small_gemm_kmax(a) for a in ("sm_90", "sm_90a", "sm_80", "sm_87", "sm_86", "sm_89", "sm_120")] == \
        [1536, 1536, 1536, 1536, 1440, 1440, 1440]
    for k, arch, small in ((1536, "sm_90", True), (1536, "sm_80", True), (1536, "sm_89", False),
                           (1440, "sm_89", True), (1456, "sm_86", False)):
        src = render(gemm_chain(f"k{k}", 64, k, [(64, False, "relu")]), precision=DType.F16, arch=arch)
        assert ("rlx_gemm_small<" in forward(src)) == small, (k, arch)
        if small:
            assert f"rlx_gemm_small_smem({small_gemm_kmax(arch)})" in src

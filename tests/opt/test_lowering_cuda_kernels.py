"""The CUDA kernel choices are LIR decisions (rlx/opt/lowering_cuda_kernels.py): made by the lowering for the
target's options, printed with the LIR, and the only thing the codegen reads about them."""

from __future__ import annotations

import pytest

from rlx.codegen.cuda import CudaTarget, render_cuda
from rlx.driver import lower_to_lir, to_mir
from rlx.errors import BuildError
from rlx.ir.decisions_cuda_kernels import CudaKernelOptions, CutlassGemm, GatherInRegion, NormInGemm
from rlx.ir.dtype import DType
from rlx.pipeline.cuda import decide_cuda as lower_cuda
from tests.gpu.gemm_common import forward, gemm_chain, norm_graph
from tests.gpu.region_gather_common import embed_graph


def _lir(graph, **target):
    return lower_cuda(lower_to_lir(to_mir(graph), 2, backend="cuda"), CudaTarget(**target))


def test_cutlass_verdicts_are_recorded_with_their_reasons() -> None:
    chain = gemm_chain("cutlass_rule", 512, 40, [(136, True, "gelu"), (64, False, "silu"), (32, True, "relu")],
                       every_output=False)
    on = _lir(chain, precision=DType.F16).decided(CutlassGemm)
    assert [(d.act, d.function) for d in on] == [("gelu", "rlx_cutlass_gemm_f16_gelu"),
                                                 ("silu", "rlx_cutlass_gemm_f16_silu")]  # relu: cuBLASLt fuses it
    off = _lir(chain, precision=DType.F16, cutlass_gemm=False).decided(CutlassGemm)
    assert [d.function for d in off] == ["", ""] and all("cutlass_gemm=False" in d.why for d in off)
    assert all("the target is sm_80" in d.why for d in _lir(chain, precision=DType.F16, arch="sm_80").decided(
        CutlassGemm))
    # the mma GEMM takes unfusable activations when asked: no CUTLASS question arises
    assert not _lir(chain, precision=DType.F16, fused_act_gemm=True).decided(CutlassGemm)
    assert not _lir(chain, gemm="builtin").decided(CutlassGemm)


def test_gathers_in_regions_follow_the_target_option() -> None:
    # e = (word[ids] + pos_table[pos]) * scale: both lookups are done by the region (%7)
    assert [(d.gather, d.region) for d in _lir(embed_graph()).decided(GatherInRegion)] == [(3, 7), (5, 7)]
    assert not _lir(embed_graph(), gather_region=False).decided(GatherInRegion)
    # the word lookup is an output too: it keeps its own kernel
    assert [(d.gather, d.region) for d in _lir(embed_graph(leak=True)).decided(GatherInRegion)] == [(5, 7)]
    # a table written by the caller per run is not a weight
    assert [d.gather for d in _lir(embed_graph(table_input=True)).decided(GatherInRegion)] == [5]


def test_norms_in_small_gemms() -> None:
    norms = _lir(norm_graph(), precision=DType.F16).decided(NormInGemm)
    assert [(d.norm, d.gemm, d.max_rows) for d in norms] == [(3, 6, 64), (11, 14, 64), (17, 19, 64)]
    assert not _lir(norm_graph(), precision=DType.F16, small_gemm=False).decided(NormInGemm)
    assert not _lir(norm_graph()).decided(NormInGemm)  # f32: no small GEMM
    assert not _lir(norm_graph(), precision=DType.F16, arch="sm_75").decided(NormInGemm)


def test_no_norm_in_a_gemm_that_runs_the_mma_kernel() -> None:
    """With fused_act_gemm, a GEMM with an unfusable activation runs rlx_gemm_mma in every step, which has no
    prologue: its norm keeps its own kernel in small steps too (before, the norm was skipped for them and the GEMM
    read A before anything wrote it)."""
    graph = norm_graph()  # layer_norm(x) -> GEMM + bias + gelu: the first norm feeds an unfusable activation
    lir = _lir(graph, precision=DType.F16, fused_act_gemm=True)
    gelu_gemms = {n.id for n in lir.graph.nodes if getattr(n.op, "activation", None) == "gelu"}
    assert gelu_gemms and not [d for d in lir.decided(NormInGemm) if d.gemm in gelu_gemms]
    src = forward(render_cuda(lir, CudaTarget(precision=DType.F16, fused_act_gemm=True), {"name": "n"}))
    assert "rlx_gemm_mma<__half, RLX_ACT_GELU" in src
    default = _lir(graph, precision=DType.F16)
    assert [d for d in default.decided(NormInGemm) if d.gemm in gelu_gemms]  # without it, the small GEMM does it


def test_codegen_refuses_a_lir_decided_for_other_options() -> None:
    lir = _lir(norm_graph(), precision=DType.F16)
    (options,) = lir.decided(CudaKernelOptions)
    assert options == CudaKernelOptions("sm_90", True, True, True, True, False)
    assert "kernel choices for sm_90: CUTLASS GEMMs on" in lir.inspect()
    for other in (CudaTarget(precision=DType.F16, small_gemm=False), CudaTarget(precision=DType.F16, arch="sm_80"),
                  CudaTarget(precision=DType.F16, cutlass_gemm=False)):
        with pytest.raises(BuildError, match="the LIR was lowered with kernel choices for sm_90"):
            render_cuda(lir, other, {"name": "n"})

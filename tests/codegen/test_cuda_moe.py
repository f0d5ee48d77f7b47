"""The MoE ops on CUDA (compile-only: nvcc, no GPU) and on Metal (refused before any build).

The f32 build of the `moe_ops` case is `tests/codegen/test_cuda_compile.py`'s; here the f16 build (half
activations and logits, f16 / f32-stored-as-f16 / block experts), the decision named in the source,
and Metal's refusal naming the op.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import rlx
from rlx.codegen.backends import first_unsupported_op
from rlx.codegen.cuda import CudaTarget
from rlx.errors import BuildError
from rlx.ir.decisions_moe import MoeExpertPlan
from rlx.ir.dtype import DType
from rlx.opt.memplan import plan
from rlx.pipeline.cuda import decide_cuda, render_cuda
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases", Path(__file__).parent.parent / "gpu" / "cases.py")
cases = sys.modules.get("rlx_cuda_cases")
if cases is None:
    cases = importlib.util.module_from_spec(_spec)
    sys.modules["rlx_cuda_cases"] = cases
    _spec.loader.exec_module(cases)


def test_cuda_source_takes_the_decided_paths_and_compiles_in_f16(tmp_path: Path) -> None:
    g = cases.CASES["moe_ops"]().graph
    target = CudaTarget(precision=DType.F16, gemm="builtin")
    lir = decide_cuda(plan(g), target)
    plans = lir.decided(MoeExpertPlan)  # up to 40 tokens x top-2: grouped, a GEMV per pair in steps of <= 16 pairs
    assert [(p.path, p.gemv_max_pairs, p.chunk_pairs) for p in plans] == [("grouped", 16, 80)] * 5
    src = render_cuda(plan(g), target, {"name": g.name})
    assert src.count("rlx_moe_gemv<__half, __half, __half>") == 3  # f32 experts stored in f16, and f16 experts
    assert src.count("rlx_moe_group_gemm<__half, __half, __half, -1, 32, 1>") == 3
    assert "rlx_moe_qgemv<__half, __half, RLX_Q8_0, 32, 34>" in src and "RLX_Q4_K, 256, 144>" in src
    assert "rlx_moe_group_gemm<__half, uint8_t, __half, RLX_Q8_0, 32, 34>" in src
    assert src.count("if (pairs > 16) {") == 5 and src.count("rlx_moe_sort<__half>") == 5
    assert "moe_matmul: pairs sorted by expert, 80 at a time, one GEMM per expert group" in src
    try:
        path, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    cu = tmp_path / "moe_ops_f16.cu"
    cu.write_text(src)
    NvccToolchain(path, text, "sm_90", find_cublas(path)).compile(cu, cu.with_suffix(".o"), "builtin",
                                                                  compile_only=True)
    assert cu.with_suffix(".o").stat().st_size > 0


def test_metal_refuses_moe_before_any_build() -> None:
    g = rlx.Graph("moe_metal")
    ids, gate = g.moe_router(g.input("logits", [1, 8]), top_k=2, normalize=True)
    g.set_outputs([g.moe_matmul(g.input("x", [1, 32]), ids, g.param("w", [8, 4, 32])), gate])
    node, reason = first_unsupported_op(g, "metal")
    assert node.kind == "moe_topk" and reason == "the METAL backend has no rule for moe_topk"
    session = rlx.Session(rlx.Device.METAL)
    assert not session.supports(g)
    with pytest.raises(BuildError, match="METAL backend has no rule for moe_topk"):
        session.render(g)


def test_moe_decoder_step_renders_for_cuda() -> None:
    """A whole MoE decoder step (`build_decoder` of a Qwen3-MoE-shaped config: a sparse layer with Q8_0 experts
    beside a dense one) lowers for CUDA at the optimizing level, takes a decided expert plan per `moe_matmul`
    and renders the MoE kernels (their nvcc build is the `moe_ops` case's, in test_cuda_compile.py: a whole
    decoder's build would add a minute of nvcc on CI's two cores)."""
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import WeightSpec, build_decoder, random_specs
    from rlx.models.moe import MoeConfig
    from rlx.pipeline import lower_to_lir

    cfg = DecoderConfig(arch="qwen3_moe", vocab_size=64, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=16, ffn_size=96, rope_variant="neox", context_length=64, qk_norm=True,
                        moe=MoeConfig(hidden_size=64, num_experts=4, top_k=2, intermediate_size=32, normalize=False),
                        moe_layers=(True, False))
    specs = {n: WeightSpec("q8_0", s.shape) if ".experts." in n else s for n, s in random_specs(cfg).items()}
    lir = lower_to_lir(build_decoder(cfg, specs, max_batch=2, max_seq=8, capacity=32), 2, backend="cuda")
    target = CudaTarget(precision=DType.F32, gemm="builtin")
    assert len(decide_cuda(lir, target).decided(MoeExpertPlan)) == 2
    src = render_cuda(lir, target, {"name": "moe_decoder"})
    for kernel in ("rlx_moe_topk<float>", "rlx_moe_gate<float, float>", "rlx_moe_qgemv<float, float, RLX_Q8_0, 32, 34>",
                   "rlx_moe_group_gemm<float, uint8_t, float, RLX_Q8_0, 32, 34>"):
        assert kernel in src, kernel

"""The short-KV attention kernel (rlx_attn_short): chosen from the keys' static bound, included only when used,
and compiled by nvcc for every mask mode (no GPU needed; tests/gpu/test_cuda_attention_short.py runs it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlx.codegen.cuda import CudaTarget, render_cuda
from rlx.errors import BuildError
from rlx.ir.dtype import DType
from rlx.opt.memplan import plan
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases", Path(__file__).parent.parent / "gpu" / "cases.py")
cases = importlib.util.module_from_spec(_spec)
sys.modules["rlx_cuda_cases"] = cases
_spec.loader.exec_module(cases)

F16 = CudaTarget(precision=DType.F16, gemm="builtin")


def _render(target: CudaTarget = F16, **kw) -> str:
    case = cases._attention_case("attn", **kw)
    return render_cuda(plan(case.graph), target, {"name": "attn"})


def test_short_kernel_is_chosen_from_the_static_key_bound() -> None:
    src = _render(heads=12, kv_heads=12, head_dim=32, mask="padding", sq=[128, 3])
    assert "rlx_attn_short<__half, int64_t, 32, RLX_MASK_PADDING, 128><<<" in src
    # its shared-memory limit is raised once, for the largest block (8 warps)
    assert "cudaFuncSetAttribute(rlx_attn_short<__half, int64_t, 32, RLX_MASK_PADDING, 128>" in src
    assert "RlxShortSmem<32, 128>::total(8)" in src
    assert "rlx_attn_fa<" not in src.split("rlx_forward")[-1]
    # more than 128 keys, head_dim above 64, or f32: the tiled kernels, and the header stays out
    for kw, target in ((dict(heads=4, kv_heads=4, head_dim=32, mask="none", sq=[129]), F16),
                       (dict(heads=2, kv_heads=2, head_dim=80, mask="bias", sq=[45]), F16),
                       (dict(heads=4, kv_heads=4, head_dim=32, mask="none", sq=[64]), CudaTarget(gemm="builtin")),
                       (dict(heads=4, kv_heads=4, head_dim=32, mask="none", sq=[64]),
                        CudaTarget(precision=DType.F16, gemm="builtin", short_attention=False))):
        src = _render(target, **kw)
        assert "rlx_attn_short" not in src and "RlxShortSmem" not in src


def test_short_kernel_compiles_for_every_mask(tmp_path: Path) -> None:
    try:
        nvcc, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    tc = NvccToolchain(nvcc, text, "sm_90", find_cublas(nvcc))
    for i, (mask, d, prec) in enumerate((("padding", 32, DType.F16), ("causal", 64, DType.BF16),
                                         ("bias", 16, DType.F16), ("none", 64, DType.F16))):
        src = _render(CudaTarget(precision=prec, gemm="builtin"), heads=4, kv_heads=2, head_dim=d, mask=mask,
                      sq=[100, 7], skv=[128, 9])
        assert "rlx_attn_short<" in src
        path = tmp_path / f"short_{i}.cu"
        path.write_text(src)
        tc.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)

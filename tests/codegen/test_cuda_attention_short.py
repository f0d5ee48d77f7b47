"""The short-KV attention kernel (rlx_attn_short): chosen from the keys' static bound, included only when used,
and compiled by nvcc for every mask mode (no GPU needed; tests/gpu/test_cuda_attention_short.py runs it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlx.codegen.cuda import CudaTarget
from rlx.errors import BuildError
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.opt.memplan import plan
from rlx.pipeline.cuda import render_cuda
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
    # rlx_attn_short2 by default (64-key chunks), launched with programmatic dependent launch (the kernel waits
    # before reading), or plainly without it
    new = "rlx_attn_short2<__half, int64_t, 32, RLX_MASK_PADDING, 128, 64>"
    assert f"rlx_launch_pdl(c->pdl, {new}, " in src
    no_pdl = _render(CudaTarget(precision=DType.F16, gemm="builtin", pdl=False), heads=12, kv_heads=12, head_dim=32,
                     mask="padding", sq=[128, 3])
    assert f"{new}<<<" in no_pdl
    assert "rlx_launch_pdl(c->pdl" not in no_pdl
    # its shared-memory limit is raised once, for the largest block (8 warps)
    assert f"cudaFuncSetAttribute({new}" in src
    assert "RlxShortSmem<32, 128>::total(8)" in src
    assert "rlx_attn_fa<" not in src.split("rlx_forward")[-1]
    assert "rlx_attn_short<" not in src.split("rlx_forward")[-1]
    # head_dim 64: 64-key chunks; attn_bk picks the chunk, attn_warps the largest block
    assert "rlx_attn_short2<__half, uint8_t, 64, RLX_MASK_NONE, 128, 64>" in _render(
        heads=4, kv_heads=4, head_dim=64, mask="none", sq=[100])
    tuned = _render(CudaTarget(precision=DType.F16, gemm="builtin", attn_bk=128, attn_warps=4), heads=12,
                    kv_heads=12, head_dim=32, mask="padding", sq=[128])
    assert "rlx_attn_short2<__half, int64_t, 32, RLX_MASK_PADDING, 128, 128>" in tuned
    assert "RlxShortSmem<32, 128>::total(4)" in tuned and "nw > 4 ? 4 : nw" in tuned
    # attn_pipe: the persistent, double-buffered form (its grid from the GPU's SM count, two stages of memory)
    pipe = _render(CudaTarget(precision=DType.F16, gemm="builtin", attn_pipe=True), heads=12, kv_heads=12,
                   head_dim=32, mask="padding", sq=[128])
    assert "rlx_attn_short2p<__half, int64_t, 32, RLX_MASK_PADDING, 128, 128>, " \
           "dim3((unsigned)RlxShort2Pipe<32, 128, 128>::grid(p, nw, c->num_sms)), 32 * nw, " \
           "RlxShort2Pipe<32, 128, 128>::smem(nw)" in pipe
    assert "RlxShort2Pipe<32, 128, 128>::smem(8)" in pipe
    # the first kernel stays selectable
    v1 = _render(CudaTarget(precision=DType.F16, gemm="builtin", short_attention_v1=True), heads=12, kv_heads=12,
                 head_dim=32, mask="padding", sq=[128, 3])
    assert "rlx_launch_pdl(c->pdl, rlx_attn_short<__half, int64_t, 32, RLX_MASK_PADDING, 128>, " in v1
    assert "rlx_attn_short2<" not in v1.split("rlx_forward")[-1]
    # more than 128 keys, head_dim above 64, or f32: the tiled kernels, and the header stays out
    for kw, target in ((dict(heads=4, kv_heads=4, head_dim=32, mask="none", sq=[129]), F16),
                       (dict(heads=2, kv_heads=2, head_dim=80, mask="bias", sq=[45]), F16),
                       (dict(heads=4, kv_heads=4, head_dim=32, mask="none", sq=[64]), CudaTarget(gemm="builtin")),
                       (dict(heads=4, kv_heads=4, head_dim=32, mask="none", sq=[64]),
                        CudaTarget(precision=DType.F16, gemm="builtin", short_attention=False))):
        src = _render(target, **kw)
        assert "rlx_attn_short" not in src and "RlxShortSmem" not in src


def test_attn_warps_is_checked() -> None:
    with pytest.raises(BuildError, match="attn_warps"):
        CudaTarget(attn_warps=3)


def test_32_key_chunks_are_for_the_short_kernels_only() -> None:
    short = _render(CudaTarget(precision=DType.F16, gemm="builtin", attn_bk=32), heads=4, kv_heads=4, head_dim=32,
                    mask="none", sq=[64])
    assert "rlx_attn_short2<__half, uint8_t, 32, RLX_MASK_NONE, 128, 32>" in short
    tiled = _render(CudaTarget(precision=DType.F16, gemm="builtin", attn_bk=32), heads=4, kv_heads=4, head_dim=32,
                    mask="none", sq=[200])
    assert "rlx_attn_fa<__half, uint8_t, 32, RLX_MASK_NONE, true, 4, 64>" in tiled


def _every_mask() -> Graph:
    """One graph, four attentions: every mask mode, head dims 16 / 32 / 64, GQA, cross attention."""
    g = Graph("short_masks")
    sq, skv = Dim.dynamic("sq", max=100), Dim.dynamic("skv", max=128)
    outs = []
    for mask, d in (("padding", 32), ("causal", 64), ("bias", 16), ("none", 64)):
        q = g.input(f"q_{mask}", [2, sq, 4 * d])
        k = g.input(f"k_{mask}", [2, skv, 2 * d])
        v = g.input(f"v_{mask}", [2, skv, 2 * d])
        m = None
        if mask == "padding":
            m = g.input("m_padding", [2, skv], "i64")
        elif mask == "bias":
            m = g.input("m_bias", [2, 1, 1, skv])
        outs.append(g.attention(q, k, v, num_heads=4, head_dim=d, mask=mask, mask_input=m, num_kv_heads=2))
    g.set_outputs(outs)
    return g


@pytest.mark.parametrize("precision,options", [("f16", {}), ("bf16", {}), ("f16", {"attn_bk": 32}),
                                               ("bf16", {"attn_pipe": True}), ("f16", {"short_attention_v1": True})])
def test_short_kernel_compiles_for_every_mask(precision: str, options: dict, tmp_path: Path) -> None:
    try:
        nvcc, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    src = render_cuda(plan(_every_mask()), CudaTarget(precision=DType.parse(precision), gemm="builtin", **options),
                      {"name": "m"})
    assert _launches(src) == 4
    for mask in ("PADDING", "CAUSAL", "BIAS", "NONE"):
        assert f"RLX_MASK_{mask}, 128" in src
    path = tmp_path / "short.cu"
    path.write_text(src)
    NvccToolchain(nvcc, text, "sm_90", find_cublas(nvcc)).compile(path, path.with_suffix(".o"), "builtin",
                                                                 compile_only=True)


def _launches(src: str) -> int:
    start = src.index("static int rlx_forward(")
    return src[start:src.index("\n}\n", start)].count("rlx_attn_short")

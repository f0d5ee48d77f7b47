"""`CopySmallGemm`: quantized products of 5..64 rows multiply their weight's dequantized copy on rlx_gemm_small (the
norm in its prologue, the residual add in its epilogue, a SwiGLU's gate and up in one launch, a layer's Q, K and V in
one launch), decided in the LIR and rendered; nvcc compiles the result. Runs without a GPU;
tests/gpu/test_cuda_copy_small.py checks the numbers."""

from __future__ import annotations

from pathlib import Path

from render_cases import _tiny_decoder_parts

from rlx.codegen.cuda import CudaTarget, render_cuda
from rlx.config import Config
from rlx.ir.decisions_cuda import DecodeGemv, DequantCopy
from rlx.ir.decisions_cuda_kernels import CopySmallGemm
from rlx.ir.dtype import DType
from rlx.models.llama import build_decoder
from rlx.opt.memplan import plan
from rlx.opt.pipeline import optimize
from rlx.pipeline.cuda import CudaStages, decide_cuda
from tests.gpu.gemm_common import nvcc_compiles


def _decoder(target: CudaTarget):
    cfg, specs = _tiny_decoder_parts()
    return decide_cuda(plan(optimize(build_decoder(cfg, specs, max_batch=32, max_seq=1, capacity=32))), target)


def test_decoder_copies_take_the_small_gemm(tmp_path: Path) -> None:
    lir = _decoder(CudaTarget(precision=DType.F16))
    small = {d.node: d for d in lir.decided(CopySmallGemm)}
    copies = {r: m for d in lir.decided(DequantCopy) for r, m in zip(d.readers, d.min_rows)}
    gemvs = lir.decided(DecodeGemv)
    # every reader of a copy takes it from the copy's first row (past the fused GEMV's 4) up to 64, except the up
    # projections, which their gate's launch computes, and the K and V products, which their Q's launch computes
    ups = {d.members[1] for d in gemvs if d.swiglu}
    siblings = {m for d in gemvs if not d.swiglu and not d.residual for m in d.members[1:]}
    assert siblings and set(small) | ups | siblings == set(copies) and not set(small) & (ups | siblings)
    assert all((d.min_rows, d.max_rows) == (copies[n], 64) for n, d in small.items())
    for g in gemvs:
        d = small[g.members[0]]
        assert d.norm == g.norm and d.add == g.residual  # what the fused GEMV absorbs, the small GEMM does too
        assert (d.pair, d.swiglu) == (((g.members[1],), g.swiglu) if g.swiglu else ((), ()))
        assert d.siblings == (() if g.swiglu or g.residual else g.members[1:])
        if d.siblings:
            assert f"(and {', '.join(f'%{n}' for n in d.siblings)}: one launch)" in d.describe()
    src = render_cuda(lir, CudaTarget(precision=DType.F16), {"name": "copy_small"})
    assert src.count("(CopySmallGemm)") == len(small)
    assert src.count("(computed by %") == len(ups) + len(siblings)
    # Q, K and V in one launch: two siblings, their column tiles after Q's
    assert "rlx_gemm_small<__half, RLX_ACT_NONE, false, 2, false, 1, false, false, 2>" in src
    assert src.count("(siblings: one launch)") == sum(1 for d in small.values() if d.siblings)
    assert "rlx_gemm_small<__half, RLX_ACT_NONE, false, 2, false, 1, false, true>" in src  # norm, SwiGLU pair
    assert "rlx_gemm_small<__half, RLX_ACT_NONE, false, 0, false, 1, true, false>" in src  # residual
    # the absorbed norms and SwiGLU regions run their own kernels past 64 rows only
    assert src.count("by its small GEMM on the dequantized copy in larger ones") == \
        sum(len(d.norm) + len(d.swiglu) for d in small.values())
    assert "rlx_gemm_small_pair_smem(K)" in src
    nvcc_compiles(src, tmp_path / "copy_small.cu")


def test_the_small_gemm_is_not_taken_where_it_cannot_run() -> None:
    # small GEMMs off (RLX_CUDA_SMALL_GEMM=0 reaches the target through Config), the built-in GEMM, f32: none
    assert CudaStages(Config.from_env({"RLX_CUDA_SMALL_GEMM": "0"})).target_options["small_gemm"] is False
    assert "small_gemm" not in CudaStages(Config.from_env({})).target_options
    for target in (CudaTarget(precision=DType.F16, small_gemm=False), CudaTarget(precision=DType.F16, gemm="builtin"),
                   CudaTarget(precision=DType.F32)):
        assert not _decoder(target).decided(CopySmallGemm)
    # before Hopper the gate and up products keep launches of their own (two slabs need up to 164 KB)
    ampere = _decoder(CudaTarget(precision=DType.F16, arch="sm_80")).decided(CopySmallGemm)
    assert ampere and not any(d.pair for d in ampere) and any(d.norm for d in ampere)
    assert any(d.siblings for d in ampere)  # one slab a block: siblings take any arch the small GEMM runs on


def _head(n: int, k: int, arch: str = "sm_90"):
    """rms_norm(x) @ W^T of a q4_1 head of n rows over k, as the CUDA pipeline decides it for f16 on `arch`."""
    import rlx
    from rlx.ir import quant as Q

    g = rlx.Graph("head")
    x = g.input("x", [rlx.Dim.dynamic("m", 128), k])
    w = g.param("w", [n, Q.row_bytes("q4_1", k)], "u8")
    g.set_outputs([g.dequant_matmul(g.rms_norm(x, g.param("g", [k]), eps=1e-5), w, quant="q4_1")])
    return decide_cuda(plan(optimize(g)), CudaTarget(precision=DType.F16, arch=arch))


def test_a_long_head_takes_the_wide_small_gemm(tmp_path: Path) -> None:
    """N >= SMALL_GEMM_WIDE_MIN_N and K within the wide kernel's shared memory (64 rows of A and three slabs of B:
    K <= 592 on sm_90, 240 on the 99 KB parts): persistent blocks over the column tiles, recorded in the LIR and
    rendered as a launch of one block a multiprocessor; otherwise the ordinary small GEMM."""
    from rlx.opt.lowering_cuda_kernels import SMALL_GEMM_WIDE_MIN_N, small_gemm_wide_kmax

    assert small_gemm_wide_kmax("sm_90") == 592 and small_gemm_wide_kmax("sm_89") == 240
    lir = _head(8200, 576)
    (d,) = lir.decided(CopySmallGemm)
    assert d.wide and d.norm and "(persistent blocks over its column tiles: the copy read once)" in d.describe()
    src = render_cuda(lir, CudaTarget(precision=DType.F16), {"name": "head"})
    assert "rlx_gemm_small_wide<__half, 2, false, 3>, dim3((unsigned)((N + RLX_GSW_BN - 1) / RLX_GSW_BN < " \
           "(int64_t)c->num_sms ? (N + RLX_GSW_BN - 1) / RLX_GSW_BN : (int64_t)c->num_sms))" in src
    assert "rlx_gemm_small_wide_smem(592)" in src  # the limit raised at load: the arch's largest K
    nvcc_compiles(src, tmp_path / "head.cu")
    for n, k, arch in ((SMALL_GEMM_WIDE_MIN_N - 8, 576, "sm_90"), (8200, 608, "sm_90"), (8200, 576, "sm_89")):
        (d,) = _head(n, k, arch).decided(CopySmallGemm)
        assert not d.wide, (n, k, arch)

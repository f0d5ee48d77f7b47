"""The launch of a PoolTail decision (rlx/codegen/cuda/pool.py): one kernel instead of the tail's, no output
conversion, refused by a target that turns it off, and nvcc compiles it (no GPU needed; tests/opt/
test_lowering_cuda_pool.py checks the decision, tests/codegen/test_cuda_pool_emulated.py the kernel's numbers on the
CPU, tests/gpu/test_cuda_pool.py on a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx.codegen.cuda import CudaTarget
from rlx.driver import lower_to_lir, to_mir
from rlx.errors import BuildError
from rlx.ir.dtype import DType
from rlx.opt.lowering import lower_for
from rlx.pipeline.cuda import render_cuda
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc
from tests.gpu.gemm_common import forward
from tests.gpu.pool_common import pool_graph


def _lir(graph, precision: str = "f16", **options):
    return lower_for(lower_to_lir(to_mir(graph), 2, backend="cuda"), "cuda", precision=precision, gemm="cublaslt",
                     **options)


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
def test_the_tail_renders_one_launch_and_no_output_conversion(precision: str) -> None:
    lir = _lir(pool_graph(), precision)
    on = forward(render_cuda(lir, CudaTarget(precision=precision), {"name": "p"}))
    off_lir = _lir(pool_graph(), precision, pool_tail=False)
    off = forward(render_cuda(off_lir, CudaTarget(precision=precision, pool_tail=False), {"name": "p"}))
    t = {"f32": "float", "f16": "__half", "bf16": "rlx_bf16"}[precision]
    assert on.count(f"rlx_pool_tail<{t}, {t}, float, {16 // DType.parse(precision).itemsize}, true>") == 1
    assert "rlx_pool_tail" not in off and off.count("rlx_reduce_rows<") == 2
    assert on.count("computed inside %") == 7  # the absorbed nodes that are not views
    assert "rlx_reduce_rows<" not in on and "converting output" not in on
    if precision != "f32":
        assert "converting output 0" in off
    assert "pool_tail=0" in CudaTarget(pool_tail=False).identity() and "pool" not in CudaTarget().identity()


def test_the_lowering_refuses_what_the_target_turns_off() -> None:
    lir = _lir(pool_graph())  # lowered with the tail: a target without it may not render it
    with pytest.raises(BuildError, match="lowered"):
        render_cuda(lir, CudaTarget(precision="f16", pool_tail=False), {"name": "p"})
    lir = _lir(pool_graph(norm="layer_res"), pool_norm=True)  # lowered with the norm in the tail's kernel
    with pytest.raises(BuildError, match="norm before a pooling tail"):
        render_cuda(lir, CudaTarget(precision="f16"), {"name": "p"})


@pytest.mark.parametrize(("norm", "nk", "res"), [("layer_res", 1, "true"), ("rms", 2, "false")])
def test_short_sentences_run_the_norm_in_the_tail(norm: str, nk: int, res: str) -> None:
    on = forward(render_cuda(_lir(pool_graph(norm=norm), pool_norm=True), CudaTarget(precision="f16", pool_norm=True),
                             {"name": "p"}))
    off = forward(render_cuda(_lir(pool_graph(norm=norm)), CudaTarget(precision="f16"), {"name": "p"}))
    # the tail picks the kernel by the sentence length; the norm's own kernel runs for long sentences only
    assert on.count(f"rlx_pool_tail_norm<__half, __half, float, 8, true, {nk}, {res}, 1>") == 1
    assert "if (seq <= 64) {" in on and on.count("rlx_pool_tail<__half, __half, float, 8, true>") == 1
    assert "if (S[1] > 64) {  /* (a step of <= 64 rows: sentences of <= 64 tokens: done in %" in on
    assert "rlx_pool_tail_norm<" not in off and "if (S[1] > 64)" not in off and "rlx_norm_vec<" in off
    assert "pool_norm=1" in CudaTarget(pool_norm=True).identity() and "pool_norm" not in CudaTarget().identity()


@pytest.mark.parametrize("precision", [DType.F32, DType.F16, DType.BF16])
def test_nvcc_compiles_the_tail(precision: DType, tmp_path: Path) -> None:
    try:
        nvcc, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    lir = lower_for(lower_to_lir(to_mir(pool_graph(hidden=36, norm="layer_res")), 2, backend="cuda"), "cuda",
                    precision=precision, gemm="builtin", pool_norm=True)
    src = render_cuda(lir, CudaTarget(precision=precision, gemm="builtin", pool_norm=True), {"name": "p"})
    vec = 4 if precision is DType.F32 else 1  # hidden 36: 16-byte loads of floats, scalar ones of 16-bit types
    assert src.count("rlx_pool_tail<") == 1 and f", {vec}, true>" in src
    assert src.count(f"rlx_pool_tail_norm<{src.split('rlx_pool_tail_norm<')[-1].split(',')[0]}") == 1
    assert f", {vec}, true, 1, true, {-(-36 // (vec * 32))}>" in src
    path = tmp_path / "pool.cu"
    path.write_text(src)
    NvccToolchain(nvcc, text, "sm_90", find_cublas(nvcc)).compile(path, path.with_suffix(".o"), "builtin",
                                                                  compile_only=True)

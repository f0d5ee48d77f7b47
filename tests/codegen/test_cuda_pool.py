"""The PoolTail decision (rlx/opt/lowering_cuda_pool.py) and its kernel launch (rlx/codegen/cuda_pool.py): which
tails run as one kernel, which are refused, what the LIR says, and that nvcc compiles the result (no GPU needed;
tests/codegen/test_cuda_pool_emulated.py checks the kernel's numbers on the CPU, tests/gpu/test_cuda_pool.py on a
GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx.codegen.cuda import CudaTarget, render_cuda
from rlx.driver import lower_to_lir, to_mir
from rlx.errors import BuildError
from rlx.ir.decisions_cuda import PoolTail
from rlx.ir.dtype import DType
from rlx.models.bert import BertConfig, build_bert
from rlx.opt.lowering import lower_for
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc
from tests.gpu.gemm_common import forward
from tests.gpu.pool_common import pool_graph

TINY_BERT = BertConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _lir(graph, precision: str = "f16", **options):
    return lower_for(lower_to_lir(to_mir(graph), 2, backend="cuda"), "cuda", precision=precision, gemm="cublaslt",
                     **options)


def _tails(graph, **options) -> list[PoolTail]:
    return _lir(graph, **options).decided(PoolTail)


def test_bert_embeddings_tail_is_one_decision() -> None:
    lir = _lir(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="embeddings"))
    (tail,) = lir.decided(PoolTail)
    assert tail.normalized and tail.abi_output == 0 and len(tail.absorbed) == 9
    assert (tail.eps_count, tail.eps_norm) == pytest.approx((1e-9, 1e-12))
    assert "masked mean + L2 normalization of %" in lir.inspect()  # rlxc inspect --stage lir shows it
    # the tokens output (no pooling) and CLS pooling have none
    assert not _tails(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="tokens"))
    assert not _tails(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="embeddings", pooling="cls"))
    # the option turns it off (the LIR, and so the cache key, differ)
    assert not _tails(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="embeddings"), pool_tail=False)


def test_mean_only_and_refused_tails() -> None:
    (mean,) = _tails(pool_graph(normalize=False))
    assert not mean.normalized and mean.abi_output == 0 and len(mean.absorbed) == 5
    # the mean is a second output: the normalization stays separate kernels, the mean is written where it lives
    (leak,) = _tails(pool_graph(leak="mean"))
    assert not leak.normalized and leak.abi_output == -1
    # an intermediate read outside the tail: nothing fused
    assert not _tails(pool_graph(leak="count")) and not _tails(pool_graph(leak="sum"))


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


@pytest.mark.parametrize("precision", [DType.F32, DType.F16, DType.BF16])
def test_nvcc_compiles_the_tail(precision: DType, tmp_path: Path) -> None:
    try:
        nvcc, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    lir = lower_for(lower_to_lir(to_mir(pool_graph(hidden=36)), 2, backend="cuda"), "cuda", precision=precision,
                    gemm="builtin")
    src = render_cuda(lir, CudaTarget(precision=precision, gemm="builtin"), {"name": "p"})
    vec = 4 if precision is DType.F32 else 1  # hidden 36: 16-byte loads of floats, scalar ones of 16-bit types
    assert src.count("rlx_pool_tail<") == 1 and f", {vec}, true>" in src
    path = tmp_path / "pool.cu"
    path.write_text(src)
    NvccToolchain(nvcc, text, "sm_90", find_cublas(nvcc)).compile(path, path.with_suffix(".o"), "builtin",
                                                                  compile_only=True)


def test_whole_run_graphs_are_rendered_where_they_apply() -> None:
    """CudaTarget.io_graph: rlx_run_device replays copies + step + flag as one graph (tests/gpu/test_cuda_io_graph.py
    runs it); not in a profiled build (eager runs) nor with the option off."""
    lir = _lir(pool_graph())
    assert "rlx_io_find(c, S, inputs, outputs)" in render_cuda(lir, CudaTarget(precision="f16"), {"name": "p"})
    for target in (CudaTarget(precision="f16", io_graph=False), CudaTarget(precision="f16", profile=True)):
        assert "rlx_io_find" not in render_cuda(lir, target, {"name": "p"})
    assert "io_graph=0" in CudaTarget(io_graph=False).identity() and "io_graph" not in CudaTarget().identity()

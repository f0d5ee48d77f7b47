"""A row gather read by one elementwise region only is done inside the region's kernel
(rlx/codegen/cuda/region_gather.py): what the source says, what is refused, and nvcc compiles it (no GPU needed;
tests/gpu/test_cuda_region_gather.py runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx.codegen.cuda import CudaTarget
from rlx.driver import lower_to_lir, to_mir
from rlx.errors import BuildError
from rlx.ir.dtype import DType
from rlx.models.bert import BertConfig, build_bert
from rlx.pipeline.cuda import render_cuda
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc
from tests.gpu.region_gather_common import embed_graph


def _src(graph, precision: str = "f16", gemm: str = "builtin", **options) -> str:
    lir = lower_to_lir(to_mir(graph), 2, backend="cuda")
    return render_cuda(lir, CudaTarget(precision=precision, gemm=gemm, **options), {"name": "g"})


def test_both_lookups_run_in_the_region() -> None:
    src = _src(embed_graph())
    assert "rlx_gather<" not in src and src.count("looked up inside %") == 2
    assert src.count("rlx_gather_at<__half, int64_t, int32_t>(") == 2
    assert "const int64_t *__restrict__ in0_idx" in src and "const int64_t *__restrict__ in1_idx" in src
    off = _src(embed_graph(), gather_region=False)
    assert off.count("rlx_gather<") >= 2 and "rlx_gather_at<" not in off
    assert "gather_region=0" in CudaTarget(gather_region=False).identity()


def test_refused_lookups_keep_their_kernel() -> None:
    # the word lookup is also an output: it runs its own kernel; the position lookup is still the region's
    src = _src(embed_graph(leak=True))
    assert src.count("rlx_gather<") == 1 and src.count("rlx_gather_at<") == 1
    # a table that is a run input (a kernel could write it): that lookup keeps its kernel
    src = _src(embed_graph(table_input=True))
    assert src.count("rlx_gather<") == 1 and src.count("rlx_gather_at<") == 1


def test_bert_embeddings_start_with_one_kernel_for_the_sum() -> None:
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    src = _src(build_bert(cfg, max_batch=2, max_seq=8, output="embeddings"), gemm="cublaslt")
    assert "rlx_gather<" not in src and src.count("looked up inside %") == 2


@pytest.mark.parametrize("precision", [DType.F32, DType.F16])
def test_nvcc_compiles_the_region(precision: DType, tmp_path: Path) -> None:
    try:
        nvcc, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    src = _src(embed_graph(), precision.value)
    assert "rlx_gather_at<" in src
    path = tmp_path / "g.cu"
    path.write_text(src)
    NvccToolchain(nvcc, text, "sm_90", find_cublas(nvcc)).compile(path, path.with_suffix(".o"), "builtin",
                                                                  compile_only=True)

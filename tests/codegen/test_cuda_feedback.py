"""Compile-only checks of device-side token feedback on CUDA (no GPU needed): the paged serving decoder with
`token_feedback` renders the `token_feed` / `token_store` kernels and the split host step
(`rlx_host_step_launch` / `rlx_host_step_finish`, two steps in flight with pinned mirrors of their own), and
nvcc compiles it. tests/gpu/test_cuda_feedback.py runs it on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from render_cases import _tiny_decoder_parts

from rlx.codegen.cuda import CudaTarget
from rlx.ir.dtype import DType
from rlx.pipeline import lower_to_lir
from rlx.pipeline.cuda import render_cuda
from rlx.toolchain.cuda import NvccToolchain


def _feedback_decoder():
    from rlx.models.llama import build_decoder

    cfg, specs = _tiny_decoder_parts()
    return build_decoder(cfg, specs, max_batch=16, max_seq=1, capacity=32, page_size=8, kv_pages=12,
                         token_feedback=True)


def _render(precision: str = "f16") -> str:
    lir = lower_to_lir(_feedback_decoder(), 2, backend="cuda")
    return render_cuda(lir, CudaTarget(precision=DType.parse(precision), gemm="builtin"), {"name": "feedback"})


def test_feedback_decoder_renders_the_feed_the_store_and_the_split_step() -> None:
    src = _render()
    forward = src.split("static int rlx_forward")[1].split("\n}\n")[0]
    # one feed of the step's tokens before the embedding, one store of its argmax ids, inside the captured program
    assert forward.count("rlx_token_feed<<<") == 1 and forward.count("rlx_token_store<<<") == 1
    assert forward.index("rlx_token_feed<<<") < forward.index("rlx_token_store<<<")
    assert "RLX_EXPORT int32_t rlx_host_step_launch(" in src and "RLX_EXPORT int32_t rlx_host_step_finish(" in src
    assert "#define RLX_INFLIGHT 2" in src


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_feedback_decoder_compiles(toolchain: NvccToolchain, precision: str, tmp_path: Path) -> None:
    path = tmp_path / f"feedback_{precision}.cu"
    path.write_text(_render(precision))
    toolchain.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)

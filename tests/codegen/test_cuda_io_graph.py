"""Whole-run graphs (CudaTarget.io_graph, templates/cuda/model.cu.j2): where rlx_run_device may replay copies, step
and flag as one graph (tests/gpu/test_cuda_io_graph.py runs it on a GPU)."""

from __future__ import annotations

from rlx.codegen.cuda import CudaTarget
from rlx.driver import lower_to_lir, to_mir
from rlx.opt.lowering import lower_for
from rlx.pipeline.cuda import render_cuda
from tests.gpu.pool_common import pool_graph


def test_whole_run_graphs_are_rendered_where_they_apply() -> None:
    """CudaTarget.io_graph: rlx_run_device replays copies + step + flag as one graph (tests/gpu/test_cuda_io_graph.py
    runs it); not in a profiled build (eager runs) nor with the option off."""
    lir = lower_for(lower_to_lir(to_mir(pool_graph()), 2, backend="cuda"), "cuda", precision="f16", gemm="cublaslt")
    assert "rlx_io_find(c, S, inputs, outputs)" in render_cuda(lir, CudaTarget(precision="f16"), {"name": "p"})
    for target in (CudaTarget(precision="f16", io_graph=False), CudaTarget(precision="f16", profile=True)):
        assert "rlx_io_find" not in render_cuda(lir, target, {"name": "p"})
    assert "io_graph=0" in CudaTarget(io_graph=False).identity() and "io_graph" not in CudaTarget().identity()

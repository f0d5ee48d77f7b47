"""Compile-only checks of control flow on CUDA: cond and a bounded while_loop, and the gradient graph of both,
rendered (optimized, as a session does) and nvcc-compiled; the while loop runs as the scan rule's host loop.
Runs on a GPU against the reference are tests/gpu/cases.py's control_flow case."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import rlx
from rlx.codegen.cuda import CudaTarget
from rlx.driver import lower_to_lir
from rlx.errors import BuildError
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.pipeline.cuda import render_cuda
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases", Path(__file__).parent.parent / "gpu" / "cases.py")
cases = importlib.util.module_from_spec(_spec)
sys.modules["rlx_cuda_cases"] = cases
_spec.loader.exec_module(cases)


@pytest.fixture(scope="module")
def toolchain() -> NvccToolchain:
    try:
        path, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    return NvccToolchain(path, text, "sm_90", find_cublas(path))


def _render(graph: Graph) -> str:
    lir = lower_to_lir(graph, 2, backend="cuda")
    return render_cuda(lir, CudaTarget(precision=DType.F32, gemm="builtin"), {"name": graph.name})


def _loss_graph() -> Graph:
    def fn(t):
        x, w = t.input("x", [4, 8]), t.input("w", [8])  # elementwise only: GEMMs compile in other tests
        y = t.cond(x.sum() > 0, lambda v, u: (v * u).tanh(), lambda v, u: v * 0.5 - u, x, w)
        z = t.while_loop(lambda c, b: (c * c).sum() < 40.0, lambda c, b: c * 1.25 + (c * b).tanh(), y,
                         bcasts=[w], max_trips=8)
        return {"loss": (z * z).sum()}

    return rlx.trace("control_loss", fn)


def test_the_while_loop_is_a_host_loop_of_masked_steps() -> None:
    src = _render(cases.CASES["control_flow"]().graph)
    assert src.count("for (int64_t rlx_s") == 1  # one loop: the while_loop; the cond is a select


def test_control_flow_and_its_gradient_compile(toolchain: NvccToolchain, tmp_path: Path) -> None:
    g = rlx.grad(_loss_graph())  # the forward cond and while_loop, then their backward: one compile for all
    src = _render(g)
    assert src.count("for (int64_t rlx_s") == 3  # the forward loop, the recomputed trajectory, the backward sweep
    path = tmp_path / f"{g.name}.cu"
    path.write_text(src)
    toolchain.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)

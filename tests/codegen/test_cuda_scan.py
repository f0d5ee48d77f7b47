"""Compile-only checks of the CUDA `scan` rule and the chunked SSM kernels: render (optimized, as a session
does) and nvcc-compile; the loop's shape in the source; what is refused before any build. Runs on a GPU are in
tests/gpu/test_cuda_scan.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlx.codegen.backends import first_unsupported_op
from rlx.codegen.cuda import CudaTarget
from rlx.driver import lower_to_lir
from rlx.ir.decisions_cuda import ScanConstants
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.opt.lowering_cuda import plan_device
from rlx.pipeline.cuda import render_cuda
from rlx.toolchain.cuda import NvccToolchain

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases", Path(__file__).parent.parent / "gpu" / "cases.py")
cases = importlib.util.module_from_spec(_spec)
sys.modules["rlx_cuda_cases"] = cases
_spec.loader.exec_module(cases)


def _render(graph: Graph, precision: str = "f32", level: int = 2) -> str:
    lir = lower_to_lir(graph, level, backend="cuda")
    return render_cuda(lir, CudaTarget(precision=DType.parse(precision), gemm="builtin"), {"name": graph.name})


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_optimized_scans_compile(toolchain: NvccToolchain, precision: str, tmp_path: Path) -> None:
    for name in ("scan_loop", "scan_ssm_body"):
        src = _render(cases.CASES[name]().graph, precision)
        path = tmp_path / f"{name}.cu"
        path.write_text(src)
        toolchain.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)


def test_the_loop_launches_the_body_per_step_with_pointers_set_on_the_host() -> None:
    src = _render(cases.CASES["scan_loop"]().graph, level=0)
    # one host loop per scan over the dynamic length, the body's kernels (with their own names) inside it
    assert src.count("for (int64_t rlx_s") == 3
    assert "const int64_t rlx_s3_L = S[0];" in src
    loop = src[src.index("for (int64_t rlx_s3_i"):]
    assert "rlx_s3_region_" in loop.split("rlx_s3_carry = rlx_s3_out;")[0]
    assert "__global__ void rlx_s3_region_" in src  # body kernels are defined at file scope
    # the reversed trajectory walks t from L-1 down, each step writing its own row of the result
    assert "L - 1 - rlx_s" in src and "result + rlx_s" in src


def test_body_constants_are_placed_with_the_graphs_and_uploaded_at_create() -> None:
    lir = lower_to_lir(cases.CASES["scan_loop"]().graph, 0, backend="cuda")
    decisions = plan_device(lir, DType.F32, "builtin")
    consts = [d for d in decisions if isinstance(d, ScanConstants)]
    assert len(consts) == 3 and all(len(d.offsets) == 1 for d in consts)
    src = _render(cases.CASES["scan_loop"]().graph, level=0)
    for d in consts:
        assert f"cudaMemcpyAsync(RLX_P(unsigned char, {d.offsets[0]})" in src


def test_nested_scans_and_unsupported_bodies_are_refused_before_any_build() -> None:
    inner = Graph("inner")
    c = inner.input("c", [4])
    inner.set_outputs([inner.activation("tanh", c)])
    outer = Graph("outer")
    c = outer.input("c", [4])
    outer.set_outputs([outer.scan(inner, c, length=3)])
    g = Graph("nested")
    c0 = g.input("c0", [4])
    g.set_outputs([g.scan(outer, c0, length=2)])
    node, reason = first_unsupported_op(g, "cuda")
    assert node.kind == "scan" and "nested" in reason

    body = Graph("int8_body")  # int8_matmul runs on the CPU only
    c, w = body.input("c", [2, 4]), body.input("w", [4, 4])
    body.set_outputs([body.int8_matmul(c, w)])
    g = Graph("bad_body")
    c0, w0 = g.input("c0", [2, 4]), g.input("w0", [4, 4])
    g.set_outputs([g.scan(body, c0, bcasts=[w0], length=Dim.dynamic("L", max=4))])
    node, reason = first_unsupported_op(g, "cuda")
    assert node.kind == "scan" and "int8_matmul" in reason


def test_a_graph_without_scans_has_no_scan_decisions() -> None:
    g = Graph("plain")
    x = g.input("x", [4])
    g.set_outputs([g.activation("relu", x)])
    lir = lower_to_lir(g, 0, backend="cuda")
    assert not [d for d in plan_device(lir, DType.F32, "builtin") if isinstance(d, ScanConstants)]
    assert "for (int64_t rlx_s" not in _render(g)


def test_chunked_ssm_paths_are_rendered_only_where_they_can_run() -> None:
    src = _render(cases.CASES["ssm_long"]().graph, level=0)
    # the chunked gated delta rule for state sizes <= 64 (48, 16), not for 128; each beside the column kernel
    assert src.count("rlx_gdn_chunk_prep<") == 2 and src.count("rlx_gdn_columns<") == 3
    assert src.count("rlx_ssm_chunk_ends<") == 1 and src.count("rlx_selective_scan<") == 1
    short = _render(cases.CASES["ssm_ops"]().graph, level=0)  # sequences of at most 40: never chunked
    assert "rlx_gdn_chunk_prep<" not in short and "rlx_gdn_columns<" in short

"""What the rlx_gemm_small / rlx_gemm_mma tests share: the GPU-only marks and unit roundoffs of tests/gpu, a build
with its params set, the norm-prologue graph, and the render / nvcc steps of tests/codegen (which check the source
without a GPU)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rlx.codegen.cuda import CudaTarget
from rlx.errors import BuildError
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.pipeline.cuda import render_cuda
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc, visible_gpu_arch

#: the marks of a test module that runs on an NVIDIA GPU
GPU_ONLY = [pytest.mark.cuda,
            pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

#: unit roundoff of each precision
U = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8}


def build_with_params(graph: Graph, precision: str, params: dict[str, np.ndarray], **options):
    """`graph` compiled for the visible GPU in `precision` with CudaTarget `options`, its params set."""
    from rlx.config import Config
    from rlx.driver import Device, Session
    from rlx.pipeline.cuda import compile_cuda

    cg = compile_cuda(Session(Device.CUDA).lower(graph), Config.from_env(), precision=precision, **options)
    for name, value in params.items():
        cg.set_param(name, value)
    return cg


def gemm_chain(name: str, rows: int, k: int, layers: Sequence[tuple[int, bool, str | None]],
               every_output: bool = True) -> Graph:
    """x [m <= `rows`, `k`] through one GEMM per layer (n, bias, activation): x W1 (+ b1) (act), then . W2 ...

    Outputs every layer's result, or only the last one's. The parameters are w1, b1, w2, ..."""
    g = Graph(name)
    y = g.input("x", [Dim.dynamic("m", max=rows), k])
    outputs = []
    for i, (n, bias, act) in enumerate(layers, 1):
        y = g.matmul(y, g.param(f"w{i}", [k, n]))
        if bias:
            y = g.add_(y, g.param(f"b{i}", [n]))
        if act is not None:
            y = g.activation(act, y)
        outputs.append(y)
        k = n
    g.set_outputs(outputs if every_output else outputs[-1:])
    return g


def scaled_normal(rng: np.random.Generator, shapes: dict[str, tuple[tuple[int, ...], float]]) -> dict[str, np.ndarray]:
    """{name: standard normal float32 of `shape` times `scale`} for {name: (shape, scale)}, drawn in that order."""
    return {name: rng.standard_normal(shape).astype(np.float32) * scale for name, (shape, scale) in shapes.items()}


def norm_graph(keep_s: bool = True) -> Graph:
    """layer_norm(x) -> GEMM; layer_norm(s + x) -> GEMM (s kept live or not); rms_norm(o) -> GEMM.

    With `keep_s` the output of the second norm is read again and s stays live, so the GEMM after it cannot
    take s's bytes; without it that GEMM may write where s lived."""
    g = Graph("small_norm")
    x = g.input("x", [Dim.dynamic("m", max=200), 64])
    h1 = g.layer_norm(x, g.param("g1", [64]), g.param("be1", [64]), 1e-5)
    y1 = g.activation("gelu", g.add_(g.matmul(h1, g.param("w1", [64, 128])), g.param("b1", [128])))
    s = g.matmul(y1, g.param("w2", [128, 64]))
    h2 = g.layer_norm(g.add_(s, x), g.param("g2", [64]), g.param("be2", [64]), 1e-5)
    y2 = g.add_(g.matmul(h2, g.param("w3", [64, 64])), g.param("b3", [64]))
    o = g.add_(g.add_(y2, h2), s) if keep_s else g.add_(y2, h2)
    h3 = g.rms_norm(o, g.param("g3", [64]), 1e-6)
    y3 = g.matmul(h3, g.param("w4", [64, 32]))
    g.set_outputs([y1, o, y3])
    return g


def render(graph: Graph, hold: bool | None = None, **target) -> str:
    """The CUDA source of `graph` at opt level 2 for `CudaTarget(**target)` (`hold`: the planner's
    hold_norm_inputs, None: as the CUDA backend plans)."""
    from rlx.driver import lower_to_lir, to_mir

    lir = lower_to_lir(to_mir(graph), 2, backend="cuda", hold_norm_inputs=hold)
    return render_cuda(lir, CudaTarget(**target), {"name": "m"})


def forward(src: str) -> str:
    """The body of the generated rlx_forward (the launches of one run)."""
    start = src.index("static int rlx_forward(")
    return src[start:src.index("\n}\n", start)]


def nvcc_compiles(source: str, path: Path) -> None:
    """nvcc compiles `source` (written to `path`) for sm_90 against cuBLASLt; skips without nvcc or cublasLt.h."""
    try:
        nvcc, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    cublas = find_cublas(nvcc)
    if not cublas.found:
        pytest.skip("cublasLt.h not found (make install CUDA=1 adds the nvidia-cublas wheel)")
    path.write_text(source)
    NvccToolchain(nvcc, text, "sm_90", cublas).compile(path, path.with_suffix(".o"), "cublaslt", compile_only=True)

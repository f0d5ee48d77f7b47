"""The CUDA backend: `render_cuda(lir, target, manifest)` renders one .cu file.

This module is the backend's entry point: the emitter and template context live in
`rlx.codegen.cuda.emit`, the per-op rules in `rlx.codegen.cuda.rules` and `rlx.codegen.cuda.quant` (registered in
`table("cuda")` when imported here), so importing `rlx.codegen.cuda` gives a ready backend.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> from rlx.pipeline.cuda import decide_cuda  # the pipeline decides, codegen renders
>>> g = Graph("demo")
>>> x = g.input("x", [4, 8])
>>> g.set_outputs([g.activation("relu", x)])
>>> src = render_cuda(decide_cuda(plan(g), CudaTarget()), CudaTarget(), {"name": "demo"})
>>> "rlx_run_device" in src and "rlx_relu" in src
True
"""

from __future__ import annotations

from rlx.codegen.cuda import collectives as cuda_collectives
from rlx.codegen.cuda import decoder as cuda_decoder
from rlx.codegen.cuda import pool as cuda_pool
from rlx.codegen.cuda import quant as cuda_quant
from rlx.codegen.cuda import rules as cuda_rules
from rlx.codegen.cuda import sample as cuda_sample
from rlx.codegen.cuda import scan as cuda_scan
from rlx.codegen.cuda import select as cuda_select
from rlx.codegen.cuda import ssm as cuda_ssm
from rlx.codegen.cuda.emit import (
    ABI_VERSION,
    CODEGEN_VERSION,
    GEMM_MODES,
    PRECISIONS,
    CudaEmitter,
    CudaTarget,
    cuda_context,
    render_cuda,
)

__all__ = ["ABI_VERSION", "CODEGEN_VERSION", "GEMM_MODES", "PRECISIONS", "CudaEmitter", "CudaTarget",
           "cuda_collectives", "cuda_decoder", "cuda_context", "cuda_pool", "cuda_quant", "cuda_rules", "cuda_sample",
           "cuda_scan", "cuda_select", "cuda_ssm", "render_cuda"]

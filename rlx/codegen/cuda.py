"""The CUDA backend: `render_cuda(lir, target, manifest)` renders one .cu file.

This module is the backend's entry point: the emitter and template context live in
`rlx.codegen.cuda_emit`, the per-op rules in `rlx.codegen.cuda_rules` and `rlx.codegen.cuda_quant` (registered in
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

from rlx.codegen import (
    cuda_collectives,
    cuda_conv,
    cuda_decoder,
    cuda_lora,
    cuda_moe,
    cuda_pool,
    cuda_quant,
    cuda_rules,
    cuda_sample,
    cuda_scan,
    cuda_select,
    cuda_ssm,
    cuda_user_op,
)
from rlx.codegen.cuda_emit import (
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
           "cuda_collectives", "cuda_conv", "cuda_decoder", "cuda_context", "cuda_lora", "cuda_moe", "cuda_pool",
           "cuda_quant", "cuda_rules", "cuda_sample", "cuda_scan", "cuda_select", "cuda_ssm", "cuda_user_op",
           "render_cuda"]

"""The CUDA backend: `render_cuda(lir, target, manifest)` renders one .cu file.

The emitter and template context live in `rlx.codegen.cuda.emit`, the per-op rules in the rule
modules listed by `rule_table()` (`rules`, `quant`, `collectives`, ...), each declaring its rules in
its `RULES`: the one list a new CUDA rule module is added to.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> from rlx.pipeline.cuda import decide_cuda  # the pipeline decides, codegen renders
>>> g = Graph("demo")
>>> x = g.input("x", [4, 8])
>>> g.set_outputs([g.activation("relu", x)])
>>> src = render_cuda(decide_cuda(plan(g), CudaTarget()), CudaTarget(), {"name": "demo"})
>>> "rlx_run_device" in src and "rlx_relu" in src
True
>>> sorted(rule_table().rules)[:3]
['activation', 'all_gather', 'all_reduce']
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

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
from rlx.codegen.registry import RuleTable


@functools.cache
def rule_table() -> RuleTable:
    """The CUDA rule table: every rule of the CUDA rule modules (made once per process)."""
    from rlx.codegen.cuda import (
        collectives,
        control,
        conv,
        decoder,
        feedback,
        lora,
        moe,
        quant,
        rules,
        sample,
        scan,
        select,
        ssm,
        user_op,
    )

    modules = (rules, quant, collectives, conv, decoder, feedback, lora, moe, sample, scan, control, select, ssm,
               user_op)
    return RuleTable.of("cuda", (m.RULES for m in modules))


@functools.cache
def decision_kernels() -> Mapping[str, Callable[[CudaEmitter, Any, int], Any]]:
    """The kernel of a node a fused-kernel decision covers, by decision kind: `fn(emitter, decision, node)`
    (each listed module's `DECISION_KERNELS`)."""
    from rlx.codegen.cuda import pool

    return MappingProxyType({**pool.DECISION_KERNELS})


def dense_decode_gemv(e: CudaEmitter, d: Any, inner: Any) -> Any:
    """A dense `DecodeGemv`'s first member: its kernel `inner` wrapped with the rlx_dgemv launch of one-row steps
    (rlx.codegen.cuda.dense; reached through the package, as the rule modules are, so the emitter does not import
    it)."""
    from rlx.codegen.cuda import dense

    return dense.dense_decode_gemv(e, d, inner)


__all__ = ["ABI_VERSION", "CODEGEN_VERSION", "GEMM_MODES", "PRECISIONS", "CudaEmitter", "CudaTarget", "cuda_context",
           "decision_kernels", "render_cuda", "rule_table"]

"""CUDA rule for `sample_top_k`: one block per row (kernels/sample.cuh).

A decoder's sampling step reads back one token id per row instead of its
logits: the block radix-selects the row's top k (k <= `SAMPLE_TOP_K_MAX`),
sorts those k, and samples at the row's u with the reference's double
arithmetic. Bad settings or u raise the device error flag (the run fails
naming the setting).

>>> import rlx
>>> from rlx.codegen.backends import supports
>>> def picker(logits: str) -> rlx.Graph:  # f16 / bf16 logits are read as they are, f64 is refused
...     g = rlx.Graph("pick")
...     x = g.input("x", [2, 50], logits)
...     g.set_outputs([g.sample_top_k(x, g.input("u", [2], "f64"), g.input("s", [3], "f64"))])
...     return g
>>> supports(picker("f16"), "cuda"), supports(picker("f64"), "cuda")
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch
from rlx.codegen.registry import Kernel, RuleSet
from rlx.codegen.sample_args import SampleIO, logits_accepts
from rlx.ir.dtype import DType
from rlx.ir.graph import Node

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/sample.cu.j2"
HEADER = "cuda/kernels/sample.cuh"
#: sample.cuh's argmax pass reduces with argmax.cuh's rlx_block_best
HEADERS = ("cuda/kernels/argmax.cuh", HEADER)
#: Logit dtypes the kernel reads (converted to f32 on load); f64 is refused.
FLOATS = (DType.F32, DType.F16, DType.BF16)


@dataclass(frozen=True, kw_only=True)
class SampleLaunch(Launch, SampleIO):
    """Launch arguments of `block_sample_top_k`: the operands (`SampleIO`) and the logits' C type t."""

    t: str
    #: SampleFromArgmax: the argmax ids copied at temperature 0 / top_k 1 (else a null pointer: scanned here)
    best: str = "(const int32_t *)nullptr"


@RULES.register("sample_top_k", accepts=logits_accepts(FLOATS, "f32, f16 or bf16"))
def sample_top_k(e: CudaEmitter, node: Node) -> Kernel:
    x_id, u_id, s_id = node.inputs
    x = e.node(x_id).shape
    d = e.sample_from_argmax.get(node.id)
    best = {"best": e.ptr(d.argmax)} if d is not None else {}
    args = SampleLaunch(**e.base(node), uses_flag=True, t=e.ctype(x_id), x=e.ptr(x_id), u=e.ptr(u_id),
                        s=e.ptr(s_id), y=e.ptr(node.id), rows=e.dim(x.dims[0]), n=e.dim(x.dims[1]), **best)
    return Kernel(node.id, "block_sample_top_k", TEMPLATE, args, headers=HEADERS, header=args.comment,
                  label=node.label)

"""CUDA rule for `lora_matmul`: one block per row, shrink by warps then expand (kernels/lora.cuh).

>>> import rlx
>>> g = rlx.Graph("lora")
>>> x, i = g.input("x", [2, 1, 64]), g.input("i", [2], "i32")
>>> a, b, s = g.param("a", [3, 8, 64]), g.param("b", [3, 32, 8]), g.param("s", [3])
>>> g.set_outputs([g.lora_matmul(x, a, b, s, i)])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cuda")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir.graph import Node

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/lora.cu.j2"
HEADERS = ("cuda/kernels/lora.cuh",)


@dataclass(frozen=True, kw_only=True)
class LoraLaunch(Launch):
    """Launch arguments of `block_lora`: operands, x's rows (all of them) and rows per group m, sizes."""

    t: str
    x: str
    a: str
    b: str
    scale: str
    index: str
    y: str
    rows: str
    m: str
    k: int
    n: int
    r: int
    slots: int


@RULES.register("lora_matmul")
def lora_matmul(e: CudaEmitter, node: Node) -> Kernel:
    x_id, a_id, b_id, s_id, i_id = node.inputs
    x, b = e.node(x_id).shape, e.node(b_id).shape
    slots, n, rank = (d.value for d in b.dims)
    args = LoraLaunch(**e.base(node), uses_flag=True, t=e.ctype(x_id), x=e.ptr(x_id), a=e.ptr(a_id),
                      b=e.ptr(b_id), scale=e.ptr(s_id), index=e.ptr(i_id), y=e.ptr(node.id),
                      rows=e.numel(x.dims[:-1]), m=e.numel(x.dims[1:-1]), k=x.dims[-1].value, n=n, r=rank,
                      slots=slots)
    return Kernel(node.id, "block_lora", TEMPLATE, args, headers=HEADERS, header=args.comment, label=node.label)

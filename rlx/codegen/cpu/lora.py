"""CPU rule for `lora_matmul` (batched LoRA, one adapter slot per row group; `rlx.ir.ops_lora`).

Registered into the CPU rule table when `rlx.codegen` is imported. Each row shrinks to the
adapter's rank (dot products with the slot's `a` rows, scaled), then expands (the slot's `b` rows):
the row's arithmetic depends only on its own values and slot, so a row gives the same result
alone or batched. Rows are shared by the team; an index past the slots fails the run.

>>> import rlx
>>> g = rlx.Graph("lora")
>>> x, i = g.input("x", [2, 1, 64]), g.input("i", [2], "i32")
>>> a, b, s = g.param("a", [3, 8, 64]), g.param("b", [3, 32, 8]), g.param("s", [3])
>>> g.set_outputs([g.lora_matmul(x, a, b, s, i)])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cpu")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import c_string, node_header
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir.graph import Node
from rlx.ir.shape import product

#: This module's CPU rules (the table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "lora.c.j2"


@dataclass(frozen=True)
class LoraArgs:
    """C expressions and sizes of one `lora_matmul` kernel (macro `lora_matmul`)."""

    label: str
    x: str
    a: str
    b: str
    scale: str
    index: str
    y: str
    groups: str
    rows: str
    k: int
    n: int
    r: int
    slots: int


def emit_lora_matmul(em, node: Node) -> Kernel:
    """The `lora_matmul` kernel of a node: shrink then expand per row."""
    x_id, a_id, b_id, s_id, i_id = node.inputs
    x, b = em.node(x_id).shape, em.node(b_id).shape
    label = c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))
    slots, n, rank = (d.value for d in b.dims)
    args = LoraArgs(label=label, x=em.ptr(x_id), a=em.ptr(a_id), b=em.ptr(b_id), scale=em.ptr(s_id),
                    index=em.ptr(i_id), y=em.ptr(node.id, const=False), groups=em.dim(x.dims[0]),
                    rows=em.dim(product(x.dims[1:-1])), k=x.dims[-1].value, n=n, r=rank, slots=slots)
    return Kernel(node.id, "lora_matmul", TEMPLATE, args, header=node_header(node, 80), func=f"rlx_op_{node.id}",
                  label=label)


RULES.register("lora_matmul")(emit_lora_matmul)

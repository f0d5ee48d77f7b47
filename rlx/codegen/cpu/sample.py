"""CPU rule for `sample_top_k` (a token id per row of logits, sampled at the row's uniform u).

Registered into the CPU rule table when `rlx.codegen` is imported. The loop is in
`templates/cpu/kernels/sample.h`: a heap keeps each row's top k (k <= `SAMPLE_TOP_K_MAX`)
in one pass over the vocabulary, then the double-precision softmax weights, top_p
prefix and inverse CDF follow the reference's arithmetic, so tokens equal
`rlx.ir.ops_sample.sample_rows`'. Bad settings or a u outside [0, 1) fail the run.

>>> import rlx
>>> g = rlx.Graph("pick")
>>> x, u, s = g.input("x", [2, 50]), g.input("u", [2], "f64"), g.input("s", [3], "f64")
>>> g.set_outputs([g.sample_top_k(x, u, s)])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cpu")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import c_string, node_header
from rlx.codegen.registry import Kernel, RuleSet
from rlx.codegen.sample_args import SampleIO, logits_accepts
from rlx.ir.dtype import DType
from rlx.ir.graph import Node

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "sample.c.j2"
#: sample.h tests NaN with argmax.h's rlx_isnan_f32 and takes its row argmax (rlx_argmax_row_f32) at temperature 0
HEADERS = ("kernels/argmax.h", "kernels/sample.h")


#: f16/bf16 logits are widened to f32 by legalization (exact)
_accepts = logits_accepts((DType.F32,), "f32 (u and settings: f64)")


@dataclass(frozen=True, kw_only=True)
class SampleArgs(SampleIO):
    """C expressions of one `sample_top_k` kernel (`SampleIO`), its error label and n as written."""

    label: str
    n_comment: str


def emit_sample_top_k(em, node: Node) -> Kernel:
    """The `sample_top_k` kernel of a `sample_top_k` node."""
    x = em.node(node.inputs[0]).shape
    label = c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))
    args = SampleArgs(x=em.ptr(node.inputs[0]), u=em.ptr(node.inputs[1]), s=em.ptr(node.inputs[2]),
                      y=em.ptr(node.id, const=False), rows=em.dim(x.dims[0]), n=em.dim(x.dims[1]), label=label,
                      n_comment=str(x.dims[1]))
    return Kernel(node.id, "sample_top_k", TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label)


RULES.register("sample_top_k", accepts=_accepts)(emit_sample_top_k)

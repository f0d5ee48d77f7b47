"""CPU rules for `token_feed` and `token_store` (device-side token feedback, `rlx.ir.ops_feedback`): two loops
over a few rows (templates/cpu/feedback.c.j2).

>>> import rlx
>>> from rlx.ir.shape import Dim
>>> g = rlx.Graph("feed")
>>> b = Dim.dynamic("batch", 4)
>>> last = g.state("last", [4], "i32")
>>> fed = g.token_feed(g.input("tokens", [b, 1], "i32"), g.input("src", [b], "i32"), last)
>>> g.set_outputs([g.token_store(g.reshape(fed, [b]), g.input("dst", [b], "i32"), last)])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cpu")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import c_string, node_header
from rlx.codegen.feedback_args import FeedbackIO, feedback_accepts
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir.graph import Node

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "feedback.c.j2"


@dataclass(frozen=True, kw_only=True)
class FeedbackArgs(FeedbackIO):
    """C expressions of one `token_feed` or `token_store` kernel (`FeedbackIO`)."""


def _args(em, node: Node, writes_state: bool) -> FeedbackArgs:
    x_id, idx_id, last_id = node.inputs
    x = em.node(x_id).shape
    return FeedbackArgs(x=em.ptr(x_id), idx=em.ptr(idx_id), last=em.ptr(last_id, const=not writes_state),
                        y=em.ptr(node.id, const=False), rows=em.dim(x.dims[0]),
                        seq=em.dim(x.dims[1]) if x.rank == 2 else "1",
                        slots=em.node(last_id).shape.static_dims[0])


def _kernel(em, node: Node, macro: str, writes_state: bool) -> Kernel:
    label = c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))
    return Kernel(node.id, macro, TEMPLATE, _args(em, node, writes_state), header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label)


@RULES.register("token_feed", accepts=feedback_accepts)
def emit_token_feed(em, node: Node) -> Kernel:
    """The `token_feed` kernel: the tokens, each row's last one from the state where its src names a slot."""
    return _kernel(em, node, "token_feed", writes_state=False)


@RULES.register("token_store", accepts=feedback_accepts)
def emit_token_store(em, node: Node) -> Kernel:
    """The `token_store` kernel: the values, each also written to the state slot its dst names."""
    return _kernel(em, node, "token_store", writes_state=True)

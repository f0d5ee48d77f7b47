"""CUDA rules for `token_feed` and `token_store` (device-side token feedback, `rlx.ir.ops_feedback`): a thread
a row (kernels/feedback.cuh).

A serving step launched before the last step's tokens reached the host takes them from the i32 state the last
step stored them in.

>>> import rlx
>>> from rlx.ir.shape import Dim
>>> g = rlx.Graph("feed")
>>> b = Dim.dynamic("batch", 4)
>>> last = g.state("last", [4], "i32")
>>> fed = g.token_feed(g.input("tokens", [b, 1], "i32"), g.input("src", [b], "i32"), last)
>>> g.set_outputs([g.token_store(g.reshape(fed, [b]), g.input("dst", [b], "i32"), last)])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cuda")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch
from rlx.codegen.feedback_args import FeedbackIO, feedback_accepts
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir.graph import Node

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/feedback.cu.j2"
HEADER = "cuda/kernels/feedback.cuh"


@dataclass(frozen=True, kw_only=True)
class FeedbackLaunch(Launch, FeedbackIO):
    """Launch arguments of `block_token_feed` / `block_token_store` (`FeedbackIO`)."""


def _kernel(e: CudaEmitter, node: Node, macro: str) -> Kernel:
    x_id, idx_id, last_id = node.inputs
    x = e.node(x_id).shape
    args = FeedbackLaunch(**e.base(node), x=e.ptr(x_id), idx=e.ptr(idx_id), last=e.ptr(last_id), y=e.ptr(node.id),
                          rows=e.dim(x.dims[0]), seq=e.dim(x.dims[1]) if x.rank == 2 else "(int64_t)1",
                          slots=e.node(last_id).shape.static_dims[0])
    return Kernel(node.id, macro, TEMPLATE, args, headers=(HEADER,), header=args.comment, label=node.label)


@RULES.register("token_feed", accepts=feedback_accepts)
def token_feed(e: CudaEmitter, node: Node) -> Kernel:
    """The tokens, each row's last one from the state where its src names a slot."""
    return _kernel(e, node, "block_token_feed")


@RULES.register("token_store", accepts=feedback_accepts)
def token_store(e: CudaEmitter, node: Node) -> Kernel:
    """The values, each also written to the state slot its dst names."""
    return _kernel(e, node, "block_token_store")

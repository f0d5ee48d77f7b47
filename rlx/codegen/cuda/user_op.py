"""CUDA rule for user-defined ops (`rlx.custom_op`): a call of the user's host function on the run's stream.

The user's header is placed once in the graph's `.cu` (`Kernel.user_code`, after RLX's kernel headers:
`kernels/user_op.cuh` defines the tensor struct it takes); the run fills one `rlx_user_tensor` per input
and one for the output (device pointers, the session's device dtypes) and calls the function, which
launches its kernels on the stream (`templates/cuda/user_op.cu.j2`). The header is read when rendered and
must still have the digest the node was traced with.

>>> import rlx
>>> op = rlx.custom_op("cuda_rule_doc", infer=lambda x: x, reference=lambda x: x)
>>> g = rlx.trace("g", lambda t: op(t.input("x", [2])))
>>> from rlx.codegen.backends import first_unsupported_op
>>> first_unsupported_op(g, "cuda")[1]
"the CUDA backend does not support user_op 'cuda_rule_doc': it was registered without cuda= code"
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch
from rlx.codegen.registry import Kernel, RuleSet
from rlx.codegen.text import c_string, comment
from rlx.codegen.user_ops import UserTensor, accepts_for, source_comment, user_code, user_tensor
from rlx.ir.graph import Node
from rlx.ir.ops_user import UserOp

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/user_op.cu.j2"
HEADER = "cuda/kernels/user_op.cuh"


@dataclass(frozen=True, kw_only=True)
class UserOpLaunch(Launch):
    """The call of one user op's host function (macro `user_op`)."""

    name: str
    name_c: str
    function: str
    source_comment: str
    inputs: tuple[UserTensor, ...]
    output: UserTensor


@RULES.register("user_op", accepts=accepts_for("cuda"))
def user_op(e: CudaEmitter, node: Node) -> Kernel:
    op: UserOp = node.op  # type: ignore[assignment]
    function, note, text = user_code(op, "cuda")

    def tensor(nid: int) -> UserTensor:
        return user_tensor(e, e.ptr(nid), e.ddt(nid), e.node(nid).shape)  # the session's device dtype

    args = UserOpLaunch(**e.base(node), name=comment(op.name, 80), name_c=c_string(op.name), function=function,
                        source_comment=source_comment(op, "cuda"),
                        inputs=tuple(tensor(i) for i in node.inputs), output=tensor(node.id))
    return Kernel(node.id, "user_op", TEMPLATE, args, headers=(HEADER,), header=args.comment, label=node.label,
                  user_code=((note, text),))

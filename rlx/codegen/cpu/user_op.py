"""CPU rule for user-defined ops (`rlx.custom_op`): a call of the user's C function.

The user's header is placed once in the graph's one source file (`Kernel.user_code`, after RLX's kernel
headers: `kernels/user_op.h` defines the tensor struct it takes); the node's function fills one
`rlx_user_tensor` per input and one for the output, and calls it (`templates/cpu/user_op.c.j2`). The
header is read when rendered and must still have the digest the node was traced with.

>>> import rlx
>>> op = rlx.custom_op("c_rule_doc", infer=lambda x: x, reference=lambda x: x)
>>> g = rlx.trace("g", lambda t: op(t.input("x", [2])))
>>> from rlx.codegen.backends import first_unsupported_op
>>> first_unsupported_op(g, "cpu")[1]
"the CPU backend does not support user_op 'c_rule_doc': it was registered without cpu= code"
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import c_string, comment, node_header
from rlx.codegen.registry import Kernel, RuleSet
from rlx.codegen.user_ops import UserTensor, accepts_for, source_comment, user_code, user_tensor
from rlx.ir.graph import Node
from rlx.ir.ops_user import UserOp

#: This module's CPU rules (the table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "user_op.c.j2"
HEADERS = ("kernels/user_op.h",)


@dataclass(frozen=True)
class UserOpArgs:
    """The call of one user op's function (macro `user_op`)."""

    name: str
    name_c: str
    function: str
    source_comment: str
    label: str
    inputs: tuple[UserTensor, ...]
    output: UserTensor


def emit_user_op(em, node: Node) -> Kernel:
    """The call of a user op's C function on its inputs."""
    op: UserOp = node.op  # type: ignore[assignment]
    function, note, text = user_code(op, "cpu")

    def tensor(nid: int, const: bool) -> UserTensor:
        shape = em.node(nid).shape
        return user_tensor(em, em.ptr(nid, const=const), shape.dtype, shape)

    label = c_string(f"%{node.id} user_op {op.name}" + (f" ({node.name[:60]})" if node.name else ""))
    args = UserOpArgs(name=comment(op.name, 80), name_c=c_string(op.name), function=function,
                      source_comment=source_comment(op, "cpu"), label=label,
                      inputs=tuple(tensor(i, True) for i in node.inputs), output=tensor(node.id, False))
    return Kernel(node.id, "user_op", TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"{getattr(em, 'prefix', 'rlx_')}op_{node.id}", label=label, user_code=((note, text),))


RULES.register("user_op", accepts=accepts_for("cpu"))(emit_user_op)

"""Metal rule for user-defined ops (`rlx.custom_op`): a kernel calling the user's MSL function per output element.

The user's header is placed once in the graph's `.metal` (`Kernel.user_code`, after RLX's kernel headers:
`kernels/user_op.metal` defines the tensor struct it takes). The node's kernel runs one thread per output
element; each fills one `rlx_user_tensor` per input and one for the output (pointers into the program
buffer, dims as expressions of the dynamic dims) and calls the function with its element's index
(`templates/metal/user_op.metal.j2`). A nonzero status sets the run's error flag to `USER_OP_FLAG` plus the
node's id, which the manifest's `flag_errors` maps to a message naming the op. The header is read when
rendered and must still have the digest the node was traced with.

>>> import rlx
>>> op = rlx.custom_op("metal_rule_doc", infer=lambda x: x, reference=lambda x: x)
>>> g = rlx.trace("g", lambda t: op(t.input("x", [2])))
>>> from rlx.codegen.backends import first_unsupported_op
>>> first_unsupported_op(g, "metal")[1]
"the METAL backend does not support user_op 'metal_rule_doc': it was registered without metal= code"
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.metal.emit import USER_OP_FLAG, Dispatch, MetalArgs, MetalEmitter, grid_1d
from rlx.codegen.registry import Kernel, RuleSet
from rlx.codegen.text import comment
from rlx.codegen.user_ops import UserTensor, accepts_for, source_comment, user_code, user_tensor
from rlx.ir.graph import Node
from rlx.ir.ops_user import UserOp
from rlx.ir.shape import product

#: This module's Metal rules (the table is made from them: `rlx.codegen.metal.rule_table`).
RULES = RuleSet("metal")

TEMPLATE = "metal/user_op.metal.j2"
HEADER = "metal/kernels/user_op.metal"


@dataclass(frozen=True, kw_only=True)
class UserOpKernel(MetalArgs):
    """The kernel of one user op (macro `block_user_op`)."""

    name: str
    op_name: str
    function: str
    source_comment: str
    flag: str
    status_flag: int
    inputs: tuple[UserTensor, ...]
    output: UserTensor


@RULES.register("user_op", accepts=accepts_for("metal"))
def user_op(e: MetalEmitter, node: Node) -> Kernel:
    op: UserOp = node.op  # type: ignore[assignment]
    function, note, text = user_code(op, "metal")

    def tensor(nid: int) -> UserTensor:
        shape = e.node(nid).shape
        return user_tensor(e, f"rlx_mem + {e.offset(nid)}", shape.dtype, shape)

    name = e.kernel_name(node)
    threads = e.target.threads
    launch = Dispatch(name, grid_1d(product(node.shape.dims), threads), (threads, 1, 1))
    args = UserOpKernel(comment=e.header(node), launches=(launch,), name=name, op_name=comment(op.name, 80),
                        function=function, source_comment=source_comment(op, "metal"),
                        flag=e.flag(), status_flag=USER_OP_FLAG + node.id, inputs=tuple(tensor(i) for i in node.inputs),
                        output=tensor(node.id))
    return Kernel(node.id, "block_user_op", TEMPLATE, args, headers=(HEADER,), header=args.comment,
                  label=node.label, user_code=((note, text),))

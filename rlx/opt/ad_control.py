"""Derivative rules of control flow: `cond` (both modes) and `while_loop` (forward; reverse through max_trips).

`cond`: the derivative of the chosen branch is the chosen derivative. Reverse
mode emits one `cond` per float operand, whose branches are each branch's vjp
(derived by `rlx.opt.ad_core.vjp`) returning that operand's cotangent; forward
mode emits one `cond` whose branches are each branch's jvp returning the output
tangent. The predicate has no derivative.

`while_loop`, forward mode: one while loop carrying the primal and its tangent
packed together (static shapes, as scan's rules pack), the cond reading the
primal half, the body the jvp of the loop body.

`while_loop`, reverse mode: the number of trips is data dependent, so the loop
is differentiated as what it equals when `max_trips` bounds it: a scan of
`max_trips` masked steps (``where(cond(c), body(c), c)``, `rlx.opt.control.masked_step`),
whose reverse-mode rule (`rlx.opt.ad_scan`) recomputes the trajectory and sweeps
back. Without `max_trips` there is no bound to sweep back over, and the rule
says so. Steps after the loop ended pass the cotangent through unchanged.
"""

from __future__ import annotations

import dataclasses
import math

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.ops_control import Cond, WhileLoop
from rlx.ir.ops_scan import Body
from rlx.ir.shape import Shape
from rlx.opt.ad_core import jvp, vjp
from rlx.opt.ad_rules import JVP, VJP, Ct, zeros
from rlx.opt.ad_scan import pack, unpack
from rlx.opt.bodies import inline_body
from rlx.opt.control import masked_step


def _numel(shape: Shape) -> int:
    if not shape.is_static:
        raise IRError(f"autodiff of while_loop: the carry must have a static shape, got {shape}")
    return math.prod(shape.static_dims)


def _canonical(body: Body) -> tuple[Graph, list[str]]:
    """`body` as a graph whose inputs are named in0..in{n-1} (autodiff finds leaves by name)."""
    g = Graph(body.name)
    names = []
    for n in body.nodes:
        op = n.op
        if isinstance(op, O.Input):
            op = dataclasses.replace(op, name=f"in{len(names)}")
            names.append(op.name)
        g.add(op, n.inputs, name=n.name)
    g.set_outputs(list(body.outputs))
    return g, names


def _output(graph: Graph, idx: int) -> Graph:
    """`graph` returning only its output `idx` (a derivative body for a one-output op)."""
    graph.set_outputs([graph.outputs[idx]])
    return graph


def _vjp_cond(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    op: Cond = node.op  # type: ignore[assignment]
    operands = args[1:]
    floats = [i for i, a in enumerate(operands) if g.shape(a).dtype.is_float]
    if not floats:
        return [None] * len(args)
    derived = []
    for body in (op.true_body, op.false_body):
        bg, names = _canonical(body)
        derived.append(vjp(bg, wrt=[names[i] for i in floats]))  # inputs: operands, d_out; outputs: out, grads
    cts: list[Ct] = [None] * len(args)
    for k, i in enumerate(floats):
        t, f = (_output(d.copy(), 1 + k) for d in derived)
        cts[1 + i] = g.cond(args[0], t, f, [*operands, ct])
    return cts


def _jvp_cond(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    op: Cond = node.op  # type: ignore[assignment]
    operands = args[1:]
    active = [i for i, a in enumerate(operands) if ts[1 + i] is not None and g.shape(a).dtype.is_float]
    branches = []
    for body in (op.true_body, op.false_body):
        bg, names = _canonical(body)
        branches.append(_output(jvp(bg, wrt=[names[i] for i in active]), 1))  # inputs: operands, tangents
    return g.cond(args[0], *branches, [*operands, *(ts[1 + i] for i in active)])


def _jvp_while(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    op: WhileLoop = node.op  # type: ignore[assignment]
    carry = g.shape(args[0])
    if not carry.dtype.is_float:
        return None
    bcasts = args[1:]
    active = [i for i, b in enumerate(bcasts) if ts[1 + i] is not None and g.shape(b).dtype.is_float]
    body, names = _canonical(op.body)
    dbody = jvp(body, wrt=[names[0], *(names[1 + i] for i in active)])  # outputs: next carry, its tangent

    def step(name: str) -> tuple[Graph, NodeId, list[NodeId], list[NodeId]]:
        s = Graph(f"{op.body.name}_{name}")
        pair = s.input("pair", [2 * _numel(carry)], carry.dtype)
        bs = [s.input(f"bcast{i}", g.shape(b)) for i, b in enumerate(bcasts)]
        tbs = [s.input(f"t_bcast{i}", g.shape(bcasts[i])) for i in active]
        return s, pair, bs, tbs

    cg, pair, bs, _ = step("jvp_cond")
    c, _tc = unpack(cg, pair, [carry, carry])
    cg.set_outputs([inline_body(cg, op.cond_body, [c, *bs])[0]])
    bg, pair, bs, tbs = step("jvp_body")
    c, tc = unpack(bg, pair, [carry, carry])
    res = inline_body(bg, dbody.as_body(), [c, *bs, tc, *tbs])
    bg.set_outputs([pack(bg, res)])
    init_t = ts[0] if ts[0] is not None else zeros(g, args[0])
    loop = g.while_loop(cg, bg, pack(g, [args[0], init_t]), bcasts=[*bcasts, *(ts[1 + i] for i in active)],
                        max_trips=op.max_trips)
    n = _numel(carry)
    return g.reshape(g.narrow(loop, 0, n, n), list(carry.dims))


def _vjp_while(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    op: WhileLoop = node.op  # type: ignore[assignment]
    if op.max_trips is None:
        raise IRError(f"autodiff: reverse mode through {node.label} while_loop needs max_trips (it is "
                      f"differentiated as a scan of max_trips masked steps); forward mode (jvp) needs none")
    if op.max_trips == 0:
        return [ct] + [None] * (len(args) - 1)
    step = masked_step(op, g.shape(args[0]), [g.shape(b) for b in args[1:]])
    scan = g.scan(step, args[0], bcasts=args[1:], length=op.max_trips)
    return VJP["scan"](g, g.node(scan), args, scan, ct)  # type: ignore[return-value]


VJP["cond"] = _vjp_cond
JVP["cond"] = _jvp_cond
VJP["while_loop"] = _vjp_while
JVP["while_loop"] = _jvp_while

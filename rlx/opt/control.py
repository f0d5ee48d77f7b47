"""Control flow across the optimizer and the backends: folding `cond` / `while_loop`, and lowering them.

Optimization (`fold_control`, run by pass "fold" after constant folding, so predicates folded to
constants are seen):

- a `cond` whose predicate is a constant becomes the chosen branch, inlined;
- a `while_loop` whose cond body returns a constant false, or whose `max_trips` is 0, becomes its init;
- operands (cond) and broadcast inputs (while_loop) that no body reads are dropped from the op.

Their bodies are optimized like scan bodies by pass "bodies" (rlx/opt/bodies.py: DCE, folding, fusion
inside each body), so a value a branch computes but never returns is gone before this pass runs.

Backends: the CPU has rules (rlx/codegen/cpu/control.py: only the taken branch runs; a real loop, unbounded
without `max_trips`), and so has CUDA (rlx/codegen/cuda/control.py: the device predicate picks the branch /
ends the loop, as conditional graph nodes under CUDA Graph capture, a host read when eager; recorded as a
`ControlFlow` decision). Where a backend has no rule for the op, or its rule refuses this node (CUDA: a body
holding a scan, cond or while_loop, one level being rendered; Metal: while_loop), `lower_cond` and
`lower_while_loop` run, registered as the decompositions of the op (rlx/opt/decompose.py), and name the node
they leave with the backend's reason (`fallback_name`; CUDA records it as a `ControlFlow` decision):

- `cond` runs both branches and selects (`where`): the value is the chosen branch's, as lax.cond's is
  under `vmap`. Both branches run, so an untaken branch costs time, and its non-finite values are
  discarded, never propagated.
- `while_loop` with `max_trips` becomes a scan of `max_trips` steps over a masked body,
  ``carry = where(cond(carry), body(carry), carry)``: once the cond is false the carry stops changing,
  so the cond stays false and the result is the while loop's. The loop, its body's kernels and its
  memory are then planned and rendered by the scan machinery (rlx/opt/scan_body.py, LirModule.bodies;
  Metal has no scan rule, so it refuses the loop before any build, naming it). A while_loop without
  `max_trips` has no bound for such a scan, and is refused with an error naming the fix.
"""

from __future__ import annotations

import dataclasses

from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.ops_control import Cond, WhileLoop
from rlx.ir.ops_scan import Body, Scan
from rlx.ir.shape import Dim, Shape
from rlx.opt.bodies import inline_body
from rlx.opt.rewrite import Rewriter, require_mir


def _constant_truth(graph: Graph, nid: NodeId) -> bool | None:
    op = graph.node(nid).op
    return bool(op.array().reshape(-1)[0]) if isinstance(op, O.Constant) else None


def _body_output_truth(body: Body) -> bool | None:
    """The value of a body's one output when it is a constant (the cond body of a loop that never runs)."""
    op = body.nodes[body.outputs[0]].op
    return bool(op.array().reshape(-1)[0]) if isinstance(op, O.Constant) else None


def _used_inputs(body: Body) -> list[bool]:
    """For each input of `body` (in order), whether some node or output reads it."""
    read = {i for n in body.nodes for i in n.inputs} | set(body.outputs)
    return [idx in read for idx in body.input_ids()]


def without_inputs(body: Body, keep: list[bool]) -> Body:
    """`body` with the inputs whose `keep` flag is false removed (they must be unread)."""
    g = Graph(body.name)
    env: dict[int, NodeId] = {}
    ins = iter(keep)
    for idx, n in enumerate(body.nodes):
        if isinstance(n.op, O.Input) and not next(ins):
            continue
        env[idx] = g.add(n.op, [env[i] for i in n.inputs], name=n.name)
    g.set_outputs([env[o] for o in body.outputs], list(body.output_names) or None)
    return g.as_body()


def _fold_cond(rw: Rewriter, node: Node) -> None:
    args = rw.args(node)
    op: Cond = node.op  # type: ignore[assignment]
    truth = _constant_truth(rw.dst, args[0])
    if truth is not None:
        rw.alias(node, inline_body(rw.dst, op.true_body if truth else op.false_body, args[1:])[0])
        return
    used = [a or b for a, b in zip(_used_inputs(op.true_body), _used_inputs(op.false_body))]
    if all(used):
        rw.emit(node, op, args)
        return
    new = Cond(without_inputs(op.true_body, used), without_inputs(op.false_body, used))
    rw.emit(node, new, [args[0], *(a for a, u in zip(args[1:], used) if u)])


def _fold_while(rw: Rewriter, node: Node) -> None:
    args = rw.args(node)
    op: WhileLoop = node.op  # type: ignore[assignment]
    if op.max_trips == 0 or _body_output_truth(op.cond_body) is False:
        rw.alias(node, args[0])
        return
    used = [a or b for a, b in zip(_used_inputs(op.cond_body), _used_inputs(op.body))]
    used[0] = True  # the carry stays, read or not
    if all(used):
        rw.emit(node, op, args)
        return
    new = dataclasses.replace(op, cond_body=without_inputs(op.cond_body, used), body=without_inputs(op.body, used))
    rw.emit(node, new, [a for a, u in zip(args, used) if u])


def fold_control(graph: Graph) -> Graph:
    """Constant predicates folded, unread operands dropped (see the module docstring).

    >>> import numpy as np
    >>> g = Graph("k")
    >>> x = g.input("x", [2])
    >>> t, f = Graph("t"), Graph("f")
    >>> t.set_outputs([t.activation("exp", t.input("v", [2]))])
    >>> f.set_outputs([f.activation("neg", f.input("v", [2]))])
    >>> g.set_outputs([g.cond(g.constant(np.bool_(True)), t, f, [x])])
    >>> [n.kind for n in fold_control(g).nodes]
    ['input', 'constant', 'activation']
    """
    require_mir(graph, "fold_control")
    if not any(isinstance(n.op, (Cond, WhileLoop)) for n in graph.nodes):
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if isinstance(node.op, Cond):
            _fold_cond(rw, node)
        elif isinstance(node.op, WhileLoop):
            _fold_while(rw, node)
        else:
            rw.copy(node)
    return rw.finish()


#: What each control op becomes where its backend's rule does not take it.
FALLBACKS = {"cond": "select", "while_loop": "masked scan"}


def fallback_name(node: Node, reason: str) -> str:
    """The name of the node a fallback lowering of `node` leaves, saying why the backend's rule did not take it.

    >>> parse_fallback("while_loop %3 as a masked scan: a scan in its body")
    ('while_loop', 'masked scan', 'a scan in its body')
    """
    return f"{node.kind} {node.label} as a {FALLBACKS[node.kind]}: {reason}"


def parse_fallback(name: str) -> tuple[str, str, str] | None:
    """(op kind, fallback, reason) from a name `fallback_name` made, else None."""
    for kind, how in FALLBACKS.items():
        marker = f" as a {how}: "
        if name.startswith(f"{kind} %") and marker in name:
            return kind, how, name.split(marker, 1)[1]
    return None


def lower_cond(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    """A `cond` as both branches inlined and a `where` on the predicate (see the module docstring)."""
    op: Cond = node.op  # type: ignore[assignment]
    a = inline_body(g, op.true_body, args[1:])[0]
    b = inline_body(g, op.false_body, args[1:])[0]
    pred = g.reshape(args[0], []) if g.shape(args[0]).rank else args[0]
    return g.add(O.Where(), [pred, a, b], name=node.name if parse_fallback(node.name) else "")


def masked_step(op: WhileLoop, carry_shape: Shape, bcast_shapes: list[Shape]) -> Graph:
    """The scan body of a bounded while loop: ``where(cond(c, *b), body(c, *b), c)``."""
    step = Graph(f"{op.body.name}_masked")
    ins = [step.input("carry", carry_shape)]
    ins += [step.input(f"bcast{i}", s) for i, s in enumerate(bcast_shapes)]
    pred = inline_body(step, op.cond_body, ins)[0]
    if step.shape(pred).rank:
        pred = step.reshape(pred, [])
    nxt = inline_body(step, op.body, ins)[0]
    step.set_outputs([step.where(pred, nxt, ins[0])])
    return _conds_as_selects(step)


def _conds_as_selects(graph: Graph) -> Graph:
    """`graph` with each cond lowered to a select: a masked step is a scan body, which holds no bodies on a
    backend that falls back to it (a cond its backend's rule took inside the loop's body comes here)."""
    if not any(isinstance(n.op, Cond) for n in graph.nodes):
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if isinstance(node.op, Cond):
            rw.alias(node, lower_cond(rw.dst, node, rw.args(node)))
        else:
            rw.copy(node)
    return rw.finish()


def lower_while_loop(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    """A bounded `while_loop` as a scan of `max_trips` masked steps (see the module docstring)."""
    op: WhileLoop = node.op  # type: ignore[assignment]
    if op.max_trips is None:
        raise BuildError(f"{node.label} while_loop has no max_trips: compiled backends run a while loop as a "
                         f"masked loop of max_trips steps; give max_trips (the reference runs it unbounded)")
    if op.max_trips == 0:
        return args[0]
    step = masked_step(op, g.shape(args[0]), [g.shape(b) for b in args[1:]])
    scan = Scan(step.as_body(), Dim(op.max_trips), num_bcast=len(args) - 1)
    # named for the loop it runs, so a backend refusing scan names the while_loop
    return g.add(scan, args, name=node.name or f"while_loop {node.label}")

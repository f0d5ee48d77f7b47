"""Passes over sub-graph bodies: optimize every scan / cond / while_loop body, inline custom functions.

`optimize_bodies` runs the full optimization pipeline on each scan body and
each control-flow body (rlx/ir/ops_control.py), recursively, since the
pipeline includes this pass, so the loop runs fused,
folded kernels like any graph. `inline_custom_fns` replaces every
`custom_fn` node by its forward body and drops a user op's `vjp` body: derivative
bodies matter only to autodiff, which runs before optimization.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.ops_control import bodies_of
from rlx.ir.ops_scan import Body, CustomFn, Scan
from rlx.ir.ops_user import UserOp
from rlx.opt.rewrite import Rewriter, require_mir


def inline_body(g: Graph, body: Body, args: list[NodeId]) -> list[NodeId]:
    """Emit `body` into `g` with its inputs bound to `args`; returns its output ids in `g`."""
    env: dict[int, NodeId] = {}
    feed = iter(args)
    for idx, n in enumerate(body.nodes):
        if isinstance(n.op, O.Input):
            env[idx] = next(feed)
        else:
            env[idx] = g.add(n.op, [env[i] for i in n.inputs], name=n.name)
    return [env[o] for o in body.outputs]


def inline_custom_fn(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    """A custom_fn node's forward body, emitted in place of the node."""
    return inline_body(g, node.op.fwd, args)[0]  # type: ignore[attr-defined]


def inline_custom_fns(graph: Graph) -> Graph:
    """`graph` with every custom_fn node replaced by its forward body, and user ops without their vjp body."""
    require_mir(graph, "inline_custom_fns")
    rw = Rewriter(graph)
    for node in graph.nodes:
        if isinstance(node.op, CustomFn):
            rw.alias(node, inline_custom_fn(rw.dst, node, rw.args(node)))
        elif isinstance(node.op, UserOp) and node.op.vjp is not None:
            rw.emit(node, dataclasses.replace(node.op, vjp=None), rw.args(node))
        else:
            rw.copy(node)
    return rw.finish()


def map_bodies(graph: Graph, fn) -> Graph:
    """`graph` with every scan and control-flow body replaced by `fn(body graph)` (a pure rewrite)."""
    rw = Rewriter(graph)
    for node in graph.nodes:
        if isinstance(node.op, Scan):
            body = fn(Graph.from_body(node.op.body)).as_body()
            rw.emit(node, dataclasses.replace(node.op, body=body), rw.args(node))
        elif bodies_of(node.op):
            new = {f: fn(Graph.from_body(b)).as_body() for f, b in bodies_of(node.op).items()}
            rw.emit(node, dataclasses.replace(node.op, **new), rw.args(node))
        else:
            rw.copy(node)
    return rw.finish()


def optimize_bodies(graph: Graph, optimize: Callable[[Graph], Graph]) -> Graph:
    """Every scan body optimized by `optimize` (the pipeline passes its own); custom functions inlined."""
    require_mir(graph, "optimize_bodies")
    if not any(isinstance(n.op, (Scan, CustomFn)) or bodies_of(n.op)
               or (isinstance(n.op, UserOp) and n.op.vjp is not None) for n in graph.nodes):
        return graph.copy()
    return map_bodies(inline_custom_fns(graph), optimize)

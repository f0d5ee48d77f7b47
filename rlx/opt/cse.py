"""Common subexpression elimination: one node per (op, inputs).

Ops are frozen dataclasses, so `(op, inputs)` is a dictionary key. Inputs and
params are never merged (each is a separate slot of the C ABI, even when two
have the same shape); identical constants are. Commutative ops (add, mul,
max, min, eq, ne) match with their operands in either order: IEEE addition
and multiplication are commutative, so this changes no value.
"""

from __future__ import annotations

from rlx.ir import ops as O
from rlx.ir.graph import Graph, NodeId
from rlx.opt.rewrite import Rewriter, require_mir

_COMMUTATIVE_BINARY = frozenset({"add", "mul", "max", "min"})
_COMMUTATIVE_COMPARE = frozenset({"eq", "ne"})


def cse(graph: Graph) -> Graph:
    """Merge nodes that compute the same thing.

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("c")
    >>> x = g.input("x", [2])
    >>> g.set_outputs([g.add_(g.activation("exp", x), g.activation("exp", x))])
    >>> [n.kind for n in cse(g).nodes]
    ['input', 'activation', 'binary']
    """
    require_mir(graph, "cse")
    rw = Rewriter(graph)
    seen: dict[tuple[O.Op, tuple[NodeId, ...]], NodeId] = {}
    for node in graph.nodes:
        if node.kind in ("input", "param"):
            rw.copy(node)
            continue
        args = tuple(rw.args(node))
        key = (node.op, _key_args(node.op, args))
        hit = seen.get(key)
        if hit is not None:
            rw.alias(node, hit)
        else:
            seen[key] = rw.emit(node, node.op, args)
    return rw.finish()


def _key_args(op: O.Op, args: tuple[NodeId, ...]) -> tuple[NodeId, ...]:
    if (isinstance(op, O.Binary) and op.fn in _COMMUTATIVE_BINARY) or \
            (isinstance(op, O.Compare) and op.fn in _COMMUTATIVE_COMPARE):
        return tuple(sorted(args))
    return args

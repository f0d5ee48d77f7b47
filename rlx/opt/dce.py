"""Dead code elimination: drop nodes no output depends on.

Inputs and params are always kept, used or not: they are slots of the C ABI
(`rlx_run`'s input array, `rlx_set_param`'s index), so removing one would
renumber the others.
"""

from __future__ import annotations

from rlx.ir.graph import Graph, NodeId
from rlx.opt.rewrite import Rewriter, require_mir


def dce(graph: Graph) -> Graph:
    """Remove nodes that no output depends on.

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("d")
    >>> x = g.input("x", [2])
    >>> _unused = g.activation("exp", x)
    >>> g.set_outputs([g.activation("neg", x)])
    >>> [n.kind for n in dce(g).nodes]
    ['input', 'activation']
    """
    require_mir(graph, "dce")
    live: set[NodeId] = set(graph.outputs)
    for node in reversed(graph.nodes):
        if node.id in live or node.kind in ("input", "param"):
            live.add(node.id)
            live.update(node.inputs)
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in live:
            rw.copy(node)
    return rw.finish()

"""Weight layout: transposes of params are done once, at `set_param` time.

A `Transpose` of a `Param` (PyTorch stores linear weights `[out, in]` and the
graph multiplies by their transpose) costs a full copy every run. When every
consumer of the param is a transpose with the same perm, the param is
re-declared with `layout=perm` and the stored shape of the transposed value:
the runtime permutes the user's array once in `set_param`, and the
transposes disappear. The user-facing shape (`Param.user_shape`), the name
and the param's slot do not change.
"""

from __future__ import annotations

from rlx.ir import ops as O
from rlx.ir.graph import Graph
from rlx.opt.rewrite import Rewriter, consumers, require_mir


def prepack_params(graph: Graph) -> Graph:
    """Absorb transposes of params into the params' layout.

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("l")
    >>> x = g.input("x", [2, 3])
    >>> w = g.param("w", [4, 3])
    >>> g.set_outputs([g.matmul(x, g.transpose(w, [1, 0]))])
    >>> p = prepack_params(g).params()[0].op
    >>> p.layout, str(p.shape), str(p.user_shape)
    ((1, 0), 'f32[3,4]', 'f32[4,3]')
    """
    require_mir(graph, "layout")
    users = consumers(graph)
    outputs = set(graph.outputs)
    rw = Rewriter(graph)
    packed: dict[int, int] = {}  # transpose node -> new param id
    for node in graph.nodes:
        if node.id in packed:
            rw.alias(node, packed[node.id])
            continue
        op = node.op
        if isinstance(op, O.Param) and node.id not in outputs and users[node.id]:
            perms = {graph.node(u).op.perm if isinstance(graph.node(u).op, O.Transpose) else None
                     for u in users[node.id]}
            if len(perms) == 1 and None not in perms:
                perm = perms.pop()
                old = op.layout or tuple(range(op.shape.rank))
                layout = tuple(old[p] for p in perm)
                stored = op.shape.with_dims(op.shape.dims[p] for p in perm)
                new_param = O.Param(op.name, stored, None if layout == tuple(range(len(layout))) else layout)
                new_id = rw.emit(node, new_param, [])
                for u in users[node.id]:
                    packed[u] = new_id
                continue
        rw.copy(node)
    return rw.finish()

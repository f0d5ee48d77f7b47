"""Algebraic simplification: identities that remove work without changing values.

Rules (a value is only replaced by one of exactly the same shape and dtype,
so an identity that would broadcast, e.g. `x[N] * ones[M,N]`, is kept):

- `x*1`, `1*x`, `x/1`, `x**1`, `x+0`, `0+x`, `x-0` → `x` (the constant is all ones / zeros)
- `transpose(transpose(x, p), q)` → one transpose with the composed perm; identity perms vanish
- `reshape(reshape(x))` → one reshape; a reshape to the input's own shape vanishes
- a cast to the input's dtype, a narrow of a whole axis, an expand to the same
  shape, a concat of one input → the input

`x + 0` → `x` is exact except for the sign of a zero result (`-0.0 + 0.0` is
`+0.0`); the two compare equal, and no op RLX has distinguishes them except
`x / 0`. Chains collapse in one pass: a node is matched against its
already-simplified inputs.
"""

from __future__ import annotations

from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node, NodeId
from rlx.opt.rewrite import Rewriter, is_fill, require_mir

# fn -> (which operand may be the identity constant, its value); "either" means both sides.
_IDENTITIES: dict[str, tuple[str, float]] = {
    "mul": ("either", 1.0),
    "add": ("either", 0.0),
    "sub": ("right", 0.0),
    "div": ("right", 1.0),
    "pow": ("right", 1.0),
}


def simplify(graph: Graph) -> Graph:
    """Apply the identities above.

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("s")
    >>> x = g.input("x", [2, 3])
    >>> t = g.transpose(g.transpose(x, [1, 0]), [1, 0])
    >>> g.set_outputs([g.mul(t, g.constant(1.0))])
    >>> simplify(g).outputs  # the output is x itself; dce drops what is left over
    [0]
    """
    require_mir(graph, "simplify")
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.kind in O.LEAF_KINDS:
            rw.copy(node)
            continue
        args = rw.args(node)
        result = _rule(rw.dst, node, args)
        if result is None:
            rw.copy(node)
        elif isinstance(result, int):
            rw.alias(node, result)
        else:
            op, ins = result
            # The replacement may itself be an identity (a composed perm that is the identity).
            again = _rule(rw.dst, Node(node.id, op, tuple(ins), node.shape, node.name), list(ins))
            if isinstance(again, int):
                rw.alias(node, again)
            else:
                rw.emit(node, op, ins)
    return rw.finish()


Rewrite = NodeId | tuple[O.Op, list[NodeId]] | None


def _rule(g: Graph, node: Node, args: list[NodeId]) -> Rewrite:
    op = node.op
    same = [a for a in args if g.node(a).shape == node.shape]
    if isinstance(op, O.Binary) and op.fn in _IDENTITIES:
        side, value = _IDENTITIES[op.fn]
        a, b = args
        if is_fill(g, b, value) and a in same:
            return a
        if side == "either" and is_fill(g, a, value) and b in same:
            return b
        return None
    if isinstance(op, O.Transpose):
        src = g.node(args[0])
        if isinstance(src.op, O.Transpose):
            composed = tuple(src.op.perm[p] for p in op.perm)
            return (O.Transpose(composed), [src.inputs[0]])
        if op.perm == tuple(range(len(op.perm))):
            return args[0]
        return None
    if isinstance(op, O.Reshape):
        src = g.node(args[0])
        if src.shape.dims == node.shape.dims:
            return args[0]
        if isinstance(src.op, O.Reshape):
            return (op, [src.inputs[0]])
        return None
    if isinstance(op, (O.Cast, O.Narrow, O.Expand, O.Concat)):
        if len(args) == 1 and args[0] in same:
            return args[0]
        return None
    return None

"""Constant folding: ops whose inputs are all constants become constants.

Values are computed by the reference interpreter, so a folded constant holds
exactly what the unfolded op would have produced (rounded to its dtype).
Folding never inflates the program: a result above `max_elements` stays an
op, and so does one that is bigger than its inputs together (an expand, a
broadcasting binary) unless it is small (`max_growth_elements`). Ops whose
evaluation fails (integer division by zero, an out-of-range gather) are left
in place, so the error surfaces at run time where the user can see it.
"""

from __future__ import annotations

import math

import numpy as np

from rlx import reference
from rlx.errors import RlxError
from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node
from rlx.ir.shape import Shape
from rlx.opt.rewrite import Rewriter, constant_from_values, constant_values, require_mir

MAX_FOLD_ELEMENTS = 1 << 20
MAX_GROWTH_ELEMENTS = 1 << 16


def fold(graph: Graph, *, max_elements: int = MAX_FOLD_ELEMENTS,
         max_growth_elements: int = MAX_GROWTH_ELEMENTS) -> Graph:
    """Replace all-constant subgraphs by their values.

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("f")
    >>> x = g.input("x", [2])
    >>> two = g.add_(g.constant(1.0), g.constant(1.0))
    >>> g.set_outputs([g.mul(x, two)])
    >>> [n.kind for n in fold(g).nodes]
    ['input', 'constant', 'constant', 'constant', 'binary']
    """
    require_mir(graph, "fold")
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.kind in O.LEAF_KINDS:
            rw.copy(node)
            continue
        args = rw.args(node)
        arg_nodes = [rw.new(a) for a in args]
        if not all(isinstance(a.op, O.Constant) for a in arg_nodes) or not node.shape.is_static:
            rw.copy(node)
            continue
        out_elems = node.shape.max_numel
        in_elems = sum(a.shape.max_numel for a in arg_nodes)
        if out_elems > max_elements or (out_elems > in_elems and out_elems > max_growth_elements):
            rw.copy(node)
            continue
        values = _evaluate(node.op, arg_nodes, node.shape)
        if values is None:
            rw.copy(node)
            continue
        const = rw.dst.add(constant_from_values(values, node.shape), name=node.name)
        rw.alias(node, const)
    return rw.finish()


def _evaluate(op: O.Op, arg_nodes: list[Node], shape: Shape) -> np.ndarray | None:
    args = [reference.to_compute(constant_values(a.op), a.shape.dtype) for a in arg_nodes]
    try:
        value = reference.evaluate(op, args, shape, {}, in_shapes=[a.shape for a in arg_nodes])
    except (RlxError, ArithmeticError, ValueError):
        return None
    value = np.asarray(value)
    if value.shape != shape.static_dims or math.prod(value.shape) != shape.max_numel:
        return None
    return reference.to_boundary(value, shape.dtype)

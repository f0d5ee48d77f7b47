"""A first-order cost model of one node: floating-point operations and bytes moved.

Costs are polynomials in the dynamic dims (a sum of monomials `coeff * sym1 *
sym2 ...`), so one table serves every run: the profiled build evaluates them
in C from the run's `sym[]` (FLOP/s and bytes/s of `rlxc bench --profile`),
the report evaluates them at the dims' bounds. The model counts what a kernel
must do at least — a multiply-add is 2 FLOPs, a transcendental 1, every input
read once and the output written once — not what a given kernel happens to do.

>>> from rlx.ir.graph import Graph
>>> from rlx.ir.shape import Dim
>>> g = Graph("c")
>>> x = g.input("x", [Dim.dynamic("n", max=8), 4])
>>> y = g.matmul(x, g.param("w", [4, 3]))
>>> c = node_cost(g, g.node(y))
>>> c.flops, evaluate(c.flops, {"n": 2})
(((24, ('n',)),), 48)
>>> evaluate(c.bytes, {"n": 2})    # x: 2*4*4, w: 4*3*4, y: 2*3*4
104
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node
from rlx.ir.shape import Dim, Shape, product

#: One term `coeff * prod(symbols)`; a polynomial is a tuple of terms.
Monomial = tuple[int, tuple[str, ...]]
Poly = tuple[Monomial, ...]


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes of one node, as polynomials in the dynamic dims."""

    flops: Poly
    bytes: Poly


def _mono(d: Dim, scale: int = 1) -> Poly:
    return ((d.coeff * scale, d.symbol_names),) if d.coeff * scale else ()


def _numel(shape: Shape) -> Dim:
    return product(shape.dims)


def _sum(*polys: Poly) -> Poly:
    """Terms with the same symbols merged; zero terms dropped; sorted (so equal costs compare equal)."""
    acc: dict[tuple[str, ...], int] = {}
    for p in polys:
        for coeff, syms in p:
            key = tuple(sorted(syms))
            acc[key] = acc.get(key, 0) + coeff
    return tuple(sorted((c, s) for s, c in acc.items() if c))


def evaluate(poly: Poly, symbols: Mapping[str, int]) -> int:
    """The value of `poly` for these dynamic dims."""
    total = 0
    for coeff, syms in poly:
        v = coeff
        for s in syms:
            v *= symbols[s]
        total += v
    return total


def at_bounds(poly: Poly, bounds: Mapping[str, int]) -> int:
    """The value of `poly` with every dynamic dim at its upper bound."""
    return evaluate(poly, bounds)


def _per_element(k: int) -> Callable[[Graph, Node], Poly]:
    return lambda g, n: _mono(_numel(n.shape), k)


def _matmul(g: Graph, n: Node) -> Poly:
    k = g.node(n.inputs[0]).shape.dims[-1]
    extra = 1 if len(n.inputs) == 3 else 0
    extra += 1 if getattr(n.op, "activation", None) else 0
    return _sum(_mono(_numel(n.shape) * k, 2), _mono(_numel(n.shape), extra))


def _swiglu(g: Graph, n: Node) -> Poly:
    k = g.node(n.inputs[0]).shape.dims[-1]
    return _sum(_mono(_numel(n.shape) * k, 4), _mono(_numel(n.shape), 3))


def _attention(g: Graph, n: Node) -> Poly:
    q, k = g.node(n.inputs[0]).shape, g.node(n.inputs[1]).shape
    op = n.op
    # QK^T and PV: 2 FLOPs per multiply-add each, over B x H x Sq x Skv x D; softmax ~5 per score.
    scores = q.dims[0] * q.dims[1] * k.dims[1] * op.num_heads
    return _sum(_mono(scores * op.head_dim, 4), _mono(scores, 5))


def _cached_attention(g: Graph, n: Node) -> Poly:
    q, cache = g.node(n.inputs[0]).shape, g.node(n.inputs[3]).shape
    op = n.op
    table = g.node(n.inputs[6]).shape if op.paged else None
    # at the cache's capacity (a row's, when paged): an upper bound
    scores = q.dims[0] * q.dims[1] * op.capacity(cache, table) * op.num_heads
    return _sum(_mono(scores * op.head_dim, 4), _mono(scores, 5))


def _region(g: Graph, n: Node) -> Poly:
    return _mono(_numel(n.shape), len(n.op.steps))


def _reduce(g: Graph, n: Node) -> Poly:
    return _mono(_numel(g.node(n.inputs[0]).shape))


def _none(g: Graph, n: Node) -> Poly:
    return ()


#: FLOPs by op kind; kinds not listed (data movement, leaves, ops added later) count 0.
FLOPS: dict[str, Callable[[Graph, Node], Poly]] = {
    "activation": _per_element(1), "binary": _per_element(1), "compare": _per_element(1),
    "where": _per_element(1), "cast": _per_element(1), "elementwise_region": _region,
    "matmul": _matmul, "fused_matmul_bias_act": _matmul, "int8_matmul": _matmul, "fused_swiglu": _swiglu,
    "reduce": _reduce, "softmax": _per_element(5), "layer_norm": _per_element(8), "rms_norm": _per_element(5),
    "fused_residual_layer_norm": _per_element(10), "fused_residual_rms_norm": _per_element(7),
    "attention": _attention, "cached_attention": _cached_attention, "rope": _per_element(3),
}


def _nbytes(shape: Shape) -> Poly:
    return _mono(_numel(shape), shape.dtype.itemsize)


def node_cost(graph: Graph, node: Node) -> Cost:
    """The cost of computing `node` once: FLOPs, and bytes read (each distinct input once) plus written."""
    flops = FLOPS.get(node.kind, _none)(graph, node)
    if node.kind in O.LEAF_KINDS:
        return Cost((), ())
    reads: Iterable[Poly] = (_nbytes(graph.node(i).shape) for i in dict.fromkeys(node.inputs))
    return Cost(_sum(flops), _sum(*reads, _nbytes(node.shape)))


__all__ = ["Cost", "FLOPS", "Monomial", "Poly", "at_bounds", "evaluate", "node_cost"]

"""Shared machinery of the passes: rebuilding a graph node by node, and use counts.

Passes never mutate their input. Each one walks the source graph in id order
(which is topological) and emits into a fresh `Graph` through a `Rewriter`,
which remembers where every source node ended up. Because nodes are emitted
in source order, inputs and params keep their declaration order, and shapes
are re-inferred (so a rewrite that breaks a shape fails loudly in `Graph.add`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.dtype import DType, bf16_to_f32, f32_to_bf16
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.shape import Shape


def require_mir(graph: Graph, pass_name: str) -> None:
    """Passes work on MIR only; HIR must be lowered first."""
    if not isinstance(graph, Graph) or graph.stage != "mir":
        stage = getattr(graph, "stage", type(graph).__name__)
        raise IRError(f"pass {pass_name!r} needs a MIR graph, got {stage!r} (lower HIR first)")


class Rewriter:
    """Builds the output graph of a pass while mapping source ids to new ids.

    >>> g = Graph("t")
    >>> x = g.input("x", [2])
    >>> g.set_outputs([g.activation("neg", x)])
    >>> rw = Rewriter(g)
    >>> for n in g.nodes:
    ...     _ = rw.copy(n)
    >>> len(rw.finish())
    2
    """

    def __init__(self, src: Graph) -> None:
        self.src = src
        self.dst = Graph(src.name)
        self.map: dict[NodeId, NodeId] = {}

    def arg(self, old: NodeId) -> NodeId:
        try:
            return self.map[old]
        except KeyError:
            raise IRError(f"pass bug: %{old} is used after being removed") from None

    def args(self, node: Node) -> list[NodeId]:
        return [self.arg(i) for i in node.inputs]

    def new(self, new_id: NodeId) -> Node:
        return self.dst.node(new_id)

    def copy(self, node: Node) -> NodeId:
        """Emit `node` unchanged (inputs remapped)."""
        return self.emit(node, node.op, self.args(node))

    def emit(self, node: Node, op: O.Op, new_inputs: Sequence[NodeId]) -> NodeId:
        """Emit `op` as the replacement of source `node`, keeping its name."""
        new_id = self.dst.add(op, new_inputs, name=node.name)
        self.map[node.id] = new_id
        return new_id

    def alias(self, node: Node, new_id: NodeId) -> None:
        """Source `node` is replaced by an already emitted value."""
        self.map[node.id] = new_id

    def finish(self) -> Graph:
        self.dst.set_outputs([self.arg(o) for o in self.src.outputs], list(self.src.output_names))
        return self.dst


def consumers(graph: Graph) -> dict[NodeId, set[NodeId]]:
    """Distinct consuming nodes of every node."""
    return {k: set(v) for k, v in graph.users().items()}


def sole_consumer(users: dict[NodeId, set[NodeId]], outputs: set[NodeId], node_id: NodeId) -> NodeId | None:
    """The one node consuming `node_id`, or None if it has several, none, or is a graph output."""
    if node_id in outputs:
        return None
    us = users[node_id]
    return next(iter(us)) if len(us) == 1 else None


def constant_values(op: O.Constant) -> np.ndarray:
    """Logical values of a constant (bf16 widened to float32)."""
    arr = op.array()
    return bf16_to_f32(arr) if op.shape.dtype is DType.BF16 else arr


def constant_from_values(values: np.ndarray, shape: Shape) -> O.Constant:
    """A Constant of `shape` holding `values` (logical values; bf16 given as floats)."""
    arr = np.asarray(values)
    if arr.shape != shape.static_dims:
        raise IRError(f"pass bug: constant values of shape {arr.shape} for {shape}")
    if shape.dtype is DType.BF16:
        data = f32_to_bf16(arr.astype(np.float32)).tobytes()
    else:
        data = np.ascontiguousarray(arr, dtype=shape.dtype.np).tobytes()
    return O.Constant(data, shape)


def is_fill(graph: Graph, node_id: NodeId, value: float) -> bool:
    """True if `node_id` is a constant whose every element equals `value`."""
    op = graph.node(node_id).op
    if not isinstance(op, O.Constant):
        return False
    vals = constant_values(op)
    return bool(vals.size) and bool(np.all(vals == value))

"""The tensor IR: dtypes, shapes, ops, graphs (MIR), HIR and LIR."""

from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.shape import Dim, Shape

__all__ = ["DType", "Dim", "Graph", "Node", "NodeId", "Shape"]

"""CPU lowering for dynamic int8: which weight params are stored quantized (`Int8Param`).

A 2-D f32 param read only by `int8_matmul` nodes, as their weight, is stored
as int8 panels at `set_param` (`rlx.ir.decisions_int8`). A param also read by
anything else keeps its f32 storage; the CPU rule then refuses the
`int8_matmul` that reads it (`rlx.codegen.cpu.int8`).

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("q")
>>> x, w = g.input("x", [4, 8]), g.param("w", [8, 16])
>>> g.set_outputs([g.int8_matmul(x, w)])
>>> [d.describe() for d in int8_params(plan(g))]
['%1 param stored as int8 per output channel for int8_matmul (quantized on set)']
"""

from __future__ import annotations

from rlx.ir.decisions_int8 import Int8Param
from rlx.ir.dtype import DType
from rlx.ir.lir import LirModule
from rlx.ir.ops_int8 import Int8MatMul


def int8_params(lir: LirModule) -> tuple[Int8Param, ...]:
    """The `Int8Param` decisions of `lir` (params read only as the weight of `int8_matmul`)."""
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    out = []
    for spec in lir.params:
        node = graph.node(spec.node)
        shape = node.shape
        if shape.dtype is not DType.F32 or shape.rank != 2 or node.id in outputs or not users[node.id]:
            continue
        readers = [graph.node(u) for u in users[node.id]]
        if all(isinstance(u.op, Int8MatMul) and [i for i, x in enumerate(u.inputs) if x == node.id] == [1]
               for u in readers):
            out.append(Int8Param(node.id, shape.dims[0].value, shape.dims[1].value))
    return tuple(out)

"""CPU lowering for convolutions: each `conv` node's algorithm, layout and weight storage (`ConvPlan`).

Depthwise convolutions (groups == C == O) run the window directly on channel
planes; every other convolution is an implicit GEMM on pixel-major tiles. Its
weight is stored packed for the GEMM micro-kernel when it is an f32 param
(groups == 1) read by nothing but conv nodes as their weight.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("c")
>>> x, w = g.input("x", [1, 8, 6, 6]), g.param("w", [16, 8, 3, 3])
>>> g.set_outputs([g.conv(x, w, pads=(1, 1, 1, 1), activation="relu")])
>>> [d.describe() for d in conv_plans(plan(g))]
['%2 conv: implicit_gemm on nhwc_tiles (weight %1 packed K x N on set)']
"""

from __future__ import annotations

from rlx.ir.decisions_conv import CONV_ALGORITHMS, ConvPlan
from rlx.ir.dtype import DType
from rlx.ir.lir import LirModule
from rlx.ir.ops_conv import Conv


def is_depthwise(groups: int, channels: int, out_channels: int) -> bool:
    """One input and one output channel per group: the window runs directly on each plane."""
    return groups > 1 and groups == channels == out_channels


def conv_plans(lir: LirModule) -> tuple[ConvPlan, ...]:
    """The `ConvPlan` of every conv node of `lir`."""
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    params = {spec.node for spec in lir.params}
    out = []
    for n in graph.nodes:
        if not isinstance(n.op, Conv):
            continue
        x = graph.node(n.inputs[0]).shape
        w_id = n.inputs[1]
        w = graph.node(w_id).shape
        algorithm = "depthwise" if is_depthwise(n.op.groups, x.dims[1].value, w.dims[0].value) else "implicit_gemm"
        packed = (algorithm == "implicit_gemm" and n.op.groups == 1 and w_id in params and w_id not in outputs
                  and w.dtype is DType.F32 and all(
                      isinstance(graph.node(u).op, Conv) and [i for i, v in enumerate(graph.node(u).inputs)
                                                              if v == w_id] == [1]
                      for u in users[w_id]))
        out.append(ConvPlan(n.id, algorithm, CONV_ALGORITHMS[algorithm], w_id, packed))
    return tuple(out)

"""CPU lowering: a squeeze-excite product computed in the weight of the pointwise conv that reads it
(`ConvInputScale`).

MobileNetV3's squeeze-excite blocks end in ``x * s`` (``s``: ``[N, C, 1, 1]``, a scale a channel) read by the block's
projection, a pointwise conv. Run as its own pass, the product reads `x` and writes a tensor of `x`'s size that the
conv then reads back (half of it from the other core: the product's threads split it by planes as the conv's do
not). Since ``W @ (s * x) = (W * s) @ x``, the conv can instead scale its block of the weight (``[out, C]``, smaller
than `x` on the 14 x 14 planes, 1-2x it on 7 x 7 ones) by the image's ``s`` and read `x` itself.

It is safe where the memory plan kept `x` and `s` through the conv (memplan's `early_residual_adds` holds them:
`conv_scale_pairs`), which is checked here: no node from the product up to the conv writes their bytes.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> from rlx.opt.lowering_conv import conv_plans
>>> g = Graph("se")
>>> x = g.input("x", [1, 16, 7, 7])
>>> s = g.activation("sigmoid", g.input("s", [1, 16, 1, 1]))
>>> g.set_outputs([g.conv(g.mul(x, s), g.param("w", [8, 16, 1, 1]))])
>>> lir = plan(g, early_residual_adds=True)
>>> for d in conv_input_scales(lir, conv_plans(lir)):
...     print(d.describe())
%5 conv reads %3 = %0 * %2 (the per-channel product in the conv's weight; %3 runs no pass)
"""

from __future__ import annotations

from collections.abc import Iterable

from rlx.ir import ops as O
from rlx.ir.decisions_conv import ConvInputScale, ConvPlan
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, NodeId
from rlx.ir.lir import LirModule, spans_meet
from rlx.ir.ops_conv import Conv
from rlx.opt.lowering_conv import is_pointwise

#: Most floats of a conv's weight scaled a unit (the scaled block lies in the thread's scratch).
SCALE_MAX_WEIGHT = 1 << 16

#: Plans that take the scale: the pointwise convs on the planes as they lie, by the BLAS or in register tiles on
#: panels (stride 1: `conv_scale_pairs` takes no strided conv).
SCALE_PLANS = frozenset({("pointwise", "nchw"), ("pointwise", "nchw_panels")})


def _channel_scale(graph: Graph, x: NodeId, s: NodeId) -> bool:
    """Whether `s` is a scale a channel of `x`: ``[N, C, 1, 1]`` against ``[N, C, H, W]``, both f32."""
    xs, ss = graph.node(x).shape, graph.node(s).shape
    return (len(xs.dims) == 4 and len(ss.dims) == 4 and xs.dtype is DType.F32 and ss.dtype is DType.F32
            and ss.dims[:2] == xs.dims[:2] and all(d.is_static and d.value == 1 for d in ss.dims[2:]))


def conv_scale_pairs(graph: Graph) -> list[tuple[NodeId, NodeId, NodeId, NodeId]]:
    """(mul, conv, x, s): products ``x * s`` of a scale a channel (`_channel_scale`) whose one reader is a 1 x 1,
    stride-1, unpadded conv of one group with a weight of at most SCALE_MAX_WEIGHT floats, as its input, the product
    no graph output. Memplan's `early_residual_adds` keeps `x` and `s` live through such a conv.

    >>> g = Graph("p")
    >>> x = g.input("x", [1, 4, 5, 5])
    >>> g.set_outputs([g.conv(g.mul(g.input("s", [1, 4, 1, 1]), x), g.param("w", [2, 4, 1, 1]))])
    >>> conv_scale_pairs(g)
    [(2, 4, 0, 1)]
    """
    users = graph.users()
    outputs = set(graph.outputs)
    out = []
    for node in graph.nodes:
        op = node.op
        if not (isinstance(op, O.Binary) and op.fn == "mul" and len(set(node.inputs)) == 2
                and node.id not in outputs and len(users[node.id]) == 1):
            continue
        conv = graph.node(users[node.id][0])
        if not (isinstance(conv.op, Conv) and conv.inputs[0] == node.id and node.id not in conv.inputs[1:]
                and conv.op.groups == 1):
            continue
        o, cg, *kernel = graph.node(conv.inputs[1]).shape.static_dims
        if len(kernel) != 2 or not is_pointwise(conv.op, tuple(kernel)) or o * cg > SCALE_MAX_WEIGHT:
            continue
        a, b = node.inputs
        for x, s in ((a, b), (b, a)):
            if graph.node(x).shape == node.shape and _channel_scale(graph, x, s):
                out.append((node.id, conv.id, x, s))
                break
    return out


def conv_input_scales(lir: LirModule, plans: Iterable[ConvPlan]) -> tuple[ConvInputScale, ...]:
    """The `ConvInputScale` of every product of `conv_scale_pairs` whose conv runs on SCALE_PLANS and whose
    operands no node from the product up to the conv (the conv included) writes."""
    plan_of = {p.node: p for p in plans}
    pos = {nid: i for i, nid in enumerate(lir.schedule)}
    out: list[ConvInputScale] = []
    for mul, conv, x, s in conv_scale_pairs(lir.graph):
        plan = plan_of.get(conv)
        if plan is None or (plan.algorithm, plan.layout) not in SCALE_PLANS or mul not in pos or conv not in pos:
            continue
        operands = [lir.arena_span(x), lir.arena_span(s)]
        if any(spans_meet(w, span) for nid in lir.schedule[pos[mul]: pos[conv] + 1]
               for w in lir.written_spans(nid) for span in operands):
            continue
        out.append(ConvInputScale(conv, mul, x, s))
    return tuple(out)

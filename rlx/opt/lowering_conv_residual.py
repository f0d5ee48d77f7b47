"""CPU lowering: residual adds computed in the store of the conv they read (`ConvResidual`).

A residual block ends in ``act(conv(h) + r)`` (ResNet: ``relu(conv2(h) + identity)``; MobileNetV3: a projection
conv plus its shortcut, no activation). Run as its own pass, the add reads the conv's output and `r` back from memory
and writes a third tensor; ONNX Runtime adds `r` in the conv's store instead. `conv_residuals` records, per conv,
that its store writes ``act(conv + bias + r)`` straight into the add's buffer, so the add runs no pass.

It is safe only where the memory plan allows it, which is checked here, not assumed: the conv writes the add's
buffer at the conv's place in the schedule, earlier than the plan expected, so

- the conv's value has no reader but the add (and is no graph output): nobody else misses it;
- `r` is computed before the conv (or is an input, param or constant);
- no node from the conv up to the add reads or writes bytes of the add's buffer (those bytes may still hold
  another value until the add, e.g. the conv's own input);
- `r` lies apart from the add's buffer, or is exactly that buffer (an add done in place on `r`) where the conv's
  kernel writes each output value once, from its own scratch (its store reads `r` where it writes). Kernels that
  accumulate in the output rows (pointwise, the channels-first implicit GEMM) would overwrite `r` first.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> from rlx.opt.lowering_conv import conv_plans
>>> g = Graph("r")
>>> x = g.input("x", [1, 16, 8, 8])
>>> h = g.conv(x, g.param("w1", [16, 16, 3, 3]), pads=(1, 1, 1, 1), activation="relu")
>>> g.set_outputs([g.activation("relu", g.add_(g.conv(h, g.param("w2", [16, 16, 3, 3]), pads=(1, 1, 1, 1)), x))])
>>> from rlx.opt.fusion import fuse
>>> lir = plan(fuse(g), early_residual_adds=True)
>>> for d in conv_residuals(lir, conv_plans(lir)):
...     print(d.describe())
%4 conv stores %5 = relu(%4 + %0) (the residual add in the conv's store; %5 runs no pass)
"""

from __future__ import annotations

from collections.abc import Iterable

from rlx.ir import ops as O
from rlx.ir.decisions_conv import ConvPlan, ConvResidual
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.lir import LirModule, spans_meet
from rlx.ir.ops_conv import Conv

#: Plans whose kernel writes each output value once, from its own scratch or registers: the store may read a
#: residual that lies in the very bytes it writes. The others accumulate in the output rows.
STORE_ONCE = frozenset({("direct", "nchw_lanes"), ("direct", "nchw_phases"), ("winograd", "nchw_wino_tiles"),
                        ("winograd", "nchw_wino4_tiles"), ("implicit_gemm", "nhwc_tiles"), ("depthwise", "nchw"),
                        ("depthwise", "nchw_rows"), ("depthwise", "nchw_row_shifts")})


def residual_add(node: Node) -> tuple[tuple[NodeId, NodeId], str | None] | None:
    """(the add's two inputs, the activation after it) when `node` is ``a + b`` or the region ``act(a + b)``.

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("a")
    >>> a, b = g.input("a", [4]), g.input("b", [4])
    >>> y = g.add_(a, b)
    >>> residual_add(g.node(y))
    ((0, 1), None)
    """
    op = node.op
    if isinstance(op, O.Binary) and op.fn == "add" and len(set(node.inputs)) == 2:
        return (node.inputs[0], node.inputs[1]), None
    if not isinstance(op, O.ElementwiseRegion) or len(op.steps) != 2 or len(node.inputs) != 2:
        return None
    add, act = op.steps
    if (isinstance(add.op, O.Binary) and add.op.fn == "add" and sorted(add.args) == [0, 1]
            and isinstance(act.op, O.Activation) and act.args == (2,) and act.op.fn in O.ACTIVATIONS):
        return (node.inputs[0], node.inputs[1]), act.op.fn
    return None


def _conv_operand(graph: Graph, users: dict[NodeId, list[NodeId]], outputs: set[NodeId], conv: NodeId,
                  add: Node) -> bool:
    """Whether `conv` may be the add's conv: an f32 conv with no activation of its own, whose one reader is the
    add, of the add's shape, no graph output."""
    c = graph.node(conv)
    return (isinstance(c.op, Conv) and c.op.activation is None and conv not in outputs and users[conv] == [add.id]
            and c.shape == add.shape and c.shape.dtype is DType.F32)


def conv_residual_pairs(graph: Graph, position: dict[NodeId, int]) -> list[tuple[NodeId, NodeId]]:
    """(add, conv) pairs: residual adds (`residual_add`) of a conv's value whose other operand has the same shape,
    with the conv that may store them (of two, the one scheduled later; `position`: the schedule's). Memplan's
    `early_residual_adds` keeps such an add's bytes free from that conv on; `conv_residuals` decides.

    >>> g = Graph("p")
    >>> x = g.input("x", [1, 4, 5, 5])
    >>> y = g.add_(g.conv(x, g.param("w", [4, 4, 3, 3]), pads=(1, 1, 1, 1)), x)
    >>> g.set_outputs([g.activation("relu", y)])
    >>> conv_residual_pairs(g, {n.id: i for i, n in enumerate(g.nodes)})
    [(3, 2)]
    """
    users = graph.users()
    outputs = set(graph.outputs)
    pairs = []
    for node in graph.nodes:
        match = residual_add(node)
        if match is None or node.id not in position:
            continue
        (a, b), _ = match
        for conv, residual in sorted(((a, b), (b, a)), key=lambda cr: -position.get(cr[0], -1)):
            if _conv_operand(graph, users, outputs, conv, node) and graph.node(residual).shape == node.shape:
                pairs.append((node.id, conv))
                break
    return pairs


def _touched(lir: LirModule, nid: NodeId, conv: NodeId) -> Iterable[tuple[int, int] | None]:
    """The arena bytes node `nid` reads or writes when it runs (the conv: not its own value, it now writes the
    add's)."""
    yield from (lir.arena_span(i) for i in lir.graph.node(nid).inputs)
    yield from lir.written_spans(nid, value=nid != conv)


def store_may_write(lir: LirModule, conv: NodeId, add: NodeId, residual: NodeId, store_once: bool,
                    pos: dict[NodeId, int] | None = None) -> bool:
    """Whether the conv may write the add's value at its own place in the schedule (the module docstring's rules;
    `pos`: each node's place in the schedule, when the caller has it)."""
    b = lir.buffers[add]
    if b.storage not in ("arena", "output"):
        return False
    pos = {nid: i for i, nid in enumerate(lir.schedule)} if pos is None else pos
    if conv not in pos or add not in pos or pos[conv] > pos[add]:
        return False
    if residual in pos and pos[residual] > pos[conv]:
        return False  # computed after the conv
    target = lir.arena_span(add)
    for nid in lir.schedule[pos[conv]: pos[add]]:
        if any(spans_meet(span, target) for span in _touched(lir, nid, conv)):
            return False
    if not spans_meet(lir.arena_span(residual), target):
        return True
    # the add in place on the residual: the same bytes exactly, and a kernel that writes each value once
    r = lir.buffers[residual]
    return store_once and r.storage == "arena" and (r.offset, r.nbytes) == (b.offset, b.nbytes)


def conv_residuals(lir: LirModule, plans: Iterable[ConvPlan]) -> tuple[ConvResidual, ...]:
    """The `ConvResidual` of every residual add that a conv of `plans` computes in its store (the module
    docstring). Of an add of two convs (ResNet's downsample blocks: the block's conv and the downsample), the one
    scheduled later stores it, reading the other's value."""
    graph = lir.graph
    plan_of = {p.node: p for p in plans}
    out: list[ConvResidual] = []
    position = {nid: i for i, nid in enumerate(lir.schedule)}
    for add, conv in conv_residual_pairs(graph, position):
        node = graph.node(add)
        plan = plan_of.get(conv)
        match = residual_add(node)
        if plan is None or match is None:
            continue
        (a, b), act = match
        residual = b if a == conv else a
        if store_may_write(lir, conv, add, residual, (plan.algorithm, plan.layout) in STORE_ONCE, position):
            out.append(ConvResidual(conv, add, residual, act))
    return tuple(out)

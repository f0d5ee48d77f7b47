"""Legalization: where a backend lacks a dtype for an op, compute it in f32 between casts.

`legalize(graph, accepts)` rewrites every node whose backend rule refuses its
dtypes but would accept them with every f16/bf16 input widened to f32: the
narrow inputs are cast to f32 (exact), the op runs in f32, and its result is
cast back to the node's dtype (one rounding, as the reference rounds once per
op). The inserted casts are ordinary graph nodes named after the op they
serve (`legalize bf16->f32 for matmul %7`), so `rlxc inspect --stage lir`
shows them; a value cast once is reused by every op that needs it.

A GEMM keeps narrow weights where the backend multiplies them as they are
(`matmul(f32, bf16) -> f32`, `rlx.ir.ops.NARROW_WEIGHT_KINDS`): only its
other inputs are widened, so a bf16 param stays bf16 (packed, half the bytes)
and the result is still rounded once.

A state input (a KV cache) is never widened: ops update it in place, and a
widened copy would take the update instead; such a node is left to the backend
to refuse.

`accepts(node, in_dtypes, out_dtype)` is the backend's rule check (the
driver passes the rule table's, so this layer knows no backend); nodes it
accepts as they are, or refuses even in f32, are left alone (the driver then
decomposes or reports them).

>>> from rlx.ir.graph import Graph
>>> g = Graph("l")
>>> x = g.input("x", [2, 4], "bf16")
>>> g.set_outputs([g.softmax(x)])
>>> f32_only = lambda node, ins, out: all(d.value == "f32" for d in (*ins, out))
>>> out = legalize(g, f32_only)
>>> [n.kind for n in out.nodes]
['input', 'cast', 'softmax', 'cast']
>>> out.node(out.outputs[0]).shape.dtype.value
'bf16'
"""

from __future__ import annotations

from collections.abc import Callable

from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, Node, NodeId
from rlx.opt.rewrite import Rewriter, require_mir

#: The backend's answer for one node with the given dtypes: True when it has a kernel for them.
Accepts = Callable[[Node, tuple[DType, ...], DType], bool]

#: Float types a backend may lack, widened to f32 (exactly) for the ops that lack them.
NARROW = (DType.F16, DType.BF16)


def _widened(dtypes: tuple[DType, ...], keep: frozenset[int] = frozenset()) -> tuple[DType, ...]:
    return tuple(DType.F32 if d in NARROW and i not in keep else d for i, d in enumerate(dtypes))


def kept_narrow(graph: Graph, node: Node, accepts: Accepts) -> frozenset[int] | None:
    """The input slots `node` keeps narrow once legalized (None: it needs no legalizing).

    Empty when every f16/bf16 input is widened; {1} for a GEMM whose backend takes its narrow
    weights under an f32 left operand."""
    if node.kind in O.LEAF_KINDS:
        return None
    ins = tuple(graph.node(i).shape.dtype for i in node.inputs)
    out = node.shape.dtype
    if out not in NARROW and not any(d in NARROW for d in ins):
        return None
    if accepts(node, ins, out):
        return None
    out_wide = DType.F32 if out in NARROW else out
    # narrow state inputs must stay as they are (updated in place): the widening may not touch them
    states = frozenset(i for i, nid in enumerate(node.inputs) if ins[i] in NARROW and _is_state(graph.node(nid)))
    if node.kind in O.NARROW_WEIGHT_KINDS and ins[1] in NARROW and node.inputs.count(node.inputs[1]) == 1:
        keep = frozenset({1})
        if states <= keep and accepts(node, _widened(ins, keep), out_wide):
            return keep
    return frozenset() if not states and accepts(node, _widened(ins), out_wide) else None


def _is_state(node: Node) -> bool:
    return isinstance(node.op, O.Input) and node.op.state


def needs_legalizing(graph: Graph, node: Node, accepts: Accepts) -> bool:
    """True when `accepts` refuses `node` as typed but takes it with f16/bf16 inputs widened to f32."""
    return kept_narrow(graph, node, accepts) is not None


def legalize(graph: Graph, accepts: Accepts) -> Graph:
    """`graph` with every f16/bf16 node the backend lacks computed in f32 between casts."""
    require_mir(graph, "legalize")
    todo = {n.id: keep for n in graph.nodes if (keep := kept_narrow(graph, n, accepts)) is not None}
    if not todo:
        return graph
    rw = Rewriter(graph)
    widened: dict[NodeId, NodeId] = {}  # new id of a narrow value -> its f32 cast (shared by readers)
    for node in graph.nodes:
        if node.id not in todo:
            rw.copy(node)
            continue
        args = []
        for slot, old in enumerate(node.inputs):
            new = rw.arg(old)
            dt = graph.node(old).shape.dtype
            if dt in NARROW and slot not in todo[node.id]:
                if new not in widened:
                    widened[new] = rw.dst.add(O.Cast(DType.F32), [new],
                                              name=f"legalize {dt.value}->f32 for {node.kind} %{node.id}")
                new = widened[new]
            args.append(new)
        result = rw.dst.add(node.op, args, name=node.name)
        want = node.shape.dtype
        if rw.new(result).shape.dtype is not want:
            result = rw.dst.add(O.Cast(want), [result], name=f"legalize f32->{want.value} after {node.kind} %{node.id}")
        rw.alias(node, result)
    return rw.finish()

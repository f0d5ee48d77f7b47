"""Weights in a narrower precision: f32 params stored as f16/bf16, read back as f32.

`store_params_in(graph, dtype)` declares every f32 param of `graph` as `dtype`
(so the compiled program holds half the bytes, and `set_param` rounds the
user's float32 values once, to nearest even) and widens it to f32 where it is
read (an exact cast), so every op still computes in f32 with f32
accumulation. Lookups into a param (`gather`, `narrow`: embedding tables)
pick their rows from the narrow table and widen only those. A GEMM whose
right operand is the param reads it narrow (`matmul(f32 x, bf16 w) -> f32`,
no cast): a backend with such a kernel multiplies the stored weights (the CPU:
`rlx.codegen.cpu.half`), the others get the cast back from legalization. It is
what `Session(Device.CPU, precision="bf16")` runs after optimizing.

>>> from rlx.ir.graph import Graph, Node, NodeId
>>> from rlx.ir.dtype import DType
>>> g = Graph("p")
>>> x = g.input("x", [2, 4])
>>> g.set_outputs([g.matmul(x, g.param("w", [4, 3])), g.softmax(g.param("s", [4]))])
>>> out = store_params_in(g, DType.BF16)
>>> [(n.kind, n.shape.dtype.value) for n in out.nodes]
[('input', 'f32'), ('param', 'bf16'), ('matmul', 'f32'), ('param', 'bf16'), ('cast', 'f32'), ('softmax', 'f32')]
"""

from __future__ import annotations

import dataclasses

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.ops_moe import MoeMatMul
from rlx.opt.rewrite import Rewriter, require_mir

#: Storage precisions a session may ask for.
PRECISIONS = (DType.F32, DType.F16, DType.BF16)


def store_params_in(graph: Graph, dtype: DType | str) -> Graph:
    """`graph` with its f32 params stored as `dtype` and widened to f32 where read."""
    require_mir(graph, "store_params_in")
    dt = DType.parse(dtype)
    if dt not in PRECISIONS:
        raise IRError(f"params can be stored in {[d.value for d in PRECISIONS]}, not {dt.value}")
    if dt is DType.F32 or not any(n.shape.dtype is DType.F32 for n in graph.params()):
        return graph
    rw = Rewriter(graph)
    stored: dict[NodeId, NodeId] = {}  # source param -> its narrow param in the new graph
    widened: dict[NodeId, NodeId] = {}  # source param -> its f32 cast (made once, where first needed)

    def wide(old: NodeId) -> NodeId:
        if old not in widened:
            widened[old] = rw.dst.add(O.Cast(DType.F32), [stored[old]], name=f"{graph.node(old).op.name} as f32")
        return widened[old]

    for node in graph.nodes:
        op = node.op
        if isinstance(op, O.Param) and op.shape.dtype is DType.F32:
            narrow = dataclasses.replace(op, shape=op.shape.with_dtype(dt), rounds_f32=True)
            stored[node.id] = rw.dst.add(narrow, [], name=node.name)
        elif isinstance(op, O.FusedSwiGLU) and _narrow_swiglu(graph, node, stored):
            # no kernel multiplies f32 x by narrow weights inside the fused op: two mixed GEMMs
            # read the weights as stored (never a per-call cast of a whole matrix)
            x, wg, wu = node.inputs
            gate = rw.dst.add(O.MatMul(), [rw.arg(x), stored[wg]], name=f"swiglu %{node.id} gate")
            up = rw.dst.add(O.MatMul(), [rw.arg(x), stored[wu]], name=f"swiglu %{node.id} up")
            rw.alias(node, rw.dst.add(O.Binary("mul"), [rw.dst.add(O.Activation("silu"), [gate]), up],
                                      name=node.name))
        elif node.kind in _PICKS and node.inputs[0] in stored:
            # an embedding lookup: pick the rows from the narrow table, widen only those
            picked = rw.dst.add(op, [stored[node.inputs[0]], *map(rw.arg, node.inputs[1:])], name=node.name)
            rw.alias(node, rw.dst.add(O.Cast(DType.F32), [picked]))
        else:
            args = [stored[i] if _weight_slot(graph, node, j) and i in stored else wide(i) if i in stored
                    else rw.arg(i) for j, i in enumerate(node.inputs)]
            rw.emit(node, op, args)
    for old in graph.outputs:
        if old in stored:
            rw.alias(graph.node(old), wide(old))
    return rw.finish()


#: Ops that select part of a param (rows of an embedding table): they read it narrow.
_PICKS = ("gather", "narrow")
#: GEMMs, whose right operand may be narrow when the left one is f32 (`rlx.ir.ops.MatMul`).
_GEMMS = (O.MatMul, O.FusedMatMulBiasAct)


def _narrow_swiglu(graph: Graph, node: Node, stored: dict[NodeId, NodeId]) -> bool:
    """True when a fused SwiGLU's weights are params made narrow, under f32 activations."""
    x, wg, wu = node.inputs
    return wg in stored and wu in stored and graph.node(x).shape.dtype is DType.F32


def _weight_slot(graph: Graph, node: Node, slot: int) -> bool:
    """True when input `slot` of `node` is the right operand of a GEMM with an f32 left operand
    that reads it nowhere else (then the GEMM takes the narrow param as it is stored); or the experts of a
    `moe_matmul` (f32 x times f32 / f16 / bf16 experts: never a per-call cast of every expert)."""
    if isinstance(node.op, MoeMatMul):
        return slot == 2 and node.op.quant is None and node.inputs.count(node.inputs[2]) == 1
    if slot != 1 or not isinstance(node.op, _GEMMS) or node.inputs.count(node.inputs[1]) != 1:
        return False
    return graph.node(node.inputs[0]).shape.dtype is DType.F32

"""`quantize(graph, "int8-dynamic")`: linear layers rewritten into `int8_matmul`.

The graph is first optimized (level 2), so every linear layer is one GEMM
node whose right operand is its weight param, already laid out `[K, N]` by
the layout pass (PyTorch's `[out, in]` weights keep their user layout), with
the bias and activation fused. Each such GEMM — `matmul(x, W)` or
`fused_matmul_bias_act(x, W[, b], act)` with W a 2-D f32 param read by
nothing but GEMMs as their right operand — becomes
`int8_matmul(x, W[, b], activation=act)` (`rlx.ir.ops_int8`).

The params do not change: names, user shapes and dtypes stay, so
`set_param` still takes the f32 weight. Quantizing it is the op's meaning;
the CPU backend does it once, inside `set_param` (per output channel, into
its int8 kernel layout), and the activations are quantized per row on every
run. Other GEMMs (attention, pooling, weights shared with other ops) stay
f32.

>>> from rlx.ir.graph import Graph
>>> g = Graph("mlp")
>>> x, w, b = g.input("x", [4, 8]), g.param("w", [16, 8]), g.param("b", [16])
>>> g.set_outputs([g.activation("gelu", g.add_(g.matmul(x, g.transpose(w, [1, 0])), b))])
>>> [n.kind for n in quantize(g, "int8-dynamic").nodes]
['input', 'param', 'param', 'int8_matmul']
"""

from __future__ import annotations

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, Node
from rlx.ir.ops_int8 import INT8_MAX_K, QUANT_MODES, Int8MatMul
from rlx.opt.pipeline import optimize
from rlx.opt.rewrite import consumers, require_mir

_GEMMS = (O.MatMul, O.FusedMatMulBiasAct)


def quantize(graph: Graph, mode: str = "int8-dynamic", *, level: int = 2) -> Graph:
    """`graph` optimized at `level` with its linear layers as `int8_matmul` (see the module docstring)."""
    require_mir(graph, "quantize")
    if mode not in QUANT_MODES:
        raise IRError(f"unknown quantization mode {mode!r}; expected one of {QUANT_MODES}")
    opt = optimize(graph, level=level)
    users = consumers(opt)
    outputs = set(opt.outputs)

    def reads_weight(node: Node, w: Node) -> bool:
        # a GEMM reading w as its right operand only, with f32 activations
        return (isinstance(node.op, _GEMMS) and [i for i, x in enumerate(node.inputs) if x == w.id] == [1]
                and opt.node(node.inputs[0]).shape.dtype is DType.F32)

    def weight_param(node: Node) -> bool:
        # B must be a 2-D f32 param that only such GEMMs read
        if not isinstance(node.op, _GEMMS) or len(node.inputs) < 2:
            return False
        w = opt.node(node.inputs[1])
        if not isinstance(w.op, O.Param) or w.id in outputs or w.shape.dtype is not DType.F32:
            return False
        if w.shape.rank != 2 or not w.shape.is_static or w.shape.dims[0].value > INT8_MAX_K:
            return False
        return all(reads_weight(opt.node(u), w) for u in users[w.id])

    out = Graph(opt.name)
    new: dict[int, int] = {}
    for node in opt.nodes:
        args = [new[i] for i in node.inputs]
        if weight_param(node):
            act = node.op.activation if isinstance(node.op, O.FusedMatMulBiasAct) else None
            new[node.id] = out.add(Int8MatMul(act), args, name=node.name)
        else:
            new[node.id] = out.add(node.op, args, name=node.name)
    out.set_outputs([new[o] for o in opt.outputs], list(opt.output_names))
    return out

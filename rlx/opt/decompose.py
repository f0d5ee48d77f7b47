"""Decomposition: an op a backend has no rule for becomes primitives it does have.

`decompose(graph, supported)` rewrites every node for which `supported(graph, node)`
is False and a decomposition exists (`DECOMPOSITIONS`, keyed by op kind and, for
activations, function): `gelu_tanh`, `silu`, `softplus`, `sigmoid` into
exp/tanh/arithmetic, `rms_norm` into mean/rsqrt/mul, `batch_norm` into arithmetic, a 3-D `pool` into
two 2-D ones. The driver passes the backend's
rule check as `supported`, so this layer needs no knowledge of backends; what is
left unsupported is reported by the driver before any build.

>>> from rlx.ir.graph import Graph
>>> g = Graph("d")
>>> x = g.input("x", [4])
>>> g.set_outputs([g.activation("softplus", x)])
>>> out = decompose(g, lambda graph, node: node.kind != "activation" or node.op.fn != "softplus")
>>> sorted({n.kind for n in out.nodes})
['activation', 'binary', 'constant', 'input']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from rlx.ir import ops as O
from rlx.ir import ops_conv as CV
from rlx.ir.graph import Graph, Node, NodeId
from rlx.opt.rewrite import Rewriter, require_mir

#: Builds the replacement of one node in `g` from its (already rewritten) inputs; returns the result id.
Decomposition = Callable[[Graph, Node, list[NodeId]], NodeId]


def _const(g: Graph, node: Node, value: float) -> NodeId:
    return g.constant(float(value), node.shape.dtype)


def _silu(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    (x,) = args
    return g.add(O.Binary("mul"), [x, _sigmoid(g, node, args)])


def _sigmoid(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    (x,) = args
    one = _const(g, node, 1.0)
    e = g.activation("exp", g.activation("neg", x))
    return g.add(O.Binary("div"), [one, g.add(O.Binary("add"), [one, e])])


def _gelu_tanh(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    (x,) = args
    cube = g.add(O.Binary("mul"), [x, g.add(O.Binary("mul"), [x, x])])
    inner = g.add(O.Binary("add"), [x, g.add(O.Binary("mul"), [_const(g, node, 0.044715), cube])])
    t = g.activation("tanh", g.add(O.Binary("mul"), [_const(g, node, float(np.sqrt(2.0 / np.pi))), inner]))
    half_x = g.add(O.Binary("mul"), [_const(g, node, 0.5), x])
    return g.add(O.Binary("mul"), [half_x, g.add(O.Binary("add"), [_const(g, node, 1.0), t])])


def _softplus(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    # max(x, 0) + log(1 + exp(-|x|)): the overflow-free form the reference defines.
    (x,) = args
    pos = g.add(O.Binary("max"), [x, _const(g, node, 0.0)])
    tail = g.activation("exp", g.activation("neg", g.activation("abs", x)))
    return g.add(O.Binary("add"), [pos, g.activation("log", g.add(O.Binary("add"), [_const(g, node, 1.0), tail]))])


def _rms_norm(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    x, gamma = args
    ms = g.add(O.Reduce("mean", (-1,), keep_dim=True), [g.add(O.Binary("mul"), [x, x])])
    inv = g.activation("rsqrt", g.add(O.Binary("add"), [ms, _const(g, node, float(node.op.eps))]))
    return g.add(O.Binary("mul"), [g.add(O.Binary("mul"), [x, inv]), gamma])


def _batch_norm(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    # (x - mean) * (scale * rsqrt(var + eps)) + bias, the [C] vectors broadcast along axis 1
    x, scale, bias, mean, var = args
    along_c = [node.shape.dims[1], *([1] * (node.shape.rank - 2))]
    inv = g.activation("rsqrt", g.add(O.Binary("add"), [var, _const(g, node, float(node.op.eps))]))
    factor = g.reshape(g.add(O.Binary("mul"), [scale, inv]), along_c)
    centered = g.add(O.Binary("sub"), [x, g.reshape(mean, along_c)])
    return g.add(O.Binary("add"), [g.add(O.Binary("mul"), [centered, factor]), g.reshape(bias, along_c)])


def _pool(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    # A 3-D pool as two 2-D ones: max and average are separable over a box window (an average's cell count,
    # with or without the pads, is the product of the per-axis counts), so pool (H, W) on [N, C*D, H, W], then
    # (D, 1) on [N, C, D, OH*OW]. A pool of fewer axes is left as it is (the backend's refusal stands).
    op: CV.Pool = node.op  # type: ignore[assignment]
    (x,) = args
    if len(op.kernel) != 3:
        return g.add(op, [x])
    strides, dilations, pads = op.geometry(3)
    n, c, d, h, w = g.shape(x).dims
    od, oh, ow = node.shape.dims[2:]
    plane = CV.Pool(op.fn, op.kernel[1:], strides[1:], (pads[1], pads[2], pads[4], pads[5]), dilations[1:],
                    op.ceil_mode, op.count_include_pad)
    hw = g.add(plane, [g.reshape(x, [n, c * d, h, w])])
    depth = CV.Pool(op.fn, (op.kernel[0], 1), (strides[0], 1), (pads[0], 0, pads[3], 0), (dilations[0], 1),
                    op.ceil_mode, op.count_include_pad)
    out = g.add(depth, [g.reshape(hw, [n, c, d, oh * ow])])
    return g.reshape(out, [n, c, od, oh, ow])


#: (op kind, activation fn or "") → decomposition into primitives.
DECOMPOSITIONS: dict[tuple[str, str], Decomposition] = {
    ("activation", "silu"): _silu,
    ("activation", "sigmoid"): _sigmoid,
    ("activation", "gelu_tanh"): _gelu_tanh,
    ("activation", "softplus"): _softplus,
    ("rms_norm", ""): _rms_norm,
    ("batch_norm", ""): _batch_norm,
    ("pool", ""): _pool,
}


def decomposition_key(node: Node) -> tuple[str, str]:
    return node.kind, getattr(node.op, "fn", "") if node.kind == "activation" else ""


def decompose(graph: Graph, supported: Callable[[Graph, Node], bool],
              why_not: Callable[[Graph, Node], str | None] | None = None) -> Graph:
    """`graph` with every unsupported node that has a decomposition replaced by primitives. `why_not` (the
    backend's reason a node is unsupported) is handed to the control-flow fallbacks, which record it in the
    name of the node they leave (`rlx.opt.control.fallback_name`), so the lowered program says why."""
    require_mir(graph, "decompose")
    from rlx.opt.bodies import inline_custom_fn, map_bodies
    from rlx.opt.control import fallback_name, lower_cond, lower_while_loop

    DECOMPOSITIONS.setdefault(("custom_fn", ""), inline_custom_fn)
    DECOMPOSITIONS.setdefault(("cond", ""), lower_cond)
    DECOMPOSITIONS.setdefault(("while_loop", ""), lower_while_loop)
    if any(n.kind in ("scan", "cond", "while_loop") for n in graph.nodes):  # a body runs on the same backend
        graph = map_bodies(graph, lambda body: decompose(body, supported, why_not))
    todo = [n for n in graph.nodes if n.kind not in O.LEAF_KINDS and not supported(graph, n)
            and decomposition_key(n) in DECOMPOSITIONS]
    if not todo:
        return graph
    rewrite = {n.id for n in todo}
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in rewrite:
            told = node
            if why_not is not None and node.kind in ("cond", "while_loop"):
                told = dataclasses.replace(node, name=fallback_name(node, why_not(graph, node) or "no rule"))
            rw.alias(node, DECOMPOSITIONS[decomposition_key(node)](rw.dst, told, rw.args(node)))
        else:
            rw.copy(node)
    out = rw.finish()
    # lowered control flow left new nodes (inlined branches, a masked scan) that may need decomposing too
    return decompose(out, supported, why_not) if any(n.kind in ("cond", "while_loop") for n in todo) else out

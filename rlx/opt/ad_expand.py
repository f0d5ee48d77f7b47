"""Composite ops written in primitives, for differentiation.

Autodiff differentiates primitives only (`rlx.opt.ad_rules`); every composite
op kind has an entry here that rebuilds it from primitives inside the
gradient graph: norms, attention, the fused ops, elementwise regions and the
SSM layers (selective_scan and gated_delta_net become a `scan` over time, so their
derivatives run as loops and allow a dynamic sequence length; the causal conv
has its own rules in `ad_rules`, through its transpose).
The rebuilt forward computes exactly what the reference defines for the op.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.shape import Dim
from rlx.opt.ad_rules import const

Expansion = Callable[[Graph, Node, list[NodeId]], NodeId]
EXPANSIONS: dict[str, Expansion] = {}


def expands(*kinds: str) -> Callable[[Expansion], Expansion]:
    def wrap(fn: Expansion) -> Expansion:
        for k in kinds:
            EXPANSIONS[k] = fn
        return fn

    return wrap


def _static(node: Node, dim: Dim, what: str) -> int:
    if not dim.is_static:
        raise IRError(f"autodiff: {node.kind} needs a static {what} to be differentiated, got {dim}")
    return dim.value


def _layer_norm(g: Graph, x: NodeId, gamma: NodeId, beta: NodeId, eps: float) -> NodeId:
    dt = g.shape(x).dtype
    mean = g.reduce("mean", x, [-1], keep_dim=True)
    xc = g.sub(x, mean)
    var = g.reduce("mean", g.mul(xc, xc), [-1], keep_dim=True)
    inv = g.activation("rsqrt", g.add_(var, const(g, eps, dt)))
    return g.add_(g.mul(g.mul(xc, inv), gamma), beta)


def _rms_norm(g: Graph, x: NodeId, gamma: NodeId, eps: float) -> NodeId:
    dt = g.shape(x).dtype
    ms = g.reduce("mean", g.mul(x, x), [-1], keep_dim=True)
    return g.mul(g.mul(x, g.activation("rsqrt", g.add_(ms, const(g, eps, dt)))), gamma)


@expands("layer_norm")
def _x_layer_norm(g: Graph, node: Node, a: list[NodeId]) -> NodeId:
    return _layer_norm(g, a[0], a[1], a[2], node.op.eps)  # type: ignore[attr-defined]


@expands("rms_norm")
def _x_rms_norm(g: Graph, node: Node, a: list[NodeId]) -> NodeId:
    return _rms_norm(g, a[0], a[1], node.op.eps)  # type: ignore[attr-defined]


@expands("fused_residual_layer_norm", "fused_residual_rms_norm")
def _x_fused_res(g: Graph, node: Node, a: list[NodeId]) -> NodeId:
    rms = node.kind == "fused_residual_rms_norm"
    n_params = 1 if rms else 2
    x = g.add_(a[0], a[1])
    if len(a) == 2 + 1 + n_params:
        x = g.add_(x, a[2])
    eps = node.op.eps  # type: ignore[attr-defined]
    return _rms_norm(g, x, a[-1], eps) if rms else _layer_norm(g, x, a[-2], a[-1], eps)


@expands("fused_matmul_bias_act")
def _x_fused_gemm(g: Graph, node: Node, a: list[NodeId]) -> NodeId:
    y = g.matmul(a[0], a[1])
    if len(a) == 3:
        y = g.add_(y, a[2])
    act = node.op.activation  # type: ignore[attr-defined]
    return g.activation(act, y) if act else y


@expands("fused_swiglu")
def _x_swiglu(g: Graph, node: Node, a: list[NodeId]) -> NodeId:
    return g.mul(g.activation("silu", g.matmul(a[0], a[1])), g.matmul(a[0], a[2]))


@expands("elementwise_region")
def _x_region(g: Graph, node: Node, a: list[NodeId]) -> NodeId:
    values = list(a)
    for step in node.op.steps:  # type: ignore[attr-defined]
        values.append(g.add(step.op, [values[i] for i in step.args]))
    return values[-1]


def _heads(g: Graph, x: NodeId, heads: int, hd: int) -> NodeId:
    b, s, _ = g.shape(x).dims
    return g.transpose(g.reshape(x, [b, s, Dim(heads), Dim(hd)]), [0, 2, 1, 3])  # [B, H, S, D]


@expands("attention")
def _x_attention(g: Graph, node: Node, a: list[NodeId]) -> NodeId:
    op: O.Attention = node.op  # type: ignore[assignment]
    q, k, v = a[:3]
    h, hkv, d = op.num_heads, op.kv_heads, op.head_dim
    dt = node.shape.dtype
    qh, kh, vh = _heads(g, q, h, d), _heads(g, k, hkv, d), _heads(g, v, hkv, d)
    if hkv != h:  # grouped-query: every kv head serves h/hkv query heads
        b, _, skv, _ = g.shape(kh).dims
        grp = h // hkv

        def widen(t: NodeId) -> NodeId:
            t5 = g.reshape(t, [b, Dim(hkv), Dim(1), skv, Dim(d)])
            return g.reshape(g.expand(t5, [b, Dim(hkv), Dim(grp), skv, Dim(d)]), [b, Dim(h), skv, Dim(d)])

        kh, vh = widen(kh), widen(vh)
    scores = g.mul(g.matmul(qh, g.transpose(kh, [0, 1, 3, 2])), const(g, op.softmax_scale, dt))
    if op.mask == "causal":
        sq = _static(node, g.shape(q).dims[1], "query length")
        skv = _static(node, g.shape(k).dims[1], "key length")
        keep = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        scores = g.where(g.constant(keep), scores, const(g, -np.inf, dt))
    elif op.mask == "padding":
        b, skv = g.shape(a[3]).dims
        m = g.reshape(a[3], [b, Dim(1), Dim(1), skv])
        keep = g.compare("ne", m, g.constant(np.zeros((), g.shape(a[3]).dtype.np), g.shape(a[3]).dtype))
        scores = g.where(keep, scores, const(g, -np.inf, dt))
    elif op.mask == "bias":
        scores = g.add_(scores, a[3])
    o = g.matmul(g.softmax(scores, -1), vh)  # [B, H, Sq, D]
    b, _, sq, _ = g.shape(o).dims
    return g.reshape(g.transpose(o, [0, 2, 1, 3]), [b, sq, Dim(h * d)])


def _step(g: Graph, x: NodeId, t: int, dims: list[Dim]) -> NodeId:
    """Row t of the sequence axis (axis 1) of x, reshaped to `dims`."""
    return g.reshape(g.narrow(x, 1, t, 1), dims)


def _time_major(g: Graph, x: NodeId) -> NodeId:
    """`[b, s, ...]` → `[s, b, ...]` (the loop runs over the leading axis of its xs)."""
    r = g.shape(x).rank
    return g.transpose(x, [1, 0, *range(2, r)])


@expands("selective_scan")
def _x_selective_scan(g: Graph, node: Node, a: list[NodeId]) -> NodeId:
    """The recurrence as a `scan` over time (state [b, h, n]); y read from its trajectory."""
    x, delta, A, B, C = a[:5]
    b, s, h = g.shape(x).dims
    n = Dim(node.op.state_size)  # type: ignore[attr-defined]
    dt = node.shape.dtype
    body = Graph("selective_scan_step")
    st = body.input("state", [b, h, n], dt)
    a_in = body.input("A", [h, n], dt)
    dt_t, x_t = body.input("dt", [b, h], dt), body.input("x", [b, h], dt)
    b_t = body.input("B", [b, n], dt)
    d3 = body.reshape(dt_t, [b, h, Dim(1)])
    inject = body.mul(body.reshape(body.mul(dt_t, x_t), [b, h, Dim(1)]), body.reshape(b_t, [b, Dim(1), n]))
    body.set_outputs([body.add_(body.mul(body.activation("exp", body.mul(d3, a_in)), st), inject)])
    init = a[5] if node.op.carry_state else g.expand(const(g, 0.0, dt), [b, h, n])  # type: ignore[attr-defined]
    traj = g.scan(body, init, bcasts=[A], xs=[_time_major(g, delta), _time_major(g, x), _time_major(g, B)],
                  save_trajectory=True)  # [s, b, h, n]
    c4 = g.reshape(_time_major(g, C), [s, b, Dim(1), n])
    return _time_major(g, g.reduce("sum", g.mul(traj, c4), [-1]))


@expands("gated_delta_net")
def _x_gdn(g: Graph, node: Node, a: list[NodeId]) -> NodeId:
    """The gated delta rule as a `scan` over time (state [b, h, n, n]); o read from its trajectory."""
    op = node.op
    q, k, v, gate, beta = a[:5]
    b, s, h, n = g.shape(q).dims
    dt = node.shape.dtype
    one = Dim(1)
    body = Graph("gated_delta_step")
    st = body.input("state", [b, h, n, n], dt)
    k_t, v_t = body.input("k", [b, h, n], dt), body.input("v", [b, h, n], dt)
    g_t, beta_t = body.input("g", [b, h], dt), body.input("beta", [b, h], dt)
    st = body.mul(st, body.reshape(body.activation("exp", g_t), [b, h, one, one]))
    k_col = body.reshape(k_t, [b, h, n, one])
    kv = body.reduce("sum", body.mul(st, k_col), [2])  # S^T k
    u = body.mul(body.reshape(beta_t, [b, h, one]), body.sub(v_t, kv))
    body.set_outputs([body.add_(st, body.mul(k_col, body.reshape(u, [b, h, one, n])))])
    init = a[5] if op.carry_state else g.expand(const(g, 0.0, dt), [b, h, n, n])  # type: ignore[attr-defined]
    traj = g.scan(body, init, xs=[_time_major(g, z) for z in (k, v, gate, beta)], save_trajectory=True)
    qs = g.mul(g.reshape(_time_major(g, q), [s, b, h, n, one]), const(g, op.q_scale, dt))  # type: ignore
    return _time_major(g, g.reduce("sum", g.mul(traj, qs), [3]))  # [b, s, h, n]

"""Derivative rules of the primitive MIR ops, one table entry per op kind.

`VJP[kind](g, node, args, out, ct)` emits into `g` the cotangents of the
node's inputs given the cotangent `ct` of its output (None for an input that
has no gradient: indices, conditions, integer values). `JVP[kind](g, node,
args, out, tangents)` emits the output tangent from the inputs' tangents
(None where an input has none). `args` and `out` are the node's inputs and
output as already emitted into `g`. Composite ops (norms, attention, fused
ops, SSM layers) are first expanded into these primitives by
`rlx.opt.ad_expand`.

Elementwise ops share one description: the partial derivative of the output
with respect to each input (`_partials`), from which both modes follow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.shape import Dim

Ct = NodeId | None
VjpRule = Callable[[Graph, Node, list[NodeId], NodeId, NodeId], list[Ct]]
JvpRule = Callable[[Graph, Node, list[NodeId], NodeId, list[Ct]], Ct]

VJP: dict[str, VjpRule] = {}
JVP: dict[str, JvpRule] = {}


def rule(table: dict, *kinds: str) -> Callable[[Callable], Callable]:
    def wrap(fn: Callable) -> Callable:
        for k in kinds:
            if k in table:
                raise TypeError(f"derivative rule for {k!r} registered twice")
            table[k] = fn
        return fn

    return wrap


# ── helpers ─────────────────────────────────────────────────────────────


def const(g: Graph, value: float, dtype: DType) -> NodeId:
    return g.constant(np.asarray(value, dtype=np.float64), dtype)


def fill(g: Graph, value: float, dims: Sequence[Dim], dtype: DType) -> NodeId:
    """`value` broadcast to `dims` (a scalar constant stays one for rank 0)."""
    c = const(g, value, dtype)
    return g.expand(c, list(dims)) if len(dims) else c


def zeros(g: Graph, like: NodeId) -> NodeId:
    s = g.shape(like)
    return fill(g, 0.0, s.dims, s.dtype)


def add(g: Graph, a: Ct, b: Ct) -> Ct:
    if a is None:
        return b
    if b is None:
        return a
    return g.add_(a, b)


def unbroadcast(g: Graph, ct: NodeId, target: Sequence[Dim]) -> NodeId:
    """Sum `ct` over the axes numpy broadcasting added to reach it from `target` dims."""
    dims = g.shape(ct).dims
    lead = len(dims) - len(target)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(target) if d == 1 and dims[lead + i] != 1]
    if axes:
        ct = g.reduce("sum", ct, axes, keep_dim=True)
    if g.shape(ct).dims != tuple(target):
        ct = g.reshape(ct, list(target))
    return ct


def _sigmoid(g: Graph, x: NodeId) -> NodeId:
    return g.activation("sigmoid", x)


def _act_deriv(g: Graph, fn: str, x: NodeId, y: NodeId) -> NodeId:
    """d act(x) / dx as a graph value (elementwise)."""
    dt = g.shape(x).dtype

    def c(v: float) -> NodeId:
        return const(g, v, dt)

    if fn == "exp":
        return y
    if fn == "log":
        return g.div(c(1.0), x)
    if fn == "sqrt":
        return g.div(c(0.5), y)
    if fn == "rsqrt":
        return g.mul(c(-0.5), g.div(y, x))
    if fn == "neg":
        return fill(g, -1.0, g.shape(x).dims, dt)
    if fn in ("abs", "relu"):
        pos = g.cast(g.compare("gt", x, c(0.0)), dt)
        if fn == "relu":
            return pos
        return g.sub(pos, g.cast(g.compare("lt", x, c(0.0)), dt))
    if fn == "sin":
        return g.activation("cos", x)
    if fn == "cos":
        return g.activation("neg", g.activation("sin", x))
    if fn == "tanh":
        return g.sub(c(1.0), g.mul(y, y))
    if fn == "sigmoid":
        return g.mul(y, g.sub(c(1.0), y))
    if fn == "softplus":
        return _sigmoid(g, x)
    if fn == "mish":  # x tanh(sp(x)): tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2), as sp' = sigmoid
        t = g.activation("tanh", g.activation("softplus", x))
        return g.add_(t, g.mul(g.mul(x, _sigmoid(g, x)), g.sub(c(1.0), g.mul(t, t))))
    if fn == "hardswish":  # 0 below -3, 1 above 3, (2x + 3) / 6 between (torch's choice at the kinks)
        mid = g.div(g.add_(g.mul(c(2.0), x), c(3.0)), c(6.0))
        return g.where(g.compare("lt", x, c(-3.0)), c(0.0), g.where(g.compare("gt", x, c(3.0)), c(1.0), mid))
    if fn == "silu":
        s = _sigmoid(g, x)
        return g.add_(s, g.mul(y, g.sub(c(1.0), s)))
    if fn == "gelu":
        # Phi(x) = gelu(x) / x (1/2 at 0) since gelu has no erf op to call; plus x * phi(x).
        phi_cdf = g.where(g.compare("eq", x, c(0.0)), c(0.5), g.div(y, x))
        pdf = g.mul(c(1.0 / math.sqrt(2.0 * math.pi)), g.activation("exp", g.mul(c(-0.5), g.mul(x, x))))
        return g.add_(phi_cdf, g.mul(x, pdf))
    if fn == "gelu_tanh":
        k = math.sqrt(2.0 / math.pi)
        u = g.mul(c(k), g.add_(x, g.mul(c(0.044715), g.mul(x, g.mul(x, x)))))
        t = g.activation("tanh", u)
        du = g.mul(c(k), g.add_(c(1.0), g.mul(c(3 * 0.044715), g.mul(x, x))))
        left = g.mul(c(0.5), g.add_(c(1.0), t))
        right = g.mul(g.mul(c(0.5), x), g.mul(g.sub(c(1.0), g.mul(t, t)), du))
        return g.add_(left, right)
    raise IRError(f"autodiff: no derivative for activation {fn!r}")


def _partials(g: Graph, node: Node, args: list[NodeId], out: NodeId) -> list[NodeId | None]:
    """∂out/∂input_i of an elementwise node, broadcast-shaped (None: no gradient flows)."""
    op = node.op
    dt = node.shape.dtype
    if isinstance(op, O.Activation):
        return [_act_deriv(g, op.fn, args[0], out)]
    if isinstance(op, O.Binary):
        a, b = args
        one = const(g, 1.0, dt)
        if op.fn == "add":
            return [one, one]
        if op.fn == "sub":
            return [one, const(g, -1.0, dt)]
        if op.fn == "mul":
            return [b, a]
        if op.fn == "div":
            return [g.div(one, b), g.activation("neg", g.div(out, b))]
        if op.fn in ("max", "min"):
            pick_a = g.cast(g.compare("ge" if op.fn == "max" else "le", a, b), dt)
            return [pick_a, g.sub(one, pick_a)]
        if op.fn == "pow":
            da = g.mul(b, g.binary("pow", a, g.sub(b, one)))
            return [da, g.mul(out, g.activation("log", a))]
        if op.fn == "fmod":  # a - trunc(a / b) * b: ∂a = 1, ∂b = -trunc(a / b) = -(a - out) / b (away from jumps)
            return [one, g.activation("neg", g.div(g.sub(a, out), b))]
    raise IRError(f"autodiff: no partials for {node.kind}")


# ── elementwise ─────────────────────────────────────────────────────────


@rule(VJP, "activation", "binary")
def _vjp_elementwise(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    if not node.shape.dtype.is_float:
        return [None] * len(args)
    return [None if p is None else unbroadcast(g, g.mul(ct, p), g.shape(a).dims)
            for p, a in zip(_partials(g, node, args, out), args)]


@rule(JVP, "activation", "binary")
def _jvp_elementwise(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    if not node.shape.dtype.is_float:
        return None
    acc: Ct = None
    for p, t in zip(_partials(g, node, args, out), ts):
        if t is not None and p is not None:
            acc = add(g, acc, g.mul(t, p))
    if acc is not None and g.shape(acc).dims != node.shape.dims:
        acc = g.expand(acc, list(node.shape.dims))
    return acc


@rule(VJP, "compare")
def _vjp_none(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    return [None] * len(args)


@rule(JVP, "compare")
def _jvp_none(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    return None


@rule(VJP, "where")
def _vjp_where(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    cond, a, b = args
    zero = const(g, 0.0, node.shape.dtype)
    return [None, unbroadcast(g, g.where(cond, ct, zero), g.shape(a).dims),
            unbroadcast(g, g.where(cond, zero, ct), g.shape(b).dims)]


@rule(JVP, "where")
def _jvp_where(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    if ts[1] is None and ts[2] is None:
        return None
    zero = const(g, 0.0, node.shape.dtype)
    return g.expand(g.where(args[0], ts[1] if ts[1] is not None else zero, ts[2] if ts[2] is not None else zero),
                    node.shape.dims)


@rule(VJP, "cast")
def _vjp_cast(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    src = g.shape(args[0]).dtype
    return [g.cast(ct, src) if src.is_float and node.shape.dtype.is_float else None]


@rule(JVP, "cast")
def _jvp_cast(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    return g.cast(ts[0], node.shape.dtype) if ts[0] is not None and node.shape.dtype.is_float else None


# ── linear algebra, reductions ─────────────────────────────────────────


def _mT(g: Graph, x: NodeId) -> NodeId:
    r = g.shape(x).rank
    return g.transpose(x, [*list(range(r - 2)), r - 1, r - 2])


@rule(VJP, "matmul")
def _vjp_matmul(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    a, b = args
    return [unbroadcast(g, g.matmul(ct, _mT(g, b)), g.shape(a).dims),
            unbroadcast(g, g.matmul(_mT(g, a), ct), g.shape(b).dims)]


@rule(JVP, "matmul")
def _jvp_matmul(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    a, b = args
    acc = None
    if ts[0] is not None:
        acc = g.matmul(ts[0], b)
    if ts[1] is not None:
        acc = add(g, acc, g.matmul(a, ts[1]))
    return acc


def _keep(g: Graph, node: Node, x: NodeId, v: NodeId) -> NodeId:
    """A reduce node's value `v` reshaped with its reduced axes kept as 1 (broadcastable against x)."""
    op: O.Reduce = node.op  # type: ignore[assignment]
    if op.keep_dim:
        return v
    axes = op.normalized_axes(g.shape(x).rank)
    dims = [Dim(1) if i in axes else d for i, d in enumerate(g.shape(x).dims)]
    return g.reshape(v, dims)


def _inv_count(g: Graph, node: Node, x: NodeId) -> NodeId:
    """1 / (elements per reduced group), as a keep-dim value: a mean of ones, so dynamic dims work."""
    op: O.Reduce = node.op  # type: ignore[assignment]
    dims = g.shape(x).dims
    axes = op.normalized_axes(len(dims))
    n = 1
    if all(dims[a].is_static for a in axes):
        for a in axes:
            n *= dims[a].value
        return const(g, 1.0 / n, node.shape.dtype)
    # dynamic: (sum of ones)^-1 over the same axes
    ones = fill(g, 1.0, dims, node.shape.dtype)
    return g.div(const(g, 1.0, node.shape.dtype), g.reduce("sum", ones, axes, keep_dim=True))


def _reduce_weights(g: Graph, node: Node, x: NodeId, out: NodeId) -> NodeId:
    """∂out/∂x broadcast to x's shape for one reduce node."""
    fn = node.op.fn  # type: ignore[attr-defined]
    dt = node.shape.dtype
    dims = g.shape(x).dims
    if fn == "sum":
        return fill(g, 1.0, dims, dt)
    if fn == "mean":
        inv = _inv_count(g, node, x)
        return g.expand(inv, dims) if len(dims) else inv
    if fn in ("max", "min"):
        hit = g.cast(g.compare("eq", x, _keep(g, node, x, out)), dt)
        # ties share the gradient equally
        axes = node.op.normalized_axes(len(dims))  # type: ignore[attr-defined]
        return g.div(hit, g.reduce("sum", hit, axes, keep_dim=True))
    if fn == "prod":
        return g.div(_keep(g, node, x, out), x)
    raise IRError(f"autodiff: no derivative for reduce {fn!r}")


@rule(VJP, "reduce")
def _vjp_reduce(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    (x,) = args
    if not node.shape.dtype.is_float:
        return [None]
    w = _reduce_weights(g, node, x, out)
    return [g.mul(w, _keep(g, node, x, ct))]


@rule(JVP, "reduce")
def _jvp_reduce(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    if ts[0] is None or not node.shape.dtype.is_float:
        return None
    w = _reduce_weights(g, node, args[0], out)
    op: O.Reduce = node.op  # type: ignore[assignment]
    return g.reduce("sum", g.mul(w, ts[0]), op.axes, op.keep_dim) if op.axes else \
        g.reduce("sum", g.mul(w, ts[0]), (), op.keep_dim)


@rule(VJP, "softmax")
def _vjp_softmax(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    ax = node.op.axis  # type: ignore[attr-defined]
    s = g.reduce("sum", g.mul(ct, out), [ax], keep_dim=True)
    return [g.mul(out, g.sub(ct, s))]


@rule(JVP, "softmax")
def _jvp_softmax(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    if ts[0] is None:
        return None
    ax = node.op.axis  # type: ignore[attr-defined]
    s = g.reduce("sum", g.mul(ts[0], out), [ax], keep_dim=True)
    return g.mul(out, g.sub(ts[0], s))


# ── movement ────────────────────────────────────────────────────────────


@rule(VJP, "reshape")
def _vjp_reshape(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    return [g.reshape(ct, list(g.shape(args[0]).dims))]


@rule(VJP, "transpose")
def _vjp_transpose(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    perm = node.op.perm  # type: ignore[attr-defined]
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return [g.transpose(ct, inv)]


@rule(VJP, "expand")
def _vjp_expand(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    return [unbroadcast(g, ct, g.shape(args[0]).dims)]


@rule(VJP, "narrow")
def _vjp_narrow(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    op = node.op
    src = g.shape(args[0])
    axis = op.axis % src.rank  # type: ignore[attr-defined]
    total = src.dims[axis]
    if not total.is_static:
        raise IRError("autodiff: narrow along a dynamic axis has no gradient rule")
    parts = []
    dt = src.dtype
    for start, length in ((0, op.start), (op.start + op.length, total.value - op.start - op.length)):  # type: ignore
        if length:
            dims = list(src.dims)
            dims[axis] = Dim(length)
            parts.append((start, g.expand(const(g, 0.0, dt), dims)))
    pieces = [p for s, p in parts if s == 0] + [ct] + [p for s, p in parts if s != 0]
    return [pieces[0] if len(pieces) == 1 else g.concat(pieces, axis)]


@rule(VJP, "concat")
def _vjp_concat(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    axis = node.op.axis % node.shape.rank  # type: ignore[attr-defined]
    outs, start = [], 0
    for a in args:
        n = g.shape(a).dims[axis].value
        outs.append(g.narrow(ct, axis, start, n))
        start += n
    return outs


@rule(VJP, "gather")
def _vjp_gather(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    table, idx = args
    ts = g.shape(table)
    axis = node.op.axis % ts.rank  # type: ignore[attr-defined]
    n = ts.dims[axis].value
    irank = g.shape(idx).rank
    # scatter-add as a one-hot matmul: onehot[m, n] = (idx[m] == n); d_table[n, rest] = onehot^T @ ct[m, rest]
    flat_idx = g.reshape(idx, [-1, 1])
    iota = g.constant(np.arange(n).reshape(1, n).astype(g.shape(idx).dtype.np), g.shape(idx).dtype)
    onehot = g.cast(g.compare("eq", flat_idx, iota), ts.dtype)
    # bring the gathered axes of ct to the front: ct dims = table[:axis] + idx dims + table[axis+1:]
    cr = g.shape(ct).rank
    perm = list(range(axis, axis + irank)) + list(range(axis)) + list(range(axis + irank, cr))
    ctp = g.transpose(ct, perm) if perm != list(range(cr)) else ct
    rest = [d for i, d in enumerate(ts.dims) if i != axis]
    ct2 = g.reshape(ctp, [-1] + ([int(np.prod([d.value for d in rest]))] if rest else [1]))
    d = g.matmul(_mT(g, onehot), ct2)  # [n, prod(rest)]
    d = g.reshape(d, [Dim(n), *rest])
    if axis:
        back = [*list(range(1, axis + 1)), 0, *list(range(axis + 1, ts.rank))]
        d = g.transpose(d, back)
    return [d, None]


def _same_op_on_tangents(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    """Linear ops: the tangent is the op applied to the tangents (missing ones as zeros)."""
    if all(t is None for t in ts[:1] if node.kind != "concat") and node.kind != "concat":
        return None
    if node.kind == "concat":
        if all(t is None for t in ts):
            return None
        ts = [t if t is not None else zeros(g, a) for t, a in zip(ts, args)]
        return g.add(node.op, ts)
    if node.kind == "gather":
        return g.add(node.op, [ts[0], args[1]])
    return g.add(node.op, [ts[0]])


for _kind in ("reshape", "transpose", "expand", "narrow", "concat", "gather"):
    JVP[_kind] = _same_op_on_tangents


@rule(VJP, "rope")
def _vjp_rope(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    # a rotation per pair: its transpose is the rotation by -angle (cos, -sin); the tables are constants
    _x, cos, sin = args
    return [g.add(node.op, [ct, cos, g.activation("neg", sin)]), None, None]


@rule(JVP, "rope")
def _jvp_rope(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    return None if ts[0] is None else g.add(node.op, [ts[0], args[1], args[2]])


# ── causal depthwise conv (bilinear in its input and weight) ────────────


def _conv(g: Graph, node: Node, x: NodeId, w: NodeId, pad: NodeId | None, reverse: bool) -> NodeId:
    # the outputs alone: a carried form's state update is no part of the derivative
    op = dataclasses.replace(node.op, reverse=reverse, carry_state=False)
    return g.add(op, [x, w] + ([pad] if pad is not None else []))


@rule(VJP, "depthwise_conv1d_causal")
def _vjp_dwconv(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    x, w = args[:2]
    pad = args[2] if len(args) > 2 else None
    rev = node.op.reverse  # type: ignore[attr-defined]
    ksz = node.op.kernel_size  # type: ignore[attr-defined]
    ws = g.shape(w)
    ch = ws.dims[0].value
    dt = node.shape.dtype
    # d x: the transposed conv (causal <-> anti-causal) of the cotangent
    dx = _conv(g, node, ct, w, None, not rev)
    # d w[:, j] = sum over batch and time of ct * (x shifted as tap j reads it): a conv with a one-hot kernel
    cols = []
    for j in range(ksz):
        onehot = np.zeros((ch, ksz))
        onehot[:, j] = 1.0
        tap = _conv(g, node, x, g.constant(onehot, dt), pad, rev)
        cols.append(g.reshape(g.reduce("sum", g.mul(ct, tap), [0, 1]), [Dim(ch), Dim(1)]))
    dw = cols[0] if ksz == 1 else g.concat(cols, 1)
    dpad = None
    if pad is not None:
        # pad row r feeds outputs t = 0..r through tap r - t: d pad[r] = sum_t w[:, r - t] * ct[t]
        # (ct rows gathered at fixed indices: this needs seq >= k-1 at run time, else a gather error)
        rows = []
        itype = np.int32
        for r in range(ksz - 1):
            acc = None
            for t in range(r + 1):
                ct_t = g.gather(ct, g.constant(np.array([t], itype)), 1)  # [b, 1, c]
                term = g.mul(ct_t, g.reshape(g.narrow(w, 1, r - t, 1), [Dim(1), Dim(1), Dim(ch)]))
                acc = term if acc is None else g.add_(acc, term)
            rows.append(acc)
        dpad = rows[0] if len(rows) == 1 else g.concat(rows, 1)
    return [dx, dw] + ([dpad] if pad is not None else []) + ([None] if len(args) > 3 else [])  # lengths: integer


@rule(JVP, "depthwise_conv1d_causal")
def _jvp_dwconv(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    x, w = args[:2]
    pad = args[2] if len(args) > 2 else None
    rev = node.op.reverse  # type: ignore[attr-defined]
    acc: Ct = None
    if ts[0] is not None or (pad is not None and ts[2] is not None):
        tx = ts[0] if ts[0] is not None else zeros(g, x)
        tpad = None if pad is None else (ts[2] if ts[2] is not None else zeros(g, pad))
        acc = _conv(g, node, tx, w, tpad, rev)
    if ts[1] is not None:
        acc = add(g, acc, _conv(g, node, x, ts[1], pad, rev))
    return acc

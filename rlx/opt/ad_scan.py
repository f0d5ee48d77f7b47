"""Derivative rules of the ops that hold bodies: `scan` and `custom_fn`.

Reverse mode of a scan ``c_{t+1} = f(c_t, b, x_t)`` is a reverse scan over the
same steps whose body is the vjp of `f` (derived by `rlx.opt.autodiff.vjp`
from the body itself): it carries the cotangent of the carry and the
accumulated cotangents of the broadcast inputs, and emits the cotangent of
each xs row. It needs every step's input carry, which a forward scan
recomputes as a trajectory of (c_t, c_{t+1}) pairs from the scan's init.
Several values travel in one carry by flattening and concatenating them
(`pack` / `unpack`; static shapes only), as the original IR's multi-output
bodies did.

`scan_checkpointed` (num_checkpoints = K) is first split into K chained scans
over consecutive segments (`expand_checkpointed`): the forward keeps only the
K segment-boundary carries, and each segment's backward recomputes its own
trajectory, so the memory plan holds K carries plus one segment's trajectory
(O(sqrt(length)) for K ~ sqrt(length)) instead of the whole trajectory.

`custom_fn` uses its supplied `vjp` / `jvp` bodies, else derives them from `fwd`; a user op (`rlx.custom_op`)
has the `vjp` body traced from its registration, or no reverse-mode derivative.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from rlx.errors import IRError
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.ops_scan import CustomFn, Scan
from rlx.ir.ops_user import UserOp
from rlx.ir.shape import Dim, Shape
from rlx.opt.ad_core import jvp, vjp
from rlx.opt.ad_expand import EXPANSIONS
from rlx.opt.ad_rules import JVP, VJP, Ct, fill, zeros
from rlx.opt.bodies import inline_body


def _numel(shape: Shape, what: str) -> int:
    if not shape.is_static:
        raise IRError(f"autodiff of scan: {what} must have a static shape, got {shape}")
    return math.prod(shape.static_dims)


def pack(g: Graph, ids: list[NodeId]) -> NodeId:
    """The values `ids` flattened and concatenated into one 1-D value."""
    flat = [g.reshape(i, [_numel(g.shape(i), "a carried value")]) for i in ids]
    return flat[0] if len(flat) == 1 else g.concat(flat, 0)


def unpack(g: Graph, packed: NodeId, shapes: list[Shape], lead: list[Dim] | None = None) -> list[NodeId]:
    """Split a packed value (1-D, or `[*lead, P]`) back into values of `shapes` (with `lead` dims first)."""
    lead = lead or []
    out, start = [], 0
    for s in shapes:
        n = _numel(s, "a carried value")
        part = g.narrow(packed, len(lead), start, n) if len(shapes) > 1 else packed
        out.append(g.reshape(part, [*lead, *s.dims]))
        start += n
    return out


def _body_parts(op: Scan) -> tuple[Graph, list[Shape]]:
    body = Graph.from_body(op.body)
    return body, [n.shape for n in body.inputs()]


def _pairs_trajectory(g: Graph, op: Scan, args: list[NodeId]) -> NodeId:
    """`[L, 2C]`: row t packs (c_t, c_{t+1}), recomputed by a forward scan from the scan's init."""
    body, shapes = _body_parts(op)
    carry = shapes[0]
    pb = Graph(f"{body.name}_pairs")
    pc = pb.input("pair", [2 * _numel(carry, "the carry")], carry.dtype)
    rest = [pb.input(f"in{i}", s) for i, s in enumerate(shapes[1:])]
    _, cur = unpack(pb, pc, [carry, carry])
    (nxt,) = inline_body(pb, op.body, [cur, *rest])
    pb.set_outputs([pack(pb, [cur, nxt])])
    init = pack(g, [args[0], args[0]])
    return g.scan(pb, init, xs=args[1 + op.num_bcast:], bcasts=args[1:1 + op.num_bcast], length=op.length,
                  save_trajectory=True, reverse=op.reverse)


def _vjp_scan(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    op: Scan = node.op  # type: ignore[assignment]
    body, shapes = _body_parts(op)
    nb, nx = op.num_bcast, op.num_xs
    carry = shapes[0]
    dt = carry.dtype
    floats = [s.dtype.is_float for s in shapes]
    bshapes, xshapes = shapes[1:1 + nb], shapes[1 + nb:]
    # which bcasts / xs get cotangents (float ones); the carry always does
    b_idx = [i for i in range(nb) if floats[1 + i]]
    x_idx = [i for i in range(nx) if floats[1 + nb + i]]
    names = [n.op.name for n in body.inputs()]
    body_vjp = vjp(body, wrt=[names[0]] + [names[1 + i] for i in b_idx] + [names[1 + nb + i] for i in x_idx])
    c_in = _pairs_trajectory(g, op, args)  # [L, 2C]
    pair_rows = g.reshape(g.narrow(c_in, 1, 0, _numel(carry, "the carry")),
                          [op.length, *carry.dims])  # c_t of every step: [L, *carry]

    # the backward body: carry packs (d c_{t+1}, sum of d b, d x_t); xs are c_t, the xs rows, d traj row
    bb = Graph(f"{body.name}_bwd")
    packed_shapes = [carry] + [bshapes[i] for i in b_idx] + [xshapes[i] for i in x_idx]
    pk = bb.input("acc", [sum(_numel(s, "a carried value") for s in packed_shapes)], dt)
    bc = [bb.input(f"b{i}", s) for i, s in enumerate(bshapes)]
    c_t = bb.input("c_t", carry)
    xr = [bb.input(f"x{i}", s) for i, s in enumerate(xshapes)]
    d_traj = bb.input("d_traj", carry) if op.save_trajectory else None
    parts = unpack(bb, pk, packed_shapes)
    d_next = parts[0]
    if d_traj is not None:
        d_next = bb.add_(d_next, d_traj)
    res = inline_body(bb, body_vjp.as_body(), [c_t, *bc, *xr, d_next])
    grads = res[1:]  # [d c_t, d b (b_idx), d x (x_idx)]
    acc_b = [bb.add_(parts[1 + k], grads[1 + k]) for k in range(len(b_idx))]
    bb.set_outputs([pack(bb, [grads[0], *acc_b, *grads[1 + len(b_idx):]])])

    seed_c = zeros(g, args[0]) if op.save_trajectory else ct
    seeds = [seed_c] + [zeros(g, args[1 + i]) for i in b_idx] + [fill(g, 0.0, xshapes[i].dims, dt) for i in x_idx]
    xs_b = [pair_rows, *args[1 + nb:]] + ([ct] if op.save_trajectory else [])
    need_rows = bool(x_idx)
    res_b = g.scan(bb, pack(g, seeds), xs=xs_b, bcasts=args[1:1 + nb], length=op.length,
                   save_trajectory=need_rows, reverse=not op.reverse)
    if need_rows:
        # row t holds the state after step t of the reverse sweep: its x part is d x_t; row 0 (forward
        # order) ends the reverse sweep and holds the final carry and bcast sums
        # row 0 (or row length-1) by a gather: a narrow cannot cut a dynamic axis
        final = g.reshape(g.gather(res_b, _last_row(g, op) if op.reverse else g.constant(np.array([0], np.int32)),
                                   0), [-1])
        d_rows = unpack(g, res_b, packed_shapes, [op.length])[1 + len(b_idx):]
    else:
        final, d_rows = res_b, []
    fin = unpack(g, final, packed_shapes)
    out_cts: list[Ct] = [fin[0]] + [None] * (nb + nx)
    for k, i in enumerate(b_idx):
        out_cts[1 + i] = fin[1 + k]
    for k, i in enumerate(x_idx):
        out_cts[1 + nb + i] = d_rows[k]
    return out_cts


def _last_row(g: Graph, op: Scan) -> NodeId:
    """i32 `[length - 1]`, also for a dynamic length (counted as a sum of ones over it)."""
    if op.length.is_static:
        return g.constant(np.array([op.length.value - 1], np.int32))
    one = g.constant(np.float32(1.0))
    count = g.reduce("sum", g.expand(one, [op.length]), [0], keep_dim=True)  # [1], exact below 2^24
    return g.cast(g.sub(count, one), "i32")


def _jvp_scan(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    op: Scan = node.op  # type: ignore[assignment]
    body, shapes = _body_parts(op)
    names = [n.op.name for n in body.inputs()]
    nb = op.num_bcast
    active = [i for i, t in enumerate(ts) if t is not None and shapes[i].dtype.is_float]
    wrt = sorted(set([0, *active]))
    jb = jvp(body, wrt=[names[i] for i in wrt])
    carry = shapes[0]
    fb = Graph(f"{body.name}_jvp")
    pc = fb.input("pair", [2 * _numel(carry, "the carry")], carry.dtype)
    c, tc = unpack(fb, pc, [carry, carry])
    ins = [fb.input(f"in{i}", s) for i, s in enumerate(shapes[1:])]
    tins = {i: fb.input(f"t{i}", shapes[i]) for i in wrt if i != 0}
    feeds = [c, *ins] + [tc if i == 0 else tins[i] for i in wrt]
    res = inline_body(fb, jb.as_body(), feeds)
    fb.set_outputs([pack(fb, [res[0], res[1]])])
    init_t = ts[0] if ts[0] is not None else zeros(g, args[0])
    # body inputs: pair, bcasts, xs rows, then tangents of bcasts (bcasts) and of xs (xs)
    t_b = [ts[i] for i in wrt if 0 < i <= nb]
    t_x = [ts[i] for i in wrt if i > nb]
    bcasts = [*args[1:1 + nb], *t_b]
    xs = [*args[1 + nb:], *t_x]
    # the body's inputs must be ordered carry, bcasts, xs: rebuild it with that order
    fb2 = _reorder(fb, nb, len(args) - 1 - nb, len(t_b), len(t_x))
    res_s = g.scan(fb2, pack(g, [args[0], init_t]), xs=xs, bcasts=bcasts, length=op.length,
                   save_trajectory=op.save_trajectory, reverse=op.reverse)
    n = _numel(carry, "the carry")
    if op.save_trajectory:
        return g.reshape(g.narrow(res_s, 1, n, n), [op.length, *carry.dims])
    return g.reshape(g.narrow(res_s, 0, n, n), list(carry.dims))


def _reorder(fb: Graph, nb: int, nx: int, ntb: int, ntx: int) -> Graph:
    """`fb` (inputs: pair, bcasts, xs, t_bcasts, t_xs) with inputs ordered pair, bcasts, t_bcasts, xs, t_xs."""
    ins = [n.id for n in fb.inputs()]
    order = [ins[0], *ins[1:1 + nb], *ins[1 + nb + nx:1 + nb + nx + ntb], *ins[1 + nb:1 + nb + nx],
             *ins[1 + nb + nx + ntb:]]
    g = Graph(fb.name)
    env: dict[int, int] = {}
    for i in order:
        n = fb.node(i)
        env[i] = g.add(n.op, [], name=n.name)
    for n in fb.nodes:
        if n.id not in env:
            env[n.id] = g.add(n.op, [env[i] for i in n.inputs], name=n.name)
    g.set_outputs([env[o] for o in fb.outputs])
    return g


def expand_checkpointed(g: Graph, node: Node, args: list[NodeId]) -> NodeId:
    """A checkpointed scan as K chained plain scans over consecutive segments (see the module docstring)."""
    op: Scan = node.op  # type: ignore[assignment]
    if not op.num_checkpoints or op.save_trajectory:
        return g.add(dataclasses.replace(op, num_checkpoints=0), args, name=node.name)
    length = op.length.value
    k = op.num_checkpoints
    bounds = [length * s // k for s in range(k + 1)]
    nb = op.num_bcast
    segs = list(itertools.pairwise(bounds))
    if op.reverse:
        segs = segs[::-1]
    carry = args[0]
    for lo, hi in segs:
        if hi == lo:
            continue
        xs = [g.narrow(x, 0, lo, hi - lo) for x in args[1 + nb:]]
        seg = dataclasses.replace(op, length=Dim(hi - lo), num_checkpoints=0)
        carry = g.add(seg, [carry, *args[1:1 + nb], *xs])
    return carry


def _vjp_custom_fn(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    op: CustomFn = node.op  # type: ignore[assignment]
    if op.vjp is not None:
        return list(inline_body(g, op.vjp, [*args, out, ct]))
    fwd = Graph.from_body(op.fwd)
    names = [n.op.name for n in fwd.inputs()]
    floats = [n.shape.dtype.is_float for n in fwd.inputs()]
    dv = vjp(fwd, wrt=[nm for nm, f in zip(names, floats) if f])
    res = inline_body(g, dv.as_body(), [*args, ct])[1:]
    it = iter(res)
    return [next(it) if f else None for f in floats]


def _jvp_custom_fn(g: Graph, node: Node, args: list[NodeId], out: NodeId, ts: list[Ct]) -> Ct:
    op: CustomFn = node.op  # type: ignore[assignment]
    tangents = [t if t is not None else zeros(g, a) for t, a in zip(ts, args)]
    if op.jvp is not None:
        return inline_body(g, op.jvp, [*args, *tangents])[0]
    fwd = Graph.from_body(op.fwd)
    names = [n.op.name for n in fwd.inputs()]
    floats = [n.shape.dtype.is_float for n in fwd.inputs()]
    dj = jvp(fwd, wrt=[nm for nm, f in zip(names, floats) if f])
    return inline_body(g, dj.as_body(), [*args, *(t for t, f in zip(tangents, floats) if f)])[1]


def _vjp_user_op(g: Graph, node: Node, args: list[NodeId], out: NodeId, ct: NodeId) -> list[Ct]:
    op: UserOp = node.op  # type: ignore[assignment]
    if op.vjp is None:
        raise IRError(f"autodiff: custom op {op.name!r} ({node.label}) has no derivative: register it with vjp=")
    return list(inline_body(g, op.vjp, [*args, out, ct]))


VJP["scan"] = _vjp_scan
JVP["scan"] = _jvp_scan
VJP["custom_fn"] = _vjp_custom_fn
JVP["custom_fn"] = _jvp_custom_fn
VJP["user_op"] = _vjp_user_op
EXPANSIONS["scan"] = expand_checkpointed

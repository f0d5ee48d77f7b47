"""CUDA lowering: a sentence-embedding tail (masked mean pooling, L2 normalization) as one kernel (`PoolTail`).

A BERT / MiniLM embedder ends with about ten small nodes: the masked sum over the sequence (a
`[B, 1, S] x [B, S, H]` product), the mask count and its clamp, the division, then `x / max(||x||_2, eps)`
(a square, a row sum, a sqrt and clamp, a division). At batch 1 each is a ~2 µs kernel that waits for the one
before it, and the product is a cuBLASLt call that cannot start early. `find_pool_tails` recognizes the
pattern in the planned LIR; `rlx.codegen.cuda.pool` renders it as one kernel (one block per sentence).

A tail is taken only when it can run later as one kernel with no other kernel observing the difference:
its intermediate nodes are read by nothing outside the tail (and are not outputs), its nodes are scheduled
back to back (so its inputs are still intact when the kernel runs at the position of the last one), and its
output's bytes do not overlap the hidden states or mask it reads (blocks of other sentences still read them).

>>> from rlx.ir.graph import Graph
>>> from rlx.ir.shape import Dim
>>> from rlx.opt.memplan import plan
>>> import numpy as np
>>> g = Graph("pool")
>>> b, s = Dim.dynamic("b", 4), Dim.dynamic("s", 16)
>>> h, m = g.input("h", [b, s, 8]), g.input("m", [b, s])
>>> summed = g.reshape(g.matmul(g.reshape(m, [b, 1, s]), h), [b, 8])
>>> mean = g.div(summed, g.binary("max", g.reduce("sum", m, [1], keep_dim=True), g.constant(np.float32(1e-9))))
>>> g.set_outputs({"e": mean})
>>> [t.describe()[:40] for t in find_pool_tails(plan(g))]
['%8 = masked mean of %0 over the sequence']
"""

from __future__ import annotations

import numpy as np

from rlx.ir import ops as O
from rlx.ir.decisions_cuda import PoolTail
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.lir import LirModule
from rlx.opt.rewrite import constant_values

#: Widest hidden size the kernel takes (its shared memory holds a few partial rows of f32 sums).
POOL_MAX_HIDDEN = 8192
#: The norm before a tail runs in the tail's kernel for sentences of at most this many tokens (one block per
#: sentence normalizes every row: past this, the norm's own kernel, many blocks, is faster than the launch it saves).
POOL_NORM_MAX_SEQ = 64
#: ... and hidden sizes of at most this (a lane keeps its chunks of a row in registers: 32 scalar chunks at worst).
POOL_NORM_MAX_HIDDEN = 1024
#: Norm kinds the kernel computes: the number of inputs after x (and the residual) it takes, gamma (and beta).
_NORMS = {"layer_norm": (False, 2), "fused_residual_layer_norm": (True, 2), "rms_norm": (False, 1),
          "fused_residual_rms_norm": (True, 1)}


def _scalar(graph: Graph, nid: NodeId) -> float | None:
    """The value of a one-element float constant, or None."""
    node = graph.node(nid)
    if not isinstance(node.op, O.Constant) or node.shape.numel != 1 or not node.shape.dtype.is_float:
        return None
    return float(np.asarray(constant_values(node.op)).reshape(-1)[0])  # logical values: bf16 widened


def _clamped(graph: Graph, node: Node, sqrt: bool) -> tuple[NodeId, float] | None:
    """(x, eps) when `node` is `max(x, eps)` (`max(sqrt(x), eps)` with `sqrt`) for a scalar constant eps:
    a `binary max` (of an `activation sqrt`), or the elementwise region the fusions make of them."""
    op = node.op
    if isinstance(op, O.Binary) and op.fn == "max" and len(node.inputs) == 2:
        for i in (0, 1):
            eps = _scalar(graph, node.inputs[1 - i])
            if eps is None:
                continue
            if not sqrt:
                return node.inputs[i], eps
            inner = graph.node(node.inputs[i])
            if isinstance(inner.op, O.Activation) and inner.op.fn == "sqrt":
                return inner.inputs[0], eps
        return None
    if isinstance(op, O.ElementwiseRegion) and len(node.inputs) == 2:
        steps = op.steps
        want = (("sqrt",) if sqrt else ()) + ("max",)
        if len(steps) != len(want):
            return None
        if sqrt and not (isinstance(steps[0].op, O.Activation) and steps[0].op.fn == "sqrt"):
            return None
        last = steps[-1]
        if not (isinstance(last.op, O.Binary) and last.op.fn == "max"):
            return None
        value = 2 if sqrt else None  # the sqrt's result is value 2 (inputs are 0 and 1)
        if sqrt and steps[0].args not in ((0,), (1,)):
            return None
        x_in = steps[0].args[0] if sqrt else None
        for a, c in (last.args, last.args[::-1]):
            if c not in (0, 1):
                continue
            eps = _scalar(graph, node.inputs[c])
            if eps is None:
                continue
            if sqrt and a == value and x_in == 1 - c:
                return node.inputs[x_in], eps
            if not sqrt and a == 1 - c:
                return node.inputs[a], eps
    return None


def _row_sum(node: Node) -> bool:
    """A sum over axis 1 of a rank-2 value, keeping it ([B, N] -> [B, 1])."""
    op = node.op
    return (isinstance(op, O.Reduce) and op.fn == "sum" and op.keep_dim and node.shape.rank == 2
            and tuple(a % 2 for a in op.axes) == (1,))


def _norm_before(lir: LirModule, hidden: Node, first: int, out: NodeId,
                 users: dict[NodeId, list[NodeId]]) -> tuple[int, ...]:
    """(the norm,) when `hidden` is a norm the tail's kernel can compute itself, else (): the tail (scheduled from
    position `first`) is its only reader, nothing but views lies between them in the schedule (so its inputs are
    intact when the tail runs), its inputs are dense and not the bytes the tail writes (`out`)."""
    spec = _NORMS.get(hidden.kind)
    graph = lir.graph
    if (spec is None or hidden.id in graph.outputs or len(set(users[hidden.id])) != 1
            or len(hidden.inputs) != 1 + int(spec[0]) + spec[1] or lir.buffers[hidden.id].storage != "arena"
            or not hidden.shape.dims[-1].is_static or hidden.shape.dims[-1].value > POOL_NORM_MAX_HIDDEN):
        return ()
    pos = {nid: i for i, nid in enumerate(lir.schedule)}
    if hidden.id not in pos or any(lir.buffers[n].storage != "view" for n in lir.schedule[pos[hidden.id] + 1:first]):
        return ()
    rows = hidden.inputs[:1 + int(spec[0])]
    if any(graph.node(i).shape != hidden.shape for i in rows) or any(
            graph.node(i).shape.dims != hidden.shape.dims[-1:] for i in hidden.inputs[len(rows):]):
        return ()  # (a broadcast residual, or per-row gains)
    if any(not _dense(lir, i) or lir.arena_overlap(i, out) for i in (*rows, *hidden.inputs[len(rows):])):
        return ()
    return (hidden.id,)


def _match(lir: LirModule, mm: Node, users: dict[NodeId, list[NodeId]], with_norm: bool = False) -> PoolTail | None:
    """The tail whose masked sum is the product `mm`, or None."""
    graph = lir.graph
    outputs = set(graph.outputs)

    def sole(nid: NodeId) -> Node | None:
        us = set(users[nid])
        if nid in outputs or len(us) != 1:
            return None
        return graph.node(us.pop())

    if len(mm.inputs) != 2 or mm.shape.rank != 3:
        return None
    mask3, hidden = (graph.node(i) for i in mm.inputs)
    if not isinstance(mask3.op, O.Reshape) or hidden.shape.rank != 3 or mask3.shape.rank != 3:
        return None
    mask = graph.node(mask3.inputs[0])
    b, s, h = hidden.shape.dims
    if (mask.shape.rank != 2 or tuple(mask.shape.dims) != (b, s) or tuple(mask3.shape.dims[1:]) != (1, s)
            or mask3.shape.dims[0] != b or not h.is_static or tuple(mm.shape.dims) != (b, 1, h)
            or not h.value or h.value > POOL_MAX_HIDDEN or set(users[mask3.id]) != {mm.id}
            or mask.shape.dtype != hidden.shape.dtype or not hidden.shape.dtype.is_float):
        return None
    flat = sole(mm.id)
    if flat is None or not isinstance(flat.op, O.Reshape) or tuple(flat.shape.dims) != (b, h):
        return None
    mean = sole(flat.id)
    if mean is None or not isinstance(mean.op, O.Binary) or mean.op.fn != "div" or mean.inputs[0] != flat.id:
        return None
    count = graph.node(mean.inputs[1])
    clamp = _clamped(graph, count, sqrt=False)
    if clamp is None or sole(count.id) is not mean:
        return None
    total = graph.node(clamp[0])
    if not _row_sum(total) or total.inputs[0] != mask.id or sole(total.id) is not count:
        return None
    absorbed = [mask3.id, mm.id, flat.id, total.id, count.id]
    out, normalized, eps_norm = mean, False, 0.0
    # x / max(sqrt(sum(x * x)), eps): mean read by its square and the final division only
    readers = set(users[mean.id])
    if mean.id not in outputs and len(readers) == 2:
        sq = next((graph.node(u) for u in readers if isinstance(graph.node(u).op, O.Binary)
                   and graph.node(u).op.fn == "mul" and graph.node(u).inputs == (mean.id, mean.id)), None)
        ssum = sole(sq.id) if sq is not None else None
        norm = sole(ssum.id) if ssum is not None and _row_sum(ssum) else None
        clamp2 = _clamped(graph, norm, sqrt=True) if norm is not None else None
        final = sole(norm.id) if clamp2 is not None and clamp2[0] == ssum.id else None
        if (final is not None and isinstance(final.op, O.Binary) and final.op.fn == "div"
                and final.inputs == (mean.id, norm.id) and readers == {sq.id, final.id}):
            absorbed += [mean.id, sq.id, ssum.id, norm.id]
            out, normalized, eps_norm = final, True, clamp2[1]
    if out is mean and mean.id not in outputs and len(readers) == 0:
        return None
    # back to back in the schedule (views included), and nothing else scheduled between them
    pos = {nid: i for i, nid in enumerate(lir.schedule)}
    ids = [*absorbed, out.id]
    if any(n not in pos for n in ids):
        return None
    spots = sorted(pos[n] for n in ids)
    if spots != list(range(spots[0], spots[0] + len(spots))) or pos[out.id] != spots[-1]:
        return None
    for src in (hidden.id, mask.id):
        if not _dense(lir, src) or lir.arena_overlap(src, out.id):
            return None  # a block writes its sentence while others still read theirs
    slot = _abi_output(lir, out.id, users)
    fused = _norm_before(lir, hidden, spots[0], out.id, users) if with_norm else ()
    return PoolTail(hidden=hidden.id, mask=mask.id, out=out.id, absorbed=tuple(absorbed),
                    normalized=normalized, eps_count=clamp[1], eps_norm=eps_norm, abi_output=slot, norm=fused,
                    norm_max_seq=POOL_NORM_MAX_SEQ if fused else 0)


def _abi_output(lir: LirModule, nid: NodeId, users: dict[NodeId, list[NodeId]]) -> int:
    """The output slot `nid` is, when the kernel can write it in its ABI dtype: it is that output alone, read by
    no node, and not copied into another output (its own buffer then stays unwritten); -1 otherwise."""
    buf = lir.buffers[nid]
    if buf.storage != "output" or users[nid] or any(n == nid for _, n in lir.output_copies):
        return -1
    slots = [i for i, spec in enumerate(lir.outputs) if spec.node == nid]
    return slots[0] if slots == [buf.slot] else -1


def _dense(lir: LirModule, nid: NodeId) -> bool:
    """`nid`'s value is row-major at its address: its own buffer, or a chain of reshapes of one."""
    while lir.buffers[nid].storage == "view":
        node = lir.graph.node(nid)
        if not isinstance(node.op, O.Reshape):
            return False
        nid = node.inputs[0]
    return True


def find_pool_tails(lir: LirModule, norm: bool = False) -> list[PoolTail]:
    """Every masked-mean (+ L2 normalization) tail of `lir` that runs as one kernel (see the module doc); with
    `norm`, each also takes the layer / RMS norm producing its hidden states where it can (`PoolTail.norm`)."""
    graph = lir.graph
    users = graph.users()
    found = []
    for node in graph.nodes:
        if isinstance(node.op, O.MatMul):
            tail = _match(lir, node, users, norm)
            if tail is not None:
                found.append(tail)
    return found

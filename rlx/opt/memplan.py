"""Memory planner: liveness over the schedule, then best-fit packing into one arena.

Inputs, params, constants and outputs live in caller- or library-owned
storage; views (reshape, contiguous narrow, same-dtype cast) alias their
source; every other value gets a 64-byte-aligned slice of one arena, packed
size-descending with best fit so that values whose lifetimes do not overlap
share bytes. Sizes are taken at the dynamic dims' upper bounds.
"""

from __future__ import annotations

import math

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.lir import Buffer, LirModule, TensorSpec
from rlx.ir.ops_control import Cond, WhileLoop, step_bodies
from rlx.ir.ops_scan import Scan
from rlx.opt.lowering_conv_residual import conv_residual_pairs
from rlx.opt.lowering_conv_scale import conv_scale_pairs
from rlx.opt.scan_body import carry_slot_bytes, control_slots_bytes, step_graph

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def view_offset(graph: Graph, node: Node) -> int | None:
    """Byte offset into the input if `node` can alias its input's storage, else None."""
    op = node.op
    if isinstance(op, O.Reshape):
        return 0
    if isinstance(op, O.Cast) and graph.node(node.inputs[0]).shape.dtype == op.dtype:
        return 0
    if isinstance(op, O.Narrow):
        src = graph.node(node.inputs[0]).shape
        axis = op.axis % src.rank
        outer, inner = src.dims[:axis], src.dims[axis + 1:]
        if all(d == 1 for d in outer) and all(d.is_static for d in inner):
            return op.start * math.prod(d.value for d in inner) * src.dtype.itemsize
    return None


def _symbols(graph: Graph) -> tuple[tuple[str, int], ...]:
    """Symbols in order of first appearance among inputs; each must be deducible from one."""
    bounds = graph.symbols()
    order: list[str] = []
    for n in graph.inputs():
        for d in n.op.shape.dims:
            if d.coeff == 1 and len(d.symbols) == 1 and d.symbols[0][0] not in order:
                order.append(d.symbols[0][0])
    missing = [s for s in bounds if s not in order]
    if missing:
        raise IRError(f"dynamic dims {missing} do not appear as a whole dimension of any input, "
                      f"so their values cannot be known at run time")
    return tuple((s, bounds[s]) for s in order)


#: Normalizations a GEMM may compute in its prologue (CUDA's rlx_gemm_small): see `plan(hold_norm_inputs=...)`.
PROLOGUE_NORM_KINDS = ("layer_norm", "rms_norm", "fused_residual_layer_norm", "fused_residual_rms_norm")
_GEMM_KINDS = ("matmul", "fused_matmul_bias_act")


def norm_gemm_pairs(graph: Graph, schedule: tuple[NodeId, ...], view_of: dict) -> list[tuple[NodeId, NodeId]]:
    """(norm, GEMM) pairs where the next non-view node scheduled after a normalization is a GEMM whose A is the
    norm's output (through views): a backend may compute the norm inside that GEMM."""
    def root(nid: NodeId) -> NodeId:
        while nid in view_of:
            nid = view_of[nid][0]
        return nid

    pairs = []
    for i, nid in enumerate(schedule):
        if graph.node(nid).kind not in PROLOGUE_NORM_KINDS:
            continue
        nxt = next((q for q in schedule[i + 1:] if q not in view_of), None)
        if nxt is not None and graph.node(nxt).kind in _GEMM_KINDS and root(graph.node(nxt).inputs[0]) == nid:
            pairs.append((nid, nxt))
    return pairs


def gemm_residual_pairs(graph: Graph, schedule: tuple[NodeId, ...]) -> list[tuple[NodeId, NodeId]]:
    """(matmul, add) pairs where a `matmul`'s one reader is a residual add scheduled right after it: a backend may
    compute the add in the GEMM's (a decode GEMV's) epilogue."""
    users = graph.users()
    pairs = []
    for i, nid in enumerate(schedule[:-1]):
        node, nxt = graph.node(nid), graph.node(schedule[i + 1])
        if (node.kind == "matmul" and set(users[nid]) == {nxt.id} and nxt.kind == "binary"
                and getattr(nxt.op, "fn", None) == "add"):
            pairs.append((nid, nxt.id))
    return pairs


def plan(graph: Graph, *, hold_norm_inputs: bool = False, early_residual_adds: bool = False) -> LirModule:
    """Plan buffers for an (optimized) graph and return its LIR.

    `hold_norm_inputs`: the inputs of a normalization stay live through the GEMM scheduled right after it
    that reads its output (`norm_gemm_pairs`), so that GEMM's output never takes their bytes and a backend may
    run the norm inside the GEMM (CUDA: the prologue of rlx_gemm_small, whose blocks still read the norm's
    inputs while others write the output). It costs an activation's bytes of arena where they would be reused.
    With it too, a matmul's A stays live through the residual add scheduled right after it (`gemm_residual_pairs`),
    so the add's output never takes A's bytes and a one-row decode GEMV (CUDA's rlx_dgemv) may write the sum while
    other blocks still read A.

    `early_residual_adds`: a residual add of a conv's value (`conv_residual_pairs`: the conv's one reader) is live
    from the conv on, so the add's bytes are no other value's while the conv runs and a backend may compute the add
    in the conv's store (the CPU: `rlx.opt.lowering_conv_residual`). It costs an activation's bytes of arena at the
    conv (the conv's own value keeps its bytes, unwritten then). With it too, the operands of a squeeze-excite
    product read by a pointwise conv (`rlx.opt.lowering_conv_scale.conv_scale_pairs`) stay live through that conv,
    which may compute the product in its weight instead.

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("p")
    >>> x = g.input("x", [64])
    >>> y = g.activation("neg", x)
    >>> for fn in ("relu", "tanh", "exp"):
    ...     y = g.activation(fn, y)
    >>> g.set_outputs([y])
    >>> lir = plan(g)
    >>> lir.arena_bytes, lir.naive_bytes
    (512, 768)
    """
    graph.verify()
    nodes = graph.nodes
    schedule = tuple(n.id for n in nodes if n.kind not in O.LEAF_KINDS)
    position = {nid: i for i, nid in enumerate(schedule)}
    buffers: dict[NodeId, Buffer] = {}

    inputs = tuple(TensorSpec(n.op.name, n.id, n.shape, state=n.op.state) for n in graph.inputs())
    params = tuple(TensorSpec(n.op.name, n.id, n.op.user_shape, n.op.layout) for n in graph.params())
    constants = tuple(n.id for n in nodes if n.kind == "constant")
    for slot, s in enumerate(inputs):
        buffers[s.node] = Buffer("input", nodes[s.node].shape.max_nbytes, slot=slot)
    for slot, s in enumerate(params):
        buffers[s.node] = Buffer("param", nodes[s.node].shape.max_nbytes, slot=slot)
    for slot, c in enumerate(constants):
        buffers[c] = Buffer("const", nodes[c].shape.max_nbytes, slot=slot)

    # Views alias their source; `root` maps every node to the node owning its storage.
    root: dict[NodeId, NodeId] = {}
    view_of: dict[NodeId, tuple[NodeId, int]] = {}
    for n in nodes:
        root[n.id] = n.id
        if n.kind in O.LEAF_KINDS:
            continue
        off = view_offset(graph, n)
        if off is not None:
            src = n.inputs[0]
            view_of[n.id] = (src, off)
            root[n.id] = root[src]

    outputs = []
    copies: list[tuple[int, NodeId]] = []
    output_owner: dict[NodeId, int] = {}
    for slot, (name, o) in enumerate(zip(graph.output_names, graph.outputs)):
        outputs.append(TensorSpec(name, o, nodes[o].shape))
        computed = nodes[o].kind not in O.LEAF_KINDS and o not in view_of
        if computed and o not in output_owner:
            output_owner[o] = slot
            buffers[o] = Buffer("output", nodes[o].shape.max_nbytes, slot=slot)
        else:
            copies.append((slot, o))

    # Liveness of arena-resident roots, inclusive [def, last use] in schedule positions.
    end_of_program = len(schedule)
    last_use: dict[NodeId, int] = {}
    for n in nodes:
        if n.kind in O.LEAF_KINDS:
            continue
        for i in n.inputs:
            r = root[i]
            last_use[r] = max(last_use.get(r, -1), position[n.id])
    for _, o in copies:
        last_use[root[o]] = end_of_program
    if hold_norm_inputs:
        for norm, gemm in norm_gemm_pairs(graph, schedule, view_of):
            for i in nodes[norm].inputs:
                last_use[root[i]] = max(last_use.get(root[i], -1), position[gemm])
        for gemm, add in gemm_residual_pairs(graph, schedule):
            a = root[nodes[gemm].inputs[0]]
            last_use[a] = max(last_use.get(a, -1), position[add])

    first_def = dict(conv_residual_pairs(graph, position)) if early_residual_adds else {}
    if early_residual_adds:  # a squeeze-excite product's operands through the conv that may compute it
        for _, conv, x, s in conv_scale_pairs(graph):
            for i in (x, s):
                last_use[root[i]] = max(last_use.get(root[i], -1), position[conv])

    arena_nodes = [n for n in nodes if n.kind not in O.LEAF_KINDS and n.id not in view_of and n.id not in output_owner]
    requests = []
    for n in arena_nodes:
        start = position[first_def[n.id]] if n.id in first_def else position[n.id]
        end = max(last_use.get(n.id, start), start)
        requests.append((n.id, _align(max(n.shape.max_nbytes, 1)), start, end))
    # Nodes that need arena space while they run (a scan: its carries and its body's arena) get a
    # workspace live only at their own step, keyed by the negated node id (-1 - id).
    for n in nodes:
        if isinstance(n.op, Scan):
            # two carry slots (this step's and the next), then the body's own arena
            slot = carry_slot_bytes(n.op, nodes[n.inputs[0]].shape.max_nbytes)
            body_arena = plan(step_graph(n.op.body)).arena_bytes
            pos = position[n.id]
            requests.append((-1 - n.id, 2 * slot + _align(body_arena), pos, pos))
        elif isinstance(n.op, (Cond, WhileLoop)):
            # one body runs at a time, in the arena the largest needs (a loop: after its slots)
            size = control_slots_bytes(n.op, nodes[n.inputs[0]].shape.max_nbytes) + _align(
                max(plan(step_graph(b)).arena_bytes for b in step_bodies(n.op)))
            requests.append((-1 - n.id, size, position[n.id], position[n.id]))
    naive = sum(size for _, size, _, _ in requests)

    placed: list[tuple[int, int, int, int]] = []  # offset, size, start, end
    offsets: dict[NodeId, int] = {}
    for nid, size, start, end in sorted(requests, key=lambda r: (-r[1], r[2], r[0])):
        busy = sorted((o, o + s) for o, s, a, b in placed if a <= end and start <= b)
        best: tuple[int, int] | None = None  # (gap size, offset)
        cursor = 0
        for lo, hi in busy:
            if lo - cursor >= size and (best is None or lo - cursor < best[0]):
                best = (lo - cursor, cursor)
            cursor = max(cursor, hi)
        offset = best[1] if best is not None else cursor
        placed.append((offset, size, start, end))
        offsets[nid] = offset
    arena = max((o + s for o, s, _, _ in placed), default=0)
    workspaces = []
    for nid, size, _, _ in requests:
        if nid < 0:
            workspaces.append((-1 - nid, offsets[nid], size))
        else:
            buffers[nid] = Buffer("arena", nodes[nid].shape.max_nbytes, offset=offsets[nid])
    for n in nodes:
        if n.id in view_of:
            src, off = view_of[n.id]
            buffers[n.id] = Buffer("view", n.shape.max_nbytes, offset=off, source=src)

    return LirModule(
        name=graph.name,
        graph=graph,
        schedule=schedule,
        buffers=buffers,
        inputs=inputs,
        outputs=tuple(outputs),
        params=params,
        constants=constants,
        symbols=_symbols(graph),
        arena_bytes=arena,
        naive_bytes=naive,
        output_copies=tuple(copies),
        workspaces=tuple(sorted(workspaces)),
    )


def live_intervals(lir: LirModule) -> dict[NodeId, tuple[int, int, int, int]]:
    """For tests and inspection: arena node → (offset, size, first step, last step)."""
    graph = lir.graph
    position = {nid: i for i, nid in enumerate(lir.schedule)}
    root = {}
    for n in graph.nodes:
        b = lir.buffers[n.id]
        root[n.id] = root[b.source] if b.storage == "view" else n.id
    last: dict[NodeId, int] = {}
    for nid in lir.schedule:
        for i in graph.node(nid).inputs:
            last[root[i]] = max(last.get(root[i], -1), position[nid])
    for _, o in lir.output_copies:
        last[root[o]] = len(lir.schedule)
    out = {}
    for nid, b in lir.buffers.items():
        if b.storage == "arena":
            out[nid] = (b.offset, b.nbytes, position[nid], max(last.get(nid, position[nid]), position[nid]))
    return out

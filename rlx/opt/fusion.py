"""Fusion into the ops every backend implements directly (see the fused ops in `ops.py`).

Each fusion finds a pattern rooted at one node, replaces the root with a fused
op and drops the other matched nodes. A node is only absorbed when it is not
a graph output and every one of its consumers is inside the same fused op, so
no value is ever computed twice. Fused ops compute their epilogue on the
unrounded intermediate (e.g. `a @ b + bias` is not rounded to f32 before the
activation), and the residual norms add `x + residual + bias` in one
expression: results differ from the unfused graph only by those skipped
roundings and float reassociation.

Order matters and is fixed by `fuse`: SwiGLU first (otherwise `silu(x @ wg)`
would become a matmul epilogue), then matmul epilogues (they win over
elementwise regions), then residual norms, then elementwise regions.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Hashable, Iterator

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.lir import LirModule
from rlx.ir.ops_conv import Conv
from rlx.opt.rewrite import Rewriter, consumers, require_mir, sole_consumer

#: Most distinct inputs an ElementwiseRegion may take (ops.ElementwiseRegion.arity).
MAX_REGION_INPUTS = O.ElementwiseRegion.arity[1]


class _Plan:
    """Fused ops chosen so far: root node -> (op, source inputs), plus the absorbed nodes."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.users = consumers(graph)
        self.outputs = set(graph.outputs)
        self.roots: dict[NodeId, tuple[O.Op, list[NodeId]]] = {}
        self.absorbed: set[NodeId] = set()

    def free(self, node_id: NodeId) -> bool:
        return node_id not in self.absorbed and node_id not in self.roots

    def sole(self, node_id: NodeId) -> NodeId | None:
        return sole_consumer(self.users, self.outputs, node_id)

    def node(self, node_id: NodeId) -> Node:
        return self.graph.node(node_id)

    def fuse(self, root: NodeId, op: O.Op, inputs: list[NodeId], absorbed: list[NodeId]) -> None:
        self.roots[root] = (op, inputs)
        self.absorbed.update(absorbed)

    def apply(self) -> Graph:
        rw = Rewriter(self.graph)
        for node in self.graph.nodes:
            if node.id in self.absorbed:
                continue
            if node.id in self.roots:
                op, ins = self.roots[node.id]
                new_id = rw.emit(node, op, [rw.arg(i) for i in ins])
                if rw.new(new_id).shape != node.shape:
                    raise IRError(f"fusion bug: {op.kind} at {node.label} gives {rw.new(new_id).shape}, "
                                  f"not {node.shape}")
            else:
                rw.copy(node)
        return rw.finish()


def scheduled_runs(lir: LirModule, member: Callable[[Node], bool], key: Callable[[Node], Hashable],
                   most: int) -> Iterator[list[Node]]:
    """Maximal runs, at most `most` long, of nodes scheduled back to back that are all `member`s with one
    `key`: the projections of one activation that a decode lowering runs as one GEMV pass."""
    nodes = [lir.graph.node(nid) for nid in lir.schedule]
    i = 0
    while i < len(nodes):
        if not member(nodes[i]):
            i += 1
            continue
        run = [nodes[i]]
        while (len(run) < most and i + len(run) < len(nodes) and member(nodes[i + len(run)])
               and key(nodes[i + len(run)]) == key(run[0])):
            run.append(nodes[i + len(run)])
        i += len(run)
        yield run


def is_silu_times(op: O.Op) -> bool:
    """The elementwise region `silu(v0) * v1` (either operand order of the product): a SwiGLU's combine
    once `fuse_regions` has merged its activation and product (the decode lowerings fold it into their GEMVs)."""
    if not isinstance(op, O.ElementwiseRegion) or len(op.steps) != 2:
        return False
    first, second = op.steps
    return (isinstance(first.op, O.Activation) and first.op.fn == "silu" and first.args == (0,)
            and isinstance(second.op, O.Binary) and second.op.fn == "mul" and sorted(second.args) == [1, 2])


def _is(node: Node, cls: type[O.Op], fn: str | None = None) -> bool:
    return isinstance(node.op, cls) and (fn is None or getattr(node.op, "fn", None) == fn)


def _is_bias(graph: Graph, bias: NodeId, full: Node) -> bool:
    """`bias` is a `[N]` vector of `full`'s dtype, N being `full`'s last dim."""
    s = graph.node(bias).shape
    return full.shape.rank >= 1 and s.dims == (full.shape.dims[-1],) and s.dtype == full.shape.dtype


# ── SwiGLU ─────────────────────────────────────────────────────────────


def fuse_swiglu(graph: Graph) -> Graph:
    """`silu(x @ wg) * (x @ wu)` → FusedSwiGLU(x, wg, wu).

    >>> g = Graph("s")
    >>> x, wg, wu = g.input("x", [2, 4]), g.param("wg", [4, 8]), g.param("wu", [4, 8])
    >>> g.set_outputs([g.mul(g.activation("silu", g.matmul(x, wg)), g.matmul(x, wu))])
    >>> [n.kind for n in fuse_swiglu(g).nodes][-1]
    'fused_swiglu'
    """
    require_mir(graph, "fuse_swiglu")
    plan = _Plan(graph)
    for node in graph.nodes:
        if not _is(node, O.Binary, "mul"):
            continue
        for gate_act, up in (node.inputs, node.inputs[::-1]):
            act, upn = plan.node(gate_act), plan.node(up)
            if gate_act == up or not _is(act, O.Activation, "silu") or not _is(upn, O.MatMul):
                continue
            gate = plan.node(act.inputs[0])
            if not _is(gate, O.MatMul) or gate.inputs[0] != upn.inputs[0]:
                continue
            if plan.sole(act.id) != node.id or plan.sole(gate.id) != act.id or plan.sole(up) != node.id:
                continue
            wg, wu = gate.inputs[1], upn.inputs[1]
            if graph.node(wg).shape != graph.node(wu).shape or node.shape != gate.shape or upn.shape != gate.shape:
                continue
            if graph.node(wg).shape.dtype != gate.shape.dtype:
                continue  # f16/bf16 weights under f32 activations: two mixed GEMMs keep them narrow
            if not all(plan.free(i) for i in (act.id, gate.id, up)):
                continue
            plan.fuse(node.id, O.FusedSwiGLU(), [gate.inputs[0], wg, wu], [act.id, gate.id, up])
            break
    return plan.apply()


# ── matmul epilogue ────────────────────────────────────────────────────


def fuse_matmul_epilogue(graph: Graph) -> Graph:
    """`act(a @ b + bias[N])`, `act(a @ b)`, `a @ b + bias[N]` → FusedMatMulBiasAct.

    >>> g = Graph("m")
    >>> x, w, b = g.input("x", [2, 4]), g.param("w", [4, 8]), g.param("b", [8])
    >>> g.set_outputs([g.activation("gelu", g.add_(g.matmul(x, w), b))])
    >>> out = fuse_matmul_epilogue(g)
    >>> out.node(out.outputs[0]).op
    FusedMatMulBiasAct(activation='gelu')
    """
    require_mir(graph, "fuse_matmul_epilogue")
    plan = _Plan(graph)
    for node in graph.nodes:
        if not _is(node, O.MatMul) or not plan.free(node.id):
            continue
        chain = [node.id]
        bias: NodeId | None = None
        activation: str | None = None
        nxt = plan.sole(node.id)
        if nxt is not None and _is(plan.node(nxt), O.Binary, "add"):
            add = plan.node(nxt)
            other = add.inputs[1] if add.inputs[0] == node.id else add.inputs[0]
            if other != node.id and add.shape == node.shape and _is_bias(graph, other, node):
                bias = other
                chain.append(add.id)
                nxt = plan.sole(add.id)
        if nxt is not None and _is(plan.node(nxt), O.Activation):
            activation = plan.node(nxt).op.fn
            chain.append(nxt)
        if len(chain) == 1 or not all(plan.free(i) for i in chain):
            continue
        ins = list(node.inputs) + ([bias] if bias is not None else [])
        plan.fuse(chain[-1], O.FusedMatMulBiasAct(activation), ins, chain[:-1])
    return plan.apply()


def fuse_conv_activation(graph: Graph) -> Graph:
    """`act(conv(x, w[, bias]))` → conv with `activation` (applied in the conv's store).

    >>> g = Graph("c")
    >>> x, w = g.input("x", [1, 2, 4, 4]), g.param("w", [3, 2, 1, 1])
    >>> g.set_outputs([g.activation("relu", g.conv(x, w))])
    >>> out = fuse_conv_activation(g)
    >>> out.node(out.outputs[0]).op.activation
    'relu'
    """
    require_mir(graph, "fuse_conv_activation")
    plan = _Plan(graph)
    for node in graph.nodes:
        if not isinstance(node.op, Conv) or node.op.activation is not None or not plan.free(node.id):
            continue
        nxt = plan.sole(node.id)
        if nxt is None or not _is(plan.node(nxt), O.Activation) or not plan.free(nxt):
            continue
        plan.fuse(nxt, dataclasses.replace(node.op, activation=plan.node(nxt).op.fn), list(node.inputs), [node.id])
    return plan.apply()


# ── residual + norm ────────────────────────────────────────────────────


def fuse_residual_norm(graph: Graph) -> Graph:
    """`norm(x + residual [+ bias[N]])` → FusedResidualLayerNorm / FusedResidualRmsNorm.

    `x` and `residual` must have the norm's shape exactly (no broadcasting).
    The bias may be added first or last (`(x + b) + r` or `(x + r) + b`).

    >>> g = Graph("r")
    >>> x, r = g.input("x", [2, 4]), g.input("r", [2, 4])
    >>> gamma, beta = g.param("g", [4]), g.param("b", [4])
    >>> g.set_outputs([g.layer_norm(g.add_(x, r), gamma, beta)])
    >>> [n.kind for n in fuse_residual_norm(g).nodes][-1]
    'fused_residual_layer_norm'
    """
    require_mir(graph, "fuse_residual_norm")
    plan = _Plan(graph)
    for node in graph.nodes:
        if isinstance(node.op, O.LayerNorm):
            make: Callable[[], O.Op] = lambda op=node.op: O.FusedResidualLayerNorm(op.eps)  # noqa: E731
        elif isinstance(node.op, O.RmsNorm):
            make = lambda op=node.op: O.FusedResidualRmsNorm(op.eps)  # noqa: E731
        else:
            continue
        match = _match_residual(plan, node)
        if match is None:
            continue
        (x, res, bias), absorbed = match
        if not all(plan.free(i) for i in absorbed):
            continue
        ins = [x, res] + ([bias] if bias is not None else []) + list(node.inputs[1:])
        plan.fuse(node.id, make(), ins, absorbed)
    return plan.apply()


def _match_residual(plan: _Plan, norm: Node) -> tuple[tuple[NodeId, NodeId, NodeId | None], list[NodeId]] | None:
    graph = plan.graph
    outer = plan.node(norm.inputs[0])
    if not _is(outer, O.Binary, "add") or plan.sole(outer.id) != norm.id or outer.shape != norm.shape:
        return None

    def full(i: NodeId) -> bool:
        return graph.node(i).shape == norm.shape

    a, b = outer.inputs
    for inner_id, other in ((a, b), (b, a)):
        inner = plan.node(inner_id)
        if inner_id == other or not _is(inner, O.Binary, "add") or plan.sole(inner_id) != outer.id \
                or inner.shape != norm.shape:
            continue
        p, q = inner.inputs
        if _is_bias(graph, other, norm) and full(p) and full(q):  # (x + r) + b
            return (p, q, other), [outer.id, inner_id]
        if full(other):  # (x + b) + r
            for x, b2 in ((p, q), (q, p)):
                if full(x) and _is_bias(graph, b2, norm):
                    return (x, other, b2), [outer.id, inner_id]
    if full(a) and full(b):
        return (a, b, None), [outer.id]
    return None


# ── elementwise regions ────────────────────────────────────────────────


def fuse_elementwise(graph: Graph) -> Graph:
    """Trees of single-consumer elementwise ops → one ElementwiseRegion each.

    Every step of a region has the region's dims (inputs may broadcast), so a
    region's loop nest computes each step once per output element and never
    recomputes a smaller intermediate.

    >>> g = Graph("e")
    >>> x, b = g.input("x", [2, 4]), g.input("b", [4])
    >>> g.set_outputs([g.activation("relu", g.mul(g.add_(x, b), x))])
    >>> out = fuse_elementwise(g)
    >>> [n.kind for n in out.nodes]
    ['input', 'input', 'elementwise_region']
    """
    require_mir(graph, "fuse_elementwise")
    plan = _Plan(graph)
    for node in reversed(graph.nodes):
        if not node.op.elementwise or not plan.free(node.id):
            continue
        members = _grow_region(plan, node)
        if len(members) < 2:
            continue
        op, ins = _region_op(graph, members)
        plan.fuse(node.id, op, ins, [m for m in members if m != node.id])
    return plan.apply()


def _grow_region(plan: _Plan, root: Node) -> list[NodeId]:
    """Members of the region rooted at `root`, in topological order."""
    members = {root.id}
    external = set(root.inputs)
    # Visit candidates highest id first: a candidate's consumers all have higher
    # ids, so whether each of them joined the region is settled when it is popped.
    heap = [-i for i in set(root.inputs)]
    heapq.heapify(heap)
    visited: set[NodeId] = set()
    while heap:
        cand = -heapq.heappop(heap)
        if cand in visited:
            continue
        visited.add(cand)
        node = plan.node(cand)
        if not node.op.elementwise or not plan.free(cand) or cand in plan.outputs:
            continue
        if node.shape.dims != root.shape.dims or not plan.users[cand] <= members:
            continue
        new_external = (external - {cand}) | (set(node.inputs) - members)
        if len(new_external) > MAX_REGION_INPUTS:
            continue
        members.add(cand)
        external = new_external
        for i in set(node.inputs):
            heapq.heappush(heap, -i)
    return sorted(members)


def _region_op(graph: Graph, members: list[NodeId]) -> tuple[O.ElementwiseRegion, list[NodeId]]:
    member_set = set(members)
    inputs: list[NodeId] = []
    for m in members:
        for i in graph.node(m).inputs:
            if i not in member_set and i not in inputs:
                inputs.append(i)
    index = {nid: k for k, nid in enumerate(inputs)}
    steps = []
    for m in members:
        node = graph.node(m)
        steps.append(O.RegionStep(node.op, tuple(index[i] for i in node.inputs)))
        index[m] = len(inputs) + len(steps) - 1
    return O.ElementwiseRegion(tuple(steps)), inputs


# ── all of them ────────────────────────────────────────────────────────

#: Fusion passes in the order `fuse` runs them (see the module docstring for why).
FUSIONS: tuple[tuple[str, Callable[[Graph], Graph]], ...] = (
    ("fuse_swiglu", fuse_swiglu),
    ("fuse_matmul_epilogue", fuse_matmul_epilogue),
    ("fuse_conv_activation", fuse_conv_activation),
    ("fuse_residual_norm", fuse_residual_norm),
    ("fuse_elementwise", fuse_elementwise),
)


def fuse(graph: Graph) -> Graph:
    """Every fusion, in order."""
    for _, fn in FUSIONS:
        graph = fn(graph)
    return graph

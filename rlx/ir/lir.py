"""LIR: the optimized MIR plus its schedule, buffer plan and IO manifest.

The LIR is what backends render and what the AOT cache is keyed by: its
canonical serialization covers structure, attributes, constants, names and
the buffer plan, never parameter values, and does not depend on node ids,
hash seeds or dict order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from rlx.ir.decisions import Decision, decisions_to_json
from rlx.ir.encode import op_to_json, shape_to_json
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.shape import Shape

LIR_FORMAT_VERSION = 1

#: Buffer storage classes. "view" shares storage with another node's buffer.
STORAGES = ("input", "param", "const", "output", "arena", "view")


@dataclass(frozen=True)
class Buffer:
    """Where one node's value lives while the program runs.

    - input / param / const / output: `slot` indexes the IO list of that kind.
    - arena: `offset` is the byte offset in the arena.
    - view: `source` is the node whose storage this aliases, `offset` bytes in.
    `nbytes` is the size at the dynamic dims' upper bounds.
    """

    storage: str
    nbytes: int
    slot: int = -1
    offset: int = 0
    source: NodeId = -1


@dataclass(frozen=True)
class TensorSpec:
    """One entry of the IO manifest. For params `shape` is what `set_param` takes."""

    name: str
    node: NodeId
    shape: Shape
    layout: tuple[int, ...] | None = None
    #: A state input: caller-owned, updated in place by the run (never copied).
    state: bool = False

    def to_json(self) -> dict:
        out = {"name": self.name, "dtype": self.shape.dtype.value, "shape": [str(d) for d in self.shape.dims]}
        if self.layout is not None:
            out["layout"] = list(self.layout)
        if self.state:
            out["state"] = True
        return out


def spans_meet(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    """Whether byte spans [start, end) `a` and `b` intersect (None, storage outside the arena, meets nothing)."""
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


@dataclass(frozen=True)
class LirModule:
    """A planned program: what a backend needs to emit code with zero run-time allocation."""

    name: str
    graph: Graph
    schedule: tuple[NodeId, ...]
    buffers: Mapping[NodeId, Buffer]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    params: tuple[TensorSpec, ...]
    constants: tuple[NodeId, ...]
    symbols: tuple[tuple[str, int], ...]
    arena_bytes: int
    naive_bytes: int
    #: (output slot, node) pairs whose value must be copied into the output at the end.
    output_copies: tuple[tuple[int, NodeId], ...] = ()
    #: The backend this LIR was lowered for ("" before `rlx.opt.lowering.lower_for`), and its decisions.
    backend: str = ""
    decisions: tuple[Decision, ...] = ()
    #: (node, arena offset, bytes): arena space a node uses only while it runs (a scan's carries and body).
    workspaces: tuple[tuple[NodeId, int, int], ...] = ()
    #: (scan node, its body's decided LIR): set with the decisions (`rlx.pipeline.decide`), so codegen renders
    #: a loop body from the LIR alone.
    bodies: tuple[tuple[NodeId, LirModule], ...] = ()

    def bodies_of(self, nid: NodeId) -> list[LirModule]:
        """Every decided body LIR of node `nid`, in order (a cond's true then false branch, a while_loop's
        cond then body; `rlx.ir.ops_control.step_bodies`)."""
        return [body for n, body in self.bodies if n == nid]

    def body(self, nid: NodeId) -> LirModule:
        """The decided LIR of scan node `nid`'s body (KeyError when the LIR was not decided with its bodies)."""
        for n, body in self.bodies:
            if n == nid:
                return body
        raise KeyError(f"scan %{nid} has no decided body: decide the LIR with rlx.pipeline.decide")

    def workspace(self, nid: NodeId) -> tuple[int, int]:
        """(arena offset, bytes) of node `nid`'s workspace."""
        for n, off, size in self.workspaces:
            if n == nid:
                return off, size
        raise KeyError(f"node %{nid} has no workspace")

    def root(self, nid: NodeId) -> NodeId:
        """The node whose storage `nid`'s value lives in (itself, or the end of its chain of views)."""
        while self.buffers[nid].storage == "view":
            nid = self.buffers[nid].source
        return nid

    def arena_span(self, nid: NodeId) -> tuple[int, int] | None:
        """The arena bytes [start, end) `nid`'s value may occupy, or None outside the arena (inputs, params,
        constants and outputs are never reused): its own buffer's span; a view's, from where it starts in its
        root buffer to the root's end (a strided view may reach any byte past its start)."""
        start, b = 0, self.buffers[nid]
        while b.storage == "view":
            start += b.offset
            b = self.buffers[b.source]
        if b.storage != "arena":
            return None
        own = self.buffers[nid]
        end = b.offset + b.nbytes if own.storage == "view" else b.offset + own.nbytes
        return b.offset + start, end

    def arena_overlap(self, a: NodeId, b: NodeId) -> bool:
        """Whether the arena bytes of `a` and `b` may meet (`arena_span`; storage outside the arena meets none)."""
        return spans_meet(self.arena_span(a), self.arena_span(b))

    def written_spans(self, nid: NodeId, value: bool = True) -> list[tuple[int, int] | None]:
        """The arena bytes node `nid` writes when it runs: its value's span (`value`; None outside the arena) and
        its workspaces'."""
        own = [self.arena_span(nid)] if value else []
        return own + [(off, off + size) for n, off, size in self.workspaces if n == nid]

    def param_readers(self) -> list[tuple[TensorSpec, list[Node]]]:
        """Each param that is not a graph output, with the nodes that read it (in graph order): what the passes
        deciding a param's storage (packed, widened, interleaved, resident) look at first."""
        users, outputs = self.graph.users(), set(self.graph.outputs)
        return [(spec, [self.graph.node(u) for u in users[spec.node]]) for spec in self.params
                if spec.node not in outputs]

    def decided(self, kind: type[Decision]) -> list:
        """The decisions of one type, in order."""
        return [d for d in self.decisions if isinstance(d, kind)]

    @property
    def reuse_ratio(self) -> float:
        return self.naive_bytes / self.arena_bytes if self.arena_bytes else 1.0

    def canonical(self) -> str:
        """Deterministic JSON text of everything that determines generated code."""
        order = {nid: i for i, nid in enumerate(n.id for n in self.graph.nodes)}

        def ref(nid: NodeId) -> int:
            return order[nid]

        nodes = []
        for n in self.graph.nodes:
            b = self.buffers[n.id]
            nodes.append({
                "op": op_to_json(n.op),
                "in": [ref(i) for i in n.inputs],
                "shape": shape_to_json(n.shape),
                "name": n.name,
                "buf": [b.storage, b.nbytes, b.slot, b.offset, ref(b.source) if b.source >= 0 else -1],
            })
        doc = {
            "format": LIR_FORMAT_VERSION,
            "name": self.name,
            "nodes": nodes,
            "schedule": [ref(i) for i in self.schedule],
            "inputs": [[s.name, ref(s.node)] for s in self.inputs],
            "outputs": [[s.name, ref(s.node)] for s in self.outputs],
            "params": [[s.name, ref(s.node)] for s in self.params],
            "constants": [ref(c) for c in self.constants],
            "symbols": [list(s) for s in self.symbols],
            "arena": self.arena_bytes,
            "copies": [[k, ref(n)] for k, n in self.output_copies],
            "backend": self.backend,
            "decisions": decisions_to_json(self.decisions, ref),
        }
        if self.workspaces:  # only when present, so LIR hashes of graphs without scans are unchanged
            doc["workspaces"] = [[ref(n), off, size] for n, off, size in self.workspaces]
        if self.bodies:  # likewise: only a decided LIR with scans has bodies
            doc["bodies"] = [[ref(n), body.hash()] for n, body in self.bodies]
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)

    def hash(self) -> str:
        """sha256 of the canonical form: the LIR hash that keys the AOT cache."""
        return hashlib.sha256(self.canonical().encode("ascii")).hexdigest()

    def manifest(self) -> dict:
        """The IO manifest embedded in every built library (see the C ABI)."""
        return {
            "name": self.name,
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "params": [self._param_json(s) for s in self.params],
            "symbols": [{"name": n, "max": m} for n, m in self.symbols],
            "arena_bytes": self.arena_bytes,
        }

    def _param_json(self, spec: TensorSpec) -> dict:
        out = spec.to_json()
        if getattr(self.graph.node(spec.node).op, "rounds_f32", False):
            out["rounds_f32"] = True  # stored narrower by the session's precision: set_param rounds float32 arrays
        return out

    def inspect(self) -> str:
        """Readable dump: the graph, then each node's buffer, then the arena summary."""
        lines = [str(self.graph), "", f"buffer plan for {self.name}:"]
        for n in self.graph.nodes:
            b = self.buffers[n.id]
            if b.storage == "arena":
                where = f"arena[{b.offset}:{b.offset + b.nbytes}]"
            elif b.storage == "view":
                where = f"view of %{b.source} +{b.offset}"
            else:
                where = f"{b.storage}[{b.slot}]"
            lines.append(f"  %{n.id:<4} {n.kind:<26} {n.shape!s:<28} {where}")
        if self.backend:
            lines.append(f"lowering decisions for {self.backend}:")
            lines.extend(f"  {d.describe()}" for d in self.decisions)
            if not self.decisions:
                lines.append("  none")
            for nid, body in self.bodies:
                kind = self.graph.node(nid).kind  # scan, cond (two bodies), while_loop (two bodies)
                lines.append(f"  {kind} %{nid} body ({len(body.schedule)} nodes, decided for {body.backend}):")
                lines.extend(f"    {d.describe()}" for d in body.decisions)
        syms = ", ".join(f"{n}<={m}" for n, m in self.symbols) or "none"
        lines.append(f"arena: {self.arena_bytes} bytes (naive {self.naive_bytes}, reuse x{self.reuse_ratio:.2f}); "
                     f"dynamic dims: {syms}")
        return "\n".join(lines)

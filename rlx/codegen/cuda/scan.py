"""CUDA rule for `scan`: the body's kernels launched from a host loop inside the generated .cu.

The body is planned as the CPU rule plans it (`rlx.opt.scan_body.step_graph`,
the plan the memory planner sized the scan's workspace for), lowered for CUDA
and rendered by a `_BodyEmitter`: its arena is the body arena inside the
scan's workspace, its constants sit where the lowering placed them
(`ScanConstants`), its broadcast inputs are the outer buffers, and three
pointers change per step — the carry in, each xs row and the carry out —
named by host variables the loop sets (`rlx_s<id>_in<k>`, `rlx_s<id>_out`).

The loop (`templates/cuda/scan.cu.j2`) runs on the host inside `rlx_forward`,
so a run with length L enqueues L copies of the body's launches; under CUDA
Graph capture that is one captured graph per length value (the length is a
dynamic-dim value, known when the graph is captured). The carry ping-pongs
between the workspace's two slots; with a trajectory each step writes its
row of the output directly and the next step reads it from there (no copies),
and the final step of a plain scan writes the output itself.

Nested scans are refused before any build (`why_not` names the reason).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rlx.codegen.common import decided_body
from rlx.codegen.cuda.emit import CudaEmitter, CudaTarget, Launch
from rlx.codegen.registry import Kernel, RuleSet
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir import ops_scan as L
from rlx.ir.decisions_cuda import ScanConstants
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.ir.lir import LirModule
from rlx.opt.scan_body import carry_slot_bytes, step_graph

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/scan.cu.j2"
#: Offset reported for a pointer chosen per step: odd, so no rule assumes it aligned for vector loads.
_UNALIGNED = 1


class _BodyEmitter(CudaEmitter):
    """A `CudaEmitter` for one scan body: static places inside the outer program, per-step pointers by name."""

    def __init__(self, lir: LirModule, target: CudaTarget, outer: CudaEmitter, prefix: str, arena: int,
                 constants: tuple[int, ...], static_inputs: dict[int, int]) -> None:
        super().__init__(lir, target)
        missing = [s for s, _ in lir.symbols if s not in outer.sym_index]
        if missing:
            raise BuildError(f"scan body uses dynamic dims {missing} the enclosing graph does not define")
        if lir.output_copies:
            raise BuildError("scan body output is not computed by a kernel of the body")
        self.sym_index = dict(outer.sym_index)
        self.prefix = prefix
        self.arena = arena
        self.constants = constants
        self.static_inputs = static_inputs

    def place(self, nid: NodeId) -> tuple[str | None, int]:
        """(host variable holding this step's base pointer, or None for a fixed place; byte offset from it)."""
        b = self.lir.buffers[nid]
        if b.storage == "view":
            base, off = self.place(b.source)
            src = self.node(b.source).shape.dtype
            return base, off + (b.offset // src.itemsize) * self.dev_dtype(src).itemsize
        if b.storage == "arena":
            return None, self.arena + b.offset
        if b.storage == "const":
            return None, self.constants[b.slot]
        if b.storage == "input":
            if b.slot in self.static_inputs:
                return None, self.static_inputs[b.slot]
            return f"{self.prefix}in{b.slot}", 0
        if b.storage == "output":
            return f"{self.prefix}out", 0
        raise BuildError(f"scan body node %{nid}: storage {b.storage!r} cannot live in a loop body")

    def offset(self, nid: NodeId) -> int:
        base, off = self.place(nid)
        return off if base is None else _UNALIGNED

    def ptr(self, nid: NodeId) -> str:
        base, off = self.place(nid)
        if base is None:
            return f"RLX_P({self.ctype(nid)}, {off})"
        return f"(({self.ctype(nid)} *)({base} + {off}))"


@dataclass(frozen=True)
class XsRow:
    """Body input `slot` is row t of the outer xs at device byte `offset`, `row_bytes` (C expression) apart."""

    slot: int
    offset: int
    row_bytes: str


@dataclass(frozen=True, kw_only=True)
class ScanLaunch(Launch):
    """The loop of one `scan` node (macro `block_scan`); `body` are the body's kernels, launched per step."""

    p: str
    length: str
    init: int
    out: int
    slots: tuple[int, int]
    carry_bytes: str
    trajectory: bool
    reverse: bool
    xs: tuple[XsRow, ...]
    body: tuple[Kernel, ...]


def bodies_why_not(bodies: Iterable[L.Body], nested: str) -> str | None:
    """Why the CUDA table cannot run a loop or branch with `bodies` (None: it can): `nested` when a body holds
    another body (one level is rendered), else the first body node no CUDA rule takes."""
    from rlx.codegen.cuda import rule_table  # the table this rule is part of (asked at run time)

    rules = rule_table()
    for body in bodies:
        if body.depth() > 1:
            return nested
        refused = rules.first_refusal(step_graph(body))
        if refused is not None:
            return f"whose body it cannot run: {refused[1]}"
    return None


def _accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return bodies_why_not((op.body,), "with a scan nested in its body (one loop level is rendered on CUDA)")  # type: ignore[attr-defined]


def emit_scan(e: CudaEmitter, node: Node) -> Kernel:
    """The host loop of a `scan` node, with its body's kernels rendered inside it."""
    op: L.Scan = node.op  # type: ignore[assignment]
    p = f"{e.prefix}s{node.id}_"
    body_lir = decided_body(e.lir, node.id)  # planned and decided with the graph (rlx.pipeline.decide)
    consts = {d.node: d.offsets for d in e.lir.decided(ScanConstants) if d.body == 0}
    if body_lir.constants and node.id not in consts:
        raise BuildError(f"scan %{node.id}: its body's constants have no device place (lower the graph for CUDA)")
    ws, _ = e.lir.workspace(node.id)
    init_shape = e.node(node.inputs[0]).shape
    slot = carry_slot_bytes(op, init_shape.max_nbytes)
    ws_abs = e.layout.arena + ws
    bcasts = node.inputs[1:1 + op.num_bcast]
    xs_ids = node.inputs[1 + op.num_bcast:]
    sub = _BodyEmitter(body_lir, e.target, e, p, ws_abs + 2 * slot, consts.get(node.id, ()),
                       {1 + i: e.offset(b) for i, b in enumerate(bcasts)})
    body = tuple(sub.kernel(nid) for nid in body_lir.schedule)
    xs = tuple(XsRow(1 + op.num_bcast + i, e.offset(x),
                     f"({e.numel(e.node(x).shape.dims[1:])}) * {e.ddt(x).itemsize}") for i, x in enumerate(xs_ids))
    smem: dict[str, str] = {}
    for k in body:
        smem.update(k.args.smem_attrs)
    args = ScanLaunch(
        **e.base(node), uses_flag=any(k.args.uses_flag for k in body), uses_lt=any(k.args.uses_lt for k in body),
        smem_attrs=tuple(smem.items()), p=p, length=e.dim(op.length), init=e.offset(node.inputs[0]),
        out=e.offset(node.id), slots=(ws_abs, ws_abs + slot),
        carry_bytes=f"({e.numel(init_shape.dims)}) * {e.ddt(node.inputs[0]).itemsize}",
        trajectory=op.save_trajectory, reverse=op.reverse, xs=xs, body=body)
    headers = tuple(dict.fromkeys(h for k in body for h in k.headers))
    return Kernel(node.id, "block_scan", TEMPLATE, args, headers=headers, header=args.comment, label=node.label,
                  subprogram=body)


RULES.register("scan", accepts=_accepts)(emit_scan)

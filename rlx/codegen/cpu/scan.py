"""CPU rule for `scan`: a C loop whose body kernels are rendered like any graph's, then called per step.

The body is planned on its own (`rlx.opt.scan_body.step_graph`, the same plan
the outer memory planner sized the workspace for) and decided by the pipeline
with the graph (`LirModule.bodies`), and rendered by an emitter
whose names carry the scan's prefix (`rlx_s<id>_op_<k>`, `rlx_s<id>_const_<k>`),
defined before the scan's own function (`Kernel.subprogram`). The loop
points the body's inputs at this step's carry, the broadcast inputs and row t
of every xs, swaps the context's arena to the body's arena (inside the scan's
workspace) for the calls, and ping-pongs two carry slots. Nested scans nest
the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlx.codegen.common import decided_body
from rlx.codegen.cpu.base import c_string, comment, node_header
from rlx.codegen.cpu.emit import CpuEmitter, CTarget
from rlx.codegen.registry import Kernel, RuleSet
from rlx.errors import BuildError
from rlx.ir import ops_scan as L
from rlx.ir.graph import Node
from rlx.ir.lir import LirModule
from rlx.opt.scan_body import carry_slot_bytes

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "scan.c.j2"


class _BodyEmitter(CpuEmitter):
    """An emitter for a loop body: constants named with the loop's prefix, dims in the outer `sym[]`."""

    def __init__(self, lir: LirModule, target: CTarget, prefix: str, sym_index: dict[str, int]) -> None:
        super().__init__(lir, target)
        self.prefix = prefix
        missing = [s for s, _ in lir.symbols if s not in sym_index]
        if missing:
            raise BuildError(f"scan body uses dynamic dims {missing} the enclosing graph does not define")
        self.sym_index = dict(sym_index)

    def base(self, nid: int) -> str:
        b = self.lir.buffers[nid]
        if b.storage == "const":
            return f"((const char *){self.prefix}const_{b.slot})"
        if b.storage == "param":
            raise BuildError("scan bodies take no params (pass weights as broadcast inputs)")
        return super().base(nid)


@dataclass(frozen=True)
class Subprogram:
    """What a loop kernel needs defined before it: the body's constants and kernels."""

    comment: str
    prefix: str
    constants: tuple
    kernels: tuple[Kernel, ...]


@dataclass(frozen=True)
class ScanArgs:
    """C expressions of one `scan` kernel (macro `scan`)."""

    label: str
    ws: str
    slot: int
    body_arena: int
    length: str
    carry_bytes: str
    init: str
    out: str
    trajectory: bool
    reverse: bool
    bcasts: tuple[str, ...]
    xs: tuple[str, ...]
    xs_row_bytes: tuple[str, ...]
    funcs: tuple[str, ...]


def emit_scan(em: CpuEmitter, node: Node) -> Kernel:
    """The loop of a `scan` node, with its body rendered as a subprogram."""
    op: L.Scan = node.op  # type: ignore[assignment]
    prefix = f"{getattr(em, 'prefix', 'rlx_')}s{node.id}_"
    body_lir = decided_body(em.lir, node.id)  # planned and decided with the graph (rlx.pipeline.decide)
    sub = _BodyEmitter(body_lir, em.target, prefix, em.sym_index)
    kernels = tuple(dataclasses.replace(k, func=f"{prefix}op_{k.node}") for k in sub.kernels())
    init_shape = em.node(node.inputs[0]).shape
    carry_nbytes = init_shape.max_nbytes
    slot = carry_slot_bytes(op, carry_nbytes)
    offset, _ = em.lir.workspace(node.id)
    bcast_ids = node.inputs[1:1 + op.num_bcast]
    xs_ids = node.inputs[1 + op.num_bcast:]
    row_bytes = []
    for x in xs_ids:
        s = em.node(x).shape
        row_bytes.append(f"(({em.numel(s.dims[1:])})*{s.dtype.itemsize})")
    label = c_string(f"%{node.id} scan" + (f" ({node.name[:60]})" if node.name else ""))
    args = ScanArgs(
        label=label, ws=f"(ctx->arena + {offset})", slot=slot, body_arena=2 * slot, length=em.dim(op.length),
        carry_bytes=f"(({em.numel(init_shape.dims)})*{init_shape.dtype.itemsize})",
        init=em.base(node.inputs[0]), out=f"((char *){em.base(node.id)})", trajectory=op.save_trajectory,
        reverse=op.reverse, bcasts=tuple(em.base(b) for b in bcast_ids), xs=tuple(em.base(x) for x in xs_ids),
        xs_row_bytes=tuple(row_bytes), funcs=tuple(k.func for k in kernels if k.macro))
    headers = tuple(dict.fromkeys(h for k in kernels for h in k.headers))
    program = Subprogram(comment(f"body of scan %{node.id}: {len(op.body.nodes)} nodes"), prefix,
                         tuple(sub.plan_constants()), kernels)
    return Kernel(node.id, "scan", TEMPLATE, args, headers=headers, header=node_header(node, 80),
                  func=f"{getattr(em, 'prefix', 'rlx_')}op_{node.id}", label=label,
                  scratch_per_thread=max([sub.scratch_per_thread, *(k.scratch_per_thread for k in kernels)]),
                  scratch_shared=max([sub.scratch_shared, *(k.scratch_shared for k in kernels)]),
                  subprogram=program)


RULES.register("scan")(emit_scan)

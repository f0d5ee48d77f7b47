"""CPU rules for `cond` and `while_loop`: real branches and a real loop over bodies rendered like a scan's.

Each body is planned and decided with the graph (`LirModule.bodies`, `rlx.ir.ops_control.step_bodies`: a
cond's true then false branch, a while_loop's cond then body) and rendered as a subprogram by the scan
rule's planner (`rlx.codegen.cpu.scan`), its names carrying the node's prefix and the body's tag
(`rlx_c<id>t_`, `rlx_c<id>f_`; `rlx_w<id>c_`, `rlx_w<id>b_`). A cond reads its predicate and calls only
the chosen branch's kernels, which write the node's own buffer. A while_loop ping-pongs two carry slots
in its workspace as a scan does, running the cond body into a one-byte predicate slot before each trip
and stopping when it is false or after `max_trips` trips; it has no bound otherwise. Both swap the
context's arena to the bodies' arena (after the slots) while a body runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlx.codegen.common import decided_body
from rlx.codegen.cpu.base import c_string, comment, node_header
from rlx.codegen.cpu.emit import CpuEmitter
from rlx.codegen.cpu.scan import Subprogram, _BodyEmitter
from rlx.codegen.registry import Kernel, RuleSet
from rlx.errors import BuildError
from rlx.ir.graph import Node
from rlx.ir.lir import LirModule
from rlx.ir.ops_control import WhileLoop
from rlx.opt.scan_body import ALIGN, carry_slot_bytes

#: This module's CPU rules (the table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "control.c.j2"


@dataclass(frozen=True)
class CondArgs:
    """C expressions of one `cond` kernel (macro `cond`)."""

    label: str
    body_arena: str
    pred: str
    operands: tuple[str, ...]
    out: str
    true_funcs: tuple[str, ...]
    false_funcs: tuple[str, ...]


@dataclass(frozen=True)
class WhileArgs:
    """C expressions of one `while_loop` kernel (macro `while_loop`)."""

    label: str
    ws: str
    slot: int
    pred_at: int
    body_arena: int
    max_trips: int | None
    carry_bytes: str
    init: str
    out: str
    bcasts: tuple[str, ...]
    cond_funcs: tuple[str, ...]
    body_funcs: tuple[str, ...]


def _bodies(em: CpuEmitter, node: Node, tags: tuple[str, str], what: str
            ) -> tuple[list[Subprogram], list[tuple[str, ...]], int, int, tuple[str, ...]]:
    """Each decided body of `node` as a subprogram: (programs, the functions each runs, scratch per thread,
    shared scratch, headers)."""
    bodies = em.lir.bodies_of(node.id)
    if len(bodies) != 2:
        decided_body(em.lir, node.id)  # raises the error naming the missing decision
        raise BuildError(f"{node.label} {node.kind} needs 2 decided bodies, the LIR holds {len(bodies)}")
    outer = getattr(em, "prefix", "rlx_")
    programs, funcs, per_thread, shared, headers = [], [], 0, 0, []
    for tag, body_lir in zip(tags, bodies):
        prefix = f"{outer}{node.kind[0]}{node.id}{tag}_"
        sub = _BodyEmitter(body_lir, em.target, prefix, em.sym_index)
        kernels = tuple(dataclasses.replace(k, func=f"{prefix}op_{k.node}") for k in sub.kernels())
        programs.append(Subprogram(comment(f"{what[tag]} of {node.kind} %{node.id}: {len(body_lir.schedule)} nodes"),
                                   prefix, tuple(sub.plan_constants()), kernels))
        funcs.append(tuple(k.func for k in kernels if k.macro))
        per_thread = max([per_thread, sub.scratch_per_thread, *(k.scratch_per_thread for k in kernels)])
        shared = max([shared, sub.scratch_shared, *(k.scratch_shared for k in kernels)])
        headers += [h for k in kernels for h in k.headers]
    return programs, funcs, per_thread, shared, tuple(dict.fromkeys(headers))


def _label(node: Node) -> str:
    return c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))


def emit_cond(em: CpuEmitter, node: Node) -> Kernel:
    """Both branches as subprograms; the kernel calls the chosen one's functions."""
    programs, funcs, per_thread, shared, headers = _bodies(em, node, ("t", "f"),
                                                           {"t": "true branch", "f": "false branch"})
    offset, _ = em.lir.workspace(node.id)
    args = CondArgs(label=_label(node), body_arena=f"(ctx->arena + {offset})", pred=em.base(node.inputs[0]),
                    operands=tuple(em.base(i) for i in node.inputs[1:]), out=f"((char *){em.base(node.id)})",
                    true_funcs=funcs[0], false_funcs=funcs[1])
    return Kernel(node.id, "cond", TEMPLATE, args, headers=headers, header=node_header(node, 80),
                  func=f"{getattr(em, 'prefix', 'rlx_')}op_{node.id}", label=args.label,
                  scratch_per_thread=per_thread, scratch_shared=shared, subprogram=tuple(programs))


def emit_while_loop(em: CpuEmitter, node: Node) -> Kernel:
    """The loop: cond body into the predicate slot, then (while it holds) the body into the next carry slot."""
    op: WhileLoop = node.op  # type: ignore[assignment]
    programs, funcs, per_thread, shared, headers = _bodies(em, node, ("c", "b"), {"c": "cond", "b": "body"})
    init = em.node(node.inputs[0]).shape
    slot = carry_slot_bytes(op, init.max_nbytes)  # type: ignore[arg-type]
    offset, _ = em.lir.workspace(node.id)
    args = WhileArgs(label=_label(node), ws=f"(ctx->arena + {offset})", slot=slot, pred_at=2 * slot,
                     body_arena=2 * slot + ALIGN, max_trips=op.max_trips,
                     carry_bytes=f"(({em.numel(init.dims)})*{init.dtype.itemsize})", init=em.base(node.inputs[0]),
                     out=f"((char *){em.base(node.id)})", bcasts=tuple(em.base(b) for b in node.inputs[1:]),
                     cond_funcs=funcs[0], body_funcs=funcs[1])
    return Kernel(node.id, "while_loop", TEMPLATE, args, headers=headers, header=node_header(node, 80),
                  func=f"{getattr(em, 'prefix', 'rlx_')}op_{node.id}", label=args.label,
                  scratch_per_thread=per_thread, scratch_shared=shared, subprogram=tuple(programs))


RULES.register("cond")(emit_cond)
RULES.register("while_loop")(emit_while_loop)
__all__ = ["LirModule", "emit_cond", "emit_while_loop"]

"""CUDA rules for `cond` and `while_loop`: the device predicate picks the branch and ends the loop.

Each body is planned and decided with the graph (`LirModule.bodies`: a cond's true then false branch, a
while_loop's cond then body) and rendered by the scan rule's body emitter (`rlx.codegen.cuda.scan`) with every
input at a fixed place: a cond's operands, a loop's carry (kept in the loop's own buffer) and broadcast inputs.
A cond's branches write the cond's buffer; a loop's cond body writes a one-byte predicate slot and its body the
next carry into a slot of the workspace (``[next carry][unused slot][predicate, trip count][bodies' arena]``,
the layout `rlx.opt.scan_body.control_slots_bytes` sizes), copied into the carry after each trip.

How a branch is taken (`templates/cuda/control.cu.j2`, recorded as a `ControlFlow` decision):

- under CUDA Graph capture, conditional graph nodes (CUDA 12.3+): a one-thread kernel sets the handles from the
  predicate the graph computed — two IF nodes for a cond (true branch, false branch), a WHILE node for a loop
  whose body graph ends by running the cond body and setting the handle again (a device trip counter enforces
  `max_trips`). The bodies are captured on the context's side stream into the nodes' body graphs, so the whole
  run stays one captured graph, replayed without a host round trip;
- eagerly (the first run of each set of dims, before its capture; every run once capture failed), the predicate
  is copied into pinned host memory and the host branches or loops, one synchronization per cond or per trip.

Both run only the taken branch and only the trips the predicate allows, so a while_loop needs no `max_trips`
here. A body holding a scan, cond or while_loop is refused (one level of bodies is rendered), and then
`rlx.opt.control`'s fallback lowering (select / masked scan) runs instead, naming this reason. Bodies' kernels
launch without programmatic dependent launch (their first kernel follows a conditional node, not a kernel).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch
from rlx.codegen.cuda.scan import _BodyEmitter, bodies_why_not
from rlx.codegen.registry import Kernel, RuleSet
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.decisions_cuda import ScanConstants
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.ops_control import WhileLoop, step_bodies
from rlx.opt.scan_body import ALIGN, carry_slot_bytes

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/control.cu.j2"
HEADER = "cuda/kernels/control.cuh"
#: Byte offset of a loop's trip counter in its predicate slot (the predicate is byte 0).
_TRIPS_AT = 8


@dataclass(frozen=True, kw_only=True)
class CondLaunch(Launch):
    """One `cond` (macro `block_cond`): the predicate's and the output's device offsets, each branch's kernels."""

    p: str
    pred: int
    out: int
    true_body: tuple[Kernel, ...]
    false_body: tuple[Kernel, ...]


@dataclass(frozen=True, kw_only=True)
class WhileLaunch(Launch):
    """One `while_loop` (macro `block_while`): device offsets of the init, the carry (the loop's own buffer), the
    next carry, the predicate and trip count; `max_trips` (-1: unbounded); the cond body's and body's kernels."""

    p: str
    init: int
    out: int
    next: int
    pred_at: int
    trips_at: int
    carry_bytes: str
    max_trips: int
    cond_body: tuple[Kernel, ...]
    body: tuple[Kernel, ...]


def _accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return bodies_why_not(step_bodies(op), "with a scan, cond or while_loop in a body (one level of bodies is "
                                           "rendered on CUDA)")


def _body_kernels(e: CudaEmitter, node: Node, tags: tuple[str, str], arena: int,
                  inputs: tuple[dict[int, int], dict[int, int]]) -> tuple[str, list[tuple[Kernel, ...]]]:
    """The node's prefix and each decided body's kernels, its inputs at the fixed offsets `inputs` gives."""
    bodies = e.lir.bodies_of(node.id)
    if len(bodies) != 2:
        raise BuildError(f"{node.label} {node.kind} needs 2 decided bodies, the LIR holds {len(bodies)} "
                         f"(codegen renders the bodies the pipeline decided)")
    consts = {(d.node, d.body): d.offsets for d in e.lir.decided(ScanConstants)}
    p = f"{e.prefix}{node.kind[0]}{node.id}_"
    target = dataclasses.replace(e.target, pdl=False)  # a body's first kernel follows a conditional node
    out = []
    for which, (tag, body_lir, static) in enumerate(zip(tags, bodies, inputs)):
        if body_lir.constants and (node.id, which) not in consts:
            raise BuildError(f"{node.label}: its body's constants have no device place (lower the graph for CUDA)")
        sub = _BodyEmitter(body_lir, target, e, f"{p}{tag}_", arena, consts.get((node.id, which), ()), static)
        out.append(tuple(sub.kernel(nid) for nid in body_lir.schedule))
    return p, out


def _launch_flags(kernels: tuple[Kernel, ...]) -> dict:
    smem: dict[str, str] = {}
    for k in kernels:
        smem.update(k.args.smem_attrs)
    return {"uses_flag": any(k.args.uses_flag for k in kernels), "uses_lt": any(k.args.uses_lt for k in kernels),
            "smem_attrs": tuple(smem.items())}


def _kernel(node: Node, macro: str, args: Launch, kernels: tuple[Kernel, ...]) -> Kernel:
    headers = tuple(dict.fromkeys([HEADER, *(h for k in kernels for h in k.headers)]))
    return Kernel(node.id, macro, TEMPLATE, args, headers=headers, header=args.comment, label=node.label,
                  subprogram=kernels)


def emit_cond(e: CudaEmitter, node: Node) -> Kernel:
    """The branches of a `cond`, each writing the cond's buffer, run as the predicate says."""
    ws, _ = e.lir.workspace(node.id)
    operands = {i: e.offset(x) for i, x in enumerate(node.inputs[1:])}
    p, (t, f) = _body_kernels(e, node, ("t", "f"), e.layout.arena + ws, (operands, operands))
    args = CondLaunch(**e.base(node), **_launch_flags(t + f), p=p, pred=e.offset(node.inputs[0]),
                      out=e.offset(node.id), true_body=t, false_body=f)
    return _kernel(node, "block_cond", args, t + f)


def emit_while_loop(e: CudaEmitter, node: Node) -> Kernel:
    """The loop of a `while_loop`: cond body, then (while it holds) body and carry copy."""
    op: WhileLoop = node.op  # type: ignore[assignment]
    init = e.node(node.inputs[0]).shape
    slot = carry_slot_bytes(op, init.max_nbytes)  # type: ignore[arg-type]
    ws, _ = e.lir.workspace(node.id)
    base = e.layout.arena + ws
    # both bodies read the carry in the loop's buffer and the broadcast inputs where they are
    static = {0: e.offset(node.id), **{1 + i: e.offset(b) for i, b in enumerate(node.inputs[1:])}}
    p, (cond, body) = _body_kernels(e, node, ("c", "b"), base + 2 * slot + ALIGN, (static, static))
    args = WhileLaunch(**e.base(node), **_launch_flags(cond + body), p=p, init=e.offset(node.inputs[0]),
                       out=e.offset(node.id), next=base, pred_at=base + 2 * slot, trips_at=base + 2 * slot + _TRIPS_AT,
                       carry_bytes=f"({e.numel(init.dims)}) * {e.ddt(node.inputs[0]).itemsize}",
                       max_trips=-1 if op.max_trips is None else op.max_trips, cond_body=cond, body=body)
    return _kernel(node, "block_while", args, cond + body)


RULES.register("cond", accepts=_accepts)(emit_cond)
RULES.register("while_loop", accepts=_accepts)(emit_while_loop)

"""The decide stage: LIR → LIR with one backend's decisions recorded, scan bodies included.

`decide(lir, backend, **options)` runs `rlx.opt.lowering.lower_for` (the backend's decision passes) and
decides every scan body the same way (`rlx.opt.scan_body.step_graph`, planned, decided, recursively
for nested scans): the decided LIR carries its decided bodies (`LirModule.bodies`), so codegen renders
a loop body from the LIR alone and never plans or decides anything itself. `body_options` are the
options a body is decided with (CUDA: no pooling tail, a body writes no graph output).

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("mlp")
>>> g.set_outputs([g.matmul(g.input("x", [4, 8]), g.param("w", [8, 16]))])
>>> lir = decide(plan(g), "cpu")
>>> lir.backend, [d.describe() for d in lir.decisions]
('cpu', ['%1 param stored packed for the GEMM kernel (K x N panels)'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.ir.lir import LirModule


def decide(lir: LirModule, backend: str, body_options: Mapping[str, object] | None = None,
           **options: object) -> LirModule:
    """`lir` with `backend`'s decisions and its scan bodies decided (idempotent on a decided LIR)."""
    if lir.backend == backend and (lir.bodies or not _scans(lir)):
        return lir
    # loaded here, not with the module: a warm cache hit decides nothing and loads no rlx.opt module
    from rlx.ir.ops_control import step_bodies
    from rlx.opt.lowering import lower_for
    from rlx.opt.memplan import plan
    from rlx.opt.scan_body import step_graph

    decided = lower_for(lir, backend, **options)
    body_opts = dict(options if body_options is None else body_options)
    bodies = tuple((nid, decide(plan(step_graph(body)), backend, body_opts, **body_opts))
                   for nid in _scans(lir) for body in step_bodies(lir.graph.node(nid).op))
    return dataclasses.replace(decided, bodies=bodies) if bodies else decided


def _scans(lir: LirModule) -> list[int]:
    """The scheduled nodes holding bodies a backend renders (scan, cond, while_loop)."""
    from rlx.ir.ops_control import step_bodies  # the op classes load with the LIR that holds them

    return [nid for nid in lir.schedule if step_bodies(lir.graph.node(nid).op)]


__all__ = ["decide"]

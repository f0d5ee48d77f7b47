"""The graph a backend runs for one scan step (or one cond / while_loop body), and the workspace such a
node needs.

Shared by the memory planner (which reserves the workspace in the arena) and
codegen (which renders the body), so both see the same body and the same plan.
A step's result must be written by some kernel of the body into the step's
output buffer, so a body whose output is a leaf or a view gets one copy
(`expand` to its own shape) appended.
"""

from __future__ import annotations

import functools

from rlx.ir import ops as O
from rlx.ir.graph import Graph
from rlx.ir.ops_scan import Body, Scan

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@functools.lru_cache(maxsize=256)
def step_graph(body: Body) -> Graph:
    """The body as the graph one loop step runs (its output computed by a kernel, never aliased)."""
    g = Graph.from_body(body)
    out = g.node(g.outputs[0])
    if out.kind in O.LEAF_KINDS or out.kind in O.VIEW_KINDS or out.kind in ("narrow", "cast") \
            or g.outputs[0] in g.outputs[1:]:
        copy = g.expand(out.id, list(out.shape.dims))
        g.set_outputs([copy], list(g.output_names))
    return g


def carry_slot_bytes(op: Scan, carry_nbytes: int) -> int:
    """Bytes of one carry slot in the workspace (the workspace holds two: this step's and the next)."""
    return _align(max(carry_nbytes, 1))


def control_slots_bytes(op: O.Op, carry_nbytes: int) -> int:
    """Bytes a cond / while_loop workspace holds before its bodies' arena: none for a cond (its branch writes
    the node's own buffer); a while_loop's two carry slots and its predicate."""
    return 2 * _align(max(carry_nbytes, 1)) + ALIGN if op.kind == "while_loop" else 0

"""The Metal lowering: where every tensor lives in the program's one shared buffer.

`metal_decisions(lir)` (`LOWERINGS["metal"]`) records a `MetalLayout`: params,
constants, inputs and outputs each at their own 256-byte aligned offset, then
the LIR's arena, then a 4-byte error flag that kernels set (a gather index out
of range) and the host checks after every run.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("demo")
>>> g.set_outputs([g.activation("relu", g.input("x", [4]))])
>>> metal_decisions(plan(g))[0].inputs
(0,)
"""

from __future__ import annotations

from rlx.ir.decisions import Decision
from rlx.ir.decisions_metal import MetalLayout
from rlx.ir.lir import LirModule

#: Alignment of every region (Metal wants 16 bytes for vector loads; 256 keeps cache lines apart).
ALIGN = 256


def metal_decisions(lir: LirModule) -> tuple[Decision, ...]:
    """The one-buffer layout of `lir` (no other decision: Metal kernels read the graph as planned)."""
    total = 0

    def alloc(nbytes: int) -> int:
        nonlocal total
        offset = (total + ALIGN - 1) // ALIGN * ALIGN
        total = offset + max(int(nbytes), 0)
        return offset

    graph = lir.graph
    params = tuple(alloc(s.shape.max_nbytes) for s in lir.params)
    constants = tuple(alloc(graph.node(nid).shape.max_nbytes) for nid in lir.constants)
    inputs = tuple(alloc(s.shape.max_nbytes) for s in lir.inputs)
    outputs = tuple(alloc(s.shape.max_nbytes) for s in lir.outputs)
    arena = alloc(lir.arena_bytes)
    flag = alloc(4)
    return (MetalLayout(total=total, params=params, constants=constants, inputs=inputs, outputs=outputs,
                        arena=arena, flag=flag),)

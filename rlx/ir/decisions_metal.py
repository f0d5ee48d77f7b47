"""Decisions of the Metal lowering (`rlx/opt/lowering_metal.py`), recorded in the LIR.

A Metal program keeps every tensor in one shared `MTLBuffer` (Apple silicon has
unified memory, so the host writes inputs and params in place and reads outputs
back without staging copies). `MetalLayout` is that buffer's byte layout; the
Metal codegen reads pointers from it and nothing else.

>>> lay = MetalLayout(total=1024, params=(0,), constants=(), inputs=(256,), outputs=(512,), arena=768, flag=1008)
>>> lay.describe()
'metal buffer: one allocation of 1024 bytes: params at 0, inputs at 256, outputs at 512, arena at 768, flag at 1008'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlx.ir.decisions import Decision, register_decision


@dataclass(frozen=True)
class MetalLayout(Decision):
    """Byte offsets of every param, constant, input and output slot, the arena and the error flag."""

    kind: ClassVar[str] = "metal_layout"
    total: int
    params: tuple[int, ...]
    constants: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    arena: int
    flag: int

    def describe(self) -> str:
        spans = [(name, offs[0]) for name, offs in (("params", self.params), ("constants", self.constants),
                                                      ("inputs", self.inputs), ("outputs", self.outputs)) if offs]
        spans += [("arena", self.arena), ("flag", self.flag)]
        text = ", ".join(f"{name} at {off}" for name, off in spans)
        return f"metal buffer: one allocation of {self.total} bytes: {text}"


register_decision(MetalLayout, ())

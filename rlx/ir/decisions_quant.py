"""The CPU decision of decode GEMV groups: quantized projections of one activation run as one pass.

`QuantGemvGroup(members, max_rows, swiglu)`: `dequant_matmul` nodes with one activation mode
(`act` "q8"/"q16", or "f32") that read one activation with one block format — a layer's Q/K/V, or its
gate/up — scheduled one after another. In a step of at most `max_rows` rows of activations
(decode) the first member's kernel quantizes the activation once (integer modes) and one OpenMP team computes
every member's output, splitting the concatenation of their weight rows
(`templates/cpu/kernels/qgemv_group.h`); the other members' kernels then return at once. With
`swiglu` (the region `silu(gate) * up` of two members) the pass writes the region's output
directly and the region's kernel returns at once too. Larger steps (prefill) run every node's
own kernel. Decided by `rlx.opt.lowering_quant_cpu`.

>>> QuantGemvGroup(members=(4, 5), max_rows=4, swiglu=(6,)).describe()
'%4 %5 run as one quantized GEMV pass when a step has <= 4 rows, writing the SwiGLU %6'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlx.ir.decisions import Decision, register_decision


@dataclass(frozen=True)
class QuantGemvGroup(Decision):
    """Quantized GEMVs of one activation run as one pass in decode steps (see the module docstring)."""

    kind: ClassVar[str] = "cpu_quant_gemv_group"
    members: tuple[int, ...]
    max_rows: int
    swiglu: tuple[int, ...] = ()

    def describe(self) -> str:
        names = " ".join(f"%{m}" for m in self.members)
        extra = f", writing the SwiGLU %{self.swiglu[0]}" if self.swiglu else ""
        return f"{names} run as one quantized GEMV pass when a step has <= {self.max_rows} rows{extra}"

    def nodes(self) -> tuple[int, ...]:
        return self.members + self.swiglu

    def skipped(self) -> tuple[int, ...]:
        """Nodes whose own kernels return at once in decode steps (the pass computed them)."""
        return self.members[1:] + self.swiglu


register_decision(QuantGemvGroup, ("members", "swiglu"))


#: Weight rows per group of an interleaved quantized param (RLX_QI_ROWS of kernels/quant_interleaved.h).
INTERLEAVE_ROWS = 16


@dataclass(frozen=True)
class InterleavedQuantParam(Decision):
    """A q8_0 / q4_0 / q4_1 weight param read only by integer-activation `dequant_matmul`s, stored at `set_param`
    with its rows interleaved by 16 (`templates/cpu/kernels/quant_interleaved.h`): the same bytes as
    GGUF's, each group's blocks holding 16 rows' scales then their quants, 4 bytes a row at a time, so a
    decode GEMV's vector lanes are 16 output columns and the integer products of many activation rows
    share one unpacking of the weights (batched decode). Decided by `rlx.opt.lowering_quant_cpu`.

    >>> InterleavedQuantParam(node=3, quant="q4_1").describe()
    '%3 param stored interleaved by 16 rows (q4_1 blocks) for the integer decode GEMV'
    """

    kind: ClassVar[str] = "quant_interleaved_param"
    node: int
    quant: str

    def describe(self) -> str:
        return (f"%{self.node} param stored interleaved by {INTERLEAVE_ROWS} rows ({self.quant} blocks) "
                "for the integer decode GEMV")

    def nodes(self) -> tuple[int, ...]:
        return (self.node,)


register_decision(InterleavedQuantParam, ("node",))

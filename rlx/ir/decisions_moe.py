"""The decision of how a `moe_matmul` runs: one GEMV per (token, expert) pair, or tokens grouped by expert.

`MoeExpertPlan(node, path, gemv_max_pairs, chunk_pairs)`, recorded by `rlx.opt.lowering_moe` for the CPU
and CUDA backends and read by their `moe_matmul` rules:

- path "gemv": the graph's steps have at most `gemv_max_pairs` (token, chosen expert) pairs (decode),
  so every pair runs one GEMV over its expert's `[N, K]` matrix: a step reads the chosen experts'
  weights and no others, and its time follows top_k, not the number of experts.
- path "grouped": larger steps (prefill) sort the pairs by expert, `chunk_pairs` at a time, and
  run one GEMM per expert group (still reading only the experts some token chose); a step that
  has at most `gemv_max_pairs` pairs at run time takes the GEMV path.

>>> MoeExpertPlan(node=7, path="gemv", gemv_max_pairs=16, chunk_pairs=0).describe()
'%7 moe_matmul: one GEMV per chosen (token, expert) pair (steps of <= 16 pairs)'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlx.ir.decisions import Decision, register_decision

#: The paths a `MoeExpertPlan` may name.
MOE_PATHS = ("gemv", "grouped")


@dataclass(frozen=True)
class MoeExpertPlan(Decision):
    """How one `moe_matmul` node runs (see the module docstring)."""

    kind: ClassVar[str] = "moe_expert_plan"
    node: int
    path: str
    gemv_max_pairs: int
    chunk_pairs: int

    def __post_init__(self) -> None:
        if self.path not in MOE_PATHS:
            raise ValueError(f"MoeExpertPlan path must be one of {MOE_PATHS}, got {self.path!r}")

    def describe(self) -> str:
        if self.path == "gemv":
            return (f"%{self.node} moe_matmul: one GEMV per chosen (token, expert) pair "
                    f"(steps of <= {self.gemv_max_pairs} pairs)")
        return (f"%{self.node} moe_matmul: pairs sorted by expert, {self.chunk_pairs} at a time, one GEMM per "
                f"expert group; steps of <= {self.gemv_max_pairs} pairs one GEMV per pair")

    def nodes(self) -> tuple[int, ...]:
        return (self.node,)


register_decision(MoeExpertPlan, ("node",))

"""What an execution context allocates, predicted before the build (`Session.estimate`).

The CPU runtime (`templates/cpu/kernels/context.h`) gives every context an
arena (every intermediate value, planned at the dynamic dims' bounds), param
storage (weights in stored layout, packed GEMM operands padded to their panel
width), scratch (a shared block plus one tile per thread) and the context
record itself; `rlx_alloc` rounds each block up to its alignment (64 bytes,
or 2 MiB for blocks of 2 MiB and more). `alloc_size` mirrors that rounding, so
an estimate is the allocation, not just the plan. State (a KV cache: state
inputs) and the caller's input/output tensors are
reported apart: the caller owns them.

>>> alloc_size(100), alloc_size(3 << 20), alloc_size(0)
(128, 4194304, 64)
>>> m = MemoryEstimate(arena=1024, params=4096, scratch=0, context=600, state=0, inputs=64, outputs=64,
...                    threads=2)
>>> m.total
5720
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

ALIGN = 64
HUGE = 2 << 20


def alloc_size(nbytes: int) -> int:
    """Bytes `rlx_alloc` takes for a block of `nbytes` (context.h)."""
    align = HUGE if nbytes >= HUGE else ALIGN
    return -(-nbytes // align) * align if nbytes else ALIGN


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one execution context (arena, params, scratch, context record: what `total` sums, what
    `CompiledGraph.memory()` reports after the build), and of what the caller owns (state, inputs,
    outputs), with every dynamic dim at its bound. `threads`: the thread count scratch is sized for;
    `profiled`: the estimate is of a profiled build (RLX_PROFILE), whose context record holds a span ring."""

    arena: int
    params: int
    scratch: int
    context: int
    state: int
    inputs: int
    outputs: int
    threads: int
    profiled: bool = False

    @property
    def total(self) -> int:
        """Bytes one context allocates (a pool of N contexts holds N times this)."""
        return self.arena + self.params + self.scratch + self.context

    def as_dict(self) -> dict[str, int]:
        return {**{k: int(v) for k, v in asdict(self).items()}, "total": self.total}

    def format(self) -> str:
        """The `rlxc inspect --memory` table.

        >>> print(MemoryEstimate(0, 0, 0, 552, 0, 0, 0, threads=1).format().splitlines()[3])
        context             552 B       552 B  the context record
        """
        record = "the context record, with a profiled build's span ring" if self.profiled else "the context record"
        rows = [("arena", self.arena, "intermediate values, planned at the dims' bounds"),
                ("params", self.params, "weights as stored (packed GEMM operands padded)"),
                ("scratch", self.scratch, f"workspace: shared block + {self.threads} thread tile(s)"),
                ("context", self.context, record),
                ("total", self.total, "per execution context"),
                ("state", self.state, "caller-owned persistent state (KV cache)"),
                ("inputs", self.inputs, "caller-owned, at the bounds"),
                ("outputs", self.outputs, "caller-owned, at the bounds")]
        return "\n".join(f"{name:<8} {nbytes:>14,d} B  {_human(nbytes):>10}  {what}" for name, nbytes, what in rows)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def estimate_lir(plan: dict[str, int], threads: int, *, profiled: bool = False) -> MemoryEstimate:
    """The allocation a context makes for a code generator's memory plan (`rlx.codegen.cpu.emit.memory_plan`)
    with scratch for `threads` threads, each block rounded as `rlx_alloc` rounds it; `profiled`: the
    plan is of a profiled build."""
    threads = max(int(threads), 1)
    scratch_bytes = plan["scratch_shared"] + threads * plan["scratch_per_thread"]
    return MemoryEstimate(arena=alloc_size(plan["arena"]), params=alloc_size(plan["params"]),
                          scratch=alloc_size(scratch_bytes) if scratch_bytes else 0, context=plan["context"],
                          state=plan["state"], inputs=plan["inputs"], outputs=plan["outputs"], threads=threads,
                          profiled=profiled)


__all__ = ["MemoryEstimate", "alloc_size", "estimate_lir"]

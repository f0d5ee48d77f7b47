"""Decisions of the CUDA lowering about which kernel does a node's work (`rlx/opt/lowering_cuda_kernels.py`).

Where the CUDA codegen could render a node in more than one way and the choice depends on neighbouring nodes or
on where bytes live, the lowering decides and records it here; the codegen only reads the records:

- `CutlassGemm`: a GEMM whose activation cuBLASLt's epilogue cannot fuse runs on the CUTLASS sm90 unit (bias and
  activation in its epilogue), or stays on cuBLASLt plus a separate pass, and why.
- `GatherInRegion`: a row gather (an embedding lookup) is done by the elementwise region that reads it.
- `NormInGemm`: a layer / RMS norm is computed in the prologue of the small GEMM that reads it, in steps of few
  rows.
- `CopySmallGemm`: a quantized product whose weight keeps a dequantized copy (`DequantCopy`) multiplies that copy
  on the small GEMM in steps of few rows (its residual add in the epilogue), not on cuBLASLt.
- `CudaKernelOptions`: the target options these were decided for (the codegen refuses another target).

>>> CutlassGemm(node=7, act="gelu", function="rlx_cutlass_gemm_f16_gelu").describe()
'%7 GEMM on CUTLASS sm90 (rlx_cutlass_gemm_f16_gelu): bias and gelu in its epilogue'
>>> CutlassGemm(node=7, act="gelu", why="an operand is not 16-byte aligned").describe()
'%7 GEMM on cuBLASLt, then a gelu pass; not on CUTLASS: an operand is not 16-byte aligned'
>>> GatherInRegion(gather=3, region=9).describe()
"%3 gather looked up inside %9's elementwise kernel (no kernel of its own)"
>>> NormInGemm(norm=12, gemm=13, max_rows=64).describe()
"%12 norm computed in the prologue of %13's small GEMM when a step has <= 64 rows (its own kernel otherwise)"
>>> CopySmallGemm(node=20, min_rows=5, max_rows=64, add=(22,)).describe()
"%20 on the small GEMM over its copy in steps of 5..64 rows (+ %22's residual add)"
>>> CopySmallGemm(node=30, min_rows=5, max_rows=64, norm=(29,), pair=(31,), swiglu=(32,)).describe()
"%30 on the small GEMM over its copy in steps of 5..64 rows (%29's norm first) (and %31's copy: %32's SwiGLU)"
>>> CopySmallGemm(node=14, min_rows=5, max_rows=64, norm=(13,), siblings=(15, 16)).describe()
"%14 on the small GEMM over its copy in steps of 5..64 rows (%13's norm first) (and %15, %16: one launch)"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlx.ir.decisions import Decision, register_decision


@dataclass(frozen=True)
class CudaKernelOptions(Decision):
    """The target options the kernel choices of this LIR were made for: the GPU `arch`, whether the CUTLASS unit may
    run GEMMs (`cutlass`: asked for and available to the build), gathers may be done by regions (`gather_region`),
    GEMMs of few rows run rlx_gemm_small (`small_gemm`), cuBLASLt's GELU epilogue takes the tanh GELU
    (`lt_gelu_epilogue`) and unfusable activations move to rlx_gemm_mma (`fused_act_gemm`)."""

    kind: ClassVar[str] = "cuda_kernel_options"
    arch: str
    cutlass: bool
    gather_region: bool
    small_gemm: bool
    lt_gelu_epilogue: bool
    fused_act_gemm: bool

    def describe(self) -> str:
        on = {True: "on", False: "off"}
        return (f"kernel choices for {self.arch}: CUTLASS GEMMs {on[self.cutlass]}, gathers in regions "
                f"{on[self.gather_region]}, small GEMMs {on[self.small_gemm]}, cuBLASLt tanh-GELU epilogue "
                f"{on[self.lt_gelu_epilogue]}, mma GEMMs for unfusable activations {on[self.fused_act_gemm]}")


@dataclass(frozen=True)
class CutlassGemm(Decision):
    """GEMM `node` (on cuBLASLt's path, with an activation `act` its epilogue cannot fuse): `function` is the CUTLASS
    sm90 launcher that runs it, bias and activation in its epilogue; '' keeps it on cuBLASLt followed by a
    bias/activation pass, `why` saying what the CUTLASS kernel lacks (the generated source repeats it)."""

    kind: ClassVar[str] = "cuda_cutlass_gemm"
    node: int
    act: str
    function: str = ""
    why: str = ""

    def describe(self) -> str:
        if self.function:
            return f"%{self.node} GEMM on CUTLASS sm90 ({self.function}): bias and {self.act} in its epilogue"
        return f"%{self.node} GEMM on cuBLASLt, then a {self.act} pass; not on CUTLASS: {self.why}"

    def nodes(self) -> tuple[int, ...]:
        return (self.node,)


@dataclass(frozen=True)
class GatherInRegion(Decision):
    """Row gather `gather` is looked up by the kernel of elementwise region `region`, its only reader
    (`rlx_gather_at`: the same bounds check and error flag as `rlx_gather`); the gather renders no code."""

    kind: ClassVar[str] = "cuda_gather_in_region"
    gather: int
    region: int

    def describe(self) -> str:
        return f"%{self.gather} gather looked up inside %{self.region}'s elementwise kernel (no kernel of its own)"

    def nodes(self) -> tuple[int, ...]:
        return (self.gather, self.region)


@dataclass(frozen=True)
class NormInGemm(Decision):
    """Layer / RMS norm `norm` is computed in the prologue of the rlx_gemm_small of GEMM `gemm` (a QKV group's
    leader: the group's one GEMM) in steps of at most `max_rows` rows; its own kernel runs in larger steps only."""

    kind: ClassVar[str] = "cuda_norm_in_gemm"
    norm: int
    gemm: int
    max_rows: int

    def describe(self) -> str:
        return (f"%{self.norm} norm computed in the prologue of %{self.gemm}'s small GEMM when a step has "
                f"<= {self.max_rows} rows (its own kernel otherwise)")

    def nodes(self) -> tuple[int, ...]:
        return (self.norm, self.gemm)


@dataclass(frozen=True)
class CopySmallGemm(Decision):
    """Quantized product `node` reads a weight with a dequantized copy (`DequantCopy`, [K, N] in the compute type):
    in steps of `min_rows`..`max_rows` rows it multiplies that copy on rlx_gemm_small (its weights fetched
    before the PDL wait) instead of cuBLASLt, whose fixed cost per launch is most of a product this small (SmolLM2's
    projections at 64 rows: ~0.3 us of weight bytes). `add`: the residual add (`DequantCopy.adds`) whose sum the
    GEMM writes, added in its epilogue (none: ()). `norm`: the norm producing its X, which the fused decode GEMV
    absorbs in smaller steps, computed in its prologue (the norm's own kernel then runs past `max_rows` only).
    `pair` / `swiglu`: the up projection of a SwiGLU whose gate `node` is (their fused decode GEMV's members), its
    copy multiplied by the same launch, which writes the SwiGLU region `swiglu` (silu(gate) * up) directly: the up
    product's and the region's own kernels run past `max_rows` only. `siblings`: products of the same X (a layer's K
    and V beside its Q: their fused decode GEMV's other members) whose copies the same launch multiplies, each
    written to its own output: one launch and one norm prologue instead of three (their own run past `max_rows`).
    `wide`: a long plain product (a vocabulary head: N >= SMALL_GEMM_WIDE_MIN_N) on rlx_gemm_small_wide instead,
    persistent blocks over its column tiles with every row of X in shared memory, so the copy is read once, not once
    per 16 rows."""

    kind: ClassVar[str] = "cuda_copy_small_gemm"
    node: int
    min_rows: int
    max_rows: int
    add: tuple[int, ...] = ()
    norm: tuple[int, ...] = ()
    pair: tuple[int, ...] = ()
    swiglu: tuple[int, ...] = ()
    siblings: tuple[int, ...] = ()
    wide: bool = False

    def describe(self) -> str:
        more = "".join(f" (%{n}'s norm first)" for n in self.norm)
        more += " (persistent blocks over its column tiles: the copy read once)" if self.wide else ""
        more += f" (and {', '.join(f'%{n}' for n in self.siblings)}: one launch)" if self.siblings else ""
        more += "".join(f" (+ %{a}'s residual add)" for a in self.add)
        more += "".join(f" (and %{u}'s copy: %{r}'s SwiGLU)" for u, r in zip(self.pair, self.swiglu))
        return f"%{self.node} on the small GEMM over its copy in steps of {self.min_rows}..{self.max_rows} rows{more}"

    def nodes(self) -> tuple[int, ...]:
        return (self.node, *self.add, *self.norm, *self.pair, *self.swiglu, *self.siblings)


register_decision(CudaKernelOptions, ())
register_decision(CutlassGemm, ("node",))
register_decision(GatherInRegion, ("gather", "region"))
register_decision(NormInGemm, ("norm", "gemm"))
register_decision(CopySmallGemm, ("node", "add", "norm", "pair", "swiglu", "siblings"))

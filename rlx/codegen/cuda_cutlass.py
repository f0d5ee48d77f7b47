"""Which GEMMs run on the CUTLASS sm90 kernel unit (`templates/cuda/kernels/gemm_cutlass.cu`), and why.

cuBLASLt's epilogues fuse a bias, ReLU and the tanh GELU; a product followed by the erf GELU (BERT, MiniLM) or
SiLU otherwise runs cuBLASLt and then a separate pass that reads and rewrites its whole output. A CUTLASS
Hopper kernel (TMA + wgmma, warp-specialized cooperative schedule) applies bias and activation to its f32
accumulators instead, so the output crosses device memory once, at cuBLASLt's mainloop speed.

`cutlass_choice` decides per GEMM; the rule records the choice in the generated source (the GEMM's comment
names the provider and the reason) and the build links the configurations the source calls
(`rlx/toolchain/cuda_units.py`).

>>> from rlx.ir.dtype import DType
>>> from rlx.ir.shape import Dim
>>> cutlass_choice(True, "sm_90", DType.F16, "gelu", True, Dim(384), Dim(1536), [0, 16, 32, 48]).function
'rlx_cutlass_gemm_f16_gelu'
>>> cutlass_choice(True, "sm_90", DType.F16, "gelu", True, Dim(384), Dim(1532), [0, 16, 32, 48]).why
'N = 1532 is not a multiple of 8 (TMA rows are whole 16-byte units)'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlx.ir.activation_table import activation_table
from rlx.ir.dtype import DType
from rlx.ir.shape import Dim

#: Activations the unit is built for (the rest stay on cuBLASLt's epilogue or a separate pass): the entries of
#: templates/activations.toml marked `cutlass`.
CUTLASS_ACTS = tuple(activation_table().cutlass_ids)
#: The archs of the sm90 kernels.
CUTLASS_ARCHS = ("sm_90", "sm_90a")
_DT = {DType.F16: "f16", DType.BF16: "bf16"}


@dataclass(frozen=True)
class CutlassChoice:
    """A GEMM's CUTLASS decision: the launcher to call (`function`), or '' and why not (`why`)."""

    function: str = ""
    why: str = ""


def cutlass_choice(enabled: bool, arch: str, dt: DType, act: str | None, folded: bool, K: Dim, N: Dim,
                   offsets: Sequence[int | None]) -> CutlassChoice:
    """Whether a GEMM C = act(A B + bias) runs on the CUTLASS unit: f16/bf16 on sm_90, an activation the unit has,
    one B for all rows (M folds the batch), static K and N multiples of 8 and 16-byte aligned operands (TMA)."""
    if act not in CUTLASS_ACTS:
        return CutlassChoice(why=f"activation {act} is fused by cuBLASLt or absent" if act else "no activation")
    if not enabled:
        return CutlassChoice(why="CudaTarget(cutlass_gemm=False), or CUTLASS unavailable for this build")
    if arch not in CUTLASS_ARCHS:
        return CutlassChoice(why=f"the CUTLASS kernels are sm_90 (wgmma); the target is {arch}")
    if dt not in _DT:
        return CutlassChoice(why=f"{dt.value} products (the unit is f16/bf16)")
    if not folded:
        return CutlassChoice(why="a batched product (one B per batch)")
    for name, d in (("K", K), ("N", N)):
        if not d.is_static:
            return CutlassChoice(why=f"{name} is dynamic")
        if d.value % 8:
            return CutlassChoice(why=f"{name} = {d.value} is not a multiple of 8 (TMA rows are whole 16-byte units)")
    if not all(o is not None and o % 16 == 0 for o in offsets):
        return CutlassChoice(why="an operand is not 16-byte aligned")
    return CutlassChoice(function=f"rlx_cutlass_gemm_{_DT[dt]}_{act}")

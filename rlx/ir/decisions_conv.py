"""The CPU decision of a convolution: its algorithm, tile layout and weight storage (`ConvPlan`).

`ConvPlan(node, algorithm, layout, weight, packed)` for each `conv` node
(`rlx.ir.ops_conv.Conv`), made by `rlx.opt.lowering_conv`:

- ``implicit_gemm`` / ``nhwc_tiles``: the output is computed in tiles of up to
  96 output pixels of one image (and one group). Each thread gathers its tile's
  receptive fields into a pixel-major (NHWC-ordered) ``[pixels, C/g * kh * kw]``
  block in its scratch — never the whole im2col matrix — multiplies it by the
  weights ``[C/g * kh * kw, O/g]`` and stores the ``[pixels, O/g]`` result
  channels-first, adding the bias and applying the activation in that store.
  With `packed` the weight param (groups == 1) is stored at `set_param` in the
  packed GEMM's K x N panels (the transpose of ONNX's ``[O, C*kh*kw]``) and the
  tile is multiplied by RLX's micro-kernel (`kernels/packed_gemm.h`); otherwise
  by `rlx_sgemm1` (BLAS or the C GEMM) on the weight as stored.
- ``depthwise`` / ``nchw``: groups == C == O: each thread takes whole channel
  planes, copies each (zero-padded, split by stride phase) into its scratch and
  runs every window tap as one contiguous run over the plane (bias in the
  accumulators, activation in the store).

>>> ConvPlan(node=5, algorithm="implicit_gemm", layout="nhwc_tiles", weight=2, packed=True).describe()
'%5 conv: implicit_gemm on nhwc_tiles (weight %2 packed K x N on set)'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlx.ir.decisions import Decision, register_decision

#: (algorithm, layout) pairs the CPU rule renders.
CONV_PLANS = (("implicit_gemm", "nchw_tiles"), ("implicit_gemm", "nhwc_tiles"), ("pointwise", "nchw"),
              ("depthwise", "nchw"))
#: Output pixels per implicit-GEMM tile (RLX_CONV_MC in templates/cpu/kernels/conv.h).
CONV_TILE_PIXELS = 96


@dataclass(frozen=True)
class ConvPlan(Decision):
    """How the CPU computes one `conv` node (see the module docstring)."""

    kind: ClassVar[str] = "conv_plan"
    node: int
    algorithm: str
    layout: str
    weight: int
    packed: bool
    #: output pixels per tile (0: whole planes)
    tile: int = 0

    def describe(self) -> str:
        store = f"weight %{self.weight} packed K x N on set" if self.packed else f"weight %{self.weight} as stored"
        tile = f", {self.tile}-pixel tiles" if self.tile else ""
        return f"%{self.node} conv: {self.algorithm} on {self.layout} ({store}{tile})"

    def nodes(self) -> tuple[int, ...]:
        return (self.node, self.weight)


register_decision(ConvPlan, ("node", "weight"))

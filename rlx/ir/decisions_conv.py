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
  packed GEMM's panels of the transpose ``[C*kh*kw, O]`` of ONNX's ``[O, C*kh*kw]``,
  cut along K into blocks of `depth` rows (each block a ``[depth, O]`` matrix of
  panels, stored one after the other), and the tile is multiplied by RLX's
  micro-kernel (`kernels/packed_gemm.h`) one block at a time: a block's slice of a
  panel stays in L1 while the tile's rows pass, and the weights stream in storage
  order. Otherwise by `rlx_sgemm1` (BLAS or the C GEMM) on the weight as stored.
- ``direct`` / ``nchw_phases``: groups == 1: each image's channels are copied,
  zero-padded and split by stride phase, into each thread's scratch (its own images,
  or at batch 1 every thread the whole image, sharing its units); every window tap of
  a run of output pixels is then a contiguous run of a phase plane, and tiles of 6
  output channels x two vectors of pixels (`vector` floats each: 16 pixels with AVX2's 8, 32 with
  AVX-512's 16) accumulate over every (channel, tap) in registers (`rlx_conv_direct_unit<vector>`),
  the weight read as stored. A work unit is `channels` output channels x up to `tile` panels (of a
  tile's pixels); its store adds bias and activation.
- ``direct`` / ``nchw_lanes``: groups == 1 with few input channels (a stem on RGB images) or, with 16-float
  vectors, many (`rlx.opt.lowering_conv.lanes_fit`): the output channels are the `vector` lanes. Each output row
  is cut into runs of at most `vector` pixels (`tile`); a run's output channels, `vector` at a time, accumulate in
  one register a pixel over every (channel, tap) inside the plane (pads skipped), each input value of a window row
  broadcast once, and are transposed in registers into rows of pixels. A work unit is a band of `rows` output rows
  of an image x a group of `channels` output channels, `vector` at a time over all of the band's rows (each output
  plane written a band at a time). With `packed` the weight param is stored at `set_param` as
  ``[O / vector, C*kh*kw, vector]`` (a tap's `vector` output channels contiguous, each block's weights together).
- ``winograd`` / ``nchw_wino_tiles``: a 3x3, stride-1 conv with 32+ channels on rows of 14+
  pixels (`rlx.opt.lowering_conv.winograd_fits`): Winograd F(2x2, 3x3). The weight param is
  stored transformed at `set_param` (`packed`: ``[16, O, C]``, ``G w G^T`` of every channel pair);
  each image's 2x2-pixel tiles (numbered ``ceil(OW/2)`` to a row, padded to panels of a register tile's width) are
  transformed into ``[16, C, tiles]``, multiplied element by element (16 products
  ``[O, C] @ [C, tiles]`` in the direct conv's register tiles, `channels` input channels at a time,
  units of one element x up to `tile` panels) and transformed back, bias and activation in the store.
- ``winograd`` / ``nchw_wino4_tiles``: the same as Winograd F(4x4, 3x3): 4x4-pixel tiles from 6 x 6
  patches (the weight stored as ``[36, O, C]``), 36 products.
- ``pointwise`` / ``nchw``: a 1x1, stride-1, unpadded conv on a small plane: each image's
  planes are the right operand of ``W[O, C] @ X[C, HW]`` (`rlx_sgemm1`) as they lie.
- ``pointwise`` / ``nchw_panels``: the same on a plane of POINTWISE_PANEL_PIXELS+
  (`rlx.opt.lowering_conv`): tiles of 6 output channels x two vectors of pixels accumulate over the
  input channels in registers (`rlx_conv_direct_tile<vector>` with one tap), the weight read as
  stored and nothing packed; work units of `channels` output channels x up to `tile` panels.
  A 1x1 conv with strides (no pads, groups 1) on STRIDED_PANEL_PIXELS+ output pixels (ResNet's
  downsamples) runs the same way on its image subsampled into the thread's scratch first.
- ``depthwise`` / ``nchw``: groups == C == O: each thread takes whole channel
  planes, copies each (zero-padded, split by stride phase) into its scratch and
  runs every window tap as one contiguous run over the plane, 32 outputs at a time
  in 8 chains of `vector`-float registers (bias in the accumulators, activation in the store).
- ``depthwise`` / ``nchw_rows``: a 3x3, stride-2, undilated depthwise conv (left and top pads 1) on output
  rows of DW_ROWS_MIN_WIDTH+ pixels: each output row straight from the plane, no phase copy, `vector` outputs
  at a time from two vectors of input columns split into even and odd lanes.
- ``depthwise`` / ``nchw_row_shifts``: an undilated depthwise conv of strides 1 or 2 whose output rows (at most
  `vector` of them) fit one `vector`, its input rows `vector` times the column stride (and |kw - left pad| <= 4 for
  every tap): each output row one vector, straight from the plane, each input row loaded once (with a column stride
  of 2 split into even and odd columns) and every tap a lane shift of it.

How the team takes a plan's work units (`ranges`): one at a time from a shared counter, or (depthwise, pointwise,
`nchw_lanes`, and `PoolPlan.ranges`: `rlx.opt.lowering_conv.TASK_RANGES`) in even contiguous ranges a thread, the
ranges a spinning team's threads steal from at their ends (`rlx_tasks_begin_pool`, kernels/threads.h; a team that does
not spin claims them one at a time). With ranges a thread writes the same share of the output run after run, next
to what the same thread wrote in the kernels before it (a depthwise conv's planes, the pointwise conv before it: its
blocks of output channels outermost), so it reads from its own core's cache.

>>> ConvPlan(node=5, algorithm="implicit_gemm", layout="nhwc_tiles", weight=2, packed=True, depth=192).describe()
'%5 conv: implicit_gemm on nhwc_tiles (weight %2 packed K x N on set, 192-deep blocks)'
>>> ConvPlan(node=7, algorithm="winograd", layout="nchw_wino_tiles", weight=6, packed=True, tile=12,
...          channels=64, vector=8).describe()  # doctest: +NORMALIZE_WHITESPACE
'%7 conv: winograd on nchw_wino_tiles (weight %6 transformed to 16 x O x C on set for F(2x2, 3x3),
 64-channel blocks, units of up to 12 16-tile panels, 8-float vectors)'
>>> ConvPlan(node=6, algorithm="depthwise", layout="nchw_rows", weight=4, packed=False, vector=16,
...          ranges=True).describe()
'%6 conv: depthwise on nchw_rows (weight %4 as stored, 16-float vectors, units in contiguous ranges a thread)'
>>> ConvPlan(node=7, algorithm="winograd", layout="nchw_wino4_tiles", weight=6, packed=True, tile=12,
...          channels=64, vector=16).describe()  # doctest: +NORMALIZE_WHITESPACE
'%7 conv: winograd on nchw_wino4_tiles (weight %6 transformed to 36 x O x C on set for F(4x4, 3x3),
 64-channel blocks, units of up to 12 32-tile panels, 16-float vectors)'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlx.ir.decisions import Decision, register_decision

#: (algorithm, layout) pairs the CPU rule renders.
CONV_PLANS = (("implicit_gemm", "nchw_tiles"), ("implicit_gemm", "nhwc_tiles"), ("pointwise", "nchw"),
              ("pointwise", "nchw_panels"), ("depthwise", "nchw"), ("depthwise", "nchw_rows"),
              ("depthwise", "nchw_row_shifts"), ("direct", "nchw_phases"), ("direct", "nchw_lanes"),
              ("winograd", "nchw_wino_tiles"), ("winograd", "nchw_wino4_tiles"))
#: Output pixels per side of a Winograd layout's tiles: F(2x2, 3x3) or F(4x4, 3x3).
WINOGRAD_TILE = {"nchw_wino_tiles": 2, "nchw_wino4_tiles": 4}
#: Output pixels per implicit-GEMM tile (RLX_CONV_MC in templates/cpu/kernels/conv.h).
CONV_TILE_PIXELS = 96
#: How a plan with `ranges` says so in its description.
RANGES_NOTE = ", units in contiguous ranges a thread"


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
    #: K rows per block of the packed weight (0: not packed)
    depth: int = 0
    #: output channels per work unit (direct; 0: every channel); Winograd: input channels per product block
    channels: int = 0
    #: floats per vector of the register tiles (direct, Winograd, pointwise on panels, depthwise; 0: none): 8 (AVX2)
    #: or 16 (AVX-512), decided from the target's instruction set; a tile and a panel are two vectors of pixels
    vector: int = 0
    #: output rows per work unit (`nchw_lanes`: a band of rows; 0: none)
    rows: int = 0
    #: how the team takes the work units: False, one at a time from a shared counter; True, in even contiguous ranges
    #: a thread (`TASK_RANGES`), stolen from at their ends while the team spins (not spinning: one at a time)
    ranges: bool = False

    def describe(self) -> str:
        store = (f"weight %{self.weight} packed K x N on set, {self.depth}-deep blocks" if self.packed
                 else f"weight %{self.weight} as stored")
        tile = f", {self.tile}-pixel tiles" if self.tile else ""
        if self.algorithm == "winograd":
            m = WINOGRAD_TILE[self.layout]
            store = f"weight %{self.weight} transformed to {(m + 2) ** 2} x O x C on set for F({m}x{m}, 3x3)"
            tile = f", {self.channels}-channel blocks, units of up to {self.tile} {self.panel}-tile panels"
        elif self.layout == "nchw_lanes":
            store = f"weight %{self.weight} blocked to O/{self.vector} x C*kh*kw x {self.vector} on set"
            tile = (f", output channels in the lanes, runs of up to {self.tile} pixels, units of {self.rows} rows x "
                    f"{self.channels} channels")
        elif self.algorithm == "direct" or self.layout == "nchw_panels":
            tile = f", units of {self.channels} channels x up to {self.tile} {self.panel}-pixel panels"
        if self.vector:
            tile += f", {self.vector}-float vectors"
        if self.ranges:
            tile += RANGES_NOTE
        return f"%{self.node} conv: {self.algorithm} on {self.layout} ({store}{tile})"

    @property
    def panel(self) -> int:
        """Pixels (Winograd: tiles) of one register tile and panel: two vectors (0 without register tiles)."""
        return 2 * self.vector

    def nodes(self) -> tuple[int, ...]:
        return (self.node, self.weight)


register_decision(ConvPlan, ("node", "weight"))


@dataclass(frozen=True)
class ConvResidual(Decision):
    """A residual add (and the activation after it) that a conv computes in its store: `add` (a binary add, or an
    elementwise region `act(a + b)`) of the conv's value and `residual` (the same shape) runs no pass of its own; the
    conv's store writes ``act(conv + bias + residual)`` straight into `add`'s buffer, reading `residual` where it
    writes (ResNet's blocks: ``relu(conv2(h) + identity)``; MobileNetV3's projection convs and their shortcut).
    Made by `rlx.opt.lowering_conv_residual` only where that is safe: the conv's one reader is the add, `residual` is
    computed before the conv, and no node from the conv up to the add touches the add's bytes.

    >>> print(ConvResidual(node=10, add=11, residual=6, activation="relu").describe())
    %10 conv stores %11 = relu(%10 + %6) (the residual add in the conv's store; %11 runs no pass)
    >>> print(ConvResidual(node=10, add=11, residual=6).describe())
    %10 conv stores %11 = %10 + %6 (the residual add in the conv's store; %11 runs no pass)
    """

    kind: ClassVar[str] = "conv_residual"
    node: int
    add: int
    residual: int
    #: applied after the add (None: none)
    activation: str | None = None

    def describe(self) -> str:
        value = f"%{self.node} + %{self.residual}"
        if self.activation:
            value = f"{self.activation}({value})"
        return (f"%{self.node} conv stores %{self.add} = {value} "
                f"(the residual add in the conv's store; %{self.add} runs no pass)")

    def nodes(self) -> tuple[int, ...]:
        return (self.node, self.add, self.residual)


register_decision(ConvResidual, ("node", "add", "residual"))


@dataclass(frozen=True)
class ConvInputScale(Decision):
    """A per-channel product ``x * s`` (``s`` of shape ``[N, C, 1, 1]``: a squeeze-excite block's scale) that the
    pointwise conv `node` reading it computes in its read: `mul` runs no pass; each of the conv's work units
    multiplies its block of the weight by the image's ``s`` (in the thread's scratch) and multiplies that by `x`'s
    planes, as ``W @ (s * x) = (W * s) @ x``. Made by `rlx.opt.lowering_conv_scale` only for pointwise convs by the
    BLAS whose input is the product's one reader, where the memory plan kept `x` and `scale` through the conv.

    >>> print(ConvInputScale(node=12, mul=11, x=6, scale=10).describe())
    %12 conv reads %11 = %6 * %10 (the per-channel product in the conv's weight; %11 runs no pass)
    """

    kind: ClassVar[str] = "conv_input_scale"
    node: int
    mul: int
    x: int
    scale: int

    def describe(self) -> str:
        return (f"%{self.node} conv reads %{self.mul} = %{self.x} * %{self.scale} "
                f"(the per-channel product in the conv's weight; %{self.mul} runs no pass)")

    def nodes(self) -> tuple[int, ...]:
        return (self.node, self.mul, self.x, self.scale)


register_decision(ConvInputScale, ("node", "mul", "x", "scale"))


#: Layouts of a CPU pool (`PoolPlan.layout`).
POOL_PLANS = ("nchw_phases", "nchw_rows", "nchw")


@dataclass(frozen=True)
class PoolPlan(Decision):
    """How the CPU computes one `pool` node: ``nchw`` (an average pool, along output rows per plane),
    ``nchw_phases`` (a max pool on each plane's stride-phase copy, -inf in the pads: every tap one contiguous run)
    or ``nchw_rows`` (a 3 x 3, stride-2 max pool, pads 1, on output rows of 16+ pixels: each output row straight
    from the plane, `vector` outputs at a time from two vectors of input columns split into even and odd lanes).

    >>> PoolPlan(node=4, layout="nchw_rows", vector=16).describe()
    '%4 pool: max on nchw_rows (rows straight from the plane, 16-float vectors)'
    >>> PoolPlan(node=4, layout="nchw_phases", ranges=True).describe()
    '%4 pool: max on nchw_phases (stride-phase copies of each plane, planes in contiguous ranges a thread)'
    """

    kind: ClassVar[str] = "pool_plan"
    node: int
    layout: str
    #: floats per vector (nchw_rows; 0: none)
    vector: int = 0
    #: the team takes the planes in even contiguous ranges a thread (as `ConvPlan.ranges`), else one at a time
    ranges: bool = False

    def describe(self) -> str:
        what = {"nchw": "average on nchw (along output rows",
                "nchw_phases": "max on nchw_phases (stride-phase copies of each plane",
                "nchw_rows": "max on nchw_rows (rows straight from the plane"}[self.layout]
        if self.layout == "nchw_rows":
            what += f", {self.vector}-float vectors"
        return f"%{self.node} pool: {what}{RANGES_NOTE.replace('units', 'planes') if self.ranges else ''})"

    def nodes(self) -> tuple[int, ...]:
        return (self.node,)


register_decision(PoolPlan, ("node",))

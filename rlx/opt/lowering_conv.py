"""CPU lowering for convolutions: each `conv` node's algorithm, tile layout and weight storage (`ConvPlan`).

See `conv_plans` for the choice: depthwise on planes, pointwise on the planes as they lie (register tiles on wide
planes, BLAS on small ones), Winograd (3x3 stride-1 convs with 32+ channels on rows of 14+ pixels: F(4x4, 3x3) on
rows of 28+, F(2x2, 3x3) below), direct on stride-phase planes (groups 1, rows of 14+ pixels), implicit GEMM on
channels-first tiles (BLAS), or on pixel-major tiles with the weight packed at `set_param` for RLX's micro-kernel
(wide convolutions on narrow rows).

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("c")
>>> x = g.input("x", [1, 8, 6, 6])
>>> y = g.conv(x, g.param("w", [16, 8, 3, 3]), pads=(1, 1, 1, 1), activation="relu")
>>> g.set_outputs([g.conv(y, g.param("w2", [512, 16, 3, 3]))])
>>> for d in conv_plans(plan(g)):
...     print(d.describe())
%2 conv: implicit_gemm on nchw_tiles (weight %1 as stored, 36-pixel tiles)
%4 conv: implicit_gemm on nhwc_tiles (weight %3 packed K x N on set, 144-deep blocks, 96-pixel tiles)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from rlx.ir.decisions_conv import CONV_TILE_PIXELS, ConvPlan, PoolPlan
from rlx.ir.dtype import DType
from rlx.ir.lir import LirModule
from rlx.ir.ops_conv import Conv, Pool, Window2d, window_2d

#: Bytes of one channels-first tile of receptive fields (K x pixels floats): about half an L2.
TILE_BYTES = 512 * 1024
MAX_TILE_PIXELS = 1024


def is_depthwise(groups: int, channels: int, out_channels: int) -> bool:
    """One input and one output channel per group: the window runs directly on each plane."""
    return groups > 1 and groups == channels == out_channels


def is_strided_pointwise(op: Conv, kernel: tuple[int, ...]) -> bool:
    """A 1x1 window with strides, no pads, groups 1, 2-D (ResNet's downsamples): its input planes subsampled
    are the GEMM operand."""
    strides, _, pads = op.geometry(len(kernel))
    return (len(kernel) == 2 and op.groups == 1 and all(k == 1 for k in kernel) and any(s > 1 for s in strides)
            and not any(pads))


#: Fewest output pixels of a strided 1x1 conv run on subsampled planes in register tiles (`pointwise` on
#: `nchw_panels`) rather than as an implicit GEMM on gathered tiles by the BLAS (ResNet-18's 28 x 28 and 14 x 14
#: downsamples, in the model on 2 threads: 152-155 -> 103-109 us and 126-127 -> 88-95; its 7 x 7 one, 512 channels,
#: keeps the packed micro-kernel).
STRIDED_PANEL_PIXELS = 128


def is_pointwise(op: Conv, kernel: tuple[int, ...]) -> bool:
    """A 1x1 window, stride 1, no pads: each image's planes are the GEMM operand as they lie."""
    strides, _, pads = op.geometry(len(kernel))
    return all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pads)


#: Fewest pixels per tile (or the whole plane, when smaller): each tile's product reads all of its group's
#: weights, so narrower tiles would stream a deep layer's weights from memory once per few pixels.
MIN_TILE_PIXELS = 128
#: Output channels from which a conv whose weight can be packed runs on pixel-major tiles with the packed
#: micro-kernel: its weights are then packed once at set_param instead of by the BLAS on every tile (measured
#: on ResNet-18's last stage, 512 channels: ~15% faster; on 64-channel stages the pixel-major gather costs more
#: than it saves).
PACKED_MIN_CHANNELS = 384


#: Deepest block of a packed conv weight (K rows): a block's slice of one panel, 256 x 16 floats with AVX2
#: (16 KiB), stays in L1 while a tile's rows pass over it.
MAX_PACK_DEPTH = 256
#: Shallowest block worth a pass of its own over the tile's product; a K with no divisor between this and
#: MAX_PACK_DEPTH is packed as one block.
MIN_PACK_DEPTH = 64


#: Fewest output pixels per row of a 3x3 stride-2 depthwise conv read row by row straight from its plane
#: (`depthwise` on `nchw_rows`); narrower rows keep the phase copy (a row's partial vector goes through a copy).
DW_ROWS_MIN_WIDTH = 16


def depthwise_rows_fit(g: Window2d) -> bool:
    """Whether a depthwise conv runs on `nchw_rows`: a 3x3, stride-2, undilated window whose top and left pads
    are 1, on output rows of DW_ROWS_MIN_WIDTH+ pixels (MobileNetV3-small's 112 and 56-wide planes).

    >>> from rlx.ir.ops_conv import Conv
    >>> s2 = Conv(strides=(2, 2), pads=(1, 1, 1, 1), groups=16)
    >>> depthwise_rows_fit(window_2d(s2, (112, 112), (56, 56), (3, 3), 1))
    True
    >>> depthwise_rows_fit(window_2d(s2, (28, 28), (14, 14), (3, 3), 1))
    False
    """
    return ((g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.ph, g.pw) == (3, 3, 2, 2, 1, 1, 1, 1)
            and g.ow >= DW_ROWS_MIN_WIDTH)


#: Farthest lane shift of a tap of a depthwise conv on `nchw_row_shifts` (|kw - left pad|).
DW_MAX_SHIFT = 4


def depthwise_shifts_fit(g: Window2d, vector: int) -> bool:
    """Whether a depthwise conv runs on `nchw_row_shifts`: strides 1 or 2, undilated, output rows of at most
    `vector` pixels and input rows of at most `vector` times the column stride, at most `vector` output rows (each
    in a register), every tap's column offset ``kw - pw`` within DW_MAX_SHIFT (MobileNetV3-small's 5 x 5 convs
    on 7 x 7 outputs and, with 16-float vectors, 14 x 14 ones).

    >>> from rlx.ir.ops_conv import Conv
    >>> same = Conv(pads=(2, 2, 2, 2), groups=8)
    >>> depthwise_shifts_fit(window_2d(same, (14, 14), (14, 14), (5, 5), 1), 16)
    True
    >>> depthwise_shifts_fit(window_2d(same, (14, 14), (14, 14), (5, 5), 1), 8)
    False
    >>> s2 = Conv(strides=(2, 2), pads=(2, 2, 2, 2), groups=8)
    >>> depthwise_shifts_fit(window_2d(s2, (28, 28), (14, 14), (5, 5), 1), 16)
    True
    """
    return (g.sh in (1, 2) and g.sw in (1, 2) and (g.dh, g.dw) == (1, 1) and g.w <= g.sw * vector
            and max(g.ow, g.oh) <= vector and g.pw <= DW_MAX_SHIFT and g.kw - 1 - g.pw <= DW_MAX_SHIFT)


def pack_depth(k: int) -> int:
    """K rows per block of a packed conv weight: the largest divisor of `k` up to MAX_PACK_DEPTH (blocks
    of equal depth: the weight is stored as a batch of ``[depth, O]`` matrices), or `k` when that divisor
    is below MIN_PACK_DEPTH.

    >>> pack_depth(576), pack_depth(4608), pack_depth(147), pack_depth(2 * 257)
    (192, 256, 147, 514)
    """
    best = max(d for d in range(1, min(k, MAX_PACK_DEPTH) + 1) if k % d == 0)
    return best if best >= MIN_PACK_DEPTH or best == k else k


#: Bytes of weights (output channels x K floats) a direct-conv work unit keeps in L2 across its pixel panels.
DIRECT_WEIGHT_BYTES = 256 * 1024
#: Most 16-pixel panels in one direct-conv work unit (its output waits in the thread's scratch for the store).
DIRECT_PANELS = 12
#: Narrowest output rows run direct: each row computes WQ - OW dropped columns (2 of 16 for a 3 x 3 window on
#: 14 columns; on 7 columns, ResNet's last stage, 2 of 9, where the packed implicit GEMM wins).
DIRECT_MIN_WIDTH = 14
#: Largest phase-plane copy of one image a direct conv may take (every thread of the team holds one in its scratch).
DIRECT_MAX_SCRATCH = 16 << 20
#: Rows of a direct-conv tile (RLX_CONV_OR in kernels/conv.h): channel blocks are multiples of it.
DIRECT_ROWS = 6


def direct_channels(out_channels: int, k: int) -> int:
    """Output channels per direct-conv work unit: the channels split into as few even blocks (multiples of
    DIRECT_ROWS) as keep a block's weights within DIRECT_WEIGHT_BYTES.

    >>> direct_channels(64, 576), direct_channels(128, 1152), direct_channels(256, 2304)
    (64, 48, 30)
    """
    blocks = -(-out_channels * k * 4 // DIRECT_WEIGHT_BYTES)
    per = -(-out_channels // blocks)
    return min(out_channels, -(-per // DIRECT_ROWS) * DIRECT_ROWS)


#: Smallest plane (output pixels) whose pointwise conv runs in register tiles on 16-pixel panels rather than as a
#: BLAS sgemm on the planes: the sgemm packs both operands on every call, a cost the shallow products of wide
#: planes feel most (MobileNetV3-small's 1x1 convs, kernel time per shape on 2 threads: 56 x 56 16 -> 72 channels
#: 100-107 -> 69 us, 28 x 28 ones 10-35% less; 14 x 14 and 7 x 7 ones up to 15% more, the partial last panel a
#: larger share of the work).
POINTWISE_PANEL_PIXELS = 512
#: Most 16-pixel panels in one pointwise work unit (its output rows, accumulated over blocks of input channels,
#: stay in L2: 96 channels x 192 pixels is 72 KiB).
POINTWISE_PANELS = 12


def direct_fits(g: Window2d) -> bool:
    """Whether a groups == 1 conv of window `g` runs direct: a window of more than one tap (a 1 x 1 window with
    strides would copy every phase plane to read one), rows wide enough, one image's phase planes small enough."""
    plane = g.sh * g.sw * ((g.phase_rows + 1) * g.phase_cols + 32)  # + RLX_DW_VEC floats of slack per plane
    return g.kh * g.kw > 1 and g.ow >= DIRECT_MIN_WIDTH and g.cg * plane * 4 <= DIRECT_MAX_SCRATCH


#: Fewest input and output channels of a Winograd conv: its transforms (about 30 adds per tile and channel, and a
#: transformed input 4x the input) are paid back by the products' 16 instead of 36 multiply-adds per tile and channel
#: pair only with enough channels on both sides.
WINOGRAD_MIN_CHANNELS = 32
#: Narrowest output rows run as Winograd.
WINOGRAD_MIN_WIDTH = DIRECT_MIN_WIDTH


def winograd_fits(op: Conv, g: Window2d) -> bool:
    """Whether a groups == 1 conv runs as Winograd F(2x2, 3x3): a 3 x 3 window, stride 1, no dilation, rows wide
    enough that the tiles fill their panels (DIRECT_MIN_WIDTH: ResNet-18's 7-wide last stage, its 512 x 512 weight
    transformed to 16 / 9 of its bytes, stays on the packed implicit GEMM), WINOGRAD_MIN_CHANNELS+ channels.

    >>> from rlx.ir.ops_conv import Conv
    >>> winograd_fits(Conv(pads=(1, 1, 1, 1)), window_2d(Conv(pads=(1, 1, 1, 1)), (56, 56), (56, 56), (3, 3), 64))
    True
    """
    return (op.groups == 1 and (g.kh, g.kw) == (3, 3) and (g.sh, g.sw, g.dh, g.dw) == (1, 1, 1, 1)
            and g.ow >= WINOGRAD_MIN_WIDTH and g.cg >= WINOGRAD_MIN_CHANNELS)


#: Most 16-tile panels in one Winograd product unit (one element's output rows for them stay in L2).
WINOGRAD_PANELS = 12
#: Most input channels a Winograd product accumulates per pass over its output tiles (a panel's block of them,
#: contiguous, 16 KiB at most, stays in L1 while the unit's tiles of output channels pass).
WINOGRAD_CHANNEL_BLOCK = 256


#: Narrowest output rows run as Winograd F(4x4, 3x3) rather than F(2x2, 3x3): its 36 multiply-adds per tile and
#: channel pair make 16 output pixels (2.25 per pixel against F(2x2)'s 4), its transforms cost more per tile.
WINOGRAD4_MIN_WIDTH = 28


def winograd_layout(g: Window2d) -> str:
    """The tile layout of a conv that `winograd_fits`: F(4x4, 3x3) on rows of WINOGRAD4_MIN_WIDTH+ pixels
    (``nchw_wino4_tiles``), F(2x2, 3x3) on narrower ones (``nchw_wino_tiles``).

    >>> from rlx.ir.ops_conv import Conv
    >>> [winograd_layout(window_2d(Conv(pads=(1, 1, 1, 1)), (s, s), (s, s), (3, 3), 64)) for s in (56, 14)]
    ['nchw_wino4_tiles', 'nchw_wino_tiles']
    """
    return "nchw_wino4_tiles" if g.ow >= WINOGRAD4_MIN_WIDTH else "nchw_wino_tiles"


def winograd_channels(channels: int) -> int:
    """Input channels per block of a Winograd product: as few even blocks as hold WINOGRAD_CHANNEL_BLOCK each.

    >>> winograd_channels(64), winograd_channels(256), winograd_channels(512)
    (64, 256, 256)
    """
    blocks = -(-channels // WINOGRAD_CHANNEL_BLOCK)
    return -(-channels // blocks)


def tile_pixels(k: int, plane: int) -> int:
    """Output pixels per channels-first tile of a K-deep product over planes of `plane` pixels: what fills
    TILE_BYTES (in multiples of 16), but at least MIN_TILE_PIXELS, and at most the whole plane."""
    fits = max(16, min(MAX_TILE_PIXELS, TILE_BYTES // (4 * k) // 16 * 16))
    return min(plane, max(fits, MIN_TILE_PIXELS))


#: Floats per vector of the register tiles, by instruction set: AVX2's 256-bit registers, AVX-512's 512-bit ones.
TILE_VECTORS = (8, 16)


def tile_vector(features: Iterable[str]) -> int:
    """Floats per vector of the conv register tiles for a target with CPU `features` (/proc/cpuinfo spellings, as
    `rlx.toolchain.isa.required_features` gives them): 16 with AVX-512F (a tile of 6 output channels x 32 pixels in
    12 zmm registers: twice the multiply-adds per instruction; ResNet-18 at batch 1 on 2 cores of an AVX-512 Xeon,
    Winograd kernels 9.2 -> 7.1 ms), else 8.

    >>> tile_vector(("avx2", "fma", "avx512f")), tile_vector(("avx2", "fma")), tile_vector(())
    (16, 8, 8)
    """
    return 16 if "avx512f" in set(features) else 8


#: Most input channels (per group) of a conv run with the output channels in the lanes (`nchw_lanes`): a network's
#: stem on RGB images, whose K = C * kh * kw is too shallow for the pixel tiles' broadcast weights to pay.
LANES_MAX_CHANNELS = 4
#: Widest window row (taps) and most output channels of a `nchw_lanes` conv: a window row's weight vectors stay in
#: registers beside the V accumulators, and the channels' weights for the whole window in L1.
LANES_MAX_KW = 8
LANES_MAX_OUT = 256
#: Output rows per `nchw_lanes` work unit: a block of output channels goes over the band's rows before the next
#: block, so each output plane is written a band at a time (ResNet-18's stem with its output out of cache, 2 threads:
#: 0.92-0.98 ms with units of one row, 0.85-0.92 with bands of 8; noisy shared host).
LANES_ROWS = 8
#: Output rows and channels of a work unit of a conv with many input channels on `nchw_lanes` (`wide_lanes_fit`):
#: units small enough to be shared by the team at batch 1 (ResNet-18's 14-wide stage: 4 bands x 2 groups); with the
#: units claimed one at a time, rows 2-14 and groups of 32-256 channels measured within the host's noise, except 256
#: (0.84 vs 0.73 ms a conv); in ranges, groups of half the channels (`lanes_wide_channels`) where more than 64.
LANES_WIDE_ROWS = 4
LANES_CHANNELS = 64


def lanes_stem_channels(out_channels: int, vector: int) -> int:
    """Output channels per work unit of a stem on `nchw_lanes`: all of them up to one vector, else about half (whole
    vectors), so that the team's ranges of units (`ConvPlan.ranges`: groups outermost) are halves of the channels, as
    the max pool's after it takes them (ResNet-18's 3 -> 64 stem in two groups of 32, in the model on 2 threads: its
    pool 113-127 -> 74-80 us, the stem itself no slower).

    >>> [lanes_stem_channels(o, v) for o, v in ((64, 16), (16, 16), (48, 16), (64, 8))]
    [32, 16, 32, 32]
    """
    return out_channels if out_channels <= vector else -(-out_channels // 2 // vector) * vector


def lanes_wide_channels(out_channels: int, vector: int) -> int:
    """Output channels per work unit of a conv with many input channels on `nchw_lanes`: LANES_CHANNELS, or half of
    the channels (whole vectors) where that is more, so that the team's ranges (`ConvPlan.ranges`, groups outermost)
    are halves of the channels (ResNet-18's 14-wide stage, 256 channels in two groups of 128, in the model on 2
    threads, profiled, three alternations: 646-681 -> 625-649 us a conv; 64 -> 128 and 128 -> 256 stride-2 convs
    within the noise).

    >>> [lanes_wide_channels(o, 16) for o in (16, 64, 128, 256, 400)]
    [16, 64, 64, 128, 192]
    """
    return min(out_channels, max(LANES_CHANNELS, out_channels // 2 // vector * vector))


def lanes_fit(g: Window2d, op: Conv, out_channels: int, vector: int) -> bool:
    """Whether a conv runs with the output channels in the vector lanes (`direct` on `nchw_lanes`): groups 1, a
    window of 2+ taps whose rows have at most LANES_MAX_KW taps, output channels a multiple of `vector`, output rows of
    `vector`+ pixels, and either at most LANES_MAX_CHANNELS input channels and LANES_MAX_OUT output channels (ResNet's
    and MobileNetV3's stems: 3 -> 64, 7 x 7 stride 2 and 3 -> 16, 3 x 3 stride 2, on 112-wide rows) or
    `wide_lanes_fit`.

    >>> from rlx.ir.ops_conv import Conv
    >>> stem = Conv(strides=(2, 2), pads=(3, 3, 3, 3))
    >>> lanes_fit(window_2d(stem, (224, 224), (112, 112), (7, 7), 3), stem, 64, 16)
    True
    >>> lanes_fit(window_2d(stem, (224, 224), (112, 112), (7, 7), 3), stem, 24, 16)
    False
    """
    return (op.groups == 1 and g.kh * g.kw > 1 and g.kw <= LANES_MAX_KW and out_channels % vector == 0
            and ((g.cg <= LANES_MAX_CHANNELS and out_channels <= LANES_MAX_OUT and g.ow >= vector)
                 or wide_lanes_fit(op, g, out_channels, vector)))


def wide_lanes_fit(op: Conv, g: Window2d, out_channels: int, vector: int) -> bool:
    """Whether a conv with many input channels runs on `nchw_lanes`: 16-float vectors (AVX-512; 8-float targets
    keep their plans, not measured there), groups 1, window rows of at most LANES_MAX_KW taps, output channels a
    multiple of the vector, a window that `direct_fits` (`conv_plans` asks once a conv is not Winograd, or would be
    F(2x2, 3x3): F(4x4) stays): ResNet-18's stride-2 3 x 3 convs (56 -> 28 and
    28 -> 14) and its 14-wide stage (in the model, profiled, 2 threads, batch 1: 0.57 + 0.56 -> 0.42 + 0.44 ms and
    0.91-1.02 -> 0.73-0.77 ms a conv).

    >>> from rlx.ir.ops_conv import Conv
    >>> same, s2 = Conv(pads=(1, 1, 1, 1)), Conv(strides=(2, 2), pads=(1, 1, 1, 1))
    >>> [wide_lanes_fit(same, window_2d(same, (14, 14), (14, 14), (3, 3), 256), o, 16) for o in (256, 36)]
    [True, False]
    >>> wide_lanes_fit(s2, window_2d(s2, (56, 56), (28, 28), (3, 3), 64), 128, 16)
    True
    >>> wide_lanes_fit(s2, window_2d(s2, (56, 56), (28, 28), (3, 3), 64), 128, 8)
    False
    """
    return (vector == 16 and op.groups == 1 and g.kh * g.kw > 1 and g.kw <= LANES_MAX_KW
            and out_channels % vector == 0 and direct_fits(g))


#: Plans whose work units the team takes in even contiguous ranges a thread (`ConvPlan.ranges`; max and average pools
#: too, `PoolPlan.ranges`): a thread's share of the output is then the same run after run and next to what it wrote in
#: the kernels before, in its own core's cache. In the models, profiled on 2 threads at batch 1 (units one at a time
#: -> in ranges): MobileNetV3-small's pointwise convs on panels 17.6-18.7 -> 12.2-13 us (16 -> 16 on 56 x 56), 51-59
#: -> 38-40 (16 -> 72), 21-28 -> 16-22 (28 x 28), its depthwise convs 1-5 us less each; ResNet-18's 14-wide
#: `nchw_lanes` convs 566-627 -> 521-563 us, its stride-2 ones 326-382 -> 314-364, its max pool 117-127 -> 104-106.
#: The pointwise convs by the BLAS (``nchw``) take their units by blocks of output channels first (with pixel tiles
#: first, a thread's range split every plane in the middle of a cache line: 40 -> 240 on 14 x 14 26.7 -> 47.8 us).
TASK_RANGES = frozenset({("depthwise", "nchw"), ("depthwise", "nchw_rows"), ("depthwise", "nchw_row_shifts"),
                         ("pointwise", "nchw"), ("pointwise", "nchw_panels"), ("direct", "nchw_lanes")})


def with_ranges(plan: ConvPlan) -> ConvPlan:
    """`plan` with `ranges` set where its layout takes its units in ranges (TASK_RANGES)."""
    return dataclasses.replace(plan, ranges=True) if (plan.algorithm, plan.layout) in TASK_RANGES else plan


def conv_plans(lir: LirModule, vector: int = 8) -> tuple[ConvPlan, ...]:
    """The `ConvPlan` of every conv node of `lir`; `vector` (TILE_VECTORS, `tile_vector` of the target) is the
    floats per vector of the register tiles (direct, Winograd, pointwise on panels).

    Depthwise convolutions run on planes; 1x1 stride-1 unpadded ones multiply the planes as they lie (in
    register tiles on panels from POINTWISE_PANEL_PIXELS output pixels, by the BLAS below, or, with
    PACKED_MIN_CHANNELS+ output channels and a packable weight, on pixel-major tiles with the weight packed); 3x3
    stride-1 ones that `winograd_fits`, with WINOGRAD_MIN_CHANNELS+ output channels and a weight param of their
    own, run as Winograd (ResNet-18's 56, 28 and 14-wide stages: 1.2-1.5x less time than direct), F(4x4, 3x3)
    on rows of WINOGRAD4_MIN_WIDTH+ (`winograd_layout`; 0.73-0.78x F(2x2)'s time on the 56 and 28-wide stages);
    convs with few input channels (`lanes_fit`: the stems on RGB images) run with the output channels in the
    vector lanes, the weight stored blocked and transposed (ResNet-18's 7 x 7 stem in the model, 2 threads: 1.05-1.11 ->
    0.80-0.84 ms), and so, with 16-float vectors, do those that would run direct or as F(2x2, 3x3)
    (`wide_lanes_fit`: ResNet-18's stride-2 3 x 3 convs and 14-wide stage); other groups == 1 ones whose window
    has 2+ taps and whose output rows are DIRECT_MIN_WIDTH+ wide run
    direct on stride-phase planes (ResNet-18's 112, 56, 28 and 14-wide convs: 5-15% less time than on
    channels-first tiles, per-op minimum on Zen 3); wide ones (PACKED_MIN_CHANNELS) with a packable
    weight are an implicit GEMM on pixel-major tiles with the weight packed for the micro-kernel; every
    other one is an implicit GEMM on channels-first tiles (the receptive fields of a tile of output
    pixels, k-major, so each kernel row reads runs of an input row; the product lands in the output rows
    directly).
    """
    if vector not in TILE_VECTORS:
        raise ValueError(f"conv register tiles take vectors of {TILE_VECTORS} floats, not {vector}")
    graph = lir.graph
    users = graph.users()
    params = {spec.node for spec in lir.params}
    outputs = set(graph.outputs)

    def packable(w_id: int) -> bool:  # an f32 param read only as the weight of convs
        return (w_id in params and w_id not in outputs and graph.node(w_id).shape.dtype is DType.F32
                and all(isinstance(graph.node(u).op, Conv)
                        and [i for i, v in enumerate(graph.node(u).inputs) if v == w_id] == [1] for u in users[w_id]))

    out = []
    for n in graph.nodes:
        if not isinstance(n.op, Conv):
            continue
        x = graph.node(n.inputs[0]).shape
        w = graph.node(n.inputs[1]).shape
        o, cg, *kernel = w.static_dims
        if is_depthwise(n.op.groups, x.dims[1].value, o):
            geo = window_2d(n.op, tuple(d.value for d in x.dims[2:]), tuple(d.value for d in n.shape.dims[2:]),
                            tuple(kernel), cg)
            layout = ("nchw_rows" if depthwise_rows_fit(geo) else
                      "nchw_row_shifts" if depthwise_shifts_fit(geo, vector) else "nchw")
            out.append(ConvPlan(n.id, "depthwise", layout, n.inputs[1], False, vector=vector))
        elif (is_strided_pointwise(n.op, tuple(kernel))
              and math.prod(d.value for d in n.shape.dims[2:]) >= STRIDED_PANEL_PIXELS):
            # each image's planes subsampled into the thread's scratch, then the pointwise panels' register tiles
            out.append(ConvPlan(n.id, "pointwise", "nchw_panels", n.inputs[1], False, POINTWISE_PANELS,
                                channels=direct_channels(o, cg), vector=vector))
        elif is_pointwise(n.op, tuple(kernel)):
            plane = math.prod(d.value for d in n.shape.dims[2:])
            if plane >= POINTWISE_PANEL_PIXELS:
                out.append(ConvPlan(n.id, "pointwise", "nchw_panels", n.inputs[1], False, POINTWISE_PANELS,
                                    channels=direct_channels(o, cg), vector=vector))
            elif n.op.groups == 1 and plane > 1 and o >= PACKED_MIN_CHANNELS and packable(n.inputs[1]):
                # wide: the weight packed once for the micro-kernel, not by the BLAS on every call (MobileNetV3's
                # 96 -> 576 on 7 x 7: 46-48 -> 32-33 us; with 40-288 output channels the BLAS was faster)
                out.append(ConvPlan(n.id, "implicit_gemm", "nhwc_tiles", n.inputs[1], True, CONV_TILE_PIXELS,
                                    pack_depth(cg)))
            else:
                out.append(ConvPlan(n.id, "pointwise", "nchw", n.inputs[1], False, MAX_TILE_PIXELS))
        elif (n.op.groups == 1 and len(kernel) == 2 and o >= WINOGRAD_MIN_CHANNELS
              and winograd_fits(n.op, geo := window_2d(n.op, tuple(d.value for d in x.dims[2:]),
                                                       tuple(d.value for d in n.shape.dims[2:]), tuple(kernel), cg))
              and packable(n.inputs[1]) and users[n.inputs[1]] == [n.id]
              and not (winograd_layout(geo) == "nchw_wino_tiles" and wide_lanes_fit(n.op, geo, o, vector))):
            out.append(ConvPlan(n.id, "winograd", winograd_layout(geo), n.inputs[1], True, WINOGRAD_PANELS,
                                channels=winograd_channels(cg), vector=vector))
        elif (len(kernel) == 2 and lanes_fit(geo := window_2d(n.op, tuple(d.value for d in x.dims[2:]),
                                                              tuple(d.value for d in n.shape.dims[2:]),
                                                              tuple(kernel), cg), n.op, o, vector)
              and packable(n.inputs[1]) and users[n.inputs[1]] == [n.id]):
            # the output channels in the lanes, the weight blocked on set: a stem on RGB (few input channels), or
            # with 16-float vectors a conv that would run direct on phase planes or as F(2x2, 3x3) (wide_lanes_fit)
            stem = geo.cg <= LANES_MAX_CHANNELS
            out.append(ConvPlan(n.id, "direct", "nchw_lanes", n.inputs[1], True, vector,
                                channels=lanes_stem_channels(o, vector) if stem else lanes_wide_channels(o, vector),
                                vector=vector,
                                rows=LANES_ROWS if stem else LANES_WIDE_ROWS))
        elif n.op.groups == 1 and direct_fits(window_2d(n.op, tuple(d.value for d in x.dims[2:]),
                                                          tuple(d.value for d in n.shape.dims[2:]), tuple(kernel), cg)):
            out.append(ConvPlan(n.id, "direct", "nchw_phases", n.inputs[1], False, DIRECT_PANELS,
                                channels=direct_channels(o, cg * math.prod(kernel)), vector=vector))
        elif n.op.groups == 1 and o >= PACKED_MIN_CHANNELS and packable(n.inputs[1]):
            out.append(ConvPlan(n.id, "implicit_gemm", "nhwc_tiles", n.inputs[1], True, CONV_TILE_PIXELS,
                                pack_depth(cg * math.prod(kernel))))
        else:
            k = cg * math.prod(kernel)
            plane = math.prod(d.value for d in n.shape.dims[2:])
            out.append(ConvPlan(n.id, "implicit_gemm", "nchw_tiles", n.inputs[1], False, tile_pixels(k, plane)))
    return tuple(with_ranges(p) for p in out)


def pool_plans(lir: LirModule, vector: int = 8) -> tuple[PoolPlan, ...]:
    """The `PoolPlan` of every 1-D or 2-D `pool` node of `lir`: an average pool along output rows (``nchw``); a max
    pool whose window `depthwise_rows_fit` (3 x 3, stride 2, pads 1, output rows of DW_ROWS_MIN_WIDTH+ pixels:
    ResNet's stem pool) row by row straight from the plane (``nchw_rows``: its phase copy cost as much as the window,
    ResNet-18's pool in the model, 2 threads: 0.20 -> 0.135 ms), any other max pool on stride-phase copies
    (``nchw_phases``); every one's planes taken in contiguous ranges a thread (`ranges`, as TASK_RANGES' convs).

    >>> from rlx.ir.graph import Graph
    >>> from rlx.opt.memplan import plan
    >>> g = Graph("p")
    >>> x = g.input("x", [1, 4, 64, 64])
    >>> g.set_outputs([g.pool("max", x, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), g.pool("max", x, (2, 2))])
    >>> [d.describe() for d in pool_plans(plan(g), 16)]  # doctest: +NORMALIZE_WHITESPACE
    ['%1 pool: max on nchw_rows (rows straight from the plane, 16-float vectors, planes in contiguous ranges a
      thread)',
     '%2 pool: max on nchw_phases (stride-phase copies of each plane, planes in contiguous ranges a thread)']
    """
    out = []
    for n in lir.graph.nodes:
        if not isinstance(n.op, Pool) or len(n.op.kernel) > 2:
            continue
        if n.op.fn != "max":
            out.append(PoolPlan(n.id, "nchw", ranges=True))
            continue
        x = lir.graph.node(n.inputs[0]).shape
        geo = window_2d(n.op, tuple(d.value for d in x.dims[2:]), tuple(d.value for d in n.shape.dims[2:]),
                        n.op.kernel, 1)
        out.append(PoolPlan(n.id, "nchw_rows", vector, ranges=True) if depthwise_rows_fit(geo)
                   else PoolPlan(n.id, "nchw_phases", ranges=True))
    return tuple(out)

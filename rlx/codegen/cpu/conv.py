"""CPU rules for the convolution family: `conv` and `pool` (`rlx.ir.ops_conv`).

Registered into the CPU rule table when `rlx.codegen` is imported. A conv is
rendered as its LIR `ConvPlan` says (`rlx.opt.lowering_conv`): an implicit GEMM
on pixel-major tiles gathered into per-thread scratch (the packed micro-kernel
when the weight is stored packed, `rlx_sgemm1` otherwise), a 1x1 product in register tiles on the planes
as they lie (pointwise), a direct or depthwise window on padded, stride-phase copies of channel planes,
Winograd F(2x2, 3x3) on 2x2-pixel tiles or F(4x4, 3x3) on 4x4 (the weight transformed at set_param: `params.py`); bias
and activation are applied in the channels-first store. Pooling runs per plane. Loops: `templates/cpu/kernels/conv.h`,
macros: `templates/cpu/conv.c.j2`. f32 only (legalization widens f16/bf16).

>>> import rlx
>>> g = rlx.Graph("c")
>>> x, w = g.input("x", [1, 4, 8, 8]), g.param("w", [8, 4, 3, 3])
>>> g.set_outputs([g.pool("max", g.conv(x, w, activation="relu"), (2, 2), strides=(2, 2))])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cpu")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import align64, c_string, comment, node_header
from rlx.codegen.registry import Kernel, RuleSet, float32_only
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.decisions_conv import CONV_TILE_PIXELS, WINOGRAD_TILE, ConvInputScale, ConvPlan, ConvResidual, PoolPlan
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.ops_conv import Conv, Pool, Window2d, pool_kernel_why_not, window_2d
from rlx.opt.lowering_conv_scale import SCALE_PLANS

#: This module's CPU rules (the table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "conv.c.j2"
#: conv.h's loops; packed_gemm.h for rlx_split, rlx_pgemm and the activation epilogue.
HEADERS = ("kernels/packed_gemm.h", "kernels/conv.h")


@dataclass(frozen=True)
class ConvArgs:
    """C expressions and sizes of one `conv` kernel (macro `conv`)."""

    comment: str
    algorithm: str
    layout: str
    packed: bool
    tile: int
    depth: int
    channels: int
    taps: str
    phases: int
    planes_offset: int
    x: str
    wt: str
    bias: str
    y: str
    n: str
    o: int
    og: int
    k: int
    groups: int
    act: str
    c_offset: int
    cg: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    ph: int
    pw: int
    #: Winograd: output pixels per tile side (2: F(2x2, 3x3), 4: F(4x4, 3x3)), tile rows and columns, columns of
    #: the phase planes (tw + 1), tiles of an image padded to whole panels, floats of one phase plane of its
    #: (m + 2) x (m + 2), stride-m patches
    m: int = 0
    th: int = 0
    tw: int = 0
    wq: int = 0
    lp: int = 0
    pl: int = 0
    #: Winograd F(4x4): tiles per tile row as numbered (`winograd_pitch`)
    tp: int = 0
    #: floats per vector of the register tiles (`ConvPlan.vector`; 0: none)
    vector: int = 0
    #: `nchw_lanes`: each row's runs of pixels (`lanes_runs`)
    runs: tuple[tuple[int, int, int, int, int], ...] = ()
    #: `nchw_lanes`: output rows per task (a band)
    rows: int = 0
    #: `nchw_panels` with strides: bytes into the thread's scratch of the subsampled image
    sub_offset: int = 0
    #: a residual add in the store (`ConvResidual`): the other operand, read where the store writes ("": none)
    residual: str = ""
    #: a squeeze-excite product in the weight (`ConvInputScale`): the scale a channel ``[N, C]`` ("": none); `x`
    #: is then the product's other operand
    scale: str = ""
    #: `ConvPlan.ranges`: the team takes the work units in contiguous ranges a thread, not one at a time
    ranges: bool = False


@dataclass(frozen=True)
class PoolArgs:
    """C expressions and sizes of one `pool` kernel (macro `pool`)."""

    comment: str
    x: str
    y: str
    planes: str
    is_max: int
    count_pad: int
    cg: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    ph: int
    pw: int
    peh: int
    pew: int
    #: max pools: each window tap's offset into a plane's phase planes (`tap_offsets`)
    taps: str = ""
    #: `PoolPlan.layout`, `vector` and `ranges`
    layout: str = "nchw_phases"
    vector: int = 0
    ranges: bool = False


def _geom_fields(g: Window2d) -> dict:
    return {f: getattr(g, f) for f in ("cg", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "dh", "dw", "ph", "pw")}


#: Output pixels a depthwise window accumulates at a time (RLX_DW_VEC in kernels/conv.h).
DW_VEC = 32


#: Output pixels of one direct-conv tile and panel with 8-float vectors (RLX_CONV_PX8 in kernels/conv.h; two vectors:
#: `ConvPlan.panel`, 32 with 16-float ones).
DIRECT_PIXELS = 16


def phase_plane_floats(g: Window2d) -> int:
    """Floats of one stride-phase plane of an input plane (rlx_conv_dw_phase in kernels/conv.h): (HQ + 1) x WQ
    and DW_VEC of slack.

    >>> from rlx.ir.ops_conv import Conv
    >>> phase_plane_floats(window_2d(Conv(pads=(1, 1, 1, 1)), (8, 8), (8, 8), (3, 3), 4))
    142
    """
    return (g.phase_rows + 1) * g.phase_cols + DW_VEC


def tap_offsets(g: Window2d) -> tuple[int, ...]:
    """Offset of each window tap (kh, kw) into a channel's phase planes (rlx_conv_phase_copy in kernels/conv.h):
    its phase plane, row and column.
    A direct or depthwise conv's source holds them as constants.

    >>> from rlx.ir.ops_conv import Conv
    >>> tap_offsets(window_2d(Conv(strides=(2, 2), pads=(1, 1, 1, 1)), (8, 8), (4, 4), (3, 3), 4))
    (0, 62, 1, 124, 186, 125, 5, 67, 6)
    """
    wq = g.phase_cols
    plane = phase_plane_floats(g)
    return tuple(((kh * g.dh % g.sh) * g.sw + kw * g.dw % g.sw) * plane + kh * g.dh // g.sh * wq + kw * g.dw // g.sw
                 for kh in range(g.kh) for kw in range(g.kw))


def depthwise_scratch_floats(g: Window2d) -> int:
    """Floats of scratch one plane of a depthwise conv takes (rlx_conv_dw_scratch in kernels/conv.h): its
    SH*SW stride-phase copies, each (HQ + 1) x WQ plus DW_VEC of slack, and its WQ-wide output.

    >>> from rlx.ir.ops_conv import Conv
    >>> depthwise_scratch_floats(window_2d(Conv(strides=(2, 2), pads=(1, 1, 1, 1), groups=4), (8, 8), (4, 4),
    ...                                    (3, 3), 1))
    280
    """
    out = -(-g.oh * g.phase_cols // DW_VEC) * DW_VEC
    return g.sh * g.sw * phase_plane_floats(g) + out


def winograd_pitch(m: int, th: int, tw: int, panel: int = DIRECT_PIXELS) -> int:
    """Tiles per tile row as an F(m x m) conv numbers them. F(4x4) takes the phase planes' width tw + 1 (a dropped
    column; each panel's patches are one contiguous run, whole vectors for the transforms) unless that needs more
    than 1/8 more `panel`-tile panels than tw: on ResNet's 56-wide stage 14 16-tile panels instead of 13 measured
    2.1 vs 2.6 ms (64 channels, batch 1, one thread), on its 28-wide stage both are 4 panels. F(2x2) always takes tw.

    >>> winograd_pitch(4, 7, 7), winograd_pitch(4, 14, 14), winograd_pitch(4, 4, 4), winograd_pitch(2, 28, 28)
    (8, 15, 4, 28)
    >>> winograd_pitch(4, 14, 14, 32), winograd_pitch(4, 3, 10, 32)
    (15, 10)
    """
    if m == 4 and 8 * -(-th * (tw + 1) // panel) <= 9 * -(-th * tw // panel):
        return tw + 1
    return tw


@dataclass(frozen=True)
class WinogradTiles:
    """The m x m-pixel tiles of a Winograd F(m x m, 3x3) conv on one image (rlx_conv_winograd_* and
    rlx_conv_winograd4_* in kernels/conv.h): (m + 2)^2 transformed elements per tile.

    >>> from rlx.ir.ops_conv import Conv
    >>> geo = window_2d(Conv(pads=(1, 1, 1, 1)), (56, 56), (56, 56), (3, 3), 64)
    >>> t = WinogradTiles.of(geo, 2)
    >>> t.th, t.tw, t.wq, t.lp, t.pl, t.scratch_floats(64, 64)
    (28, 28, 29, 784, 902, 1605632)
    >>> t = WinogradTiles.of(geo, 4)
    >>> t.th, t.tw, t.wq, t.lp, t.pl, t.scratch_floats(64, 64)
    (14, 14, 15, 224, 272, 1032192)
    >>> WinogradTiles.of(window_2d(Conv(pads=(1, 1, 1, 1)), (28, 28), (28, 28), (3, 3), 64), 4, 32).lp
    64
    """

    m: int
    th: int
    tw: int
    wq: int
    lp: int
    pl: int
    #: tiles per tile row as numbered (F(2x2): tw; F(4x4): `winograd_pitch`)
    tp: int

    @classmethod
    def of(cls, g: Window2d, m: int, panel: int = DIRECT_PIXELS) -> WinogradTiles:
        """The tiles of `g` for F(m x m), numbered in panels of `panel` tiles (`ConvPlan.panel`)."""
        th, tw = -(-g.oh // m), -(-g.ow // m)
        wq = tw + 1
        tp = winograd_pitch(m, th, tw, panel)
        lp = -(-th * tp // panel) * panel
        return cls(m, th, tw, wq, lp, (th + 2) * wq + DW_VEC, tp)  # (HQ + 1) x WQ + slack, HQ = th + 1

    @property
    def elements(self) -> int:
        """Transformed elements per tile: (m + 2)^2."""
        return (self.m + 2) ** 2

    def thread_floats(self) -> int:
        """Floats of one thread's own buffers: one channel's m x m phase planes, m output rows (m TW wide) and,
        for F(4x4), one output channel's pixels tile-major ([16, lp])."""
        return self.m ** 2 * (self.pl + self.tw) + (16 * self.lp if self.m == 4 else 0)

    def scratch_floats(self, channels: int, out_channels: int) -> int:
        """Floats of V [E, C, lp] and M [E, O, lp], one image's transformed input and products."""
        return self.elements * (channels + out_channels) * self.lp


def lanes_runs(g: Window2d, vector: int) -> tuple[tuple[int, int, int, int, int], ...]:
    """How a conv on `nchw_lanes` cuts each output row: as few runs of at most `vector` pixels as cover it, of equal
    length (the last maybe shorter), each a call of rlx_conv_lanes_block<V> with its length and the window columns
    ``[j0, j1)`` of its receptive field inside the plane as constants. Consecutive runs alike are one entry
    ``(first output column, runs, pixels a run, j0, j1)``.

    >>> from rlx.ir.ops_conv import Conv
    >>> stem = Conv(strides=(2, 2), pads=(3, 3, 3, 3))
    >>> lanes_runs(window_2d(stem, (224, 224), (112, 112), (7, 7), 3), 16)
    ((0, 1, 16, 3, 37), (16, 5, 16, 0, 37), (96, 1, 16, 0, 35))
    >>> s2 = Conv(strides=(2, 2), pads=(1, 1, 1, 1))
    >>> lanes_runs(window_2d(s2, (56, 56), (28, 28), (3, 3), 64), 16)
    ((0, 1, 14, 1, 29), (14, 1, 14, 0, 29))
    >>> lanes_runs(window_2d(Conv(pads=(1, 1, 1, 1)), (14, 14), (14, 14), (3, 3), 256), 16)
    ((0, 1, 14, 1, 15),)
    """
    n = -(-g.ow // vector)
    r = -(-g.ow // n)
    runs: list[list[int]] = []
    for ow0 in range(0, g.ow, r):
        px = min(r, g.ow - ow0)
        iw0 = ow0 * g.sw - g.pw
        tc = (px - 1) * g.sw + (g.kw - 1) * g.dw + 1
        j0, j1 = min(tc, max(0, -iw0)), max(0, min(tc, g.w - iw0))
        if runs and runs[-1][2:] == [px, j0, j1]:
            runs[-1][1] += 1
        else:
            runs.append([ow0, 1, px, j0, j1])
    return tuple(tuple(run) for run in runs)  # type: ignore[misc]


def emit_conv(em, node: Node) -> Kernel:
    """The `conv` kernel of a node, as its `ConvPlan` decides."""
    op: Conv = node.op  # type: ignore[assignment]
    plan = next((d for d in em.lir.decided(ConvPlan) if d.node == node.id), None)
    if plan is None:
        raise BuildError(f"%{node.id} conv has no ConvPlan in the LIR: decide the LIR for the CPU first")
    x = em.node(node.inputs[0]).shape
    o, cg, *kernel = em.node(node.inputs[1]).shape.static_dims
    # a residual add the store computes: it writes the add's value (and its activation) into the add's buffer
    res = next((d for d in em.lir.decided(ConvResidual) if d.node == node.id), None)
    if res is not None and op.activation is not None:
        raise BuildError(f"%{node.id} conv has its own activation and a ConvResidual: the lowering never pairs them")
    stored = f"; stores %{res.add} = {res.activation or ''}(conv + %{res.residual})" if res else ""
    # a squeeze-excite product computed in the weight: the conv reads the product's operands
    sc = next((d for d in em.lir.decided(ConvInputScale) if d.node == node.id), None)
    if sc is not None and (plan.algorithm, plan.layout) not in SCALE_PLANS:
        raise BuildError(f"%{node.id} conv on {plan.layout} has a ConvInputScale: only {sorted(SCALE_PLANS)} take one")
    if sc is not None:
        stored += f"; reads %{sc.mul} = %{sc.x} * %{sc.scale}"
    geo = window_2d(op, tuple(d.value for d in x.dims[2:]), tuple(d.value for d in node.shape.dims[2:]),
                   tuple(kernel), cg)
    k = cg * geo.kh * geo.kw
    og = o // op.groups
    a_bytes = align64(CONV_TILE_PIXELS * k * 4)
    wino = WinogradTiles.of(geo, WINOGRAD_TILE[plan.layout], plan.panel) if plan.algorithm == "winograd" else None
    planes_offset = (align64(wino.scratch_floats(cg, o) * 4) if wino
                     else align64(plan.channels * plan.tile * plan.panel * 4))
    args = ConvArgs(
        comment=comment(f"conv {plan.algorithm} on {plan.layout}: {x} * w[{o},{cg},{','.join(map(str, kernel))}] "
                        f"groups={op.groups}{stored}"),
        algorithm=plan.algorithm, layout=plan.layout, packed=plan.packed, tile=plan.tile,
        depth=plan.depth or cg * geo.kh * geo.kw, channels=plan.channels or o,
        taps=", ".join(map(str, tap_offsets(geo))), phases=geo.sh * geo.sw * phase_plane_floats(geo),
        planes_offset=planes_offset,
        x=em.ptr(sc.x if sc else node.inputs[0]), scale=em.ptr(sc.scale) if sc else "",
        wt=em.ptr(node.inputs[1]),
        bias=em.ptr(node.inputs[2]) if len(node.inputs) == 3 else "",
        y=em.ptr(res.add if res else node.id, const=False), residual=em.ptr(res.residual) if res else "",
        n=em.dim(x.dims[0]), o=o, og=og, k=k, groups=op.groups,
        act=(res.activation if res else op.activation) or "", c_offset=a_bytes,
        vector=plan.vector, runs=lanes_runs(geo, plan.vector) if plan.layout == "nchw_lanes" else (),
        rows=plan.rows, sub_offset=align64((cg + og) * plan.panel * 4), ranges=plan.ranges,
        **_geom_fields(geo),
        **({f: getattr(wino, f) for f in ("m", "th", "tw", "wq", "lp", "pl", "tp")} if wino else {}))
    label = c_string(f"%{node.id} conv" + (f" ({node.name[:60]})" if node.name else ""))
    if wino:  # V and M of one image, then the thread's own buffers
        scratch = planes_offset + align64(wino.thread_floats() * 4)
    elif plan.layout == "nchw_lanes":  # a run's V x V block of output
        scratch = align64(plan.vector ** 2 * 4)
    elif plan.algorithm == "direct":  # each thread's unit of output, then one image's phase planes
        scratch = args.planes_offset + align64(cg * args.phases * 4)
    elif plan.layout == "nchw_panels":  # a plane's partial last panel and its product (strided: the subsampled image)
        scratch = align64((cg + og) * plan.panel * 4)
        if geo.sh > 1 or geo.sw > 1:
            scratch += align64(cg * geo.oh * geo.ow * 4)
        elif sc is not None:  # a block of the weight scaled by the image's scale
            scratch += align64(og * k * 4)
    elif plan.layout == "nhwc_tiles":  # pixel-major receptive fields and the product's tile
        scratch = a_bytes + align64(CONV_TILE_PIXELS * og * 4)
    elif plan.algorithm == "implicit_gemm":  # channels-first receptive fields of one tile
        scratch = align64(plan.tile * k * 4)
    elif sc is not None:  # pointwise by the BLAS: a block of the weight scaled by the image's scale
        scratch = align64(og * k * 4)
    elif plan.layout == "nchw_rows":  # depthwise from the plane: one output row, whole vectors
        scratch = align64(-(-geo.ow // plan.vector) * plan.vector * 4)
    elif plan.layout == "nchw_row_shifts":  # the output rows (a vector each), the plane's last 4 vectors, 2 zero ones
        scratch = align64((geo.oh + 6) * plan.vector * 4)
    else:  # depthwise: the padded phase planes and the output of one plane
        scratch = align64(depthwise_scratch_floats(geo) * 4)
    return Kernel(node.id, "conv", TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label, scratch_per_thread=scratch)


def emit_pool(em, node: Node) -> Kernel:
    """The `pool` kernel of a node: each thread takes whole channel planes."""
    op: Pool = node.op  # type: ignore[assignment]
    x = em.node(node.inputs[0]).shape
    geo = window_2d(op, tuple(d.value for d in x.dims[2:]), tuple(d.value for d in node.shape.dims[2:]),
                   op.kernel, 1)
    is_max = op.fn == "max"
    plan = next((d for d in em.lir.decided(PoolPlan) if d.node == node.id), None)
    if plan is None:
        raise BuildError(f"%{node.id} pool has no PoolPlan in the LIR: decide the LIR for the CPU first")
    args = PoolArgs(comment=comment(f"{op.fn} pool {op.kernel} of {x} on {plan.layout}"), x=em.ptr(node.inputs[0]),
                    y=em.ptr(node.id, const=False), planes=em.numel(x.dims[:2]), is_max=int(is_max),
                    count_pad=int(op.count_include_pad), peh=geo.peh, pew=geo.pew, **_geom_fields(geo),
                    taps=", ".join(map(str, tap_offsets(geo))) if is_max else "", layout=plan.layout,
                    vector=plan.vector, ranges=plan.ranges)
    label = c_string(f"%{node.id} pool" + (f" ({node.name[:60]})" if node.name else ""))
    if plan.layout == "nchw_rows":  # one output row, whole vectors
        scratch = align64(-(-geo.ow // plan.vector) * plan.vector * 4)
    elif is_max:  # each plane's stride-phase planes (as a depthwise conv's, -inf in the pads)
        scratch = align64(depthwise_scratch_floats(geo) * 4)
    else:
        scratch = 0
    return Kernel(node.id, "pool", TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label, scratch_per_thread=scratch)


RULES.register("conv", accepts=float32_only)(emit_conv)
def _pool_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return pool_kernel_why_not(op) or float32_only(op, in_dtypes, out_dtype)


RULES.register("pool", accepts=_pool_accepts)(emit_pool)

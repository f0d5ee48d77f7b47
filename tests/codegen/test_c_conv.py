"""The CPU convolution family (`rlx/codegen/cpu/conv.py`, kernels/conv.h) against the numpy reference.

One graph holds every variant, compiled once with a dynamic batch and run at two batch sizes:
implicit GEMM on channels-first tiles (strided, padded, grouped, dilated, 1-D), on pixel-major
tiles with the weight packed (384 channels), direct on stride-phase planes (rows of 14+ pixels:
odd sizes, channels not a multiple of the 6-channel tile, stride 2, a 7x7 stem, dilation with
uneven pads, 1-D, and channel blocks of a wide K; a 1x1 stride-2 conv stays on tiles), Winograd F(2x2, 3x3)
(3x3 stride 1 with 32+ channels: odd output sizes, uneven pads, the weight transformed at set_param) and F(4x4, 3x3)
(rows of 28+: partial tiles in both axes), direct with the output channels in the lanes (3 input channels: a 7x7
stride-2 stem and a dilated 3x3 with uneven pads, partial runs of pixels), pointwise
(1x1 on the planes as they lie, by the BLAS: 110 pixels, a single pixel, grouped, 3 pixels: one tile split by output
channels; in register tiles on a 520-pixel plane: a partial last panel, two blocks of input channels, grouped),
depthwise (strided with hardswish fused, dilated, uneven pads, 1-D), max / average pooling (pads, ceil_mode,
count_include_pad, dilations, 1-D, and 3-D decomposed into two 2-D pools), and batch_norm
(decomposed into primitives). The packed micro-kernel and the no-micro-kernel fallback (an x86-64
build without AVX2) both run, and the register tiles on 8-float vectors (x86-64; x86-64-v3, AVX2) and on 16-float
ones (x86-64-v4, where the CPU has AVX-512F; native on such a CPU).
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import session, x86_targets

import rlx
from rlx.ir.decisions_conv import ConvPlan, PoolPlan
from rlx.opt.lowering_conv import TASK_RANGES

BATCH = rlx.Dim.dynamic("b", max=3)


def _graph() -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(31)
    g = rlx.Graph("convs")
    params: dict[str, np.ndarray] = {}

    def param(name: str, shape: list[int], positive: bool = False) -> int:
        v = rng.standard_normal(shape).astype(np.float32) * np.float32(0.5)
        params[name] = np.abs(v) + np.float32(0.5) if positive else v
        return g.param(name, shape)

    x = g.input("x", [BATCH, 5, 11, 10])
    seq = g.input("seq", [BATCH, 6, 23])
    vol = g.input("vol", [BATCH, 3, 6, 7, 5])
    img = g.input("img", [BATCH, 7, 9, 31])
    deep = g.input("deep", [BATCH, 40, 7, 16])
    plane = g.input("plane", [BATCH, 6, 1, 3])
    pooled = g.input("pooled", [BATCH, 240, 2, 3])
    wide_plane = g.input("wide_plane", [BATCH, 40, 20, 26])
    chans = g.input("chans", [BATCH, 260, 3, 16])
    wino4 = g.input("wino4", [BATCH, 33, 9, 30])
    rows = g.input("rows", [BATCH, 3, 5, 36])
    small = g.input("small", [BATCH, 4, 6, 7])
    rgb = g.input("rgb", [BATCH, 3, 20, 37])
    outs = {
        # 100+ output pixels: more than one 96-pixel tile per image
        "strided": g.conv(x, param("w_s", [7, 5, 3, 3]), param("b_s", [7]), strides=(2, 1), pads=(1, 2, 0, 1),
                          activation="relu"),
        # pointwise (1x1, stride 1, no pads): 110 pixels, one pixel (a squeeze-excite style 1x1 on a pooled
        # vector), grouped
        "pointwise": g.conv(x, param("w_p", [33, 5, 1, 1])),
        "pointwise_pixel": g.conv(g.pool("avg", deep, (7, 16)), param("w_pp", [24, 40, 1, 1]), param("b_pp", [24]),
                                  activation="relu"),
        # one pixel with 150 x 240 weights (RLX_GEMV_TEAM_MIN+): the team shares the matrix-vector product, four
        # rows at a time, blocks of 40 output channels (the last one 30: two rows alone)
        "pointwise_pixel_team": g.conv(g.pool("avg", pooled, (2, 3)), param("w_ppt", [150, 240, 1, 1]),
                                       param("b_ppt", [150])),
        "pointwise_grouped": g.conv(deep, param("w_pg", [20, 20, 1, 1]), groups=2),
        # a 520-pixel plane: register tiles on 16-pixel panels (32 whole, one of 8 pixels); 40 channels: two blocks
        # of input channels accumulated in the output rows; 13 output channels: tiles of 6, 6 and 1; grouped
        "pointwise_panels": g.conv(wide_plane, param("w_pd", [13, 40, 1, 1]), param("b_pd", [13]), activation="relu"),
        "pointwise_panels_grouped": g.conv(wide_plane, param("w_pdg", [10, 20, 1, 1]), groups=2),
        # 1x1 stride 2 on 10 x 13 outputs (128+ pixels: a downsample): the image subsampled into scratch, then the
        # panels' register tiles (4 whole panels and a partial one of 8-float vectors' 16 or 16-float ones' 32)
        "pointwise_strided": g.conv(wide_plane, param("w_ps", [14, 40, 1, 1]), param("b_ps", [14]), strides=(2, 2),
                                    activation="relu"),
        # 3 pixels on 2+ threads: one tile (a plane under 128 pixels), the team sharing it by blocks of output channels
        "pointwise_tail": g.conv(plane, param("w_pt", [5, 6, 1, 1]), param("b_pt", [5]), activation="relu"),
        # wide: the weight packed for the micro-kernel, pixel-major tiles; a wide pointwise conv on a small plane too
        "pointwise_wide": g.conv(deep, param("w_pw", [392, 40, 1, 1]), param("b_pw", [392]), activation="relu"),
        "wide": g.conv(x, param("w_w", [384, 5, 3, 3]), param("b_w", [384]), pads=(1, 1, 1, 1), activation="silu"),
        # 416 channels on one 48-pixel tile: at batch 1 the team shares it, each thread whole 32-wide panels
        # (13 blocks of 32, not 26 of 16: the second thread's first block once began inside a 32-wide panel)
        "wide_shared": g.conv(g.pool("max", x, (2, 2), strides=(2, 1)), param("w_ws", [416, 5, 3, 3]),
                              pads=(1, 1, 1, 1)),
        "grouped": g.conv(g.conv(x, param("w_e", [8, 5, 1, 1])), param("w_g", [6, 4, 3, 2]), param("b_g", [6]),
                          groups=2, dilations=(2, 3), pads=(2, 2, 2, 2), activation="gelu"),
        "depthwise": g.conv(x, param("w_d", [5, 1, 5, 5]), param("b_d", [5]), groups=5, strides=(2, 2),
                            pads=(2, 2, 2, 2), activation="hardswish"),
        # depthwise: stride 1 with dilation and uneven pads; strides 3 x 2 with a dilated, uneven window; 1-D
        "depthwise_dilated": g.conv(x, param("w_dd", [5, 1, 3, 3]), groups=5, dilations=(2, 1), pads=(1, 0, 2, 1),
                                    activation="relu"),
        "depthwise_s3": g.conv(x, param("w_d3", [5, 1, 3, 2]), param("b_d3", [5]), groups=5, strides=(3, 2),
                               dilations=(1, 2), pads=(0, 1, 2, 0)),
        # 3 x 3 stride 2 on rows of 16+ outputs: straight from the plane (nchw_rows); 36 columns (even: whole vectors
        # past a row's end read the next row, a copy on the plane's last row), 31 (odd: column W is a pad, a copy)
        "depthwise_rows": g.conv(rows, param("w_dr", [3, 1, 3, 3]), param("b_dr", [3]), groups=3, strides=(2, 2),
                                 pads=(1, 1, 1, 1), activation="hardswish"),
        "depthwise_rows_odd": g.conv(img, param("w_dro", [7, 1, 3, 3]), groups=7, strides=(2, 2), pads=(1, 1, 1, 1)),
        # stride 1 on rows and columns that fit a vector (nchw_row_shifts): uneven pads (taps shifted -2 .. 2 lanes; the
        # plane's last rows from the copy of its end), 8 and 16-float vectors; 11 x 10 with 3 x 3 (16-float vectors)
        "depthwise_shifts": g.conv(small, param("w_ds", [4, 1, 5, 5]), param("b_ds", [4]), groups=4,
                                   pads=(1, 2, 3, 1), activation="hardswish"),
        "depthwise_shifts_3x3": g.conv(x, param("w_ds3", [5, 1, 3, 3]), groups=5, pads=(1, 1, 1, 1), activation="relu"),
        # strides 2 (the rows split into even and odd columns): 5 x 5 on 6 x 7, 3 x 3 on 11 x 10 (8-float vectors: two
        # per input row); "depthwise" above runs there too
        "depthwise_shifts_s2": g.conv(small, param("w_ds2", [4, 1, 5, 5]), param("b_ds2", [4]), groups=4,
                                      strides=(2, 2), pads=(2, 1, 1, 2)),
        "depthwise_shifts_s2_wide": g.conv(x, param("w_dsw", [5, 1, 3, 3]), groups=5, strides=(2, 2), pads=(1, 0, 0, 1),
                                           activation="relu"),
        "depthwise_1d": g.conv(seq, param("w_d1", [6, 1, 3]), param("b_d1", [6]), groups=6, pads=(1, 1)),
        "audio": g.conv(g.conv(seq, param("w_a1", [9, 6, 3]), param("b_a1", [9]), pads=(1, 1), activation="gelu"),
                        param("w_a2", [9, 9, 3]), param("b_a2", [9]), strides=(2,), pads=(1, 1), activation="gelu"),
        # direct (rows of 14+ output pixels): 13 channels (two 6-channel tiles and a 1-channel one)
        "direct": g.conv(img, param("w_x", [13, 7, 3, 3]), param("b_x", [13]), pads=(1, 1, 1, 1), activation="relu"),
        "direct_s2": g.conv(img, param("w_x2", [10, 7, 3, 3]), strides=(2, 2), pads=(1, 1, 1, 1)),
        "direct_stem": g.conv(img, param("w_x7", [9, 7, 7, 7]), param("b_x7", [9]), strides=(2, 2),
                              pads=(3, 3, 3, 3), activation="silu"),
        "direct_dilated": g.conv(img, param("w_xd", [8, 7, 3, 2]), strides=(1, 2), dilations=(2, 3),
                                 pads=(2, 0, 1, 3)),
        # Winograd F(2x2, 3x3) (3x3, stride 1, 32+ channels, rows of 14+): odd output sizes (partial tiles cropped),
        # uneven pads, 38 output channels (6-channel tiles and a 2-channel one); 260 input channels: two blocks of 130
        "winograd": g.conv(wide_plane, param("w_wg", [38, 40, 3, 3]), param("b_wg", [38]), pads=(1, 0, 2, 1),
                           activation="relu"),
        "winograd_deep": g.conv(deep, param("w_wd", [36, 40, 3, 3]), pads=(1, 1, 1, 1)),
        "winograd_blocks": g.conv(chans, param("w_wb", [34, 260, 3, 3]), param("b_wb", [34]), pads=(1, 1, 1, 1)),
        # Winograd F(4x4, 3x3) (rows of 28+): 9 x 30 outputs (partial tiles in both axes cropped), uneven pads,
        # 34 output channels (6-channel tiles and a 4-channel one), 33 input channels
        "winograd4": g.conv(wino4, param("w_w4", [34, 33, 3, 3]), param("b_w4", [34]), pads=(2, 1, 0, 1),
                            activation="relu"),
        # 8 x 32 outputs: 2 x 8 tiles numbered 8 to a row (9, the phase planes' width, would take two panels, not one)
        "winograd4_pitch": g.conv(wino4, param("w_w4p", [32, 33, 3, 3]), pads=(0, 2, 1, 2)),
        "tiles_1x1_s2": g.conv(img, param("w_x1", [6, 7, 1, 1]), param("b_x1", [6]), strides=(2, 2)),
        # few input channels (a stem on RGB): the output channels in the lanes (nchw_lanes), the weight transposed on
        # set; 10 x 19 outputs (runs of 16 or 8 pixels and a partial one, the first and last runs' windows past the
        # edges, rows past the top and bottom), 32 channels (two vectors of 16, four of 8); dilated with uneven pads and
        # column stride 2, no bias
        "lanes_stem": g.conv(rgb, param("w_l7", [32, 3, 7, 7]), param("b_l7", [32]), strides=(2, 2), pads=(3, 3, 3, 3),
                             activation="relu"),
        "lanes_dilated": g.conv(rgb, param("w_ld", [16, 3, 3, 3]), strides=(1, 2), dilations=(2, 1), pads=(1, 0, 2, 1),
                                activation="hardswish"),
        # many input channels with the output channels in the lanes where the vectors have 16 floats (wide_lanes_fit:
        # else direct on phase planes or F(2x2, 3x3)): stride 2 on a 31-wide row (one run of 16, both edges in the
        # pads); stride 1 on 7 x 16 (80 channels: groups of 64 and 16); 25-wide rows with uneven pads (two runs of 13)
        "lanes_wide_s2": g.conv(img, param("w_lw2", [16, 7, 3, 3]), param("b_lw2", [16]), strides=(2, 2),
                                pads=(1, 1, 1, 1), activation="relu"),
        "lanes_wide": g.conv(deep, param("w_lw", [80, 40, 3, 3]), param("b_lw", [80]), pads=(1, 1, 1, 1)),
        "lanes_wide_uneven": g.conv(wide_plane, param("w_lwu", [16, 40, 3, 3]), pads=(0, 1, 1, 0),
                                    activation="hardswish"),
        # K = 40 x 7 x 7: the 36 output channels' weights take two 18-channel blocks
        "direct_blocks": g.conv(deep, param("w_xb", [36, 40, 7, 7]), param("b_xb", [36]), pads=(3, 3, 3, 3)),
        "maxpool": g.pool("max", x, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
        # 3 x 3 stride 2 pads 1 on rows of 16+ outputs: row by row from the plane (PoolPlan nchw_rows); W even and odd
        "maxpool_rows": g.pool("max", rows, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
        "maxpool_rows_odd": g.pool("max", img, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
        "avgpool_ceil": g.pool("avg", x, (3, 2), strides=(2, 2), pads=(1, 0, 1, 1), ceil_mode=True),
        "avgpool_pad": g.pool("avg", x, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=True),
        "maxpool_1d": g.pool("max", seq, (3,), strides=(2,), ceil_mode=True),
        "avgpool_dilated": g.pool("avg", x, (3, 2), strides=(1, 2), pads=(2, 1, 1, 0), dilations=(2, 3)),
        "maxpool_3d": g.pool("max", vol, (3, 2, 2), strides=(2, 2, 1), pads=(1, 0, 1, 1, 1, 0), dilations=(1, 2, 1),
                             ceil_mode=True),
        "avgpool_3d_pad": g.pool("avg", vol, (2, 3, 2), strides=(2, 2, 2), pads=(1, 1, 0, 1, 1, 1), ceil_mode=True,
                                 count_include_pad=True),
        "avgpool_3d": g.pool("avg", vol, (3, 3, 3), strides=(1, 2, 2), pads=(1, 1, 1, 1, 1, 1), dilations=(2, 1, 2)),
        "batch_norm": g.batch_norm(x, param("bn_s", [5]), param("bn_b", [5]), param("bn_m", [5]),
                                   param("bn_v", [5], positive=True), eps=1e-3),
    }
    g.set_outputs(outs)
    return g, params


def _feeds(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    return {"x": rng.standard_normal((batch, 5, 11, 10)).astype(np.float32),
            "seq": rng.standard_normal((batch, 6, 23)).astype(np.float32),
            "vol": rng.standard_normal((batch, 3, 6, 7, 5)).astype(np.float32),
            "img": rng.standard_normal((batch, 7, 9, 31)).astype(np.float32),
            "deep": rng.standard_normal((batch, 40, 7, 16)).astype(np.float32),
            "plane": rng.standard_normal((batch, 6, 1, 3)).astype(np.float32),
            "pooled": rng.standard_normal((batch, 240, 2, 3)).astype(np.float32),
            "wide_plane": rng.standard_normal((batch, 40, 20, 26)).astype(np.float32),
            "chans": rng.standard_normal((batch, 260, 3, 16)).astype(np.float32),
            "wino4": rng.standard_normal((batch, 33, 9, 30)).astype(np.float32),
            "rows": rng.standard_normal((batch, 3, 5, 36)).astype(np.float32),
            "small": rng.standard_normal((batch, 4, 6, 7)).astype(np.float32),
            "rgb": rng.standard_normal((batch, 3, 20, 37)).astype(np.float32)}


def _has_flags(*flags: str) -> bool:
    from rlx.toolchain.isa import X86_LEVELS, cpu_flags

    have = cpu_flags() or frozenset()
    # a level's build is refused unless the CPU has every feature of that level
    level = "x86-64-v4" if "avx512f" in flags else "x86-64-v3"
    return set(flags) <= have and set(X86_LEVELS[level]) <= have


def _has_avx512() -> bool:
    return _has_flags("avx512f")


@pytest.fixture(scope="module")
def built() -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    return _graph()


@pytest.mark.parametrize("target", x86_targets("x86-64", "x86-64-v3", "x86-64-v4"))
def test_every_variant_matches_the_reference(built: tuple[rlx.Graph, dict[str, np.ndarray]], target: str) -> None:
    g, params = built
    sess = session(cpu_target=target)
    cg = sess.compile(g)
    # the scratch the plan sizes (direct convs: each thread's output units and phase planes) is what the context holds
    assert sess.estimate(g).scratch == cg.memory()["scratch"]
    for name, value in params.items():
        cg.set_param(name, value)
    plans = {(d.algorithm, d.layout) for d in cg.lir.decided(ConvPlan)}
    assert plans == {("implicit_gemm", "nchw_tiles"), ("implicit_gemm", "nhwc_tiles"), ("pointwise", "nchw"),
                     ("pointwise", "nchw_panels"),
                     ("depthwise", "nchw"), ("depthwise", "nchw_rows"), ("depthwise", "nchw_row_shifts"),
                     ("direct", "nchw_phases"), ("direct", "nchw_lanes"),
                     ("winograd", "nchw_wino_tiles"), ("winograd", "nchw_wino4_tiles")}
    assert {d.channels for d in cg.lir.decided(ConvPlan) if d.algorithm == "direct"} >= {13, 18}
    assert any(d.packed for d in cg.lir.decided(ConvPlan))
    # the strided 1x1 conv on 130 output pixels: pointwise panels over the subsampled image
    assert ("pointwise", "nchw_panels") in {(d.algorithm, d.layout) for d in cg.lir.decided(ConvPlan)
                                            if tuple(cg.lir.graph.node(d.weight).shape.static_dims) == (14, 40, 1, 1)}
    # the wide 1x1 conv on a 112-pixel plane: pixel-major tiles, its weight packed at set_param
    assert ("implicit_gemm", "nhwc_tiles", True) in {(d.algorithm, d.layout, d.packed) for d in cg.lir.decided(ConvPlan)
                                                     if tuple(cg.lir.graph.node(d.weight).shape.static_dims)
                                                     == (392, 40, 1, 1)}
    # register tiles on the target's vectors: AVX-512's 16 floats where the target has it, else 8 (x86-64: 8)
    want_vector = 16 if target == "x86-64-v4" or (target == "native" and _has_avx512()) else 8
    assert {d.vector for d in cg.lir.decided(ConvPlan) if d.algorithm in ("direct", "winograd", "depthwise")
            or d.layout == "nchw_panels"} == {want_vector}
    assert f"{want_vector}-float vectors" in cg.lir.inspect()
    assert "batch_norm" not in {n.kind for n in cg.lir.graph.nodes}  # decomposed before the CPU rules
    assert all(len(n.op.kernel) <= 2 for n in cg.lir.graph.nodes if n.kind == "pool")  # 3-D: two 2-D pools
    assert "conv: implicit_gemm on nchw_tiles (weight %" in cg.lir.inspect()
    assert "conv: depthwise on nchw (" in cg.lir.inspect()
    assert "conv: depthwise on nchw_rows (" in cg.lir.inspect()
    assert "conv: depthwise on nchw_row_shifts (" in cg.lir.inspect()
    assert "conv: winograd on nchw_wino_tiles (weight %" in cg.lir.inspect()
    assert "pool: max on nchw_rows" in cg.lir.inspect() and "pool: max on nchw_phases" in cg.lir.inspect()
    assert "conv: direct on nchw_lanes (weight %" in cg.lir.inspect()
    assert "x C*kh*kw x" in cg.lir.inspect()
    # depthwise, pointwise and lanes convs and every pool take their units in contiguous ranges a thread
    assert {(d.algorithm, d.layout) for d in cg.lir.decided(ConvPlan) if d.ranges} == TASK_RANGES
    assert all(d.ranges for d in cg.lir.decided(PoolPlan))
    assert "units in contiguous ranges a thread" in cg.lir.inspect()
    assert "planes in contiguous ranges a thread" in cg.lir.inspect()
    # many input channels in the lanes only with 16-float vectors, in units of 4 rows x 64 channels at most
    wide = {(d.channels, d.rows) for d in cg.lir.decided(ConvPlan)
            if d.layout == "nchw_lanes" and cg.lir.graph.node(d.weight).shape.static_dims[1] > 4}
    assert wide == ({(16, 4), (64, 4)} if want_vector == 16 else set())
    # stems: every channel up to a vector's, else about half (32 -> two groups of 16; 16 with 8-float vectors: 8 + 8)
    stems = {d.channels for d in cg.lir.decided(ConvPlan)
             if d.layout == "nchw_lanes" and cg.lir.graph.node(d.weight).shape.static_dims[1] <= 4}
    assert stems == ({16} if want_vector == 16 else {16, 8})
    assert {d.channels for d in cg.lir.decided(ConvPlan) if d.layout == "nchw_wino_tiles"} == {40, 130}
    assert "conv: winograd on nchw_wino4_tiles (weight %" in cg.lir.inspect()
    assert "36 x O x C on set for F(4x4, 3x3)" in cg.lir.inspect()
    for batch in (3, 2, 1):  # 2 images on 2 threads: one each (direct convs: no team barrier)
        feeds = _feeds(batch)
        got = cg.run(**feeds)
        want = rlx.reference.run(g, feeds, params)
        for name, a, b in zip(g.output_names, got, want):
            assert a.shape == b.shape, name
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()), err_msg=name)


def test_units_in_ranges_or_claimed_give_the_same_values(built: tuple[rlx.Graph, dict[str, np.ndarray]]) -> None:
    """A spinning team takes the units of the plans with `ranges` in contiguous ranges a thread (stealing at their
    ends), one that does not spin claims them one at a time: every variant the same bit for bit either way, at batch 1
    (the team shares one image's units) and 3, and both threads at work."""
    from rlx.runtime.team import WaitPolicy

    g, params = built
    cg = rlx.Session(profile=True).compile(g, num_threads=2)
    for name, value in params.items():
        cg.set_param(name, value)
    cg.team.threads = 2
    for batch in (1, 3):
        feeds = _feeds(batch)
        cg.team.policy = WaitPolicy(spins=True, adaptive=False, source="test")  # hold the team where it is set
        spinning = cg.run(**feeds)
        cg.run(**{k: np.zeros_like(v) for k, v in feeds.items()})  # other values in the arena: a unit left undone shows
        cg.trace(clear=True)
        cg.team.policy = WaitPolicy(spins=False, adaptive=False, source="test")
        claimed = cg.run(**feeds)
        assert cg._pool.primary.team == (2, False)
        spans = [s for s in cg.trace(clear=True) if s.thread >= 0]
        assert {s.thread for s in spans if s.kind in ("conv", "pool")} == {0, 1}
        want = rlx.reference.run(g, feeds, params)
        for name, a, b, w in zip(g.output_names, spinning, claimed, want):
            np.testing.assert_array_equal(a, b, err_msg=name)
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()), err_msg=name)


def test_f16_conv_runs_in_f32_between_casts() -> None:
    """The conv rule takes f32: legalization widens an f16 conv's inputs and rounds its result back."""
    g = rlx.Graph("f16conv")
    x = g.input("x", [2, 3, 6, 6], "f16")
    g.set_outputs([g.conv(x, g.param("w", [4, 3, 3, 3], "f16"), pads=(1, 1, 1, 1), activation="relu")])
    rng = np.random.default_rng(5)
    xv, wv = (rng.standard_normal(s).astype(np.float16) for s in ((2, 3, 6, 6), (4, 3, 3, 3)))
    cg = session().compile(g)
    cg.set_param("w", wv)
    got = cg.run(x=xv)[0]
    want = rlx.reference.run(g, {"x": xv}, {"w": wv})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-2)


def test_max_pool_on_phase_planes_keeps_nan_and_pads() -> None:
    """A max pool runs on stride-phase planes with -inf in the pads: a NaN in a window wins it, a pad never does
    (an all-negative plane), a ceil_mode window past the end pad takes only its cells inside the input."""
    g = rlx.Graph("maxpool_nan")
    x = g.input("x", [2, 3, 9, 12])
    g.set_outputs({"s2": g.pool("max", x, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
                   "ceil": g.pool("max", x, (3, 2), strides=(2, 3), pads=(0, 1, 1, 0), ceil_mode=True),
                   "dilated": g.pool("max", x, (2, 3), strides=(1, 2), pads=(1, 2, 0, 2), dilations=(2, 2))})
    xv = -np.abs(np.random.default_rng(7).standard_normal((2, 3, 9, 12)).astype(np.float32)) - np.float32(1.0)
    xv[0, 1, 4, 5] = np.nan
    xv[1, 2, 0, 0] = np.nan
    xv[1, 0, 8, 11] = -np.inf
    cg = session().compile(g)
    got = cg.run(x=xv)
    want = rlx.reference.run(g, {"x": xv}, {})
    for name, a, b in zip(g.output_names, got, want):
        assert np.isnan(a).sum() > 0, name  # the NaN windows
        np.testing.assert_array_equal(a, b, err_msg=name)  # a max is exact, NaN where the reference's is


@pytest.mark.parametrize("target", x86_targets("x86-64", "x86-64-v3", "x86-64-v4"))
@pytest.mark.parametrize("width", [36, 35, 64])
def test_max_pool_by_rows_keeps_nan_and_pads(target: str, width: int) -> None:
    """A 3 x 3 stride-2 max pool with pads 1 on output rows of 16+ pixels runs row by row straight from the plane
    (PoolPlan nchw_rows, ResNet's stem pool): the same results as the reference, bit for bit: a NaN in a window wins
    it, a pad never does (an all-negative plane, -inf values), on rows whose vectors pass the row's end (even widths:
    the next row's columns; odd ones and the plane's last row: a copy padded with -inf), batch and planes split over
    the team."""
    from rlx.ir.decisions_conv import PoolPlan

    g = rlx.Graph("maxpool_rows")
    x = g.input("x", [BATCH, 3, 9, width])
    g.set_outputs([g.pool("max", x, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1))])
    cg = session(cpu_target=target).compile(g)
    assert [d.layout for d in cg.lir.decided(PoolPlan)] == ["nchw_rows"]
    assert "pool: max on nchw_rows" in cg.lir.inspect()
    for batch in (3, 1):
        xv = -np.abs(np.random.default_rng(batch).standard_normal((batch, 3, 9, width)).astype(np.float32)) - 1
        xv[0, 1, 4, 5] = np.nan
        xv[0, 2, 8, width - 1] = np.nan  # the plane's last row and column
        xv[-1, 0, 0, 0] = -np.inf
        xv[-1, 0, 3, 17:20] = np.nan
        got = cg.run(x=xv)[0]
        want = rlx.reference.run(g, {"x": xv}, {})[0]
        assert np.isnan(got).sum() >= 3
        np.testing.assert_array_equal(got, want)

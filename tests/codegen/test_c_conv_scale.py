"""Squeeze-excite products computed in the weight of the pointwise conv that reads them (`ConvInputScale`,
`rlx/opt/lowering_conv_scale.py`) against the numpy reference: either operand order, a dynamic batch (each image its
own scale), one-pixel and odd planes, planes on panels (a partial last panel too), a bias, an activation and a
residual add in the same conv's store, more output channels than a block, 8 and 16-float vectors; and the products
that stay a pass.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import compiled_with, match_reference_at, session, x86_targets

import rlx
from rlx.ir.decisions_conv import ConvInputScale, ConvPlan, ConvResidual
from rlx.opt.lowering_conv_scale import SCALE_MAX_WEIGHT

BATCH = rlx.Dim.dynamic("b", max=3)

#: name -> (input [C, H, W], output channels, activation, residual add after the conv)
CASES = {
    "se_7x7": ((96, 7, 7), 24, None, True),
    "se_14x14": ((40, 14, 14), 16, "hardswish", False),
    "odd_plane": ((13, 5, 3), 11, "relu", False),
    "one_pixel": ((24, 1, 1), 9, None, False),
    "wide_out": ((16, 6, 6), 72, None, True),
    "panels": ((16, 24, 28), 16, "relu", False),
    "panels_partial": ((24, 23, 29), 40, None, True),
}


def _graph() -> tuple[rlx.Graph, dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
    rng = np.random.default_rng(11)
    g = rlx.Graph("conv_scales")
    params: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    outs = {}
    for name, ((c, h, w), o, act, residual) in CASES.items():
        x = g.input(f"x_{name}", [BATCH, c, h, w])
        shapes[f"x_{name}"], shapes[f"s_{name}"] = (c, h, w), (c, 1, 1)
        # a squeeze-excite scale computed in the arena (as the model's hardsigmoid of the block's 1x1 convs; on a
        # one-pixel plane the input itself, an activation there would fuse with the product)
        s = g.input(f"s_{name}", [BATCH, c, 1, 1])
        if h * w > 1:
            s = g.activation("sigmoid", s)
        # the product's operand computed in the arena too, by a depthwise conv (as the model's)
        params[f"d_{name}"] = (rng.standard_normal((c, 1, 3, 3)) * 0.3).astype(np.float32)
        h1 = g.conv(x, g.param(f"d_{name}", [c, 1, 3, 3]), pads=(1, 1, 1, 1), groups=c, activation="relu")
        params[f"w_{name}"] = (rng.standard_normal((o, c, 1, 1)) * 0.3).astype(np.float32)
        params[f"b_{name}"] = (rng.standard_normal(o) * 0.3).astype(np.float32)
        prod = g.mul(s, h1) if name.startswith("s") else g.mul(h1, s)  # either operand order
        y = g.conv(prod, g.param(f"w_{name}", [o, c, 1, 1]), g.param(f"b_{name}", [o]), activation=act)
        if residual:
            shapes[f"r_{name}"] = (o, h, w)
            y = g.add_(y, g.input(f"r_{name}", [BATCH, o, h, w]))
        outs[name] = y
    g.set_outputs(outs)
    return g, params, shapes


@pytest.mark.parametrize("target", x86_targets("x86-64-v3"))
def test_products_in_the_pointwise_weight_match_the_reference(target: str) -> None:
    g, params, shapes = _graph()
    cg = compiled_with(g, params, cpu_target=target)
    decided = cg.lir.decided(ConvInputScale)
    plans = {d.node: (d.algorithm, d.layout) for d in cg.lir.decided(ConvPlan)}
    assert len(decided) == len(CASES)
    assert {plans[d.node] for d in decided} == {("pointwise", "nchw"), ("pointwise", "nchw_panels")}
    assert len(cg.lir.decided(ConvResidual)) == 3  # the residual adds still in the same convs' stores
    assert "the per-channel product in the conv's weight" in cg.lir.inspect()
    assert cg.source.count("(ConvInputScale)") >= len(CASES)
    match_reference_at(cg, g, params, shapes, (3, 1, 2))


def test_products_that_stay_a_pass() -> None:
    """No fusion when the product has another reader or is a graph output, when the scale is not a channel's (a
    full tensor, or a pixel's), when the conv is not pointwise (a window, strides) or its weight is over
    SCALE_MAX_WEIGHT floats; the results still match."""
    rng = np.random.default_rng(5)
    g = rlx.Graph("no_scale")
    x = g.input("x", [2, 8, 6, 6])
    s = g.input("s", [2, 8, 1, 1])
    big_c = SCALE_MAX_WEIGHT // 64 + 8
    xb = g.input("xb", [1, big_c, 2, 2])
    sb = g.input("sb", [1, big_c, 1, 1])
    xp = g.input("xp", [1, 8, 32, 32])
    params = {"w": (rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32),
              "w3": (rng.standard_normal((4, 8, 3, 3)) * 0.3).astype(np.float32),
              "wb": (rng.standard_normal((64, big_c, 1, 1)) * 0.1).astype(np.float32)}
    w = g.param("w", [4, 8, 1, 1])
    two = g.mul(x, s)
    shown = g.mul(g.activation("tanh", x), s)
    full = g.mul(x, g.activation("tanh", x))
    pixel = g.mul(x, g.input("sp", [2, 1, 6, 6]))
    window = g.mul(g.activation("exp", x), s)
    g.set_outputs({"two_readers": g.conv(two, w), "also": g.activation("relu", two), "shown": shown,
                   "shown_conv": g.conv(shown, w), "full": g.conv(full, w), "pixel": g.conv(pixel, w),
                   "window": g.conv(window, g.param("w3", [4, 8, 3, 3]), pads=(1, 1, 1, 1)),
                   "big": g.conv(g.mul(xb, sb), g.param("wb", [64, big_c, 1, 1])),
                   "strided": g.conv(g.mul(xp, g.input("sq", [1, 8, 1, 1])), w, strides=(2, 2))})
    cg = session().compile(g)
    for name, value in params.items():
        cg.set_param(name, value)
    assert cg.lir.decided(ConvInputScale) == []
    feeds = {"x": rng.standard_normal((2, 8, 6, 6)).astype(np.float32),
             "s": rng.standard_normal((2, 8, 1, 1)).astype(np.float32),
             "sp": rng.standard_normal((2, 1, 6, 6)).astype(np.float32),
             "xb": rng.standard_normal((1, big_c, 2, 2)).astype(np.float32),
             "sb": rng.standard_normal((1, big_c, 1, 1)).astype(np.float32),
             "xp": rng.standard_normal((1, 8, 32, 32)).astype(np.float32),
             "sq": rng.standard_normal((1, 8, 1, 1)).astype(np.float32)}
    for name, a, b in zip(g.output_names, cg.run(**feeds), rlx.reference.run(g, feeds, params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()), err_msg=name)

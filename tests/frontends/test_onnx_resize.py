"""`rlx.frontends.onnx_resize`: ONNX Resize over static axes (nearest by any factor, linear, cubic; axes and
aspect-ratio policies), one model compiled once for the CPU and checked against the reference and
onnxruntime for two inputs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper
from onnx_helpers import _check, _model, _vi

F = TensorProto.FLOAT


def _resize(out: str, scales: str = "", sizes: str = "", **attrs: object) -> object:
    inputs = ["x", "", scales] + ([sizes] if sizes else [])
    return helper.make_node("Resize", inputs, [out], **attrs)


def test_resize_modes_equal_onnxruntime(rng: np.random.Generator) -> None:
    nodes = [
        _resize("lin_up", "s_up", mode="linear"),
        _resize("lin_down_ac", "s_down", mode="linear", coordinate_transformation_mode="align_corners"),
        _resize("lin_sizes", sizes="sz", mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
        _resize("cubic_up", "s_up", mode="cubic"),
        _resize("cubic_excl", "s_down", mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5),
        _resize("near_down", "s_down", mode="nearest"),
        _resize("near_sizes", sizes="sz", mode="nearest", nearest_mode="ceil",
                coordinate_transformation_mode="asymmetric"),
        _resize("near_axes", sizes="sz_hw", mode="nearest", axes=[3, 2], keep_aspect_ratio_policy="not_larger"),
    ]
    inits = [("s_up", np.array([1, 1, 2, 1.5], np.float32)), ("s_down", np.array([1, 1, 0.6, 0.75], np.float32)),
             ("sz", np.array([2, 3, 7, 5], np.int64)), ("sz_hw", np.array([9, 7], np.int64))]
    outs = [n.output[0] for n in nodes]
    model = _model(nodes, [_vi("x", F, [2, 3, 5, 4])], [_vi(o, F, None) for o in outs], inits=inits, opset=19)
    feeds = [{"x": rng.standard_normal((2, 3, 5, 4)).astype(np.float32)} for _ in range(2)]
    _check(model, feeds)

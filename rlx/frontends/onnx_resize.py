"""ONNX ``Resize`` over static axes: nearest, linear and cubic, every coordinate transform but
``tf_crop_and_resize``, ``axes`` and ``keep_aspect_ratio_policy``, as ONNX's reference computes them.

Resizing is separable: each resized axis maps output position ``x`` to a source coordinate (the
coordinate transform), takes the n nearest source positions around it (n = 2 for nearest and
linear, 4 for cubic; positions beyond the edge read the edge value) and weighs them (one-hot for
nearest, by the distance for linear, Keys' cubic kernel with ``cubic_coeff_a`` for cubic;
``exclude_outside`` drops the positions beyond the edge and renormalizes). The importer computes
those positions and weights once, in float64, and emits per axis one `gather` per tap (a nearest
resize: one gather, exact for any dtype) and the weighted sum of the taps.

>>> index, weight = _taps(4, 8, 2.0, "nearest", "asymmetric", "floor", -0.75, False)
>>> [int(index[int(np.argmax([w[x] for w in weight]))][x]) for x in range(8)]  # each output's one-hot tap
[0, 0, 1, 1, 2, 2, 3, 3]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx.errors import IRError
from rlx.ir.graph import NodeId

#: Coordinate transforms computed here (tf_crop_and_resize needs its roi and extrapolation value).
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source(x: int, n_in: int, n_out: int, scale: float, transform: str) -> float:
    """The source coordinate of output position `x` (ONNX's coordinate transforms)."""
    width = scale * n_in  # the real-valued output length the transforms use
    if transform == "align_corners":
        return 0.0 if width == 1 else x * (n_in - 1) / (width - 1)
    if transform == "asymmetric":
        return x / scale
    if transform == "pytorch_half_pixel":
        return -0.5 if width == 1 else (x + 0.5) / scale - 0.5
    if transform == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (x + 0.5) / scale - 0.5
    return (x + 0.5) / scale - 0.5  # half_pixel


def _weights(ratio: float, mode: str, rounding: str, a: float) -> list[float]:
    """The taps' weights for a source coordinate `ratio` past the left tap of the middle pair, in (0, 1]."""
    if mode == "nearest":
        if ratio == 1:
            return [0.0, 1.0]
        right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False,
                 "ceil": True}[rounding]
        return [float(not right), float(right)]
    if mode == "linear":
        return [1 - ratio, ratio]
    d = [1 + ratio, ratio, 1 - ratio, 2 - ratio]  # distances of the four taps (Keys' kernel, parameter a)
    return [((a * t - 5 * a) * t + 8 * a) * t - 4 * a if t > 1 else ((a + 2) * t - (a + 3)) * t * t + 1 for t in d]


def _taps(n_in: int, n_out: int, scale: float, mode: str, transform: str, rounding: str, a: float,
          exclude_outside: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per tap: the source index of every output position (clamped to the edge) and its weight."""
    n = 4 if mode == "cubic" else 2
    index = np.zeros((n, n_out), np.int64)
    weight = np.zeros((n, n_out), np.float64)
    for x in range(n_out):
        src = _source(x, n_in, n_out, scale, transform)
        left = math.ceil(src) - 1  # the middle pair is (left, left + 1); the source sits in (left, left + 1]
        w = np.array(_weights(src - left, mode, rounding, a))
        pos = np.arange(left - (n // 2 - 1), left + n // 2 + 1)
        if exclude_outside:
            w = np.where((pos < 0) | (pos >= n_in), 0.0, w)
            w = w / w.sum()
        index[:, x] = np.clip(pos, 0, n_in - 1)
        weight[:, x] = w
    return list(index), list(weight)


def resize_static(imp: Any, node: Any, x: NodeId, axes: Sequence[int], mode: str, transform: str,
                  rounding: str) -> NodeId:
    """`x` resized along `axes` (all static), reading the scales or sizes of `node` as ONNX's Resize does."""
    g = imp.g
    dims = [d.value for d in g.shape(x).dims]
    if transform not in TRANSFORMS or (mode == "nearest" and rounding not in _NEAREST):
        raise IRError(f"Resize coordinate_transformation_mode={transform!r}, nearest_mode={rounding!r} is not "
                      f"supported (transforms: {', '.join(TRANSFORMS)})")
    if node.attr("antialias", 0):
        raise IRError("Resize antialias=1 is not supported")
    if mode != "nearest" and not g.shape(x).dtype.is_float:
        raise IRError(f"Resize mode={mode!r} needs a float input, got {g.shape(x).dtype}")
    policy = node.attr("keep_aspect_ratio_policy", "stretch") or "stretch"
    if node.input(3) is not None:
        sizes = [int(v) for v in imp.static(node, 3, "sizes").reshape(-1)]
        if len(sizes) != len(axes):
            raise IRError(f"Resize has {len(sizes)} sizes for axes {list(axes)}")
        scales = [s / dims[a] for a, s in zip(axes, sizes)]
        if policy in ("not_larger", "not_smaller"):
            common = min(scales) if policy == "not_larger" else max(scales)
            scales = [common] * len(axes)
            sizes = [int(common * dims[a] + 0.5) for a in axes]
        elif policy != "stretch":
            raise IRError(f"Resize keep_aspect_ratio_policy={policy!r} is not one of stretch, not_larger, not_smaller")
    else:
        scales = [float(v) for v in np.asarray(imp.static(node, 2, "scales"), np.float64).reshape(-1)]
        if len(scales) != len(axes):
            raise IRError(f"Resize has {len(scales)} factors for axes {list(axes)} of a rank-{len(dims)} input")
        if any(not s > 0 for s in scales):
            raise IRError(f"Resize scales {scales} must be positive")
        sizes = [int(s * dims[a]) for a, s in zip(axes, scales)]
    a_cubic = float(node.attr("cubic_coeff_a", -0.75))
    exclude = bool(node.attr("exclude_outside", 0))
    for axis, scale, size in zip(axes, scales, sizes):
        if size == dims[axis] and scale == 1:
            continue
        index, weight = _taps(dims[axis], size, scale, mode, transform, rounding, a_cubic, exclude)
        if mode == "nearest":  # two one-hot taps: one gather of the chosen source per position, exact
            x = g.gather(x, g.constant(np.where(weight[1] > 0, index[1], index[0]), "i64"), axis)
        else:
            shape = [1] * len(dims)
            shape[axis] = size
            terms = [g.mul(g.gather(x, g.constant(idx, "i64"), axis),
                           g.constant(w.reshape(shape), g.shape(x).dtype)) for idx, w in zip(index, weight)]
            x = terms[0]
            for t in terms[1:]:  # left to right, as ONNX's reference sums them
                x = g.add_(x, t)
        dims[axis] = size
    return x

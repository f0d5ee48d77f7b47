"""ONNX handlers of the convolution family, merged into `rlx.frontends.onnx.HANDLERS`.

Conv (1-D / 2-D, groups, dilations, pads and every `auto_pad` mode), ConvTranspose (as a conv over
the input with zeros woven in, its weight flipped at import), BatchNormalization
(inference: folded into the preceding Conv's weight and bias at import when that conv
has param weights, else the `batch_norm` op), MaxPool / AveragePool (1-D / 2-D / 3-D,
`ceil_mode`, `count_include_pad`, dilations), GlobalAveragePool / GlobalMaxPool (a mean / max over the
spatial axes), Pad (constant / reflect / edge / wrap, as slices, gathers and concatenations), Resize (nearest
neighbour by integer factors, as a broadcast), and the ops around them in torch's vision
exports: HardSwish, HardSigmoid, Flatten. Each handler takes the importer and the node, as the main table's do, and
reads only the importer's public helpers (`tensor`, `value`, `known`, `emit`, `g`,
`params`, `add_initializer`), so this module imports nothing from `rlx.frontends.onnx`.

>>> sorted(CONV_HANDLERS)[:4]
['AveragePool', 'BatchNormalization', 'Conv', 'ConvTranspose']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlx.errors import IRError
from rlx.frontends.onnx_resize import resize_static
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.ops_conv import Conv, pads_for_auto
from rlx.ir.shape import Dim, normalize_axis, product

Handler = Callable[[Any, Any], list[Any]]


def _spatial_rank(what: str, dims: tuple[Dim, ...], most: int = 2) -> int:
    r = len(dims) - 2
    if not 1 <= r <= most:
        forms = ("1-D ([N, C, L])", "2-D ([N, C, H, W])", "3-D ([N, C, D, H, W])")[:most]
        raise IRError(f"{what} over {r} spatial axes: RLX supports {', '.join(forms)} inputs")
    if not all(d.is_static for d in dims[1:]):
        raise IRError(f"{what} needs static channel and spatial sizes (only the batch may be dynamic), got "
                      f"[{', '.join(map(str, dims))}]")
    return r


def _window(node: Any, sizes: tuple[int, ...], kernel: tuple[int, ...],
            strides: tuple[int, ...], dilations: tuple[int, ...]) -> tuple[int, ...]:
    """The explicit pads (begins, then ends) of a window node: `pads`, or those its `auto_pad` implies."""
    r = len(sizes)
    auto = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto != "NOTSET":
        if node.attr("pads") is not None and any(node.attr("pads")):
            raise IRError(f"auto_pad={auto} and explicit pads {list(node.attr('pads'))} together")
        try:
            return pads_for_auto(auto, sizes, kernel, strides, dilations)
        except Exception as exc:
            raise IRError(str(exc)) from None
    pads = tuple(int(p) for p in (node.attr("pads") or [0] * (2 * r)))
    if len(pads) != 2 * r:
        raise IRError(f"pads {list(pads)} must hold {2 * r} values (begins, then ends)")
    return pads


def _ints_attr(node: Any, key: str, r: int) -> tuple[int, ...]:
    v = tuple(int(s) for s in (node.attr(key) or [1] * r))
    if len(v) != r:
        raise IRError(f"{key} {list(v)} must hold {r} values")
    return v


def _conv(imp: Any, node: Any) -> list[Any]:
    x = imp.tensor(node.inputs[0])
    w = imp.tensor(node.inputs[1])
    bias = imp.tensor(node.input(2)) if node.input(2) is not None else None
    xs, ws = imp.g.shape(x), imp.g.shape(w)
    r = _spatial_rank("Conv", xs.dims)
    if ws.rank != r + 2 or not ws.is_static:
        raise IRError(f"Conv weight must be a static rank-{r + 2} tensor, got {ws}")
    kernel = tuple(d.value for d in ws.dims[2:])
    if node.attr("kernel_shape") is not None and tuple(node.attr("kernel_shape")) != kernel:
        raise IRError(f"kernel_shape {list(node.attr('kernel_shape'))} disagrees with the weight {ws}")
    strides, dilations = _ints_attr(node, "strides", r), _ints_attr(node, "dilations", r)
    pads = _window(node, tuple(d.value for d in xs.dims[2:]), kernel, strides, dilations)
    return [imp.emit(imp.g.conv(x, w, bias, strides=strides, dilations=dilations, pads=pads,
                                groups=int(node.attr("group", 1))))]


def _zero_stuff(imp: Any, x: int, axis: int, stride: int) -> int:
    """x with stride - 1 zeros between neighbours along static `axis` (length (n - 1) * stride + 1)."""
    g = imp.g
    dims = list(g.shape(x).dims)
    n = dims[axis].value
    col = g.reshape(x, [*dims[:axis + 1], Dim(1), *dims[axis + 1:]])
    zeros = g.expand(g.constant(np.zeros([1] * (len(dims) + 1), np.float32), g.shape(x).dtype),
                     [*dims[:axis + 1], Dim(stride - 1), *dims[axis + 1:]])
    woven = g.reshape(g.concat([col, zeros], axis + 1), [*dims[:axis], Dim(n * stride), *dims[axis + 1:]])
    return g.narrow(woven, axis, 0, (n - 1) * stride + 1)


def _conv_transpose(imp: Any, node: Any) -> list[Any]:
    """ConvTranspose as a conv: the input with zeros woven in (stride), padded by d*(k-1) - pad, convolved
    with the weight flipped and its in/out channels swapped (per group): a new param made at import."""
    x = imp.tensor(node.inputs[0])
    xs = imp.g.shape(x)
    r = _spatial_rank("ConvTranspose", xs.dims)
    w_name = node.inputs[1]
    w = imp.known(w_name)
    if w is not None and w.dtype != object:
        w = np.asarray(w, np.float32)
        w_shape = list(w.shape)
    else:  # a run-time weight: flipped and turned by graph ops (static shape)
        w = None
        w_dims = imp.g.shape(imp.tensor(w_name)).dims
        if not all(d.is_static for d in w_dims):
            raise IRError(f"ConvTranspose needs a weight of static shape, got {list(w_dims)}")
        w_shape = [d.value for d in w_dims]
    if len(w_shape) != r + 2:
        raise IRError(f"ConvTranspose weight must be rank {r + 2}, got shape {w_shape}")
    if (node.attr("auto_pad", "NOTSET") or "NOTSET") != "NOTSET" or node.attr("output_shape") is not None:
        raise IRError("ConvTranspose with auto_pad or output_shape is not supported; give pads (and output_padding)")
    groups = int(node.attr("group", 1))
    c, og, *kernel = w_shape
    if c != xs.dims[1].value or c % groups:
        raise IRError(f"ConvTranspose weight {w_shape} does not match input {xs} with group={groups}")
    strides, dilations = _ints_attr(node, "strides", r), _ints_attr(node, "dilations", r)
    pads = tuple(int(p) for p in (node.attr("pads") or [0] * (2 * r)))
    extra = tuple(int(p) for p in (node.attr("output_padding") or [0] * r))
    if len(pads) != 2 * r or len(extra) != r:
        raise IRError(f"ConvTranspose pads {list(pads)} / output_padding {list(extra)} must hold {2 * r} / {r} values")
    conv_pads = [d * (k - 1) - p for d, k, p in zip(dilations, kernel, pads[:r])]
    conv_pads += [d * (k - 1) - p + e for d, k, p, e in zip(dilations, kernel, pads[r:], extra)]
    if any(p < 0 for p in conv_pads):
        raise IRError(f"ConvTranspose pads {list(pads)} larger than dilation * (kernel - 1) are not supported")
    # [C, O/g, *k] -> [O, C/g, *k]: per group swap the channel axes, and flip the window
    cg = c // groups
    if w is not None:
        flipped = w[(slice(None), slice(None), *([slice(None, None, -1)] * r))]
        turned = flipped.reshape(groups, cg, og, *kernel).swapaxes(1, 2).reshape(groups * og, cg, *kernel)
        name = f"{node.outputs[0]}::conv_weight"
        imp.add_initializer(name, np.ascontiguousarray(turned), DType.F32)
        weight = imp.tensor(name)
    else:
        g, weight = imp.g, imp.tensor(w_name)
        for axis, k in enumerate(kernel):  # flip the window: gather each spatial axis in reverse
            weight = g.gather(weight, g.constant(np.arange(k - 1, -1, -1), "i64"), 2 + axis)
        weight = g.reshape(g.transpose(g.reshape(weight, [groups, cg, og, *kernel]),
                                       [0, 2, 1, *range(3, 3 + r)]), [groups * og, cg, *kernel])
    for axis, s in enumerate(strides):
        if s > 1:
            x = _zero_stuff(imp, x, 2 + axis, s)
    bias = imp.tensor(node.input(2)) if node.input(2) is not None else None
    return [imp.emit(imp.g.conv(x, weight, bias, dilations=dilations, pads=tuple(conv_pads),
                                groups=groups))]


def _param_value(imp: Any, node_id: int) -> tuple[str, np.ndarray] | None:
    """(name, value) of a graph node that is a param the import holds the value of."""
    op = imp.g.node(node_id).op
    if isinstance(op, O.Param) and op.name in imp.params:
        return op.name, imp.params[op.name]
    return None


def _batch_norm(imp: Any, node: Any) -> list[Any]:
    if int(node.attr("training_mode", 0)):
        raise IRError("BatchNormalization with training_mode=1 (batch statistics) is not supported; export the "
                      "model in eval mode")
    eps = float(node.attr("epsilon", 1e-5))
    x = imp.tensor(node.inputs[0])
    stats = [imp.known(node.input(i)) for i in range(1, 5)]
    folded = _fold_into_conv(imp, node, x, stats, eps) if all(s is not None for s in stats) else None
    if folded is not None:
        return [imp.emit(folded)]
    scale, b, mean, var = (imp.tensor(node.inputs[i]) for i in range(1, 5))
    return [imp.emit(imp.g.batch_norm(x, scale, b, mean, var, eps=eps))]


def _fold_into_conv(imp: Any, node: Any, x: int, stats: list[np.ndarray], eps: float) -> int | None:
    """A new conv computing BN(conv(...)) with folded params, when x is a conv with param weights; else None.

    The original conv stays in the graph for any other reader (dead code otherwise): its value is unchanged.
    """
    conv = imp.g.node(x)
    if not isinstance(conv.op, Conv) or conv.op.activation is not None or conv.shape.dtype is not DType.F32:
        return None
    weight = _param_value(imp, conv.inputs[1])
    bias = _param_value(imp, conv.inputs[2]) if len(conv.inputs) == 3 else None
    if weight is None or (len(conv.inputs) == 3 and bias is None):
        return None
    scale, beta, mean, var = (np.asarray(s, np.float64).reshape(-1) for s in stats)
    w = np.asarray(weight[1], np.float64)
    inv = scale / np.sqrt(var + eps)
    b = np.asarray(bias[1], np.float64) if bias is not None else np.zeros(w.shape[0])
    base = node.outputs[0]
    names = (f"{base}::folded_weight", f"{base}::folded_bias")
    imp.add_initializer(names[0], (w * inv.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32), DType.F32)
    imp.add_initializer(names[1], ((b - mean) * inv + beta).astype(np.float32), DType.F32)
    op = conv.op
    return imp.g.conv(conv.inputs[0], imp.tensor(names[0]), imp.tensor(names[1]), strides=op.strides,
                      dilations=op.dilations, pads=op.pads, groups=op.groups)


#: Integer types whose every value an f32 holds exactly (MaxPool computes on them in f32).
_SMALL_INTS = (DType.I8, DType.U8, DType.I16, DType.U16)


def _pool(fn: str) -> Handler:
    def handle(imp: Any, node: Any) -> list[Any]:
        if any(node.outputs[1:]):
            raise IRError("only the pooled output is supported, not the Indices output")
        x = imp.tensor(node.inputs[0])
        xs = imp.g.shape(x)
        r = _spatial_rank(node.op_type, xs.dims, 3)
        kernel = tuple(int(k) for k in node.attr("kernel_shape") or ())
        if len(kernel) != r:
            raise IRError(f"kernel_shape {list(kernel)} must hold {r} values")
        strides, dilations = _ints_attr(node, "strides", r), _ints_attr(node, "dilations", r)
        if int(node.attr("storage_order", 0)):
            raise IRError("storage_order=1 (column-major indices) is not supported")
        pads = _window(node, tuple(d.value for d in xs.dims[2:]), kernel, strides, dilations)
        exact_in_f32 = fn == "max" and xs.dtype in _SMALL_INTS
        if exact_in_f32:  # MaxPool of 8/16-bit integers: a max is exact on their f32 values
            x = imp.g.cast(x, DType.F32)
        y = imp.g.pool(fn, x, kernel, strides=strides, pads=pads, dilations=dilations,
                       ceil_mode=bool(node.attr("ceil_mode", 0)),
                       count_include_pad=bool(node.attr("count_include_pad", 0)))
        return [imp.emit(imp.g.cast(y, xs.dtype) if exact_in_f32 else y)]
    return handle


def _global_pool(fn: str) -> Handler:
    """GlobalAveragePool / GlobalMaxPool: a mean / max over every spatial axis (any number of them)."""
    def handle(imp: Any, node: Any) -> list[Any]:
        x = imp.tensor(node.inputs[0])
        rank = imp.g.shape(x).rank
        if rank < 3:
            raise IRError(f"{node.op_type} needs [N, C, spatial...], got {imp.g.shape(x)}")
        return [imp.emit(imp.g.reduce(fn, x, tuple(range(2, rank)), keep_dim=True))]
    return handle


def _flatten(imp: Any, node: Any) -> list[Any]:
    x = imp.tensor(node.inputs[0])
    dims = imp.g.shape(x).dims
    axis = int(node.attr("axis", 1))
    axis = axis + len(dims) if axis < 0 else axis
    if not 0 <= axis <= len(dims):
        raise IRError(f"Flatten axis {node.attr('axis')} is out of range for rank {len(dims)}")
    return [imp.emit(imp.g.reshape(x, [product(dims[:axis]), product(dims[axis:])]))]


def _hard_swish(imp: Any, node: Any) -> list[Any]:
    return [imp.emit(imp.g.activation("hardswish", imp.tensor(node.inputs[0])))]


def _hard_sigmoid(imp: Any, node: Any) -> list[Any]:
    # max(0, min(1, alpha * x + beta))
    x = imp.tensor(node.inputs[0])
    dtype = imp.g.shape(x).dtype
    alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
    y = imp.g.add_(imp.g.mul(x, imp.scalar(alpha, dtype)), imp.scalar(beta, dtype))
    y = imp.g.binary("min", y, imp.scalar(1.0, dtype))
    return [imp.emit(imp.g.binary("max", y, imp.scalar(0.0, dtype)))]


def _pad_piece(imp: Any, x: int, axis: int, width: int, at_start: bool, mode: str, value: float) -> int:
    """The `width` values padded before (at_start) or after x along `axis`."""
    g = imp.g
    dims = list(g.shape(x).dims)
    n = dims[axis].value
    target = [*dims[:axis], Dim(width), *dims[axis + 1:]]
    if mode == "constant":
        fill = g.constant(np.full([1] * len(dims), value, np.float32), g.shape(x).dtype)
        return g.expand(fill, target)
    if mode == "edge":
        return g.expand(g.narrow(x, axis, 0 if at_start else n - 1, 1), target)
    if mode == "wrap":  # the values from the other end, around as often as the width needs: a gather
        idx = [(i - width) % n for i in range(width)] if at_start else [i % n for i in range(width)]
        return g.gather(x, g.constant(np.asarray(idx, np.int64), DType.I64), axis)
    # reflect: the mirror image without the edge value itself
    if width >= n:
        raise IRError(f"reflect padding of {width} needs more than {width} values along axis {axis}, got {n}")
    rows = range(width, 0, -1) if at_start else range(n - 2, n - 2 - width, -1)
    return g.concat([g.narrow(x, axis, i, 1) for i in rows], axis)


def _pad(imp: Any, node: Any) -> list[Any]:
    x = imp.tensor(node.inputs[0])
    dims = imp.g.shape(x).dims
    rank = len(dims)
    mode = node.attr("mode", "constant") or "constant"
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise IRError(f"Pad mode {mode!r} is not supported (constant, reflect, edge, wrap are)")
    pads = [int(p) for p in imp.static(node, 1, "pads").reshape(-1)]
    axes = list(range(rank))
    if node.input(3) is not None:
        axes = [int(a) + rank if int(a) < 0 else int(a) for a in imp.static(node, 3, "axes").reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise IRError(f"Pad has {len(pads)} pads for {len(axes)} axes")
    value = 0.0
    if node.input(2) is not None:
        value = float(np.asarray(imp.static(node, 2, "constant_value")).reshape(-1)[0])
    for axis, before, after in zip(axes, pads[:len(axes)], pads[len(axes):]):
        if not before and not after:
            continue
        if not dims[axis].is_static:
            raise IRError(f"Pad along the dynamic axis {axis} ({dims[axis]}) is not supported")
        n = imp.g.shape(x).dims[axis].value
        if before < 0 or after < 0:  # negative pads crop
            lo, hi = max(0, -before), max(0, -after)
            x = imp.g.narrow(x, axis, lo, n - lo - hi)
            before, after = max(0, before), max(0, after)
        parts = [_pad_piece(imp, x, axis, before, True, mode, value)] if before else []
        parts.append(x)
        if after:
            parts.append(_pad_piece(imp, x, axis, after, False, mode, value))
        x = imp.g.concat(parts, axis) if len(parts) > 1 else x
    return [imp.emit(x)]


#: Coordinate transforms and rounding under which nearest resizing by an integer factor repeats each value.
_REPEATING = {("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"), ("half_pixel", "round_prefer_ceil"),
              ("pytorch_half_pixel", "round_prefer_floor"), ("pytorch_half_pixel", "round_prefer_ceil")}


def _resize(imp: Any, node: Any) -> list[Any]:
    x = imp.tensor(node.inputs[0])
    dims = imp.g.shape(x).dims
    mode = node.attr("mode", "nearest") or "nearest"
    transform = node.attr("coordinate_transformation_mode", "half_pixel") or "half_pixel"
    rounding = node.attr("nearest_mode", "round_prefer_floor") or "round_prefer_floor"
    resized = [normalize_axis(int(a), len(dims)) for a in (node.attr("axes", None) or range(len(dims)))]
    if mode not in ("nearest", "linear", "cubic"):
        raise IRError(f"Resize mode={mode!r} is not one of nearest, linear, cubic")
    if all(dims[a].is_static for a in resized) and len(set(resized)) == len(resized):
        return [imp.emit(resize_static(imp, node, x, resized, mode, transform, rounding))]
    # a dynamic axis: nearest resizing by integer factors (each value repeated), whatever the length
    if mode != "nearest" or (transform, rounding) not in _REPEATING:
        raise IRError(f"Resize mode={mode!r}, coordinate_transformation_mode={transform!r}, nearest_mode="
                      f"{rounding!r} is not supported: RLX resizes by nearest neighbour with integer factors "
                      "(asymmetric + floor, or half_pixel + round_prefer_floor/ceil)")
    policy = node.attr("keep_aspect_ratio_policy", "stretch") or "stretch"
    if policy != "stretch" and node.input(3) is not None:
        raise IRError(f"Resize keep_aspect_ratio_policy={policy!r} is not supported (only 'stretch')")
    axes = [normalize_axis(int(a), len(dims)) for a in (node.attr("axes", None) or range(len(dims)))]
    picked = [dims[a] for a in axes]  # the axes the scales or sizes are given for (opset 18's `axes`)
    if node.input(3) is not None:
        sizes = [int(v) for v in imp.static(node, 3, "sizes").reshape(-1)]
        if any(not d.is_static or size % d.value for d, size in zip(picked, sizes)):
            raise IRError(f"Resize to sizes {sizes}: each must be an integer multiple of the static input "
                          f"[{', '.join(map(str, picked))}] (a dynamic axis takes scales instead)")
        given = [size // d.value for d, size in zip(picked, sizes)]
    else:
        scales = np.asarray(imp.static(node, 2, "scales"), np.float64).reshape(-1)
        if np.any(scales != np.round(scales)) or np.any(scales < 1):
            raise IRError(f"Resize scales {scales.tolist()} must be integers >= 1")
        given = [int(v) for v in scales]
    if len(given) != len(axes) or len(set(axes)) != len(axes):
        raise IRError(f"Resize has {len(given)} factors for axes {axes} of a rank-{len(dims)} input")
    factors = [1] * len(dims)
    for a, f in zip(axes, given):
        factors[a] = f
    # x[..., i, ...] -> [..., i, f, ...] broadcast -> merged: each value repeated f times along its axis
    split = [e for d, f in zip(dims, factors) for e in ((d, Dim(1)) if f > 1 else (d,))]
    wide = [e for d, f in zip(dims, factors) for e in ((d, Dim(f)) if f > 1 else (d,))]
    y = imp.g.expand(imp.g.reshape(x, split), wide)
    return [imp.emit(imp.g.reshape(y, [d * Dim(f) if f > 1 else d for d, f in zip(dims, factors)]))]


#: ONNX op type → handler, merged into `rlx.frontends.onnx.HANDLERS` (whose own entries win).
CONV_HANDLERS: dict[str, Handler] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "BatchNormalization": _batch_norm,
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "GlobalAveragePool": _global_pool("mean"),
    "GlobalMaxPool": _global_pool("max"),
    "Flatten": _flatten,
    "HardSwish": _hard_swish,
    "HardSigmoid": _hard_sigmoid,
    "Pad": _pad,
    "Resize": _resize,
}

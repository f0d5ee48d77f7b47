"""ONNX op handlers beyond the core set: what torch.onnx exports of transformers emit.

Every op here is built from existing RLX ops (no new IR op): boolean logic from
`where` / `compare`, CumSum as a sum over a selected square (a select, not a
product with the mask: inf * 0 would be NaN), GatherElements / GatherND as a
`gather` on the flattened data with computed flat indices, ScatterND (known
indices) as a `where` over a gathered update, Tile as reshape + expand, Trilu as
a `where` with a constant mask, TopK as K argmax steps (K ≤ 64). Each folds in numpy when its inputs are known at
import time (shape subgraphs, masks built from constants), so most of the mask
arithmetic of an export never reaches the graph.

What needs an op RLX lacks is refused with the reason: TopK with K > 64 on a
run-time tensor (a sort), ScatterND with computed indices or a reduction, GatherND
with batch_dims > 0 at run time. Mod of floats is C's fmod (`binary fmod`), with
the sign fixed up to the divisor's for fmod=0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rlx.errors import IRError
from rlx.frontends.onnx_importer import (
    Handler,
    _dtype,
    _Importer,
    _known,
    _Node,
    _numeric,
    _Value,
    narrow_cast,
)
from rlx.ir.dtype import DType
from rlx.ir.graph import NodeId
from rlx.ir.shape import Dim, normalize_axis, product

__all__ = ["EXTRA_HANDLERS", "layer_norm_decomposed", "wrap_indices"]

# ── helpers ─────────────────────────────────────────────────────────────


def _const(imp: _Importer, value: object, dtype: DType) -> NodeId:
    np_type = np.float32 if dtype is DType.BF16 else dtype.np
    return imp.g.constant(np.asarray(value, dtype=np_type), dtype)


def _known_inputs(imp: _Importer, node: _Node, what: str) -> list[np.ndarray]:
    return [_numeric(imp.known(n), f"{what} input {n!r}") for n in node.inputs if n]  # type: ignore[arg-type]


def _static_dims(imp: _Importer, name: str, what: str) -> list[int]:
    dims = imp.dims(name)
    if not all(d.is_static for d in dims):
        raise IRError(f"{what} needs the static shape of {name!r}, got {dims}")
    return [d.value for d in dims]


def _fold_or(fold: Callable[..., np.ndarray], out_dtype: Callable[[_Importer, _Node], DType],
             build: Callable[[_Importer, _Node], NodeId]) -> Handler:
    """A handler folding with `fold(*known inputs, node)` when every input is known, else building graph ops."""
    def handle(imp: _Importer, node: _Node) -> list[_Value]:
        if imp.foldable(node):
            with np.errstate(all="ignore"):
                arr = fold(*_known_inputs(imp, node, node.op_type), node=node)
            return [_known(arr, out_dtype(imp, node))]
        return [imp.emit(build(imp, node))]
    return handle


def _first_dtype(imp: _Importer, node: _Node) -> DType:
    return imp.value(node.inputs[0]).dtype


def _bool_dtype(imp: _Importer, node: _Node) -> DType:
    return DType.BOOL


# ── logic and predicates ────────────────────────────────────────────────


def _bool_inputs(imp: _Importer, node: _Node) -> tuple[NodeId, NodeId]:
    a, b = imp.tensor(node.inputs[0]), imp.tensor(node.inputs[1])
    for t in (a, b):
        if imp.g.shape(t).dtype is not DType.BOOL:
            raise IRError(f"{node.op_type} needs bool inputs, got {imp.g.shape(t)}")
    return a, b


def _build_and(imp: _Importer, node: _Node) -> NodeId:
    a, b = _bool_inputs(imp, node)
    return imp.g.where(a, b, _const(imp, False, DType.BOOL))


def _build_or(imp: _Importer, node: _Node) -> NodeId:
    a, b = _bool_inputs(imp, node)
    return imp.g.where(a, _const(imp, True, DType.BOOL), b)


def _build_xor(imp: _Importer, node: _Node) -> NodeId:
    a, b = _bool_inputs(imp, node)
    return imp.g.compare("ne", a, b)


def _build_isnan(imp: _Importer, node: _Node) -> NodeId:
    x = imp.tensor(node.inputs[0])
    return imp.g.compare("ne", x, x)  # NaN is the one value unequal to itself


def _build_isinf(imp: _Importer, node: _Node) -> NodeId:
    x = imp.tensor(node.inputs[0])
    dtype = imp.g.shape(x).dtype
    pos, neg = bool(node.attr("detect_positive", 1)), bool(node.attr("detect_negative", 1))
    tests = ([imp.g.compare("eq", x, _const(imp, np.inf, dtype))] if pos else []) + \
            ([imp.g.compare("eq", x, _const(imp, -np.inf, dtype))] if neg else [])
    if not tests:
        return imp.g.expand(_const(imp, False, DType.BOOL), imp.g.shape(x).dims)
    out = tests[0]
    for t in tests[1:]:
        out = imp.g.where(out, _const(imp, True, DType.BOOL), t)
    return out


def _fold_isinf(x: np.ndarray, *, node: _Node) -> np.ndarray:
    pos, neg = bool(node.attr("detect_positive", 1)), bool(node.attr("detect_negative", 1))
    return (np.isposinf(x) & pos) | (np.isneginf(x) & neg)


def _build_sign(imp: _Importer, node: _Node) -> NodeId:
    x = imp.tensor(node.inputs[0])
    dtype = imp.g.shape(x).dtype
    zero = _const(imp, 0, dtype)
    negative = imp.g.where(imp.g.compare("lt", x, zero), _const(imp, -1, dtype), x)  # 0 and NaN stay
    return imp.g.where(imp.g.compare("gt", x, zero), _const(imp, 1, dtype), negative)


# ── elementwise arithmetic ──────────────────────────────────────────────


def _variadic(fn: str, np_fn: Callable[[np.ndarray, np.ndarray], np.ndarray], mean: bool = False) -> Handler:
    """Max / Min / Sum / Mean of any number of broadcasting inputs."""
    def fold(*arrays: np.ndarray, node: _Node) -> np.ndarray:
        out = arrays[0]
        for a in arrays[1:]:
            out = np_fn(out, a)
        return (out / len(arrays)).astype(arrays[0].dtype) if mean else out

    def build(imp: _Importer, node: _Node) -> NodeId:
        names = [n for n in node.inputs if n]
        out = imp.tensor(names[0])
        for n in names[1:]:
            out = imp.g.binary(fn, out, imp.tensor(n))
        if mean:
            out = imp.g.div(out, _const(imp, len(names), imp.g.shape(out).dtype))
        if len(names) == 1:
            out = imp.g.reshape(out, imp.g.shape(out).dims)  # a node of its own for the output
        return out
    return _fold_or(fold, _first_dtype, build)


def _fold_clip(x: np.ndarray, *bounds: np.ndarray, node: _Node) -> np.ndarray:
    lo, hi = _clip_bounds(node, bounds)
    if lo is not None:
        x = np.where(x < lo, lo, x)
    if hi is not None:
        x = np.where(x > hi, hi, x)
    return x


def _clip_bounds(node: _Node, values: Sequence[object]) -> tuple[object | None, object | None]:
    if "min" in node.attrs or "max" in node.attrs:  # opset < 11 form, kept for models converted up
        return node.attr("min"), node.attr("max")
    names = list(node.inputs[1:3]) + [""] * 2
    it = iter(values)
    lo = next(it) if names[0] else None
    hi = next(it) if names[1] else None
    return lo, hi


def _build_clip(imp: _Importer, node: _Node) -> NodeId:
    x = imp.tensor(node.inputs[0])
    out = x
    for i, fn in ((1, "max"), (2, "min")):
        name = node.input(i)
        if name is not None:
            out = imp.g.binary(fn, out, imp.tensor(name))
    return imp.g.reshape(out, imp.g.shape(out).dims) if out == x else out


def _fold_mod(a: np.ndarray, b: np.ndarray, *, node: _Node) -> np.ndarray:
    if node.attr("fmod", 0):
        return np.fmod(a, b)
    if a.dtype.kind in "iu" and np.any(b == 0):
        raise IRError("integer Mod by zero")
    return np.mod(a, b)


def _build_mod(imp: _Importer, node: _Node) -> NodeId:
    a, b = imp.tensor(node.inputs[0]), imp.tensor(node.inputs[1])
    dtype = imp.g.shape(a).dtype
    if dtype.is_float:  # C's fmod
        rem = imp.g.binary("fmod", a, b)
    else:  # C's truncating remainder: the sign of a
        rem = imp.g.sub(a, imp.g.mul(imp.g.div(a, b), b))
    if node.attr("fmod", 0):
        return rem
    zero = _const(imp, 0, dtype)
    differ = imp.g.compare("ne", imp.g.compare("lt", rem, zero), imp.g.compare("lt", b, zero))
    fix = imp.g.where(imp.g.compare("ne", rem, zero), differ, _const(imp, False, DType.BOOL))
    return imp.g.where(fix, imp.g.add_(rem, b), rem)  # Python's %: the sign of b


def _fold_reciprocal(x: np.ndarray, *, node: _Node) -> np.ndarray:
    return (1 / x).astype(x.dtype)


def _build_reciprocal(imp: _Importer, node: _Node) -> NodeId:
    x = imp.tensor(node.inputs[0])
    return imp.g.div(_const(imp, 1, imp.g.shape(x).dtype), x)


def _fold_leaky_relu(x: np.ndarray, *, node: _Node) -> np.ndarray:
    return np.where(x < 0, x * np.asarray(node.attr("alpha", 0.01), x.dtype), x)


def _build_leaky_relu(imp: _Importer, node: _Node) -> NodeId:
    x = imp.tensor(node.inputs[0])
    dtype = imp.g.shape(x).dtype
    scaled = imp.g.mul(x, _const(imp, float(node.attr("alpha", 0.01)), dtype))
    return imp.g.where(imp.g.compare("lt", x, _const(imp, 0, dtype)), scaled, x)


def _activation(fn: str, np_fn: Callable[[np.ndarray], np.ndarray]) -> Handler:
    def fold(x: np.ndarray, *, node: _Node) -> np.ndarray:
        return np_fn(x).astype(x.dtype)

    def build(imp: _Importer, node: _Node) -> NodeId:
        return imp.g.activation(fn, imp.tensor(node.inputs[0]))
    return _fold_or(fold, _first_dtype, build)


def _np_softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x)


def _np_mish(x: np.ndarray) -> np.ndarray:
    return x * np.tanh(np.logaddexp(0, x))


def _np_hardswish(x: np.ndarray) -> np.ndarray:
    return x * np.clip(x / 6 + 0.5, 0, 1)


# ── shapes ──────────────────────────────────────────────────────────────


def _flatten(imp: _Importer, node: _Node) -> list[_Value]:
    x = node.inputs[0]
    dims = imp.dims(x)
    axis = int(node.attr("axis", 1))
    if not -len(dims) <= axis <= len(dims):
        raise IRError(f"Flatten axis {axis} is out of range for rank {len(dims)}")
    axis = axis + len(dims) if axis < 0 else axis
    target = [product(dims[:axis]), product(dims[axis:])]
    known = imp.known(x)
    if imp.foldable(node) and known is not None and all(d.is_static for d in target):
        return [_known(_numeric(known, f"input {x!r}").reshape([d.value for d in target]), imp.value(x).dtype)]
    return [imp.emit(imp.g.reshape(imp.tensor(x), target))]


def _size(imp: _Importer, node: _Node) -> list[_Value]:
    n = product(imp.dims(node.inputs[0]))
    arr = np.empty((), dtype=object)
    arr[()] = n
    return [_known(arr, DType.I64)]


def _dropout(imp: _Importer, node: _Node) -> list[_Value]:
    training = node.input(2)
    if training is not None and bool(np.asarray(imp.static(node, 2, "training_mode")).reshape(())):
        raise IRError("Dropout in training mode is not supported (RLX imports inference graphs)")
    x = imp.value(node.inputs[0])
    outs = [x]
    if len(node.outputs) > 1 and node.outputs[1]:
        dims = imp.dims(node.inputs[0])
        if all(d.is_static for d in dims):
            outs.append(_known(np.ones([d.value for d in dims], bool), DType.BOOL))
        else:
            outs.append(imp.emit(imp.g.expand(_const(imp, True, DType.BOOL), dims)))
    return outs


def _cast_like(imp: _Importer, node: _Node) -> list[_Value]:
    x, target = imp.value(node.inputs[0]), imp.value(node.inputs[1]).dtype
    if target.is_narrow or x.dtype.is_narrow:
        return [imp.emit(narrow_cast(imp, node.inputs[0], target, node.attr("saturate", 1)))]
    if imp.foldable(node) and x.known is not None:
        arr = _numeric(x.known, f"input {node.inputs[0]!r}")
        return [_known(arr != 0 if target is DType.BOOL else arr.astype(target.np), target)]
    if x.dtype is target:
        return [x]
    return [imp.emit(imp.g.cast(imp.tensor(node.inputs[0]), target))]


def _tile(imp: _Importer, node: _Node) -> list[_Value]:
    x = node.inputs[0]
    dims = imp.dims(x)
    reps = imp.ints(node, 1, "repeats")
    if len(reps) != len(dims) or any(not isinstance(r, int) or r < 0 for r in reps):
        raise IRError(f"Tile repeats {reps} must be {len(dims)} integers >= 0")
    known = imp.known(x)
    if imp.foldable(node) and known is not None:
        return [_known(np.tile(_numeric(known, f"input {x!r}"), reps), imp.value(x).dtype)]
    t = imp.tensor(x)
    split = [d for dim in dims for d in (Dim(1), dim)]
    grown = [d for r, dim in zip(reps, dims) for d in (Dim(r), dim)]  # type: ignore[arg-type]
    t = imp.g.expand(imp.g.reshape(t, split), grown)
    return [imp.emit(imp.g.reshape(t, [Dim(r) * d for r, d in zip(reps, dims)]))]  # type: ignore[arg-type]


def _trilu(imp: _Importer, node: _Node) -> list[_Value]:
    x = node.inputs[0]
    k = int(np.asarray(imp.static(node, 1, "k")).reshape(())) if node.input(1) else 0
    upper = bool(node.attr("upper", 1))
    known = imp.known(x)
    if imp.foldable(node) and known is not None:
        arr = _numeric(known, f"input {x!r}")
        return [_known(np.triu(arr, k) if upper else np.tril(arr, k), imp.value(x).dtype)]
    dims = imp.dims(x)
    if len(dims) < 2 or not (dims[-1].is_static and dims[-2].is_static):
        raise IRError(f"Trilu needs static last two dims, got {dims}")
    n, m = dims[-2].value, dims[-1].value
    rows, cols = np.arange(n)[:, None], np.arange(m)[None, :]
    keep = (cols - rows >= k) if upper else (cols - rows <= k)
    t = imp.tensor(x)
    dtype = imp.g.shape(t).dtype
    return [imp.emit(imp.g.where(_const(imp, keep, DType.BOOL), t, _const(imp, 0, dtype)))]


# ── cumulative sums and index ops ──────────────────────────────────────


def _cumsum_mask(n: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """mask[i, j]: whether x[j] adds into out[i]."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if reverse:
        return (j > i) if exclusive else (j >= i)
    return (j < i) if exclusive else (j <= i)


def _cumsum(imp: _Importer, node: _Node) -> list[_Value]:
    x = node.inputs[0]
    dims = imp.dims(x)
    axis_arr = np.asarray(imp.static(node, 1, "axis")).reshape(())
    axis = normalize_axis(int(axis_arr), len(dims), "CumSum axis")
    exclusive, reverse = bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0))
    if not dims[axis].is_static:
        raise IRError(f"CumSum along the dynamic axis {dims[axis]} is not supported")
    n = dims[axis].value
    mask = _cumsum_mask(n, exclusive, reverse)
    known = imp.known(x)
    if imp.foldable(node) and known is not None:
        arr = np.moveaxis(_numeric(known, f"input {x!r}"), axis, -1)
        out = np.where(mask, arr[..., None, :], 0).sum(-1).astype(arr.dtype)
        return [_known(np.moveaxis(out, -1, axis), imp.value(x).dtype)]
    t = imp.tensor(x)
    dtype = imp.g.shape(t).dtype
    rank = len(dims)
    perm = [i for i in range(rank) if i != axis] + [axis]
    moved = imp.g.transpose(t, perm) if axis != rank - 1 else t
    lead = [dims[i] for i in perm[:-1]]
    rows = imp.g.reshape(moved, [*lead, 1, n])
    # [..., n, n]: row i holds the terms of out[i]; a select, not a product with the mask (inf * 0 is NaN)
    terms = imp.g.where(_const(imp, mask, DType.BOOL), rows, _const(imp, 0, dtype))
    out = imp.g.reduce("sum", terms, [rank], False)
    if axis != rank - 1:
        out = imp.g.transpose(out, [perm.index(i) for i in range(rank)])
    return [imp.emit(out)]


def _flat_strides(dims: Sequence[int]) -> np.ndarray:
    return np.array([int(np.prod(dims[i + 1:])) for i in range(len(dims))], np.int64)


def wrap_indices(imp: _Importer, idx: NodeId, size: int | Sequence[int]) -> NodeId:
    """Negative run-time indices counted from the end (ONNX allows [-n, n)); `size` broadcasts against them."""
    dtype = imp.g.shape(idx).dtype
    n = _const(imp, size, dtype)
    return imp.g.where(imp.g.compare("lt", idx, _const(imp, 0, dtype)), imp.g.add_(idx, n), idx)


def _gather_elements(imp: _Importer, node: _Node) -> list[_Value]:
    data, idx = node.inputs[:2]
    dims = imp.dims(data)
    axis = normalize_axis(int(node.attr("axis", 0)), len(dims), "GatherElements axis")
    known_idx = imp.known(idx)
    if imp.foldable(node):
        arr, ind = _known_inputs(imp, node, "GatherElements")
        n = arr.shape[axis]
        _check_range(ind, n, "GatherElements")
        return [_known(np.take_along_axis(arr, np.where(ind < 0, ind + n, ind), axis=axis), imp.value(data).dtype)]
    shape = _static_dims(imp, data, "GatherElements")
    idx_shape = _static_dims(imp, idx, "GatherElements")
    strides = _flat_strides(shape)
    # flat[i0..] = sum_d (d == axis ? idx[i] : i_d) * stride_d
    grid = np.indices(idx_shape, dtype=np.int64)
    base = sum(grid[d] * strides[d] for d in range(len(shape)) if d != axis)
    flat_data = imp.g.reshape(imp.tensor(data), [int(np.prod(shape))])
    if known_idx is not None:
        ind = _numeric(known_idx, f"indices {idx!r}").astype(np.int64)
        _check_range(ind, shape[axis], "GatherElements")
        flat = base + np.where(ind < 0, ind + shape[axis], ind) * strides[axis]
        index = _const(imp, flat, DType.I64)
    else:
        ind = wrap_indices(imp, imp.g.cast(imp.tensor(idx), DType.I64), shape[axis])
        index = imp.g.add_(imp.g.mul(ind, _const(imp, strides[axis], DType.I64)), _const(imp, base, DType.I64))
    return [imp.emit(imp.g.gather(flat_data, index, 0))]


def _check_range(ind: np.ndarray, n: int, what: str) -> None:
    if ind.size and (ind.min() < -n or ind.max() >= n):
        raise IRError(f"{what} index out of range for an axis of {n}")


def _np_gather_nd(data: np.ndarray, ind: np.ndarray, batch_dims: int) -> np.ndarray:
    k = ind.shape[-1]
    lead = data.shape[:batch_dims]
    inner = data.shape[batch_dims:]
    ind = np.where(ind < 0, ind + np.array(inner[:k]), ind)
    flat_data = data.reshape(int(np.prod(lead, dtype=np.int64)), *inner)
    flat_ind = ind.reshape(flat_data.shape[0], -1, k)
    out = np.stack([b[tuple(np.moveaxis(i, -1, 0))] for b, i in zip(flat_data, flat_ind)])
    return out.reshape(*ind.shape[:-1], *inner[k:])


def _gather_nd(imp: _Importer, node: _Node) -> list[_Value]:
    data, idx = node.inputs[:2]
    batch_dims = int(node.attr("batch_dims", 0))
    if imp.foldable(node):
        arr, ind = _known_inputs(imp, node, "GatherND")
        return [_known(_np_gather_nd(arr, ind.astype(np.int64), batch_dims), imp.value(data).dtype)]
    if batch_dims:
        raise IRError(f"GatherND with batch_dims={batch_dims} on run-time values is not supported (only 0)")
    idx_shape = _static_dims(imp, idx, "GatherND")
    k = idx_shape[-1]
    dims = imp.dims(data)
    if k > len(dims) or not all(d.is_static for d in dims[:k]):
        raise IRError(f"GatherND needs the first {k} dims of the data static, got {dims}")
    head = [d.value for d in dims[:k]]
    strides = _flat_strides(head)
    flat_data = imp.g.reshape(imp.tensor(data), [Dim(int(np.prod(head, dtype=np.int64))), *dims[k:]])
    known_idx = imp.known(idx)
    if known_idx is not None:
        ind = _numeric(known_idx, f"indices {idx!r}").astype(np.int64)
        for j, n in enumerate(head):
            _check_range(ind[..., j], n, "GatherND")
        ind = np.where(ind < 0, ind + np.array(head), ind)
        index = _const(imp, (ind * strides).sum(-1), DType.I64)
    else:
        ind = imp.g.cast(imp.tensor(idx), DType.I64)
        ind = wrap_indices(imp, ind, head)
        index = imp.g.reduce("sum", imp.g.mul(ind, _const(imp, strides, DType.I64)), [len(idx_shape) - 1], False)
    return [imp.emit(imp.g.gather(flat_data, index, 0))]


def _np_scatter_nd(data: np.ndarray, ind: np.ndarray, upd: np.ndarray, reduction: str) -> np.ndarray:
    out = data.copy()
    k = ind.shape[-1]
    ind = np.where(ind < 0, ind + np.array(data.shape[:k]), ind)
    fns = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    for pos in np.ndindex(ind.shape[:-1]):
        at = tuple(ind[pos])
        out[at] = upd[pos] if reduction == "none" else fns[reduction](out[at], upd[pos])
    return out


def _scatter_nd(imp: _Importer, node: _Node) -> list[_Value]:
    data, idx, upd = node.inputs[:3]
    reduction = node.attr("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise IRError(f"unknown ScatterND reduction {reduction!r}")
    if imp.foldable(node):
        arr, ind, u = _known_inputs(imp, node, "ScatterND")
        return [_known(_np_scatter_nd(arr, ind.astype(np.int64), u, reduction), imp.value(data).dtype)]
    known_idx = imp.known(idx)
    if known_idx is None:
        raise IRError(f"the ScatterND indices ({idx!r}) must be known at import time (RLX scatters only to known "
                      "positions), but they are computed at run time")
    if reduction != "none":
        raise IRError(f"ScatterND reduction={reduction!r} on run-time values is not supported (only 'none')")
    ind = _numeric(known_idx, f"indices {idx!r}").astype(np.int64)
    k = ind.shape[-1]
    dims = imp.dims(data)
    if not all(d.is_static for d in dims[:k]):
        raise IRError(f"ScatterND needs the first {k} dims of the data static, got {dims}")
    head = [d.value for d in dims[:k]]
    positions = int(np.prod(head, dtype=np.int64))
    for j, n in enumerate(head):
        _check_range(ind[..., j], n, "ScatterND")
    flat = (np.where(ind < 0, ind + np.array(head), ind) * _flat_strides(head)).sum(-1).reshape(-1)
    source = np.zeros(positions, np.int64)  # which update row lands on each position (the last one wins)
    written = np.zeros(positions, bool)
    source[flat] = np.arange(flat.size)
    written[flat] = True
    rest = list(dims[k:])
    flat_data = imp.g.reshape(imp.tensor(data), [Dim(positions), *rest])
    flat_upd = imp.g.reshape(imp.tensor(upd), [Dim(max(flat.size, 1)) if flat.size else Dim(0), *rest])
    if not flat.size:
        return [imp.value(data)]
    picked = imp.g.gather(flat_upd, _const(imp, source, DType.I64), 0)
    mask = _const(imp, written.reshape([positions] + [1] * len(rest)), DType.BOOL)
    return [imp.emit(imp.g.reshape(imp.g.where(mask, picked, flat_data), dims))]


def _np_arg(fn: str) -> Callable[..., np.ndarray]:
    def fold(x: np.ndarray, *, node: _Node) -> np.ndarray:
        axis, keep, last = _arg_attrs(node, x.ndim)
        y = np.flip(x, axis) if last else x
        out = (np.argmax if fn == "max" else np.argmin)(y, axis=axis)
        if last:
            out = x.shape[axis] - 1 - out
        return np.expand_dims(out, axis) if keep else out
    return fold


def _arg_attrs(node: _Node, rank: int) -> tuple[int, bool, bool]:
    axis = normalize_axis(int(node.attr("axis", 0)), rank, f"{node.op_type} axis")
    return axis, bool(node.attr("keepdims", 1)), bool(node.attr("select_last_index", 0))


def _arg_build(fn: str) -> Callable[[_Importer, _Node], NodeId]:
    def build(imp: _Importer, node: _Node) -> NodeId:
        x = imp.tensor(node.inputs[0])
        s = imp.g.shape(x)
        axis, keep, last = _arg_attrs(node, s.rank)
        if not s.dtype.is_float:
            x = imp.g.cast(x, DType.F64)  # exact for every int32 and for int64 below 2**53
        if fn == "min":
            x = imp.g.activation("neg", x)
        n = s.dims[axis]
        if last:
            if not n.is_static:
                raise IRError(f"select_last_index along the dynamic axis {n} is not supported")
            x = imp.g.gather(x, _const(imp, np.arange(n.value - 1, -1, -1), DType.I64), axis)
        out = imp.g.cast(imp.g.argmax(x, axis), DType.I64)
        if last:
            out = imp.g.sub(_const(imp, n.value - 1, DType.I64), out)
        if keep:
            dims = list(s.dims)
            dims[axis] = Dim(1)
            out = imp.g.reshape(out, dims)
        return out
    return build


def _int64(imp: _Importer, node: _Node) -> DType:
    return DType.I64


#: The largest K TopK unrolls on run-time values (one argmax and a masking per element taken).
TOPK_MAX_K = 64


def _np_topk_order(arr: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Indices sorting `arr` along `axis`, largest (or smallest) first, ties by the lower index."""
    if not largest:
        return np.argsort(arr, axis=axis, kind="stable")
    n = arr.shape[axis]
    rev = np.argsort(np.flip(arr, axis), axis=axis, kind="stable")  # ties: the higher original index first
    return n - 1 - np.flip(rev, axis)


def _topk(imp: _Importer, node: _Node) -> list[_Value]:
    x = node.inputs[0]
    dims = imp.dims(x)
    axis = normalize_axis(int(node.attr("axis", -1)), len(dims), "TopK axis")
    k = int(np.asarray(imp.static(node, 1, "K")).reshape(-1)[0])
    largest = bool(node.attr("largest", 1))  # `sorted` may be 0: any order is allowed, sorted is one
    if not dims[axis].is_static or not 0 <= k <= dims[axis].value:
        raise IRError(f"TopK K={k} along the axis {dims[axis]}: K must be in [0, n] of a static axis")
    known = imp.known(x)
    if imp.foldable(node) and known is not None:
        arr = _numeric(known, f"input {x!r}")
        idx = np.take(_np_topk_order(arr, axis, largest), np.arange(k), axis=axis)
        return [_known(np.take_along_axis(arr, idx, axis=axis), imp.value(x).dtype), _known(idx, DType.I64)]
    if k > TOPK_MAX_K:
        raise IRError(f"TopK with K={k} > {TOPK_MAX_K} on a run-time tensor is not supported (RLX has no sort; "
                      "smaller K unrolls into argmax steps)")
    if k == 0:
        raise IRError("TopK with K=0 on a run-time tensor gives empty outputs, which RLX does not build")
    return [imp.emit(t) for t in _topk_unrolled(imp, imp.tensor(x), axis, k, largest)]


def _topk_unrolled(imp: _Importer, x: NodeId, axis: int, k: int, largest: bool) -> tuple[NodeId, NodeId]:
    """TopK as K argmax steps, each taken element masked to -inf (ties: the lower index first)."""
    g = imp.g
    s = g.shape(x)
    n = s.dims[axis].value
    work = x if s.dtype.is_float else g.cast(x, DType.F64)  # exact for every int32, int64 below 2**53
    if not largest:
        work = g.activation("neg", work)
    wdt = g.shape(work).dtype
    iota = _const(imp, np.arange(n).reshape([n if i == axis else 1 for i in range(s.rank)]), DType.I64)
    neg_inf = _const(imp, -np.inf, wdt)
    taken = g.expand(_const(imp, False, DType.BOOL), s.dims)
    keep_dims = [Dim(1) if i == axis else d for i, d in enumerate(s.dims)]
    values, indices = [], []
    for _ in range(k):
        idx = g.reshape(g.cast(g.argmax(work, axis), DType.I64), keep_dims)
        best = g.reduce("max", work, [axis], True)
        # every untaken element is -inf: argmax would pick index 0 again; take the first untaken one instead
        first_free = g.reshape(g.cast(g.argmax(g.cast(g.compare("eq", taken, _const(imp, False, DType.BOOL)),
                                                      DType.F32), axis), DType.I64), keep_dims)
        idx = g.where(g.compare("eq", best, neg_inf), first_free, idx)
        hit = g.compare("eq", iota, idx)
        values.append(best)
        indices.append(idx)
        work = g.where(hit, neg_inf, work)
        taken = g.where(hit, _const(imp, True, DType.BOOL), taken)
    value = g.concat(values, axis) if k > 1 else values[0]
    if not largest:
        value = g.activation("neg", value)
    if not s.dtype.is_float:
        value = g.cast(value, s.dtype)
    index = g.concat(indices, axis) if k > 1 else indices[0]
    return value, index


# ── LayerNormalization over any trailing axes, with Mean and InvStdDev ─


def layer_norm_decomposed(imp: _Importer, node: _Node) -> list[_Value]:
    """LayerNormalization as reductions: any `axis`, and the optional Mean / InvStdDev outputs."""
    x = imp.tensor(node.inputs[0])
    s = imp.g.shape(x)
    axis = normalize_axis(int(node.attr("axis", -1)), s.rank, "LayerNormalization axis")
    stash = _dtype(int(node.attr("stash_type", 1)), "LayerNormalization stash_type")
    eps = float(node.attr("epsilon", 1e-5))
    axes = list(range(axis, s.rank))
    xc = imp.g.cast(x, stash) if stash is not s.dtype else x
    mean = imp.g.reduce("mean", xc, axes, True)
    centered = imp.g.sub(xc, mean)
    var = imp.g.reduce("mean", imp.g.mul(centered, centered), axes, True)
    inv = imp.g.activation("rsqrt", imp.g.add_(var, _const(imp, eps, stash)))
    y = imp.g.mul(centered, inv)
    if stash is not s.dtype:
        y = imp.g.cast(y, s.dtype)
    y = imp.g.mul(y, imp.tensor(node.inputs[1]))
    if node.input(2):
        y = imp.g.add_(y, imp.tensor(node.inputs[2]))
    return [imp.emit(y), imp.emit(mean), imp.emit(inv)]


def _passthrough_fold(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def fold(*arrays: np.ndarray, node: _Node) -> np.ndarray:
        return fn(*arrays)
    return fold


#: ONNX op type → handler, merged into `rlx.frontends.onnx.HANDLERS`.
EXTRA_HANDLERS: dict[str, Handler] = {
    "And": _fold_or(_passthrough_fold(np.logical_and), _bool_dtype, _build_and),
    "Or": _fold_or(_passthrough_fold(np.logical_or), _bool_dtype, _build_or),
    "Xor": _fold_or(_passthrough_fold(np.logical_xor), _bool_dtype, _build_xor),
    "IsNaN": _fold_or(_passthrough_fold(np.isnan), _bool_dtype, _build_isnan),
    "IsInf": _fold_or(_fold_isinf, _bool_dtype, _build_isinf),
    "Sign": _fold_or(_passthrough_fold(lambda x: np.sign(x).astype(x.dtype)), _first_dtype, _build_sign),
    "Max": _variadic("max", np.maximum),
    "Min": _variadic("min", np.minimum),
    "Sum": _variadic("add", np.add),
    "Mean": _variadic("add", np.add, mean=True),
    "Clip": _fold_or(_fold_clip, _first_dtype, _build_clip),
    "Mod": _fold_or(_fold_mod, _first_dtype, _build_mod),
    "Reciprocal": _fold_or(_fold_reciprocal, _first_dtype, _build_reciprocal),
    "LeakyRelu": _fold_or(_fold_leaky_relu, _first_dtype, _build_leaky_relu),
    "Softplus": _activation("softplus", _np_softplus),
    "Mish": _activation("mish", _np_mish),
    "HardSwish": _activation("hardswish", _np_hardswish),
    "Flatten": _flatten,
    "Size": _size,
    "Dropout": _dropout,
    "CastLike": _cast_like,
    "Tile": _tile,
    "Trilu": _trilu,
    "CumSum": _cumsum,
    "GatherElements": _gather_elements,
    "GatherND": _gather_nd,
    "ScatterND": _scatter_nd,
    "ArgMax": _fold_or(_np_arg("max"), _int64, _arg_build("max")),
    "ArgMin": _fold_or(_np_arg("min"), _int64, _arg_build("min")),
    "TopK": _topk,
}


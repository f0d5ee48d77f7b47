"""`View`: how a tensor's elements sit in memory — dims, element strides and an offset.

Every backend (and the reference, through `View.numpy_strides`) describes
strided access with this one type: broadcasting is a stride of 0, a
transpose permutes strides, a narrow moves the offset, and `collapse`
merges neighbouring axes that several views walk contiguously alike so the
generated loop nests are as shallow as possible. Dims and strides are `Dim`s,
so they stay symbolic in the dynamic dims; backends spell them as C
expressions with `rlx.codegen.common.dim_expr`.

>>> from rlx.ir.shape import Dim
>>> x = View.dense([Dim(2), Dim(3)])
>>> [str(s) for s in x.strides]
['3', '1']
>>> b = View.dense([Dim(3)]).broadcast_to([Dim(2), Dim(3)])
>>> [str(s) for s in b.strides]
['0', '1']
>>> dims, (sx, sb) = collapse([Dim(2), Dim(3)], x, b)
>>> [str(d) for d in dims], [str(s) for s in sx.strides], [str(s) for s in sb.strides]
(['2', '3'], ['3', '1'], ['0', '1'])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlx.errors import ShapeError
from rlx.ir.shape import Dim, Shape, product


def dense_strides(dims: Sequence[Dim]) -> tuple[Dim, ...]:
    """Row-major element strides of `dims`."""
    out: list[Dim] = []
    acc = Dim(1)
    for d in reversed(dims):
        out.append(acc)
        acc = acc * d
    return tuple(reversed(out))


@dataclass(frozen=True)
class View:
    """Element `i` (a multi-index) lives at `offset + sum(i[k] * strides[k])` elements from the base."""

    dims: tuple[Dim, ...]
    strides: tuple[Dim, ...]
    offset: Dim = Dim(0)  # noqa: RUF009 - Dim is a frozen (immutable) value

    def __post_init__(self) -> None:
        if len(self.dims) != len(self.strides):
            raise ShapeError(f"view has {len(self.dims)} dims but {len(self.strides)} strides")

    @staticmethod
    def dense(dims: Sequence[Dim]) -> View:
        """A contiguous row-major tensor of `dims`."""
        return View(tuple(dims), dense_strides(dims))

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def numel(self) -> Dim:
        return product(self.dims)

    def is_broadcast(self, axis: int) -> bool:
        """True when every index along `axis` reads the same element."""
        return self.strides[axis] == 0 and self.dims[axis] != 1

    def broadcast_to(self, target: Sequence[Dim]) -> View:
        """This view read as `target` with numpy broadcasting (right-aligned; size-1 axes get stride 0)."""
        target = tuple(target)
        pad = len(target) - self.rank
        if pad < 0:
            raise ShapeError(f"cannot broadcast a rank-{self.rank} view to rank {len(target)}")
        strides: list[Dim] = []
        for k, t in enumerate(target):
            if k < pad:
                strides.append(Dim(0))
                continue
            d = self.dims[k - pad]
            if d == t:
                strides.append(self.strides[k - pad] if t != 1 else Dim(0))
            elif d == 1:
                strides.append(Dim(0))
            else:
                raise ShapeError(f"cannot broadcast dims {[str(x) for x in self.dims]} to {[str(x) for x in target]}")
        return View(target, tuple(strides), self.offset)

    def permute(self, perm: Sequence[int]) -> View:
        """Axis `i` of the result is axis `perm[i]` of this view."""
        return View(tuple(self.dims[p] for p in perm), tuple(self.strides[p] for p in perm), self.offset)

    def numpy_strides(self, itemsize: int, values: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(shape, byte strides, byte offset) for `numpy.lib.stride_tricks.as_strided` at these symbol values."""
        shape = tuple(d.evaluate(values) for d in self.dims)
        strides = tuple(s.evaluate(values) * itemsize if s.coeff else 0 for s in self.strides)
        offset = self.offset.evaluate(values) * itemsize if self.offset.coeff else 0
        return shape, strides, offset


def _zero(s: Dim) -> bool:
    return s.coeff == 0


def collapse(dims: Sequence[Dim], *views: View) -> tuple[list[Dim], list[View]]:
    """Drop size-1 axes and merge neighbours that every view walks as one axis.

    Axes k and k+1 merge when, in every view, stride[k] == stride[k+1] * dims[k+1]
    (contiguous) or both strides are 0 (broadcast along both). The result has
    the same element order; views keep their offsets.
    """
    keep = [k for k, d in enumerate(dims) if d != 1]
    out_dims = [dims[k] for k in keep]
    strides = [[v.strides[k] for k in keep] for v in views]
    k = len(out_dims) - 2
    while k >= 0:
        nxt = out_dims[k + 1]
        mergeable = all(
            (_zero(s[k]) and _zero(s[k + 1])) or (not _zero(s[k + 1]) and s[k] == s[k + 1] * nxt)
            for s in strides
        )
        if mergeable:
            out_dims[k] = out_dims[k] * nxt
            for s in strides:
                s[k] = s[k + 1]
                del s[k + 1]
            del out_dims[k + 1]
        k -= 1
    return out_dims, [View(tuple(out_dims), tuple(s), v.offset) for s, v in zip(strides, views)]


def _transpose_view(op: Any, base: View, out_dims: tuple[Dim, ...]) -> View:
    return base.permute(op.perm)


def _narrow_view(op: Any, base: View, out_dims: tuple[Dim, ...]) -> View:
    axis = op.axis % base.rank
    dims = list(base.dims)
    dims[axis] = Dim(op.length)
    return View(tuple(dims), base.strides, base.strides[axis] * op.start)


def _expand_view(op: Any, base: View, out_dims: tuple[Dim, ...]) -> View:
    return base.broadcast_to(out_dims)


#: op kind → the View of its dense input that reads as its output.
MOVEMENT_VIEWS: dict[str, Callable[[Any, View, tuple[Dim, ...]], View]] = {
    "transpose": _transpose_view,
    "narrow": _narrow_view,
    "expand": _expand_view,
}


def movement_view(op: Any, x: Shape, out: Shape, symbols: dict[str, int] | None = None) -> View:
    """The View of a dense input `x` that reads as the output of data-movement `op`.

    Transpose permutes strides, narrow moves the offset along its axis, expand
    broadcasts (stride 0). The reference and every backend read movement ops
    through this one function; with `symbols`, `out` is evaluated at those values.
    """
    rule = MOVEMENT_VIEWS.get(op.kind)
    if rule is None:
        raise ShapeError(f"{op.kind!r} is not a data-movement op")
    out_dims = out.dims if symbols is None else tuple(Dim(v) for v in out.concrete(symbols))
    return rule(op, View.dense(x.dims), out_dims)

"""Dimensions (static or symbolic) and tensor shapes.

A dimension is a monomial: a static coefficient times a product of named
dynamic symbols, each with a declared upper bound. ``Dim(384)`` is static,
``Dim.dynamic("seq", max=512)`` is a symbol, and ``batch * seq`` (what a
reshape that flattens two dynamic dims produces) is still one ``Dim``.
Generated code evaluates a dim as an expression of the symbol values passed
at run time; buffers are sized for the product of the bounds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from rlx.errors import IRError, ShapeError
from rlx.ir.dtype import DType

#: Largest number of elements any single tensor may declare (guards hostile input).
MAX_ELEMENTS = 1 << 40
_SYMBOL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Dim:
    """One dimension: ``coeff * prod(symbols)``.

    >>> seq = Dim.dynamic("seq", max=512)
    >>> str(seq * 4), (seq * 4).max
    ('4*seq', 2048)
    >>> Dim(8).is_static, Dim(8).value
    (True, 8)
    """

    coeff: int
    symbols: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.coeff, bool) or not isinstance(self.coeff, int):
            raise IRError(f"dimension size must be an int, got {self.coeff!r}")
        if self.coeff < 0:
            raise IRError(f"dimension size must be >= 0, got {self.coeff}")
        if self.coeff > MAX_ELEMENTS:
            raise IRError(f"dimension size {self.coeff} is absurdly large")
        if list(self.symbols) != sorted(self.symbols):
            object.__setattr__(self, "symbols", tuple(sorted(self.symbols)))

    @staticmethod
    def dynamic(name: str, max: int) -> Dim:
        """A named dynamic dimension whose run-time value is at most `max`."""
        if not isinstance(name, str) or not _SYMBOL_RE.match(name):
            raise IRError(f"dynamic dim name must be an identifier (letters, digits, _), got {name!r}")
        if isinstance(max, bool) or not isinstance(max, int) or max < 1 or max > MAX_ELEMENTS:
            raise IRError(f"dynamic dim {name!r} needs an int upper bound >= 1, got {max!r}")
        return Dim(1, ((name, max),))

    @staticmethod
    def of(value: DimLike) -> Dim:
        if isinstance(value, Dim):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise IRError(f"expected an int or Dim for a dimension, got {value!r}")
        return Dim(value)

    @property
    def is_static(self) -> bool:
        return not self.symbols

    @property
    def value(self) -> int:
        """The static size; raises for a dynamic dim."""
        if self.symbols:
            raise ShapeError(f"dimension {self} is dynamic and has no static value")
        return self.coeff

    @property
    def max(self) -> int:
        """Upper bound of the dimension (the static size for static dims)."""
        return self.coeff * math.prod(bound for _, bound in self.symbols)

    @property
    def symbol_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.symbols)

    def evaluate(self, values: dict[str, int]) -> int:
        return self.coeff * math.prod(values[name] for name, _ in self.symbols)

    def __mul__(self, other: DimLike) -> Dim:
        o = Dim.of(other)
        return Dim(self.coeff * o.coeff, tuple(sorted(self.symbols + o.symbols)))

    __rmul__ = __mul__

    def divide(self, other: Dim) -> Dim | None:
        """Exact quotient ``self / other`` as a Dim, or None if not exact."""
        if other.coeff == 0 or self.coeff % other.coeff:
            return None
        remaining = list(self.symbols)
        for sym in other.symbols:
            if sym not in remaining:
                return None
            remaining.remove(sym)
        return Dim(self.coeff // other.coeff, tuple(remaining))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            return not self.symbols and self.coeff == other
        if isinstance(other, Dim):
            return self.coeff == other.coeff and self.symbols == other.symbols
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.coeff, self.symbols))

    def __str__(self) -> str:
        if not self.symbols:
            return str(self.coeff)
        names = "*".join(name for name, _ in self.symbols)
        return names if self.coeff == 1 else f"{self.coeff}*{names}"

    def __repr__(self) -> str:
        if not self.symbols:
            return f"Dim({self.coeff})"
        return f"Dim({self})"


DimLike = int | Dim


def product(dims: Iterable[Dim]) -> Dim:
    out = Dim(1)
    for d in dims:
        out = out * d
    return out


@dataclass(frozen=True)
class Shape:
    """Dims plus dtype of a tensor value.

    >>> s = Shape.of([2, Dim.dynamic("seq", max=128), 384])
    >>> str(s), s.rank, s.max_numel
    ('f32[2,seq,384]', 3, 98304)
    """

    dims: tuple[Dim, ...]
    dtype: DType = DType.F32

    def __post_init__(self) -> None:
        dims = tuple(Dim.of(d) for d in self.dims)
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        if len(dims) > 16:
            raise IRError(f"rank {len(dims)} exceeds the supported maximum of 16")
        if math.prod(d.max for d in dims) > MAX_ELEMENTS:
            raise IRError(f"shape {self} declares more than {MAX_ELEMENTS} elements")

    @staticmethod
    def of(dims: Iterable[DimLike], dtype: DType | str = DType.F32) -> Shape:
        return Shape(tuple(Dim.of(d) for d in dims), DType.parse(dtype))

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def numel(self) -> Dim:
        return product(self.dims)

    @property
    def max_numel(self) -> int:
        return math.prod(d.max for d in self.dims)

    @property
    def max_nbytes(self) -> int:
        return self.max_numel * self.dtype.itemsize

    @property
    def is_static(self) -> bool:
        return all(d.is_static for d in self.dims)

    @property
    def static_dims(self) -> tuple[int, ...]:
        return tuple(d.value for d in self.dims)

    @property
    def symbols(self) -> dict[str, int]:
        return {name: bound for d in self.dims for name, bound in d.symbols}

    def concrete(self, values: dict[str, int]) -> tuple[int, ...]:
        return tuple(d.evaluate(values) for d in self.dims)

    def with_dtype(self, dtype: DType) -> Shape:
        return Shape(self.dims, dtype)

    def with_dims(self, dims: Iterable[DimLike]) -> Shape:
        return Shape(tuple(Dim.of(d) for d in dims), self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.dims)}]"


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ShapeError(f"{what} must be an int, got {axis!r}")
    if not -rank <= axis < rank:  # a rank-0 tensor has no axis at all
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def broadcast_dims(*dim_lists: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Numpy broadcasting over Dims; raises ShapeError naming both sides."""
    rank = max((len(d) for d in dim_lists), default=0)
    out: list[Dim] = []
    for i in range(rank):
        chosen = Dim(1)
        for dims in dim_lists:
            j = i - (rank - len(dims))
            if j < 0:
                continue
            d = dims[j]
            if d == 1:
                continue
            if chosen == 1:
                chosen = d
            elif chosen != d:
                shapes = " vs ".join("[" + ",".join(map(str, ds)) + "]" for ds in dim_lists)
                raise ShapeError(f"cannot broadcast shapes {shapes}: dim {i} is {chosen} vs {d}")
        out.append(chosen)
    return tuple(out)


def check_symbol_bounds(shapes: Iterable[Shape]) -> dict[str, int]:
    """Collect symbol bounds, raising if one symbol is declared with two bounds."""
    bounds: dict[str, int] = {}
    for shape in shapes:
        for name, bound in shape.symbols.items():
            if bounds.setdefault(name, bound) != bound:
                raise IRError(f"dynamic dim {name!r} declared with two bounds: {bounds[name]} and {bound}")
    return bounds

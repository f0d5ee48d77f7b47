"""Dim algebra, shapes and broadcasting (static and dynamic)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx.errors import IRError, ShapeError
from rlx.ir.dtype import DType
from rlx.ir.shape import MAX_ELEMENTS, Dim, Shape, broadcast_dims, check_symbol_bounds, normalize_axis, product

SEQ = Dim.dynamic("seq", max=512)
BATCH = Dim.dynamic("batch", max=8)


def test_static_dim() -> None:
    d = Dim(7)
    assert d.is_static and d.value == 7 and d.max == 7 and str(d) == "7" and repr(d) == "Dim(7)"
    assert d == 7 and d != 8 and d == Dim(7)
    assert hash(d) == hash(Dim(7))
    assert Dim.of(7) == d and Dim.of(d) is d


def test_dynamic_dim() -> None:
    assert not SEQ.is_static
    assert SEQ.max == 512 and str(SEQ) == "seq" and repr(SEQ) == "Dim(seq)"
    assert SEQ.symbol_names == ("seq",)
    assert SEQ.evaluate({"seq": 17}) == 17
    assert SEQ != 512
    seq = SEQ
    assert seq != Dim(1)
    with pytest.raises(ShapeError, match="dynamic"):
        _ = SEQ.value


def test_dim_multiplication_is_commutative_monomial() -> None:
    a = SEQ * 4
    b = 4 * SEQ
    assert a == b and str(a) == "4*seq" and a.max == 2048
    bs = BATCH * SEQ
    assert bs == SEQ * BATCH
    assert str(bs) == "batch*seq"  # symbols are kept sorted, so equal monomials print alike
    assert bs.max == 8 * 512
    assert bs.evaluate({"batch": 3, "seq": 5}) == 15
    assert (bs * 2).coeff == 2 and Dim(3) * Dim(5) == 15
    assert str(SEQ * SEQ) == "seq*seq"


def test_dim_divide() -> None:
    bs = BATCH * SEQ * 6
    assert bs.divide(SEQ) == BATCH * 6
    assert bs.divide(Dim(3)) == BATCH * SEQ * 2
    assert bs.divide(bs) == Dim(1)
    assert bs.divide(Dim(4)) is None  # 6 not divisible by 4
    assert SEQ.divide(BATCH) is None
    assert Dim(6).divide(Dim(0)) is None
    assert (SEQ * SEQ).divide(SEQ) == SEQ


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, None, MAX_ELEMENTS + 1])
def test_bad_dim_sizes(bad: object) -> None:
    with pytest.raises(IRError):
        Dim.of(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "bound"), [
    ("1seq", 4), ("se q", 4), ("", 4), ("x" * 65, 4), ("seq", 0), ("seq", -3), ("seq", 2.0), ("seq", True),
    (3, 4), ("seq", MAX_ELEMENTS + 1),
])
def test_bad_dynamic_dims(name: object, bound: object) -> None:
    with pytest.raises(IRError):
        Dim.dynamic(name, max=bound)  # type: ignore[arg-type]


def test_product() -> None:
    assert product([]) == 1
    assert product([Dim(2), SEQ, Dim(3)]) == SEQ * 6


def test_shape_basics() -> None:
    s = Shape.of([BATCH, SEQ, 384], "bf16")
    assert s.rank == 3 and s.dtype is DType.BF16
    assert str(s) == "bf16[batch,seq,384]"
    assert s.max_numel == 8 * 512 * 384 and s.max_nbytes == s.max_numel * 2
    assert s.numel == BATCH * SEQ * 384
    assert not s.is_static
    assert s.symbols == {"batch": 8, "seq": 512}
    assert s.concrete({"batch": 2, "seq": 3}) == (2, 3, 384)
    assert s.with_dtype(DType.F32).dtype is DType.F32
    assert s.with_dims([1, 2]).dims == (Dim(1), Dim(2))
    scalar = Shape.of([])
    assert scalar.rank == 0 and scalar.max_numel == 1 and str(scalar) == "f32[]" and scalar.static_dims == ()
    with pytest.raises(ShapeError):
        _ = s.static_dims


def test_shape_limits() -> None:
    with pytest.raises(IRError, match="rank 17"):
        Shape.of([1] * 17)
    Shape.of([1] * 16)
    with pytest.raises(IRError, match="elements"):
        Shape.of([1 << 30, 1 << 30])
    with pytest.raises(IRError, match="elements"):  # the bound counts, not just the static part
        Shape.of([Dim.dynamic("n", max=1 << 21), 1 << 20])
    with pytest.raises(IRError):
        Shape.of([2], "f99")


@pytest.mark.parametrize(("a", "b", "out"), [
    ((2, 3), (3,), (2, 3)),
    ((2, 1), (1, 4), (2, 4)),
    ((), (5,), (5,)),
    ((4, 1, 3), (2, 1), (4, 2, 3)),
    ((0, 1), (1, 3), (0, 3)),
    ((1,), (0,), (0,)),
])
def test_broadcast_static(a: tuple, b: tuple, out: tuple) -> None:
    da, db = tuple(map(Dim, a)), tuple(map(Dim, b))
    assert broadcast_dims(da, db) == tuple(map(Dim, out))
    assert broadcast_dims(db, da) == tuple(map(Dim, out))


def test_broadcast_dynamic() -> None:
    assert broadcast_dims((BATCH, SEQ, Dim(4)), (Dim(1), Dim(4))) == (BATCH, SEQ, Dim(4))
    assert broadcast_dims((Dim(1), SEQ), (BATCH, Dim(1))) == (BATCH, SEQ)
    assert broadcast_dims((SEQ,), (SEQ,)) == (SEQ,)
    assert broadcast_dims((SEQ,), (Dim(1),), (Dim(1),)) == (SEQ,)
    assert broadcast_dims() == ()


@pytest.mark.parametrize(("a", "b"), [
    ((Dim(2), Dim(3)), (Dim(4),)),
    ((SEQ,), (Dim(4),)),  # a dynamic dim is never assumed equal to a static one
    ((SEQ,), (BATCH,)),
    ((SEQ,), (SEQ * 2,)),
])
def test_broadcast_errors_name_both_shapes(a: tuple, b: tuple) -> None:
    with pytest.raises(ShapeError, match=r"cannot broadcast shapes \[.*\] vs \[.*\]"):
        broadcast_dims(a, b)


@given(st.lists(st.integers(1, 4), max_size=5), st.lists(st.integers(1, 4), max_size=5))
def test_broadcast_matches_numpy(a: list[int], b: list[int]) -> None:
    import numpy as np

    try:
        want = np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        with pytest.raises(ShapeError):
            broadcast_dims(tuple(map(Dim, a)), tuple(map(Dim, b)))
        return
    assert broadcast_dims(tuple(map(Dim, a)), tuple(map(Dim, b))) == tuple(map(Dim, want))


def test_normalize_axis() -> None:
    assert normalize_axis(-1, 3) == 2
    assert normalize_axis(0, 3) == 0
    assert normalize_axis(-3, 3) == 0
    for bad in (3, -4):
        with pytest.raises(ShapeError, match="out of range for rank 3"):
            normalize_axis(bad, 3)
    with pytest.raises(ShapeError, match="rank 0"):  # a scalar has no axis 0
        normalize_axis(0, 0)
    with pytest.raises(ShapeError, match="must be an int"):
        normalize_axis(True, 3)


def test_check_symbol_bounds() -> None:
    assert check_symbol_bounds([Shape.of([SEQ]), Shape.of([SEQ, BATCH])]) == {"seq": 512, "batch": 8}
    with pytest.raises(IRError, match="two bounds"):
        check_symbol_bounds([Shape.of([SEQ]), Shape.of([Dim.dynamic("seq", max=256)])])

"""The CPU `argmax` kernel (rlx/codegen/cpu/select.py, templates/cpu/kernels/argmax.h) equals numpy's argmax:
contiguous f32 rows go through the block pass of `rlx_argmax_row_f32` (AVX2 where the build has it), so the rows
put the deciding value at block boundaries (256 values a block), in short tails, and hold NaN, infinities, ties
and signed zeros; a strided axis and f64 rows take the scalar loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx import reference
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim

N = 1100  # four full blocks and a tail of 76


@pytest.fixture(scope="module")
def rows_f32() -> tuple[Graph, object]:
    g = Graph("argmax_rows")
    x = g.input("x", [Dim.dynamic("rows", max=5), Dim.dynamic("n", max=N)])
    g.set_outputs([g.argmax(x, axis=1), g.argmax(x, axis=0)])
    return g, rlx.Session().compile(g)


def _check(compiled: tuple[Graph, object], x: np.ndarray) -> None:
    g, cg = compiled
    got = cg.run({"x": x})
    want = reference.run(g, {"x": x})
    for axis, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(a, np.argmax(x, axis=1 - axis).astype(np.int32))
        np.testing.assert_array_equal(a, b)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_random_rows_equal_numpy(rows_f32, data: st.DataObject) -> None:
    rows, n = data.draw(st.integers(1, 5)), data.draw(st.sampled_from([1, 7, 8, 255, 256, 257, 513, 1000, N]))
    r = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    if data.draw(st.booleans()):
        x = r.standard_normal((rows, n)).astype(np.float32)
    else:  # a coarse grid: many ties for the maximum, across blocks
        x = (r.integers(-6, 6, (rows, n)) / 2).astype(np.float32)
    for _ in range(data.draw(st.integers(0, 3))):  # specials at drawn places
        special = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30]))
        x[data.draw(st.integers(0, rows - 1)), data.draw(st.integers(0, n - 1))] = special
    _check(rows_f32, x)


def test_edge_rows(rows_f32) -> None:
    x = np.zeros((5, N), np.float32)
    x[0, [255, 256, 1099]] = 3.0           # a tie across a block boundary: the lower index
    x[1, 700] = np.nan                       # a NaN after the maximum still wins
    x[1, 3] = np.inf
    x[1, 900] = np.nan
    x[2, :] = -np.inf                        # all -inf: the first
    x[3, :512] = -0.0                        # -0 ties +0: the first index
    x[4, 1099] = 1.0                         # the last value, in the tail
    _check(rows_f32, x)


def test_f64_rows_take_the_loop() -> None:
    g = Graph("argmax_f64")
    x = g.input("x", [3, 300], "f64")
    g.set_outputs([g.argmax(x, axis=1)])
    cg = rlx.Session().compile(g)
    v = np.random.default_rng(3).standard_normal((3, 300))
    v[1, 17] = np.nan
    v[2, [40, 290]] = 9.0
    np.testing.assert_array_equal(cg.run({"x": v})[0], np.argmax(v, axis=1).astype(np.int32))

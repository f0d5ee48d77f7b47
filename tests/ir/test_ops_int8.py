"""The exact arithmetic of dynamic int8 (`rlx.ir.ops_int8`): quantization and the reference product."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.errors import ShapeError
from rlx.ir.graph import Graph
from rlx.ir.ops_int8 import fma_f32, int8_matmul_ref, quantize_symmetric


def test_quantize_rows_rounds_half_to_even_and_clips() -> None:
    x = np.array([[127.0, 0.5, 1.5, -2.5, -127.0], [0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    q, s = quantize_symmetric(x, axis=1)
    assert q.dtype == np.int8 and s.dtype == np.float32
    assert q.tolist() == [[127, 0, 2, -2, -127], [0, 0, 0, 0, 0]]
    assert s.tolist() == [1.0, 0.0]


def test_quantize_columns_scale_and_error_bound() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((50, 7)).astype(np.float32)
    q, s = quantize_symmetric(w, axis=0)
    assert q.shape == w.shape and s.shape == (7,)
    np.testing.assert_allclose(s, np.abs(w).max(axis=0) / 127, rtol=1e-7)
    assert (np.abs(q).max(axis=0) == 127).all()
    assert (np.abs(q * s - w) <= s / 2 * (1 + 1e-6)).all()  # rounding error at most half a step


def test_non_finite_slices_get_nan_scales() -> None:
    x = np.array([[1.0, np.inf], [np.nan, 1.0], [1.0, 2.0]], np.float32)
    q, s = quantize_symmetric(x, axis=1)
    assert np.isnan(s[:2]).all() and (q[:2] == 0).all()
    assert q[2].tolist() == [64, 127]


def test_reference_product_is_the_integer_product() -> None:
    x = np.array([[127.0, -3.0, 5.0]], np.float32)
    w = np.array([[127.0, 1.0], [2.0, -127.0], [0.0, 4.0]], np.float32)
    y, acc = int8_matmul_ref(x, w, np.array([1.0, -1.0], np.float32))
    assert acc.tolist() == [[127 * 127 - 6, 127 + 381 + 20]]
    assert y.tolist() == [[127 * 127 - 6 + 1, 127 + 381 + 20 - 1]]


def test_fma_rounds_once() -> None:
    a, b, c = np.float32(1 + 2**-12), np.float32(1 + 2**-12), np.float32(-1)
    # a*b = 1 + 2^-11 + 2^-24: rounding the product first would lose the 2^-24
    assert fma_f32(a, b, c) == np.float32(2**-11 + 2**-24)


def test_graph_builder_and_errors() -> None:
    g = Graph("q")
    x, w = g.input("x", [4, 8]), g.param("w", [8, 3])
    y = g.int8_matmul(x, w, g.param("b", [3]), activation="relu")
    assert str(g.shape(y)) == "f32[4,3]"
    with pytest.raises(ShapeError, match="bias must be f32"):
        g.int8_matmul(x, w, g.param("b2", [4]))

"""The `sample_top_k` op (rlx/ir/ops_sample.py): shapes, settings checks, and its numpy meaning against an
independent formulation (a full stable sort, normalized probabilities, numpy's own inverse-CDF search)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlx import reference
from rlx.errors import ExecutionError, ShapeError
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.ops_sample import SAMPLE_TOP_K_MAX, SampleTopK, check_settings, descending_order, sample_rows
from rlx.ir.shape import Dim, Shape


def _independent(row: np.ndarray, u: float, temperature: float, top_k: int | None,
                 top_p: float | None) -> tuple[int, float]:
    """(token, distance of u from the nearest CDF boundary) by the textbook recipe: sort everything,
    normalize, cut, renormalize, search."""
    if temperature == 0:
        return int(np.argmax(row)), 1.0
    order = np.argsort(-row.astype(np.float64), kind="stable")
    if top_k is not None:
        order = order[:top_k]
    logits = row[order].astype(np.float64) / temperature
    p = np.exp(logits - logits.max())
    p /= p.sum()
    if top_p is not None:
        keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1
        margin_p = float(np.min(np.abs(np.cumsum(p) - top_p)))
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    else:
        margin_p = 1.0
    cdf = np.cumsum(p)
    j = min(int(np.searchsorted(cdf, u, side="right")), len(order) - 1)
    return int(order[j]), min(float(np.min(np.abs(cdf - u))), margin_p)


def test_infer_and_shape_errors() -> None:
    rows = Dim.dynamic("rows", max=4)
    g = Graph("s")
    x, u, s = g.input("x", [rows, 10]), g.input("u", [rows], "f64"), g.input("s", [3], "f64")
    out = g.sample_top_k(x, u, s)
    assert g.shape(out).dtype.value == "i32" and g.shape(out).dims == (rows,)
    for bad_x, bad_u, bad_s, match in ((("x2", [rows, 10], "i32"), None, None, "floating-point logits"),
                                       (("x3", [10], "f32"), None, None, r"\[rows, vocab\]"),
                                       (None, ("u2", [rows], "f32"), None, "u as f64"),
                                       (None, ("u3", [3], "f64"), None, "u as f64"),
                                       (None, None, ("s2", [4], "f64"), "settings as f64\\[3\\]"),
                                       (None, None, ("s3", [3], "f32"), "settings as f64\\[3\\]")):
        xi = g.input(*bad_x) if bad_x else x
        ui = g.input(*bad_u) if bad_u else u
        si = g.input(*bad_s) if bad_s else s
        with pytest.raises(ShapeError, match=match):
            g.sample_top_k(xi, ui, si)
    with pytest.raises(ShapeError, match="empty vocabulary"):
        SampleTopK().infer([Shape((Dim(2), Dim(0)), DType.F32), Shape((Dim(2),), DType.F64),
                            Shape((Dim(3),), DType.F64)])


def test_serialized_graph_round_trips() -> None:
    g = Graph("s")
    x, u, s = g.input("x", [2, 7]), g.input("u", [2], "f64"), g.input("s", [3], "f64")
    g.set_outputs([g.sample_top_k(x, u, s)])
    again = Graph.from_json(g.to_json())
    assert again.to_json() == g.to_json()
    feed = {"x": np.arange(14, dtype=np.float32).reshape(2, 7), "u": np.array([0.3, 0.9]),
            "s": np.array([1.0, 3.0, 1.0])}
    np.testing.assert_array_equal(reference.run(again, feed)[0], reference.run(g, feed)[0])


@pytest.mark.parametrize(("args", "match"), [
    ((-0.5, 4, None), "temperature must be a finite number >= 0"),
    ((float("nan"), 4, None), "temperature"),
    ((float("inf"), 4, None), "temperature"),
    ((1.0, 0, None), "top_k must be an integer >= 1"),
    ((1.0, 2.5, None), "top_k must be an integer >= 1"),
    ((1.0, 4, 0.0), r"top_p must be in \(0, 1\]"),
    ((1.0, 4, 1.5), r"top_p must be in \(0, 1\]"),
])
def test_bad_settings_name_the_setting(args: tuple, match: str) -> None:
    with pytest.raises(ExecutionError, match=match):
        check_settings(*args)
    with pytest.raises(ExecutionError, match=match):
        sample_rows(np.zeros((1, 5), np.float32), np.zeros(1), *args)


def test_the_op_refuses_top_k_above_the_cap_and_u_outside_0_1() -> None:
    g = Graph("s")
    x, u, s = g.input("x", [2, 300]), g.input("u", [2], "f64"), g.input("s", [3], "f64")
    g.set_outputs([g.sample_top_k(x, u, s)])
    feed = {"x": np.zeros((2, 300), np.float32), "u": np.array([0.1, 0.2]),
            "s": np.array([1.0, SAMPLE_TOP_K_MAX + 1, 1.0])}
    with pytest.raises(ExecutionError, match="above the op's cap 256"):
        reference.run(g, feed)
    for bad in (1.0, -0.1, np.nan):
        with pytest.raises(ExecutionError, match=r"u must be in \[0, 1\)"):
            reference.run(g, {**feed, "s": np.array([1.0, 5, 1.0]), "u": np.array([0.5, bad])})
    # the cap itself is fine
    assert reference.run(g, {**feed, "s": np.array([1.0, SAMPLE_TOP_K_MAX, 1.0])})[0].shape == (2,)


def test_ties_go_to_the_lower_index_and_nan_ranks_first() -> None:
    x = np.array([1.0, 3.0, 2.0, 3.0, 3.0, -0.0, 0.0], np.float32)
    assert descending_order(x).tolist() == [1, 3, 4, 2, 0, 5, 6]
    xn = x.copy()
    xn[[2, 5]] = np.nan
    assert descending_order(xn).tolist()[:2] == [2, 5]
    # top_k=2 keeps tokens 1 and 3 of the three 3.0s, each with probability 1/2
    row = x[None]
    assert sample_rows(row, np.array([0.0]), 1.0, 2, None).tolist() == [1]
    assert sample_rows(row, np.array([0.4999]), 1.0, 2, None).tolist() == [1]
    assert sample_rows(row, np.array([0.5]), 1.0, 2, None).tolist() == [3]  # c_0 = 1 is not > 0.5 * 2
    assert sample_rows(row, np.array([np.nextafter(1.0, 0)]), 1.0, 2, None).tolist() == [3]
    # a NaN on top takes the row; so does +inf
    assert sample_rows(xn[None], np.array([0.9]), 1.0, 4, None).tolist() == [2]
    xi = x.copy()
    xi[6] = np.inf
    assert sample_rows(xi[None], np.array([0.9]), 1.0, 4, None).tolist() == [6]


def test_argmax_cases_top_k_1_temperature_0_and_tiny_top_p() -> None:
    r = np.random.default_rng(0)
    x = r.standard_normal((6, 50)).astype(np.float32)
    x[2, 7] = x[2, 9] = x[2].max() + 1  # a tie for first: the lower index
    want = np.argmax(x, axis=1)
    for u in (0.0, 0.5, np.nextafter(1.0, 0)):
        us = np.full(6, u)
        np.testing.assert_array_equal(sample_rows(x, us, 1.0, 1, None), want)
        np.testing.assert_array_equal(sample_rows(x, us, 0.0, 40, 0.5), want)
        np.testing.assert_array_equal(sample_rows(x, us, 0.7, 40, 1e-9), want)


def test_u_at_0_takes_the_top_and_just_below_1_the_last_kept_token() -> None:
    x = np.array([[0.5, 2.0, 1.0, -1.0, 1.5]], np.float32)
    assert sample_rows(x, np.array([0.0]), 1.0, 3, None).tolist() == [1]
    assert sample_rows(x, np.array([np.nextafter(1.0, 0)]), 1.0, 3, None).tolist() == [2]  # 3rd best
    assert sample_rows(x, np.array([np.nextafter(1.0, 0)]), 1.0, 5, None).tolist() == [3]  # the worst
    # top_p: the smallest prefix reaching it; u just below 1 picks its last token
    p = np.exp(np.array([2.0, 1.5, 1.0, 0.5, -1.0]))
    p /= p.sum()
    cut = float(np.cumsum(p)[1])  # exactly the first two tokens' mass
    assert sample_rows(x, np.array([np.nextafter(1.0, 0)]), 1.0, 5, cut * 0.999).tolist() == [4]
    assert sample_rows(x, np.array([np.nextafter(1.0, 0)]), 1.0, 5, cut * 1.001).tolist() == [2]


def test_the_reference_evaluator_is_sample_rows() -> None:
    g = Graph("s")
    x, u, s = g.input("x", [3, 40]), g.input("u", [3], "f64"), g.input("s", [3], "f64")
    g.set_outputs([g.sample_top_k(x, u, s)])
    r = np.random.default_rng(1)
    for settings_ in ((0.8, 10, 0.9), (0.0, 5, 1.0), (2.0, 40, 1.0)):
        feed = {"x": r.standard_normal((3, 40)).astype(np.float32), "u": r.random(3), "s": np.array(settings_)}
        want = sample_rows(feed["x"], feed["u"], *settings_)
        np.testing.assert_array_equal(reference.run(g, feed)[0], want)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_sample_rows_matches_the_textbook_recipe(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 60))
    grid = data.draw(st.booleans())  # values on a coarse grid: many ties
    values = st.integers(-6, 6).map(lambda v: v / 2) if grid else st.floats(-20, 20, width=32)
    row = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), np.float32)
    u = data.draw(st.floats(0, 1, exclude_max=True))
    temperature = data.draw(st.sampled_from([0.0, 0.3, 1.0, 2.5]))
    top_k = data.draw(st.none() | st.integers(1, 70))
    top_p = data.draw(st.none() | st.floats(1e-6, 1.0))
    want, margin = _independent(row, u, temperature, top_k, top_p)
    assume(margin > 1e-9)  # the two formulations round differently right at a boundary
    assert sample_rows(row[None], np.array([u]), temperature, top_k, top_p).tolist() == [want]

"""The CPU `sample_top_k` kernel (rlx/codegen/cpu/sample.py, templates/cpu/kernels/sample.h) equals the
reference token for token: random rows (hypothesis), ties, NaN and infinity, top_k 1 and at the cap,
tiny top_p, temperature 0, u at 0 and just below 1; bad settings fail the run naming the setting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx import reference
from rlx.errors import ExecutionError
from rlx.ir.graph import Graph
from rlx.ir.ops_sample import SAMPLE_TOP_K_MAX
from rlx.ir.shape import Dim

VOCAB = 700
BELOW_1 = float(np.nextafter(1.0, 0.0))


@pytest.fixture(scope="module")
def compiled() -> tuple[Graph, object]:
    g = Graph("sample_cpu")
    rows = Dim.dynamic("rows", max=6)
    x, u, s = g.input("x", [rows, VOCAB]), g.input("u", [rows], "f64"), g.input("s", [3], "f64")
    g.set_outputs([g.sample_top_k(x, u, s)])
    return g, rlx.Session().compile(g)


def _check(compiled: tuple[Graph, object], x: np.ndarray, u: np.ndarray, s: tuple) -> np.ndarray:
    g, cg = compiled
    feed = {"x": x, "u": np.asarray(u, np.float64), "s": np.array(s, np.float64)}
    got = cg.run(feed)[0]
    np.testing.assert_array_equal(got, reference.run(g, feed)[0], err_msg=f"settings {s}")
    return got


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_rows_equal_the_reference(compiled, data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 6))
    seed = data.draw(st.integers(0, 2**32 - 1))
    r = np.random.default_rng(seed)
    if data.draw(st.booleans()):
        x = (r.standard_normal((rows, VOCAB)) * data.draw(st.sampled_from([0.1, 3.0, 30.0]))).astype(np.float32)
    else:  # a coarse grid: long runs of ties
        x = (r.integers(-10, 10, (rows, VOCAB)) / 4).astype(np.float32)
    u = np.array(data.draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=rows, max_size=rows)))
    temperature = data.draw(st.sampled_from([0.0, 1e-3, 0.5, 0.8, 1.0, 4.0]))
    top_k = data.draw(st.integers(1, SAMPLE_TOP_K_MAX))
    top_p = data.draw(st.sampled_from([1.0, 0.95, 0.5, 1e-6]) | st.floats(1e-3, 1.0))
    _check(compiled, x, u, (temperature, top_k, top_p))


def test_edge_cases(compiled) -> None:
    r = np.random.default_rng(5)
    x = r.standard_normal((6, VOCAB)).astype(np.float32)
    x[0, [10, 400, 699]] = 9.0                # a three-way tie for first
    x[1, 5] = x[1, 6] = np.nan                # NaN ranks first (the first NaN takes the row)
    x[2, 300] = np.inf                        # +inf takes the row
    x[3, :] = -np.inf                         # all -inf: the first token
    x[4, :] = 0.0
    x[4, 650:] = -0.0                         # -0 ties +0: the lower index wins
    argmax = np.array([10, 5, 300, 0, 0, int(np.argmax(x[5]))])
    for u in (0.0, 0.5, BELOW_1):
        us = np.full(6, u)
        np.testing.assert_array_equal(_check(compiled, x, us, (0.0, 50, 1.0)), argmax)   # temperature 0
        np.testing.assert_array_equal(_check(compiled, x, us, (1.3, 1, 1.0)), argmax)    # top_k 1
        np.testing.assert_array_equal(_check(compiled, x, us, (0.9, 40, 1e-9)), argmax)  # tiny top_p
    # u at 0 takes the best token, just below 1 the last kept one (the tie members in index order)
    assert _check(compiled, x, np.zeros(6), (1.0, 3, 1.0))[0] == 10
    assert _check(compiled, x, np.full(6, BELOW_1), (1.0, 3, 1.0))[0] == 699
    assert _check(compiled, x, np.full(6, BELOW_1), (1e6, SAMPLE_TOP_K_MAX, 1.0))[4] == SAMPLE_TOP_K_MAX - 1
    _check(compiled, x, r.random(6), (0.7, SAMPLE_TOP_K_MAX, 0.9))  # the cap


def test_a_vocabulary_smaller_than_top_k() -> None:
    g = Graph("sample_small")
    x, u, s = g.input("x", [2, 3]), g.input("u", [2], "f64"), g.input("s", [3], "f64")
    g.set_outputs([g.sample_top_k(x, u, s)])
    cg = rlx.Session().compile(g)
    feed = {"x": np.array([[0.0, 1.0, 0.5], [2.0, 2.0, 2.0]], np.float32), "u": np.array([BELOW_1, BELOW_1]),
            "s": np.array([1.0, 200.0, 1.0])}
    np.testing.assert_array_equal(cg.run(feed)[0], [0, 2])
    np.testing.assert_array_equal(reference.run(g, feed)[0], [0, 2])


@pytest.mark.parametrize(("s", "u", "match"), [
    ((-1.0, 5, 1.0), 0.5, "temperature must be a finite number >= 0, got -1"),
    ((np.nan, 5, 1.0), 0.5, "temperature"),
    ((1.0, 0, 1.0), 0.5, "top_k must be an integer >= 1, got 0"),
    ((1.0, 2.5, 1.0), 0.5, "top_k must be an integer >= 1, got 2.5"),
    ((1.0, SAMPLE_TOP_K_MAX + 1, 1.0), 0.5, "above the op's cap 256"),
    ((1.0, 5, 0.0), 0.5, r"top_p must be in \(0, 1\], got 0"),
    ((1.0, 5, 1.5), 0.5, r"top_p must be in \(0, 1\]"),
    ((1.0, 5, 1.0), 1.0, r"u must be in \[0, 1\), got 1 \(row 1\)"),
    ((1.0, 5, 1.0), -0.25, r"u must be in \[0, 1\)"),
])
def test_bad_settings_fail_the_run(compiled, s: tuple, u: float, match: str) -> None:
    _, cg = compiled
    feed = {"x": np.zeros((2, VOCAB), np.float32), "u": np.array([0.1, u]), "s": np.array(s, np.float64)}
    with pytest.raises(ExecutionError, match=match):
        cg.run(feed)
    assert cg.run({**feed, "u": np.array([0.1, 0.2]), "s": np.array([1.0, 5, 1.0])})[0].shape == (2,)  # usable


def test_half_logits_are_widened_and_f64_refused_on_cuda() -> None:
    """f16 logits run through legalization's exact widening on the CPU; CUDA reads f32/f16/bf16 logits and
    refuses f64 before any build."""
    from rlx.codegen.backends import first_unsupported_op

    g = Graph("sample_f16")
    x, u, s = g.input("x", [3, 90], "f16"), g.input("u", [3], "f64"), g.input("s", [3], "f64")
    g.set_outputs([g.sample_top_k(x, u, s)])
    feed = {"x": np.random.default_rng(2).standard_normal((3, 90)).astype(np.float16), "u": np.array([0.1, 0.5, 0.9]),
            "s": np.array([0.9, 30, 0.95])}
    np.testing.assert_array_equal(rlx.Session().compile(g).run(feed)[0], reference.run(g, feed)[0])
    assert first_unsupported_op(g, "cuda") is None
    g64 = Graph("sample_f64")
    x, u, s = g64.input("x", [3, 90], "f64"), g64.input("u", [3], "f64"), g64.input("s", [3], "f64")
    g64.set_outputs([g64.sample_top_k(x, u, s)])
    node, reason = first_unsupported_op(g64, "cuda")
    assert node.kind == "sample_top_k" and "f64" in reason

"""CPU backend parity for data movement: transpose, narrow, concat, reshape (views and copies),
gather (every table dtype, both index dtypes, any axis, bounds-checked). Data movement never
rounds, so every comparison is exact.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from cpu_helpers import check, compile_graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlx

EXACT = {"rtol": 0, "atol": 0}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 5), min_size=2, max_size=5), st.randoms())
def test_transpose_random_permutations(rng, shape, rnd):
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    g = rlx.Graph("transpose")
    x = g.input("x", shape)
    xi = g.input("xi", shape, "i64")
    g.set_outputs([g.transpose(x, perm), g.transpose(xi, perm)])
    check(g, {"x": rng.standard_normal(shape).astype(np.float32),
              "xi": rng.integers(-9, 9, shape).astype(np.int64)}, **EXACT)


def test_transpose_2d_tiles_and_dtypes(rng):
    g = rlx.Graph("transpose2d")
    outs = {}
    for dt in ("f32", "f16", "u8", "f64"):
        x = g.input(f"x_{dt}", [67, 45], dt)
        outs[dt] = g.transpose(x, [1, 0])
    x3 = g.input("x3", [4, 33, 70])
    outs["heads"] = g.transpose(g.reshape(x3, [4, 33, 7, 10]), [0, 2, 1, 3])
    g.set_outputs(outs)
    feed = {f"x_{dt}": rng.integers(0, 200, (67, 45)).astype(rlx.DType.parse(dt).np) for dt in ("f32", "f16", "u8",
                                                                                                  "f64")}
    feed["x3"] = rng.standard_normal((4, 33, 70)).astype(np.float32)
    check(g, feed, **EXACT)


def test_narrow_concat_reshape(rng):
    seq = rlx.Dim.dynamic("seq", max=12)
    g = rlx.Graph("move")
    x = g.input("x", [2, seq, 12])
    y = g.input("y", [2, seq, 5])
    outs = {
        "narrow_last": g.narrow(x, 2, 3, 6),
        "narrow_first": g.narrow(x, 0, 1, 1),  # contiguous: a view, copied to the output
        "concat": g.concat([x, y, x], 2),
        "concat0": g.concat([x, x], 0),
        "reshape": g.reshape(x, [2, seq, 3, 4]),
        "reshape_neg": g.activation("neg", g.reshape(g.narrow(x, 2, 0, 4), [-1, 2])),
        "input_out": x,
    }
    g.set_outputs(outs)
    cg = compile_graph(g)
    for s in (1, 7, 12):
        feed = {"x": rng.standard_normal((2, s, 12)).astype(np.float32),
                "y": rng.standard_normal((2, s, 5)).astype(np.float32)}
        check(g, feed, cg=cg, **EXACT)


@pytest.mark.parametrize(("table_dtype", "index_dtype"),
                         list(itertools.product(["f32", "bf16", "i8", "i64", "bool"], ["i32", "i64"])))
def test_gather_dtypes(rng, table_dtype, index_dtype):
    g = rlx.Graph("gather")
    t = g.input("t", [11, 6], table_dtype)
    i = g.input("i", [2, 5], index_dtype)
    g.set_outputs([g.gather(t, i, 0), g.gather(t, g.narrow(i, 1, 0, 3), 1)])
    dt = rlx.DType.parse(table_dtype)
    raw = rng.integers(-3, 4, (11, 6))
    tv = raw != 0 if dt is rlx.DType.BOOL else raw.astype(np.float32 if dt is rlx.DType.BF16 else dt.np)
    iv = rng.integers(0, 6, (2, 5)).astype(rlx.DType.parse(index_dtype).np)
    check(g, {"t": tv, "i": iv}, **EXACT)


def test_gather_embedding_table_param(rng):
    seq = rlx.Dim.dynamic("seq", max=64)
    g = rlx.Graph("embed")
    ids = g.input("ids", [2, seq], "i64")
    table = g.param("table", [100, 32])
    g.set_outputs([g.gather(table, ids)])
    params = {"table": rng.standard_normal((100, 32)).astype(np.float32)}
    cg = compile_graph(g, params)
    for s in (1, 64):
        ids_v = rng.integers(0, 100, (2, s))
        check(g, {"ids": ids_v}, params, cg=cg, **EXACT)


def test_gather_out_of_range_index_is_an_error_not_a_crash(rng):
    g = rlx.Graph("gather_bad")
    table = g.param("table", [10, 4])
    ids = g.input("ids", [3], "i32")
    g.set_outputs([g.gather(table, ids)])
    cg = compile_graph(g, {"table": np.zeros((10, 4), np.float32)})
    for bad in (10, -1, 2**31 - 1):
        with pytest.raises(rlx.ExecutionError, match=f"gather index {bad} at position 1 is out of range"):
            cg.run(ids=np.array([0, bad, 3], np.int32))
    assert cg.run(ids=np.array([9, 0, 3], np.int32))[0].shape == (3, 4)  # still usable afterwards

"""Decompositions: each replacement equals the op it replaces, on the reference."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.opt.decompose import DECOMPOSITIONS, decompose


def _graph(kind: str, fn: str, dtype: str) -> rlx.Graph:
    g = rlx.Graph("d")
    x = g.input("x", [3, 16], dtype)
    if kind == "rms_norm":
        g.set_outputs([g.rms_norm(x, g.param("g", [16], dtype), eps=1e-5)])
    elif kind == "batch_norm":  # over axis 1: 16 channels
        g.set_outputs([g.batch_norm(x, *(g.param(n, [16], dtype) for n in "sbmv"), eps=1e-3)])
    else:
        g.set_outputs([g.activation(fn, x)])
    return g


@pytest.mark.parametrize("key", sorted(k for k in DECOMPOSITIONS if k != ("pool", "")),
                         ids=lambda k: ":".join(filter(None, k)))
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_decomposition_matches_the_op(key, dtype):
    kind, fn = key
    g = _graph(kind, fn, dtype)
    out = decompose(g, lambda graph, node: (node.kind, getattr(node.op, "fn", "")) != (kind, fn)
                    and not (kind == "rms_norm" and node.kind == "rms_norm"))
    assert kind not in {n.kind for n in out.nodes} or kind == "activation"
    assert all(getattr(n.op, "fn", None) != fn for n in out.nodes if fn)
    rng = np.random.default_rng(0)
    np_dtype = {"f32": np.float32, "f64": np.float64}[dtype]
    feed = {"x": (rng.standard_normal((3, 16)) * 4).astype(np_dtype)}
    params = {"g": rng.standard_normal(16).astype(np_dtype)} if kind == "rms_norm" else {}
    if kind == "batch_norm":
        params = {n: rng.standard_normal(16).astype(np_dtype) for n in "sbm"}
        params["v"] = (rng.random(16) + 0.5).astype(np_dtype)
    want = rlx.reference.run(g, feed, params)[0]
    got = rlx.reference.run(out, feed, params)[0]
    # Several rounded ops instead of one: a few ulps of the dtype.
    rtol, atol = (1e-5, 1e-6) if dtype == "f32" else (1e-12, 1e-14)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_supported_ops_are_left_alone():
    g = _graph("activation", "silu", "f32")
    assert decompose(g, lambda graph, node: True) is g


@pytest.mark.parametrize("pool", [
    dict(fn="max", kernel=(2, 3, 2), strides=(2, 1, 2), pads=(1, 1, 0, 0, 1, 1), dilations=(1, 2, 1), ceil_mode=True),
    dict(fn="avg", kernel=(3, 2, 2), strides=(2, 2, 1), pads=(1, 0, 1, 1, 1, 0), ceil_mode=True,
         count_include_pad=True),
    dict(fn="avg", kernel=(2, 2, 3), pads=(1, 1, 1, 0, 1, 1), dilations=(2, 1, 2)),
])
def test_a_3d_pool_is_two_2d_pools(pool: dict) -> None:
    """The ("pool", "") decomposition: a 3-D pool as a 2-D pool over (H, W) then a (kd, 1) one; 2-D pools stay."""
    g = rlx.Graph("d")
    batch = rlx.Dim.dynamic("batch", 3)
    x = g.input("x", [batch, 3, 6, 7, 5])
    fn, kernel = pool.pop("fn"), pool.pop("kernel")
    g.set_outputs([g.pool(fn, x, kernel, **pool), g.pool(fn, g.input("y", [batch, 2, 5, 5]), (2, 2))])
    out = decompose(g, lambda graph, node: node.kind != "pool")
    assert sorted(len(n.op.kernel) for n in out.nodes if n.kind == "pool") == [2, 2, 2]
    rng = np.random.default_rng(1)
    for b in (1, 3):
        feed = {"x": rng.standard_normal((b, 3, 6, 7, 5)).astype(np.float32),
                "y": rng.standard_normal((b, 2, 5, 5)).astype(np.float32)}
        for got, want in zip(rlx.reference.run(out, feed), rlx.reference.run(g, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

"""User-defined ops (rlx.custom_op, rlx/ir/ops_user.py): registration, inference, the reference, the digest,
and how the optimizer treats them (opaque to fusion, visible to DCE and CSE)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.errors import BuildError, ExecutionError, IRError, ShapeError
from rlx.ir.ops_user import USER_OPS, check_current
from rlx.opt.pipeline import optimize
from tests.ir.user_ops import EXAMPLE, swish_beta

HEADERS = EXAMPLE.parent


def _swish(x: np.ndarray, beta: float) -> np.ndarray:
    return x / (1.0 + np.exp(-beta * x.astype(np.float64)))


def test_traces_and_the_reference_computes_it() -> None:
    op = swish_beta()
    g = rlx.trace("t", lambda t: op(t.input("x", [rlx.Dim.dynamic("n", 8), 3]), t.input("beta", [])))
    x = np.linspace(-3, 3, 15, dtype=np.float32).reshape(5, 3)
    (y,) = reference.run(g, {"x": x, "beta": np.array(0.7, np.float32)})
    np.testing.assert_allclose(y, _swish(x, 0.7), rtol=1e-6)
    assert "user_op[swish_beta, digest=" in str(g)


def test_registration_errors_are_clear(tmp_path: Path) -> None:
    ok = {"infer": lambda x: x, "reference": lambda x: x}
    with pytest.raises(IRError, match="does not exist"):
        rlx.custom_op("missing_header", cpu=tmp_path / "nope.h", **ok)
    with pytest.raises(IRError, match="must be an identifier"):
        rlx.custom_op("not an identifier", **ok)
    with pytest.raises(IRError, match=r"the metal header .* does not exist"):  # metal= is checked like cpu=
        rlx.custom_op("with_metal", metal=tmp_path / "nope.metal", **ok)
    with pytest.raises(IRError, match="header path or a"):
        rlx.custom_op("bad_pair", cpu=(HEADERS / "swish_beta.h", "not a name"), **ok)
    bad = rlx.custom_op("bad_infer", infer=lambda x: "f32[2]", reference=lambda x: x)
    with pytest.raises(ShapeError, match="infer must return a Shape"):
        rlx.trace("t", lambda t: bad(t.input("x", [2])))
    wrong = rlx.custom_op("wrong_reference", infer=lambda x: x, reference=lambda x: x[:1])
    g = rlx.trace("t", lambda t: wrong(t.input("x", [2])))
    with pytest.raises(ExecutionError, match=r"reference returned shape \(1,\), infer says \(2,\)"):
        reference.run(g, {"x": np.ones(2, np.float32)})


def test_infer_may_change_shape_and_dtype() -> None:
    rows = rlx.custom_op("row_sums", infer=lambda x: ((x.dims[0],), "f64"), reference=lambda x: x.sum(axis=1))
    g = rlx.trace("t", lambda t: rows(t.input("x", [4, 3])))
    assert str(g.shape(g.outputs[0])) == "f64[4]"
    (y,) = reference.run(g, {"x": np.ones((4, 3), np.float32)})
    assert y.tolist() == [3.0] * 4


def test_digest_follows_the_header_and_stale_graphs_are_refused(tmp_path: Path) -> None:
    header = tmp_path / "swish_beta.h"
    shutil.copy(HEADERS / "swish_beta.h", header)
    op = swish_beta("swish_digest", c_header=header)
    g = rlx.trace("t", lambda t: op(t.input("x", [2]), t.input("beta", [])))
    before = op.spec.digest()
    check_current([n.op for n in g.nodes])
    header.write_text(header.read_text() + "\n/* edited */\n")
    assert op.spec.digest() != before
    with pytest.raises(BuildError, match="changed since the graph was traced"):
        check_current([n.op for n in g.nodes])
    g2 = rlx.trace("t", lambda t: op(t.input("x", [2]), t.input("beta", [])))
    check_current([n.op for n in g2.nodes])
    assert g2.to_json() != g.to_json()  # the graph (and so the compile index) sees the edit


def test_unregistered_ops_are_named() -> None:
    op = swish_beta("swish_gone")
    g = rlx.trace("t", lambda t: op(t.input("x", [2]), t.input("beta", [])))
    text = g.to_json()
    del USER_OPS["swish_gone"]
    with pytest.raises(IRError, match=r"'swish_gone' is not registered in this process: call rlx.custom_op"):
        rlx.Graph.from_json(text)


def test_opaque_to_fusion_visible_to_dce_and_cse() -> None:
    op = swish_beta()

    def model(t):
        x, beta = t.input("x", [4, 8]), t.input("beta", [])
        h = (x * 2.0).tanh()  # an elementwise chain on each side: fusion must not swallow the user op
        a, b = op(h, beta), op(h, beta)  # the same call twice: CSE keeps one
        op(x, beta)  # unused: DCE drops it
        return (a + b).relu()

    g = rlx.trace("t", model)
    opt = optimize(g, 2)
    users = [n for n in opt.nodes if n.kind == "user_op"]
    assert len(users) == 1
    assert users[0].inputs[0] != opt.inputs()[0].id  # the unused call on x is gone
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    feed = {"x": x, "beta": np.array(1.3, np.float32)}
    np.testing.assert_allclose(reference.run(opt, feed)[0], reference.run(g, feed)[0], rtol=1e-6)
    np.testing.assert_allclose(reference.run(g, feed)[0], np.maximum(2 * _swish(np.tanh(2 * x), 1.3), 0),
                               rtol=1e-5, atol=1e-6)


def test_vjp_matches_finite_differences() -> None:
    op = swish_beta()
    g = rlx.trace("t", lambda t: op(t.input("x", [6]), t.input("beta", [])).sum())
    dg = rlx.grad(g, wrt=["x", "beta"])
    x = np.linspace(-2, 2, 6).astype(np.float32)
    beta = np.array(0.8, np.float32)
    dx, dbeta = reference.run(dg, {"x": x, "beta": beta})[1:]

    def loss(xv: np.ndarray, b: float) -> float:
        return float(_swish(xv.astype(np.float64), b).sum())

    eps = 1e-4
    want_dx = [(loss(x + eps * e, 0.8) - loss(x - eps * e, 0.8)) / (2 * eps) for e in np.eye(6)]
    np.testing.assert_allclose(dx, want_dx, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(dbeta, (loss(x, 0.8 + eps) - loss(x, 0.8 - eps)) / (2 * eps), rtol=1e-3)


def test_no_vjp_is_a_clear_autodiff_error() -> None:
    op = rlx.custom_op("no_vjp", infer=lambda x: x, reference=lambda x: x)
    g = rlx.trace("t", lambda t: op(t.input("x", [3])).sum())
    with pytest.raises(IRError, match=r"custom op 'no_vjp' .* has no derivative: register it with vjp="):
        rlx.grad(g, wrt=["x"])

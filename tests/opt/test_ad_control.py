"""Derivatives of cond (both modes) and while_loop (forward; reverse through max_trips): finite differences,
vjp/jvp agreement, a compiled CPU gradient graph, clear refusals, and JAX (lax.cond, lax.while_loop,
lax.fori_loop) when installed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.errors import IRError
from rlx.reference import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cpu_helpers import check

F = "f64"
EPS = 1e-6


def _cond_graph(dtype: str = F) -> rlx.Graph:
    def fn(t):
        x, w = t.input("x", [3], dtype), t.input("w", [3], dtype)
        # the true branch reads both operands, the false branch only x: w's cotangent there is zero
        return t.cond(x.sum() > 0, lambda v, u: (v * u).tanh() + v * v, lambda v, u: v.exp() * 0.5, x, w)

    return rlx.trace("cond", fn)


def _while_graph(dtype: str = F, max_trips: int | None = 30, loss: bool = False) -> rlx.Graph:
    def fn(t):
        x, w = t.input("x", [3], dtype), t.input("w", [3], dtype)
        z = t.while_loop(lambda c, b: (c * c).sum() < 40.0, lambda c, b: c * 1.25 + (b * c).tanh(), x,
                         bcasts=[w], max_trips=max_trips)
        return {"loss": (z * z).sum()} if loss else z

    return rlx.trace("while", fn)


def _feeds(x: list[float], dtype=np.float64) -> dict[str, np.ndarray]:
    return {"x": np.array(x, dtype), "w": np.array([0.5, -0.2, 0.3], dtype)}


def _fd_check(g: rlx.Graph, feeds: dict[str, np.ndarray], *, reverse: bool = True, seed: int = 0) -> None:
    """vjp and jvp of `g` against central differences along a random direction."""
    rng = np.random.default_rng(seed)
    out = run(g, feeds)[0]
    d = {k: rng.standard_normal(v.shape) for k, v in feeds.items()}
    plus = run(g, {k: v + EPS * d[k] for k, v in feeds.items()})[0]
    minus = run(g, {k: v - EPS * d[k] for k, v in feeds.items()})[0]
    fd = (plus - minus) / (2 * EPS)
    jg = rlx.jvp(g)
    tan = run(jg, {**feeds, **{f"t_{k}": v for k, v in d.items()}})[1]
    np.testing.assert_allclose(tan, fd, rtol=1e-6, atol=1e-8)
    if reverse:
        cot = rng.standard_normal(out.shape)
        vg = rlx.vjp(g)
        got = dict(zip(vg.output_names, run(vg, {**feeds, f"d_{g.output_names[0]}": cot})))
        lhs = sum(float(np.sum(got[f"grad_{k}"] * d[k])) for k in feeds)
        assert abs(lhs - float(np.sum(cot * fd))) <= 1e-6 * max(1.0, abs(lhs))


@pytest.mark.parametrize("x", [[1.0, -2.0, 3.0], [-1.0, 0.5, -2.0]], ids=["true", "false"])
def test_cond_derivatives_match_finite_differences(x: list[float]) -> None:
    _fd_check(_cond_graph(), _feeds(x))


def test_cond_cotangent_of_an_operand_the_taken_branch_ignores_is_zero() -> None:
    got = run(rlx.vjp(_cond_graph()), {**_feeds([-1.0, 0.5, -2.0]), "d_out0": np.ones(3)})
    np.testing.assert_array_equal(got[2], np.zeros(3))  # grad_w: the false branch never reads w
    assert np.all(got[1] != 0)


@pytest.mark.parametrize("x", [[0.3, -0.2, 0.1], [2.0, 1.0, -3.0], [9.0, 0.0, 0.0]],
                         ids=["many_trips", "few_trips", "no_trip"])
def test_while_loop_derivatives_match_finite_differences(x: list[float]) -> None:
    _fd_check(_while_graph(), _feeds(x))


def test_while_loop_stopped_by_max_trips_is_differentiated_through_those_trips() -> None:
    g = _while_graph(max_trips=3)
    feeds = _feeds([0.1, 0.1, 0.1])
    c = feeds["x"]
    for _ in range(3):  # the loop would run on: max_trips ends it
        c = c * 1.25 + np.tanh(feeds["w"] * c)
    np.testing.assert_allclose(run(g, feeds)[0], c, rtol=1e-14)
    _fd_check(g, feeds)


def test_while_loop_forward_mode_needs_no_bound_and_reverse_mode_names_the_fix() -> None:
    g = _while_graph(max_trips=None)
    _fd_check(g, _feeds([0.3, -0.2, 0.1]), reverse=False)
    with pytest.raises(IRError, match=r"reverse mode through .* while_loop needs max_trips"):
        rlx.vjp(g)


def test_compiled_gradient_of_control_flow_matches_the_reference() -> None:
    def fn(t):
        x, w = t.input("x", [3]), t.input("w", [3])
        y = t.cond(x.sum() > 0, lambda v, u: (v * u).tanh() + v, lambda v, u: v * 0.5 - u, x, w)
        z = t.while_loop(lambda c, b: (c * c).sum() < 40.0, lambda c, b: c * 1.25 + (b * c).tanh(), y,
                         bcasts=[w], max_trips=30)
        return {"loss": (z * z).sum()}

    dg = rlx.grad(rlx.trace("cf", fn))
    cg = rlx.Session(rlx.Device.CPU).compile(dg)
    for x in ([1.0, -2.0, 3.0], [-1.0, 0.5, -2.0]):
        check(dg, _feeds(x, np.float32), rtol=1e-4, atol=1e-5, cg=cg)


def test_against_jax_cond_and_while_loop() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    for x in ([1.0, -2.0, 3.0], [-1.0, 0.5, -2.0]):
        feeds = _feeds(x)

        def cond_loss(x, w):
            y = jax.lax.cond(jnp.sum(x) > 0, lambda v, u: jnp.tanh(v * u) + v * v, lambda v, u: jnp.exp(v) * 0.5,
                             x, w)
            return jnp.sum(y)

        want = jax.grad(cond_loss, argnums=(0, 1))(feeds["x"], feeds["w"])
        got = run(rlx.vjp(_cond_graph()), {**feeds, "d_out0": np.ones(3)})
        for a, b in zip(got[1:], want):
            np.testing.assert_allclose(a, np.asarray(b), rtol=1e-12, atol=1e-14)

    def step(c, w):
        return c * 1.25 + jnp.tanh(w * c)

    def while_value(x, w):
        return jax.lax.while_loop(lambda c: jnp.sum(c * c) < 40.0, lambda c: step(c, w), x)

    feeds = _feeds([0.3, -0.2, 0.1])
    np.testing.assert_allclose(run(_while_graph(), feeds)[0], np.asarray(while_value(feeds["x"], feeds["w"])),
                               rtol=1e-12)
    tx = np.array([0.1, 0.2, -0.3])
    _, want_t = jax.jvp(lambda x: while_value(x, feeds["w"]), (feeds["x"],), (tx,))
    got_t = run(rlx.jvp(_while_graph(), wrt="x"), {**feeds, "t_x": tx})[1]
    np.testing.assert_allclose(got_t, np.asarray(want_t), rtol=1e-10)

    def masked_loss(x, w):  # lax.while_loop has no reverse mode: the bounded masked loop is its equal
        def body(_, c):
            return jnp.where(jnp.sum(c * c) < 40.0, step(c, w), c)

        z = jax.lax.fori_loop(0, 30, body, x)
        return jnp.sum(z * z)

    want = jax.grad(masked_loss, argnums=(0, 1))(feeds["x"], feeds["w"])
    got = run(rlx.grad(_while_graph(loss=True)), feeds)
    for a, b in zip(got[1:], want):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-10, atol=1e-12)

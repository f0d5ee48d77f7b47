"""Derivatives of scan (every form, checkpointed) and custom_fn: finite differences, compiled CPU
gradient graphs, the memory plan of checkpointed backward, and JAX (lax.scan, custom_vjp) when installed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.opt.memplan import plan
from rlx.reference import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cpu_helpers import check

F = "f64"
EPS = 1e-6


def _scan_graph(length: int | rlx.Dim = 5, *, dtype: str = F, c: int = 3, loss: bool = False,
                **kw: object) -> rlx.Graph:
    def fn(t):
        xs = t.input("xs", [length, c], dtype)
        c0, w = t.input("c0", [c], dtype), t.input("w", [c], dtype)
        out = t.scan(lambda cc, ww, x: (cc * ww + x).tanh(), c0, xs=[xs], bcasts=[w], **kw)
        return {"loss": (out * out).sum()} if loss else out

    return rlx.trace("scan", fn)


def _feeds(rng: np.random.Generator, length: int, c: int = 3, dtype=np.float64) -> dict[str, np.ndarray]:
    return {"xs": rng.standard_normal((length, c)).astype(dtype), "c0": rng.standard_normal(c).astype(dtype),
            "w": rng.standard_normal(c).astype(dtype)}


def _fd_check(g: rlx.Graph, feeds: dict[str, np.ndarray], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    out = run(g, feeds)[0]
    cot = rng.standard_normal(out.shape)
    d = {k: rng.standard_normal(v.shape) for k, v in feeds.items()}
    plus = run(g, {k: v + EPS * d[k] for k, v in feeds.items()})[0]
    minus = run(g, {k: v - EPS * d[k] for k, v in feeds.items()})[0]
    fd = (plus - minus) / (2 * EPS)
    vg = rlx.vjp(g)
    got = dict(zip(vg.output_names, run(vg, {**feeds, f"d_{g.output_names[0]}": cot})))
    lhs = sum(float(np.sum(got[f"grad_{k}"] * d[k])) for k in feeds)
    assert abs(lhs - float(np.sum(cot * fd))) <= 1e-6 * max(1.0, abs(lhs))
    jg = rlx.jvp(g)
    tan = run(jg, {**feeds, **{f"t_{k}": v for k, v in d.items()}})[1]
    np.testing.assert_allclose(tan, fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kw", [{}, {"trajectory": True}, {"reverse": True}, {"checkpoints": 2},
                                {"trajectory": True, "reverse": True}])
def test_scan_derivatives_match_finite_differences(kw: dict) -> None:
    _fd_check(_scan_graph(5, **kw), _feeds(np.random.default_rng(1), 5))


def test_checkpointed_backward_equals_full_backward() -> None:
    feeds = _feeds(np.random.default_rng(2), 9)
    full = run(rlx.grad(_scan_graph(9, loss=True)), feeds)
    for k in (1, 3, 4, 9):
        ck = run(rlx.grad(_scan_graph(9, loss=True, checkpoints=k)), feeds)
        for a, b in zip(full, ck):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_checkpointed_backward_arena_grows_like_sqrt_length() -> None:
    """Peak arena of the gradient graph: ~length for full backward, ~sqrt(length) with sqrt(length) checkpoints."""
    sizes = {}
    for length in (16, 64, 256):
        k = round(length ** 0.5)
        full = plan(rlx.optimize(rlx.grad(_scan_graph(length, dtype="f32", c=64, loss=True), wrt=["c0", "w"])))
        ck = plan(rlx.optimize(rlx.grad(_scan_graph(length, dtype="f32", c=64, loss=True, checkpoints=k),
                                        wrt=["c0", "w"])))
        sizes[length] = (full.arena_bytes, ck.arena_bytes)
    for small, big in ((16, 64), (64, 256)):  # length x4 each time
        full_ratio = sizes[big][0] / sizes[small][0]
        ck_ratio = sizes[big][1] / sizes[small][1]
        assert full_ratio > 3.0, sizes  # linear: ~4x
        assert ck_ratio < 2.3, sizes  # sqrt: ~2x
    assert sizes[256][1] * 4 < sizes[256][0]


def test_compiled_scan_gradients_match_reference_dynamic_length() -> None:
    length = rlx.Dim.dynamic("L", 16)
    dg = rlx.grad(_scan_graph(length, dtype="f32", c=4, loss=True), wrt=["c0", "w", "xs"])
    from cpu_helpers import compile_graph

    cg = compile_graph(dg, opt_level=2)
    rng = np.random.default_rng(3)
    for n in (1, 7, 16):
        check(dg, _feeds(rng, n, 4, np.float32), rtol=2e-4, atol=1e-5, cg=cg)
    ck = rlx.grad(_scan_graph(12, dtype="f32", c=4, loss=True, checkpoints=3), wrt=["c0", "w", "xs"])
    check(ck, _feeds(rng, 12, 4, np.float32), rtol=2e-4, atol=1e-5, opt_level=2)


# ── custom_fn ───────────────────────────────────────────────────────────


def _clip_graph(with_rules: bool) -> rlx.Graph:
    """A straight-through clip: the supplied vjp passes gradients through unchanged (JAX custom_vjp style)."""
    def fn(t):
        x = t.input("x", [5], F)
        vjp = (lambda xx, out, d: [d]) if with_rules else None
        jvp = (lambda xx, tx: tx) if with_rules else None
        y = t.custom_fn(lambda xx: xx.maximum(-0.5).minimum(0.5), [x * 2.0], vjp=vjp, jvp=jvp)
        return {"loss": (y * y).sum()}

    return rlx.trace("clip", fn)


def test_custom_fn_uses_the_supplied_vjp_and_jvp() -> None:
    x = np.array([-2.0, -0.1, 0.0, 0.2, 3.0])
    y = np.clip(2 * x, -0.5, 0.5)
    got = run(rlx.grad(_clip_graph(True)), {"x": x})[1]
    np.testing.assert_allclose(got, 2 * y * 2)  # straight through: d/dx = 2y * 2 everywhere
    derived = run(rlx.grad(_clip_graph(False)), {"x": x})[1]
    np.testing.assert_allclose(derived, np.where(np.abs(2 * x) < 0.5, 2 * y * 2, 0.0))
    tan = run(rlx.jvp(_clip_graph(True)), {"x": x, "t_x": np.ones(5)})[1]
    np.testing.assert_allclose(tan, np.sum(2 * y * 2))


def test_custom_fn_compiles_inlined_and_round_trips() -> None:
    g = _clip_graph(True)
    assert str(rlx.Graph.from_json(g.to_json())) == str(g)
    check(rlx.grad(_clip_graph(True)), {"x": np.linspace(-1, 1, 5)}, rtol=1e-12, atol=1e-12)


# ── JAX (optional peer) ─────────────────────────────────────────────────


def test_against_jax_lax_scan_and_custom_vjp() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    feeds = _feeds(np.random.default_rng(4), 6)

    def loss(xs, c0, w):
        c, _ = jax.lax.scan(lambda c, x: (jnp.tanh(c * w + x), None), c0, xs)
        return jnp.sum(c * c)

    want = jax.grad(loss, argnums=(0, 1, 2))(feeds["xs"], feeds["c0"], feeds["w"])
    got = dict(zip(*[rlx.grad(_scan_graph(6, loss=True)).output_names,
                     run(rlx.grad(_scan_graph(6, loss=True)), feeds)]))
    for name, w in zip(("xs", "c0", "w"), want):
        np.testing.assert_allclose(got[f"grad_{name}"], np.asarray(w), rtol=1e-10, atol=1e-12)

    @jax.custom_vjp
    def clip(x):
        return jnp.clip(x, -0.5, 0.5)

    clip.defvjp(lambda x: (clip(x), None), lambda _, d: (d,))
    x = np.array([-2.0, -0.1, 0.0, 0.2, 3.0])
    want = jax.grad(lambda x: jnp.sum(clip(2 * x) ** 2))(x)
    np.testing.assert_allclose(run(rlx.grad(_clip_graph(True)), {"x": x})[1], np.asarray(want), rtol=1e-12)


@pytest.mark.parametrize("kw", [{"reverse": True}, {"reverse": True, "trajectory": True}, {}])
def test_scan_derivatives_with_a_dynamic_length(kw: dict) -> None:
    _fd_check(_scan_graph(rlx.Dim.dynamic("L", 8), **kw), _feeds(np.random.default_rng(7), 5))

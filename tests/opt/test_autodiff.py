"""rlx.vjp / rlx.grad / rlx.jvp / rlx.jacfwd: every op's derivatives against central finite differences.

Graphs are float64 and evaluated by the reference, so a finite difference with
step 1e-6 is accurate to ~1e-8 relative: each op is checked along a random
direction (reverse mode: <cot, J v> = <J^T cot, v>; forward mode: J v), which
tests the whole Jacobian product rather than a few elements. Compiled CPU
gradient graphs (f32) are checked against the reference, and against PyTorch
autograd / JAX when those are installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.reference import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cpu_helpers import check, compile_graph

F = "f64"
EPS = 1e-6


def _feeds(g: rlx.Graph, rng: np.random.Generator, positive: bool) -> dict[str, np.ndarray]:
    out = {}
    for n in g.inputs() + g.params():
        s = n.op.shape.static_dims
        if n.op.shape.dtype.is_float:
            out[n.op.name] = rng.uniform(0.5, 1.5, s) if positive else rng.standard_normal(s)
        elif n.op.name.startswith("ids"):
            out[n.op.name] = rng.integers(0, 5, s).astype(n.op.shape.dtype.np)
        else:
            out[n.op.name] = rng.integers(0, 2, s).astype(n.op.shape.dtype.np)
    return out


def _split(g: rlx.Graph, feeds: dict) -> tuple[dict, dict]:
    params = {n.op.name for n in g.params()}
    return {k: v for k, v in feeds.items() if k not in params}, {k: v for k, v in feeds.items() if k in params}


def _eval(g: rlx.Graph, feeds: dict) -> list[np.ndarray]:
    ins, ps = _split(g, feeds)
    return run(g, ins, ps)


def check_derivatives(build: Callable[[rlx.Graph], int | dict], *, positive: bool = False, seed: int = 0,
                      wrt: list[str] | None = None, rtol: float = 1e-6) -> None:
    """vjp and jvp of the graph `build` makes agree with central differences along a random direction."""
    g = rlx.Graph("op")
    out = build(g)
    g.set_outputs(out if isinstance(out, dict) else [out])
    rng = np.random.default_rng(seed)
    feeds = _feeds(g, rng, positive)
    names = wrt or [n.op.name for n in g.inputs() + g.params() if n.op.shape.dtype.is_float]
    direction = {k: rng.standard_normal(feeds[k].shape) for k in names}
    cots = [rng.standard_normal(np.shape(v)) for v in _eval(g, feeds)]

    def moved(sign: float) -> list[np.ndarray]:
        return _eval(g, {k: v + sign * EPS * direction[k] if k in direction else v for k, v in feeds.items()})

    plus, minus = moved(1.0), moved(-1.0)
    fd = [(p - m) / (2 * EPS) for p, m in zip(plus, minus)]
    # reverse mode
    vg = rlx.vjp(g, wrt=names)
    vfeeds = dict(feeds)
    for name, c in zip(g.output_names, cots):
        vfeeds[f"d_{name}"] = c
    got = dict(zip(vg.output_names, _eval(vg, vfeeds)))
    lhs = sum(float(np.sum(got[f"grad_{k}"] * direction[k])) for k in names)
    rhs = sum(float(np.sum(c * d)) for c, d in zip(cots, fd))
    assert abs(lhs - rhs) <= rtol * max(1.0, abs(rhs)) + 1e-7, f"vjp: <grad, v> = {lhs} but FD gives {rhs}"
    # forward mode
    jg = rlx.jvp(g, wrt=names)
    jfeeds = {**feeds, **{f"t_{k}": direction[k] for k in names}}
    tans = dict(zip(jg.output_names, _eval(jg, jfeeds)))
    for name, want in zip(g.output_names, fd):
        np.testing.assert_allclose(tans[f"t_{name}"], want, rtol=1e-5, atol=1e-6, err_msg=f"jvp of {name}")


def x(g: rlx.Graph, name: str = "x", dims: tuple = (2, 3, 4)) -> int:
    return g.input(name, list(dims), F)


# ── elementwise ─────────────────────────────────────────────────────────

POSITIVE_ONLY = {"log", "sqrt", "rsqrt"}


@pytest.mark.parametrize("fn", O.ACTIVATIONS)
def test_activation(fn: str) -> None:
    check_derivatives(lambda g: g.activation(fn, x(g)), positive=fn in POSITIVE_ONLY)


@pytest.mark.parametrize("fn", O.BINARY_OPS)
def test_binary_with_broadcasting(fn: str) -> None:
    check_derivatives(lambda g: g.binary(fn, x(g), x(g, "y", (3, 1))), positive=fn == "pow")


def test_where_and_compare() -> None:
    check_derivatives(lambda g: g.where(g.compare("gt", x(g), x(g, "y", (4,))), x(g, "a"), x(g, "b", (3, 4))))


def test_cast_roundtrip() -> None:
    def build(g: rlx.Graph) -> int:
        a = x(g)
        return g.cast(g.mul(a, a), "f64")

    check_derivatives(build)


# ── linear algebra, reductions, norms ───────────────────────────────────


def test_matmul_batched_broadcast() -> None:
    check_derivatives(lambda g: g.matmul(x(g, "a", (2, 3, 4)), x(g, "b", (4, 5))))
    check_derivatives(lambda g: g.matmul(x(g, "a", (1, 3, 4)), x(g, "b", (2, 4, 5))))


@pytest.mark.parametrize("fn", O.REDUCE_OPS)
@pytest.mark.parametrize(("axes", "keep"), [((1,), False), ((0, 2), True), ((), False)])
def test_reduce(fn: str, axes: tuple, keep: bool) -> None:
    check_derivatives(lambda g: g.reduce(fn, x(g), axes, keep), positive=fn == "prod")


def test_softmax_and_norms() -> None:
    check_derivatives(lambda g: g.softmax(x(g), 1))
    check_derivatives(lambda g: g.layer_norm(x(g), g.param("ga", [4], F), g.param("be", [4], F), 1e-5))
    check_derivatives(lambda g: g.rms_norm(x(g), g.param("ga", [4], F), 1e-6))


# ── movement ────────────────────────────────────────────────────────────


def test_movement_ops() -> None:
    check_derivatives(lambda g: g.reshape(x(g), [4, 6]))
    check_derivatives(lambda g: g.transpose(x(g), [2, 0, 1]))
    check_derivatives(lambda g: g.narrow(x(g), 2, 1, 2))
    check_derivatives(lambda g: g.concat([x(g), x(g, "y", (2, 1, 4))], 1))
    check_derivatives(lambda g: g.expand(x(g, "x", (3, 1)), [2, 3, 4]))


@pytest.mark.parametrize("axis", [0, 1])
def test_gather(axis: int) -> None:
    check_derivatives(lambda g: g.gather(g.param("table", [5, 5], F), g.input("ids", [2, 3], "i32"), axis),
                      wrt=["table"])


# ── transformer and fused ops ───────────────────────────────────────────


@pytest.mark.parametrize(("mask", "kv"), [("none", 2), ("causal", 1), ("padding", 2), ("bias", 2)])
def test_attention(mask: str, kv: int) -> None:
    def build(g: rlx.Graph) -> int:
        q = x(g, "q", (2, 3, 8))
        k, v = x(g, "k", (2, 4, kv * 4)), x(g, "v", (2, 4, kv * 4))
        m = None
        if mask == "padding":
            m = g.constant(np.array([[1, 1, 0, 1], [1, 1, 1, 1]], np.int32))
        elif mask == "bias":
            m = x(g, "bias", (1, 2, 3, 4))
        return g.attention(q, k, v, num_heads=2, head_dim=4, mask=mask, mask_input=m, num_kv_heads=kv)

    check_derivatives(build)


def test_rope() -> None:
    def build(g: rlx.Graph) -> int:
        ang = np.arange(3)[:, None] * np.array([1.0, 0.3])[None]
        return g.rope(x(g, "x", (2, 3, 8)), g.constant(np.cos(ang), F), g.constant(np.sin(ang), F), head_dim=4)

    check_derivatives(build)


def test_fused_ops() -> None:
    w = lambda g, n="w": g.param(n, [4, 5], F)  # noqa: E731
    check_derivatives(lambda g: g.add(O.FusedMatMulBiasAct("gelu"), [x(g), w(g), g.param("b", [5], F)]))
    check_derivatives(lambda g: g.add(O.FusedSwiGLU(), [x(g), w(g), w(g, "w2")]))
    check_derivatives(lambda g: g.add(O.FusedResidualLayerNorm(1e-5), [x(g), x(g, "r"), g.param("bi", [4], F),
                                                                      g.param("ga", [4], F), g.param("be", [4], F)]))
    check_derivatives(lambda g: g.add(O.FusedResidualRmsNorm(1e-6), [x(g), x(g, "r"), g.param("ga", [4], F)]))
    steps = (O.RegionStep(O.Binary("mul"), (0, 1)), O.RegionStep(O.Activation("tanh"), (2,)),
             O.RegionStep(O.Binary("add"), (3, 0)))
    check_derivatives(lambda g: g.add(O.ElementwiseRegion(steps), [x(g), x(g, "y")]))


# ── SSM ops ─────────────────────────────────────────────────────────────


def test_selective_scan() -> None:
    def build(g: rlx.Graph) -> int:
        return g.selective_scan(x(g, "x", (2, 4, 3)), g.activation("softplus", x(g, "dt", (2, 4, 3))),
                                g.activation("neg", g.activation("exp", x(g, "A", (3, 2)))),
                                x(g, "B", (2, 4, 2)), x(g, "C", (2, 4, 2)))

    check_derivatives(build)


@pytest.mark.parametrize("carry", [False, True])
def test_gated_delta_net(carry: bool) -> None:
    def build(g: rlx.Graph) -> int:
        q, k, v = (x(g, n, (1, 3, 2, 4)) for n in "qkv")
        gate = g.activation("neg", g.activation("softplus", x(g, "g", (1, 3, 2))))
        beta = g.activation("sigmoid", x(g, "beta", (1, 3, 2)))
        state = x(g, "s0", (1, 2, 4, 4)) if carry else None
        return g.gated_delta_net(q, k, v, gate, beta, state=state)

    check_derivatives(build)


@pytest.mark.parametrize(("pad", "reverse"), [(False, False), (True, False), (False, True)])
def test_depthwise_conv(pad: bool, reverse: bool) -> None:
    check_derivatives(lambda g: g.depthwise_conv1d_causal(x(g, "x", (2, 5, 3)), g.param("w", [3, 3], F),
                                                          x(g, "p", (2, 2, 3)) if pad else None, reverse=reverse))


# ── API behaviour ───────────────────────────────────────────────────────


def _mlp_loss(dtype: str = "f32") -> rlx.Graph:
    def fn(t):
        xx = t.input("x", [8, 6], dtype)
        y = t.input("y", [8, 3], dtype)  # one-hot labels
        w1, w2 = t.param("w1", [6, 16], dtype), t.param("w2", [16, 3], dtype)
        h = (xx @ w1).gelu()
        logits = h.layer_norm(t.param("ga", [16], dtype), t.param("be", [16], dtype)) @ w2
        logp = logits - (logits.exp().sum(-1, keepdim=True)).log()
        return {"loss": -(logp * y).sum() / 8.0}

    return rlx.trace("mlp", fn)


def _mlp_feeds(rng: np.random.Generator, dtype=np.float32) -> tuple[dict, dict]:
    ins = {"x": rng.standard_normal((8, 6)).astype(dtype),
           "y": np.eye(3)[rng.integers(0, 3, 8)].astype(dtype)}
    params = {"w1": rng.standard_normal((6, 16)).astype(dtype) * 0.5, "w2": rng.standard_normal((16, 3)).astype(dtype),
              "ga": np.ones(16, dtype), "be": np.zeros(16, dtype)}
    return ins, params


def test_grad_of_a_loss_matches_finite_differences_elementwise() -> None:
    g = _mlp_loss("f64")
    dg = rlx.grad(g, wrt=["w2", "x"])
    assert dg.output_names == ["loss", "grad_w2", "grad_x"]
    ins, params = _mlp_feeds(np.random.default_rng(0), np.float64)
    _loss, gw2, gx = run(dg, ins, params)
    for name, got in (("w2", gw2), ("x", gx)):
        src = params if name in params else ins
        for idx in [(0, 0), (3, 1), (5, 2)]:
            hi, lo = dict(src), dict(src)
            hi[name] = src[name].copy()
            lo[name] = src[name].copy()
            hi[name][idx] += EPS
            lo[name][idx] -= EPS
            fhi = run(g, hi if src is ins else ins, hi if src is params else params)[0]
            flo = run(g, lo if src is ins else ins, lo if src is params else params)[0]
            np.testing.assert_allclose(got[idx], (fhi - flo) / (2 * EPS), rtol=1e-6, atol=1e-8)


def test_compiled_cpu_gradient_graph_matches_reference() -> None:
    dg = rlx.grad(_mlp_loss(), wrt=["w1", "w2", "ga", "be"])
    ins, params = _mlp_feeds(np.random.default_rng(1))
    check(dg, ins, params, rtol=2e-4, atol=2e-5, opt_level=2)


def test_jacfwd_matches_vjp_rows() -> None:
    g = rlx.Graph("j")
    a = g.input("a", [3], F)
    g.set_outputs({"y": g.activation("tanh", g.matmul(g.reshape(a, [1, 3]), g.param("w", [3, 2], F)))})
    jg = rlx.jacfwd(g, "a")
    rng = np.random.default_rng(4)
    feeds = {"a": rng.standard_normal(3)}
    w = rng.standard_normal((3, 2))
    jac = run(jg, feeds, {"w": w})[1]
    assert jac.shape == (1, 2, 3)
    y = np.tanh(feeds["a"] @ w)
    np.testing.assert_allclose(jac[0], ((1 - y**2)[:, None] * w.T), rtol=1e-12)


def test_errors_are_clear() -> None:
    g = _mlp_loss()
    with pytest.raises(IRError, match="'nope' is not an input or param"):
        rlx.grad(g, wrt=["nope"])
    g2 = rlx.Graph("vec")
    g2.set_outputs([g2.activation("exp", g2.input("x", [3]))])
    with pytest.raises(IRError, match="must be one float value"):
        rlx.grad(g2)
    g3 = rlx.Graph("dyn")
    s = rlx.Dim.dynamic("s", 8)
    g3.set_outputs([g3.attention(*(g3.input(n, [1, s, 4]) for n in "qkv"), num_heads=1, head_dim=4, mask="causal")])
    with pytest.raises(IRError, match="static query length"):
        rlx.vjp(g3)


# ── peers (optional) ────────────────────────────────────────────────────


def test_against_torch_autograd() -> None:
    torch = pytest.importorskip("torch")
    g = _mlp_loss("f64")
    ins, params = _mlp_feeds(np.random.default_rng(2), np.float64)
    got = dict(zip(*[rlx.grad(g).output_names, run(rlx.grad(g), ins, params)]))
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in {**ins, **params}.items()}
    h = torch.nn.functional.gelu(tp["x"] @ tp["w1"])
    h = torch.nn.functional.layer_norm(h, (16,), tp["ga"], tp["be"], 1e-5)
    loss = -(torch.log_softmax(h @ tp["w2"], -1) * tp["y"]).sum() / 8.0
    loss.backward()
    for k in ("w1", "w2", "ga", "be", "x"):
        np.testing.assert_allclose(got[f"grad_{k}"], tp[k].grad.numpy(), rtol=1e-9, atol=1e-12)


def test_ssm_gradients_compile_with_a_dynamic_sequence_length() -> None:
    """selective_scan / gated_delta_net differentiate as loops (scan) and the conv through its transpose, so the
    sequence may be dynamic."""
    s = rlx.Dim.dynamic("s", 16)

    def fn(t):
        x, dt = t.input("x", [2, s, 3]), t.input("dt", [2, s, 3])
        b, c = t.input("B", [2, s, 4]), t.input("C", [2, s, 4])
        x = t.depthwise_conv1d_causal(x, t.param("cw", [3, 4]))
        y = t.selective_scan(x, dt.softplus(), -(t.param("A_log", [3, 4]).exp()), b, c)
        q = t.input("q", [2, s, 2, 4])
        o = t.gated_delta_net(q, q, q, -(t.input("g", [2, s, 2]).softplus()), t.input("beta", [2, s, 2]).sigmoid())
        return {"loss": (y * y).mean() + (o * o).mean()}

    dg = rlx.grad(rlx.trace("ssm_loss", fn), wrt=["A_log", "cw", "x", "q"])
    rng = np.random.default_rng(6)
    params = {"A_log": rng.standard_normal((3, 4)).astype(np.float32) * 0.3,
              "cw": rng.standard_normal((3, 4)).astype(np.float32) * 0.5}
    cg = compile_graph(dg, params, opt_level=2)
    for n in (1, 9):
        ins = {"x": rng.standard_normal((2, n, 3)), "dt": rng.standard_normal((2, n, 3)) - 1,
               "B": rng.standard_normal((2, n, 4)), "C": rng.standard_normal((2, n, 4)),
               "q": rng.standard_normal((2, n, 2, 4)) * 0.5, "g": rng.standard_normal((2, n, 2)),
               "beta": rng.standard_normal((2, n, 2))}
        check(dg, {k: v.astype(np.float32) for k, v in ins.items()}, params, rtol=2e-4, atol=2e-5, cg=cg)


def test_against_jax_grad() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    g = _mlp_loss("f64")
    ins, params = _mlp_feeds(np.random.default_rng(2), np.float64)
    dg = rlx.grad(g)
    got = dict(zip(dg.output_names, run(dg, ins, params)))

    def loss(p, x, y):
        h = jax.nn.gelu(x @ p["w1"], approximate=False)
        mu = h.mean(-1, keepdims=True)
        h = (h - mu) / jnp.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * p["ga"] + p["be"]
        return -(jax.nn.log_softmax(h @ p["w2"], -1) * y).sum() / 8.0

    want = jax.grad(loss)(params, ins["x"], ins["y"])
    for k in params:
        np.testing.assert_allclose(got[f"grad_{k}"], np.asarray(want[k]), rtol=1e-9, atol=1e-12)

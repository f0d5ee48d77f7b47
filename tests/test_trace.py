"""Tracing: traced programs equal builder-API graphs; operators, methods, errors."""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.errors import IRError, ShapeError
from rlx.ir.dtype import DType, bf16_to_f32
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.trace import TracedTensor, Tracer, trace


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ── traced == built ─────────────────────────────────────────────────────


def test_traced_mlp_is_the_builder_graph():
    def fn(t):
        x = t.input("x", [4, 15, 384])
        w = t.param("w", [384, 1536])
        b = t.param("b", [1536])
        return (x @ w + b).gelu()

    g = Graph("mlp")
    x, w, b = g.input("x", [4, 15, 384]), g.param("w", [384, 1536]), g.param("b", [1536])
    g.set_outputs([g.activation("gelu", g.add_(g.matmul(x, w), b))])
    assert str(trace("mlp", fn)) == str(g)


def test_traced_scalar_arithmetic_is_the_builder_graph():
    def fn(t):
        x = t.input("x", [2, 3])
        y = t.input("y", [3])
        return {"a": 2 * x - x / 3, "b": -(1 - y) + x * y, "c": (x + 2) * 2}

    g = Graph("ar")
    x, y = g.input("x", [2, 3]), g.input("y", [3])
    two = g.constant(2.0)
    twice = g.mul(two, x)
    a = g.sub(twice, g.div(x, g.constant(3.0)))
    one = g.constant(1.0)
    b = g.add_(g.activation("neg", g.sub(one, y)), g.mul(x, y))
    c = g.mul(g.add_(x, two), two)  # the tracer reuses the scalar constant 2
    g.set_outputs({"a": a, "b": b, "c": c})
    assert str(trace("ar", fn)) == str(g)


def test_traced_attention_block_is_the_builder_graph():
    def fn(t):
        x = t.input("x", [1, 6, 32])
        wq, wk, wv = (t.param(n, [32, 32]) for n in ("wq", "wk", "wv"))
        g, beta = t.param("g", [32]), t.param("beta", [32])
        cos, sin = t.input("cos", [6, 4]), t.input("sin", [6, 4])
        h = x.layer_norm(g, beta, 1e-12)
        q = t.rope(h @ wq, cos, sin, head_dim=8)
        k = t.rope(h @ wk, cos, sin, head_dim=8)
        ctx = t.attention(q, k, h @ wv, num_heads=4, head_dim=8, mask="causal")
        return (ctx + x).rms_norm(g)

    g = Graph("blk")
    x = g.input("x", [1, 6, 32])
    wq, wk, wv = (g.param(n, [32, 32]) for n in ("wq", "wk", "wv"))
    gm, beta = g.param("g", [32]), g.param("beta", [32])
    cos, sin = g.input("cos", [6, 4]), g.input("sin", [6, 4])
    h = g.layer_norm(x, gm, beta, 1e-12)
    q = g.rope(g.matmul(h, wq), cos, sin, head_dim=8)
    k = g.rope(g.matmul(h, wk), cos, sin, head_dim=8)
    ctx = g.attention(q, k, g.matmul(h, wv), num_heads=4, head_dim=8, mask="causal")
    g.set_outputs([g.rms_norm(g.add_(ctx, x), gm)])
    assert str(trace("blk", fn)) == str(g)


def test_traced_shape_methods_are_the_builder_graph():
    def fn(t):
        x = t.input("x", [2, 3, 4])
        a = x.reshape(6, -1).t().unsqueeze(0).squeeze(0)
        b = x.transpose(0, 2).permute(1, 0, 2).transpose([2, 1, 0])
        c = x.narrow(2, 1, 2).sum(axis=-1, keepdim=True).cast("f16")
        d = x.softmax(1).mean((0, 1)).max()
        return [a, b, c, d]

    g = Graph("shp")
    x = g.input("x", [2, 3, 4])
    a = g.reshape(g.reshape(g.transpose(g.reshape(x, [6, -1]), [1, 0]), [1, 4, 6]), [4, 6])
    b = g.transpose(g.transpose(g.transpose(x, [2, 1, 0]), [1, 0, 2]), [2, 1, 0])
    c = g.cast(g.reduce("sum", g.narrow(x, 2, 1, 2), [-1], keep_dim=True), "f16")
    d = g.reduce("max", g.reduce("mean", g.softmax(x, 1), [0, 1]), [])
    g.set_outputs([a, b, c, d])
    assert str(trace("shp", fn)) == str(g)


# ── operators and methods, checked by value ─────────────────────────────


def run1(fn, inputs: dict[str, np.ndarray], params: dict | None = None) -> np.ndarray:
    return reference.run(trace("t", fn), inputs, params or {})[0]


@pytest.mark.parametrize("expr, want", [
    (lambda x, y: x + y, lambda x, y: x + y),
    (lambda x, y: x - y, lambda x, y: x - y),
    (lambda x, y: x * y, lambda x, y: x * y),
    (lambda x, y: x / y, lambda x, y: x / y),
    (lambda x, y: x + 1.5, lambda x, y: x + 1.5),
    (lambda x, y: 1.5 + x, lambda x, y: 1.5 + x),
    (lambda x, y: x - 2, lambda x, y: x - 2),
    (lambda x, y: 2 - x, lambda x, y: 2 - x),
    (lambda x, y: 3 * x, lambda x, y: 3 * x),
    (lambda x, y: x * 3, lambda x, y: x * 3),
    (lambda x, y: x / 4, lambda x, y: x / 4),
    (lambda x, y: 4 / y, lambda x, y: 4 / y),
    (lambda x, y: -x, lambda x, y: -x),
    (lambda x, y: abs(x), lambda x, y: np.abs(x)),
    (lambda x, y: abs(y) ** 0.5, lambda x, y: np.abs(y) ** 0.5),
    (lambda x, y: 2.0 ** x, lambda x, y: 2.0 ** x),
    (lambda x, y: x * x + x, lambda x, y: x * x + x),
    (lambda x, y: np.float32(2) * x, lambda x, y: 2 * x),
    (lambda x, y: x + np.arange(3, dtype=np.float32), lambda x, y: x + np.arange(3)),
    (lambda x, y: x.maximum(y), lambda x, y: np.maximum(x, y)),
    (lambda x, y: x.minimum(0.0), lambda x, y: np.minimum(x, 0)),
])
def test_arithmetic_operators(rng, expr, want):
    xv, yv = rand(rng, 2, 3), rand(rng, 3) + 3.0

    def fn(t):
        return expr(t.input("x", [2, 3]), t.input("y", [3]))

    got = run1(fn, {"x": xv, "y": yv})
    np.testing.assert_allclose(got, want(xv.astype(np.float64), yv.astype(np.float64)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op, want", [
    (lambda x: x < 0, lambda x: x < 0),
    (lambda x: x <= 0.5, lambda x: x <= 0.5),
    (lambda x: x > 0, lambda x: x > 0),
    (lambda x: x >= 0.5, lambda x: x >= 0.5),
    (lambda x: x.eq(x), lambda x: x == x),
    (lambda x: x.ne(0.0), lambda x: x != 0),
])
def test_comparisons_give_bool(rng, op, want):
    xv = rand(rng, 8)
    got = run1(lambda t: op(t.input("x", [8])), {"x": xv})
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, want(xv))


@pytest.mark.parametrize("fn", ["gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "exp", "log", "sqrt",
                                "rsqrt", "neg", "abs", "sin", "cos"])
def test_every_activation_method(rng, fn):
    xv = np.abs(rand(rng, 2, 5)) + 0.1  # positive, so log/sqrt/rsqrt are defined
    got = run1(lambda t: getattr(t.input("x", [2, 5]), fn)(), {"x": xv})
    want = reference.ACTIVATION_FNS[fn](xv.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    g = trace("a", lambda t: getattr(t.input("x", [2, 5]), fn)())
    assert g.node(g.outputs[0]).op.fn == fn


def test_matmul_spellings(rng):
    xv, wv = rand(rng, 3, 4), rand(rng, 4, 5)
    want = xv.astype(np.float64) @ wv
    for spell in (lambda t, x, w: x @ w, lambda t, x, w: x.matmul(w), lambda t, x, w: x.mm(w),
                  lambda t, x, w: t.matmul(x, w)):
        got = run1(lambda t, s=spell: s(t, t.input("x", [3, 4]), t.param("w", [4, 5])), {"x": xv}, {"w": wv})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    got = run1(lambda t: wv.T @ t.input("x", [3, 4]).t(), {"x": xv})
    np.testing.assert_allclose(got, want.T, rtol=1e-5, atol=1e-6)


def test_norms_softmax_and_reductions(rng):
    xv, gv, bv = rand(rng, 3, 8), rand(rng, 8), rand(rng, 8)
    x64 = xv.astype(np.float64)

    def fn(t):
        x, g, b = t.input("x", [3, 8]), t.param("g", [8]), t.param("b", [8])
        return [x.layer_norm(g, b, 1e-5), x.rms_norm(g, 1e-6), x.softmax(), x.sum(), x.mean(0),
                x.max(1, keepdim=True), x.min((0, 1)), (x * 0.5).prod(-1)]

    ln, rms, sm, s, mean, mx, mn, prod = reference.run(trace("n", fn), {"x": xv}, {"g": gv, "b": bv})
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    np.testing.assert_allclose(ln, (x64 - mu) / np.sqrt(var + 1e-5) * gv + bv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rms, x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * gv, rtol=1e-5)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(-1, keepdims=True), rtol=1e-6)
    assert s.shape == () and mean.shape == (8,) and mx.shape == (3, 1) and mn.shape == () and prod.shape == (3,)
    np.testing.assert_allclose(s, x64.sum(), rtol=1e-5)
    np.testing.assert_allclose(mean, x64.mean(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(mx, x64.max(1, keepdims=True))
    np.testing.assert_allclose(mn, x64.min())
    np.testing.assert_allclose(prod, (x64 * 0.5).prod(-1), rtol=1e-5)


def test_shape_methods_by_value(rng):
    xv = rand(rng, 2, 3, 4)

    def fn(t):
        x = t.input("x", [2, 3, 4])
        return [x.reshape([4, -1]), x.reshape(24), x.transpose(1, 2), x.transpose([2, 0, 1]), x.permute(2, 0, 1),
                x.t(), x.unsqueeze(-1), x.unsqueeze(1), x.reshape(2, 1, 3, 1, 4).squeeze(), x.narrow(1, 1, 2),
                x.narrow(-1, 0, 1).squeeze(-1), x.expand(5, 2, 3, 4)]

    got = reference.run(trace("s", fn), {"x": xv})
    want = [xv.reshape(4, -1), xv.reshape(24), xv.transpose(0, 2, 1), xv.transpose(2, 0, 1), xv.transpose(2, 0, 1),
            xv.swapaxes(-1, -2), xv[..., None], xv[:, None], xv, xv[:, 1:3], xv[..., 0],
            np.broadcast_to(xv, (5, 2, 3, 4))]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_tracer_functional_ops(rng):
    table, idx = rand(rng, 10, 4), np.array([[1, 9], [0, 3]], np.int32)

    def fn(t):
        tab = t.param("table", [10, 4])
        ids = t.input("ids", [2, 2], "i32")
        emb = t.gather(tab, ids)
        both = t.concat([emb, emb * 2], axis=-1)
        return [both, t.where(both > 0, both, 0.0), t.softmax(both, -1), t.layer_norm(both, np.ones(8), np.zeros(8))]

    cat, relu, _, _ = reference.run(trace("f", fn), {"ids": idx}, {"table": table})
    emb = table[idx]
    np.testing.assert_array_equal(cat, np.concatenate([emb, emb * 2], -1))
    np.testing.assert_array_equal(relu, np.maximum(cat, 0))


def test_introspection_and_dynamic_dims():
    seq = Dim.dynamic("seq", max=64)
    seen = {}

    def fn(t):
        x = t.input("x", [2, seq, 8], "f16")
        y = x.unsqueeze(1)
        seen.update(shape=y.shape, dtype=y.dtype, rank=y.rank, ndim=y.ndim, repr=repr(x))
        return y.reshape(2, seq * 8)

    g = trace("d", fn)
    assert seen["shape"] == (2, 1, seq, 8) and isinstance(seen["shape"][0], int) and seen["shape"][2] is seq
    assert seen["dtype"] is DType.F16 and seen["rank"] == seen["ndim"] == 4
    assert seen["repr"] == "TracedTensor(%0: f16[2,seq,8], trace='d')"
    assert str(g.shape(g.outputs[0])) == "f16[2,8*seq]"


# ── scalars and dtypes ──────────────────────────────────────────────────


def test_scalars_take_the_tensor_dtype(rng):
    def fn(t):
        return [t.input("h", [3], "f16") * 0.1, t.input("b", [3], "bf16") + 1.0, t.input("i", [3], "i32") * 3]

    g = trace("dt", fn)
    consts = [n for n in g.nodes if n.kind == "constant"]
    assert [str(n.shape) for n in consts] == ["f16[]", "bf16[]", "i32[]"]
    assert bf16_to_f32(consts[1].op.array()).item() == 1.0
    hv = np.array([1, 2, 3], np.float16)
    bv = np.array([1.5, -2.0, 0.25], np.float32)  # bf16-representable
    iv = np.array([1, -2, 7], np.int32)
    h, b, i = reference.run(g, {"h": hv, "b": bv, "i": iv})
    np.testing.assert_array_equal(h, (hv * np.float16(0.1)))
    np.testing.assert_array_equal(b, bv + 1)
    assert i.dtype == np.int32 and i.tolist() == [3, -6, 21]


def test_scalars_that_do_not_fit_the_dtype_are_rejected():
    with pytest.raises(ShapeError, match=r"2\.5 is not exactly representable as i32"):
        trace("x", lambda t: t.input("i", [3], "i32") + 2.5)
    with pytest.raises(ShapeError, match="overflows f16"):
        trace("x", lambda t: t.input("h", [3], "f16") * 1e6)
    with pytest.raises(TypeError):
        trace("x", lambda t: t.input("x", [3]) + "1")
    with pytest.raises(TypeError):
        trace("x", lambda t: t.input("x", [3]) + True)


def test_one_constant_per_distinct_scalar():
    g = trace("c", lambda t: (t.input("x", [3]) * 2 + 2) * 2 - 3)
    assert [n.op.array().item() for n in g.nodes if n.kind == "constant"] == [2.0, 3.0]


def test_explicit_constants():
    def fn(t):
        x = t.input("x", [2])
        return [x + t.constant([1.0, 2.0]), t.constant(np.arange(3)), t.constant(0.5, "bf16")]

    g = trace("k", fn)
    kinds = [str(n.shape) for n in g.nodes if n.kind == "constant"]
    assert kinds == ["f32[2]", "i64[3]", "bf16[]"]
    with pytest.raises(IRError, match="must be numeric"):
        trace("k", lambda t: t.constant("abc"))


# ── by value and by reference ───────────────────────────────────────────


def test_tensors_are_immutable_reusable_handles(rng):
    def fn(t):
        x = t.input("x", [4])
        y = x + 1
        z = y * y + y  # y used three times; x and y stay what they were
        assert y.id == 2 and x.id == 0
        return [z, x, y]

    g = trace("r", fn)
    mul = next(n for n in g.nodes if n.kind == "binary" and n.op.fn == "mul")
    assert mul.inputs == (2, 2)
    xv = rand(rng, 4)
    z, x, y = reference.run(g, {"x": xv})
    np.testing.assert_array_equal(x, xv)
    np.testing.assert_array_equal(y, xv + np.float32(1))
    np.testing.assert_allclose(z, (xv + 1.0) ** 2 + (xv + 1.0), rtol=1e-6)


def test_tensor_identity_semantics():
    def fn(t):
        x = t.input("x", [2])
        same = TracedTensor(t, x.id)
        assert x != same and x == x  # `==` is identity, never a graph op
        assert len({x, same}) == 2
        with pytest.raises(IRError, match="no value while tracing"):
            bool(x > 0)
        with pytest.raises(IRError, match="no value while tracing"):
            if x:
                pass
        return x

    trace("i", fn)


# ── errors ──────────────────────────────────────────────────────────────


def test_shape_errors_at_trace_time_show_the_shapes():
    def matmul(t):
        return t.input("x", [4, 8]) @ t.param("w", [16, 4])

    with pytest.raises(ShapeError, match=r"matmul\(f32\[4,8\], f32\[16,4\]\):.*inner dims differ"):
        trace("m", matmul)
    with pytest.raises(ShapeError, match=r"\+\(f32\[4,8\], f32\[3\]\):.*cannot broadcast"):
        trace("b", lambda t: t.input("x", [4, 8]) + t.input("y", [3]))
    with pytest.raises(ShapeError, match=r"reshape to \[5,-1\]\(f32\[4,8\]\):.*not divisible"):
        trace("r", lambda t: t.input("x", [4, 8]).reshape(5, -1))
    with pytest.raises(ShapeError, match=r"squeeze\(f32\[4,8\]\): axis 0 has size 4, not 1"):
        trace("s", lambda t: t.input("x", [4, 8]).squeeze(0))
    with pytest.raises(ShapeError, match=r"unsqueeze\(f32\[4,8\]\): unsqueeze axis 5 is out of range"):
        trace("u", lambda t: t.input("x", [4, 8]).unsqueeze(5))
    with pytest.raises(ShapeError, match=r"transpose\(0, 3\)\(f32\[4,8\]\): transpose axis 3 is out of range"):
        trace("tr", lambda t: t.input("x", [4, 8]).transpose(0, 3))
    with pytest.raises(ShapeError, match=r"t\(\) needs rank >= 2, got f32\[8\]"):
        trace("t", lambda t: t.input("x", [8]).t())
    with pytest.raises(ShapeError, match=r"layer_norm\(f32\[4,8\], f32\[4\], f32\[4\]\)"):
        trace("ln", lambda t: t.input("x", [4, 8]).layer_norm(t.param("g", [4]), t.param("b", [4])))
    with pytest.raises(ShapeError, match=r"narrow.*out of range for axis 1 of f32\[4,8\]"):
        trace("n", lambda t: t.input("x", [4, 8]).narrow(1, 6, 4))
    with pytest.raises(IRError, match="two axes to swap or one permutation"):
        trace("p", lambda t: t.input("x", [2, 3, 4]).transpose(0, 1, 2))


def test_mixing_two_traces_is_an_error():
    kept = {}

    def first(t):
        kept["x"] = t.input("x", [3])
        return kept["x"] + 1

    trace("first", first)

    def second(t):
        return t.input("y", [3]) + kept["x"]

    with pytest.raises(IRError, match="belongs to trace 'first', not 'second'"):
        trace("second", second)
    with pytest.raises(IRError, match="belongs to trace 'first'"):
        trace("third", lambda t: kept["x"])  # returning a foreign tensor
    with pytest.raises(IRError, match="trace 'first' has finished"):
        kept["x"] * 2


def test_nested_tensors_of_a_live_second_tracer_are_rejected():
    other = Tracer("other")
    foreign = other.input("z", [3])

    def fn(t):
        x = t.input("x", [3])
        with pytest.raises(IRError, match="belongs to trace 'other', not 'main'"):
            t.concat([x, foreign], axis=0)
        with pytest.raises(IRError, match="belongs to trace 'other'"):
            x.matmul(foreign)
        return x

    trace("main", fn)


def test_outputs_forms_and_bad_returns():
    g = trace("o", lambda t: (t.input("x", [2]), t.input("y", [2])))
    assert g.output_names == ["out0", "out1"]
    g = trace("o", lambda t: {"logits": t.input("x", [2]).relu()})
    assert g.output_names == ["logits"]
    with pytest.raises(IRError, match="must return a TracedTensor"):
        trace("o", lambda t: None)
    with pytest.raises(IRError, match="expected a TracedTensor, got int"):
        trace("o", lambda t: [t.input("x", [2]), 3])
    with pytest.raises(IRError, match="needs at least one output"):
        trace("o", lambda t: [])


def test_the_tracer_closes_even_when_the_function_fails():
    kept = {}

    def boom(t):
        kept["x"] = t.input("x", [2])
        raise RuntimeError("user bug")

    with pytest.raises(RuntimeError, match="user bug"):
        trace("b", boom)
    with pytest.raises(IRError, match="has finished"):
        kept["x"].relu()


# ── custom_fn_multi: several outputs, one custom VJP over all of them ──────────────────────────────


def _sincos_graph(vjp):
    def f(t):
        x, w = t.input("x", [5]), t.input("w", [5])
        s, c = t.custom_fn_multi(lambda a, b: ((a * b).sin(), (a * b).cos()), [x, w], vjp=vjp)
        return {"loss": s.sum() + (c * 3.0).sum(), "s": s, "c": c}
    return trace("sincos", f)


def test_custom_fn_multi_uses_its_vjp_over_every_output():
    """The custom VJP sees both outputs' cotangents (here a deliberately scaled rule, to show it is the one used)."""
    def vjp(a, b, s, c, ds, dc):
        g = ds * c - dc * s  # d/du of (sin u, cos u) against (ds, dc), u = a * b
        return g * b * 2.0, g * a * 2.0

    from rlx import grad, reference
    g = _sincos_graph(vjp)
    x = np.linspace(-1, 1, 5).astype(np.float32)
    w = np.linspace(0.5, 2, 5).astype(np.float32)
    outs = reference.run(grad(g, wrt=["x", "w"], output="loss"), {"x": x, "w": w})
    u = (x * w).astype(np.float64)
    gu = np.cos(u) * 1.0 - 3.0 * np.sin(u)
    np.testing.assert_allclose(outs[1], 2 * gu * w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[2], 2 * gu * x, rtol=1e-5, atol=1e-6)


def test_custom_fn_multi_without_vjp_derives_it_and_compiles():
    from rlx import Session, grad, reference
    g = _sincos_graph(None)
    x = np.linspace(-1, 1, 5).astype(np.float32)
    w = np.linspace(0.5, 2, 5).astype(np.float32)
    dg = grad(g, wrt=["x"], output="loss")
    u = (x * w).astype(np.float64)
    np.testing.assert_allclose(reference.run(dg, {"x": x, "w": w})[1], (np.cos(u) - 3 * np.sin(u)) * w,
                               rtol=1e-5, atol=1e-6)
    got = Session().compile(g).run(x=x, w=w)
    for a, b in zip(got, reference.run(g, {"x": x, "w": w})):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

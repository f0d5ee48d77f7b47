"""Graphs for optimizer and planner tests: a hypothesis strategy for random MIR graphs, and a BERT encoder.

`random_cases()` draws a `Case`: a graph built from the MIR op set (elementwise
chains with broadcasting, identities, constant subgraphs, duplicated work,
matmuls with transposed params / bias / activation, SwiGLU, residual norms,
reshapes, transposes, softmax, reductions, gather, attention, concat,
narrow...), with static or dynamic batch and sequence dims, plus concrete
inputs and params to run it on.

Values are kept well-conditioned so that the fused ops' skipped f32 roundings
(a relative 2**-24 each) cannot be amplified past the tests' tolerance:
divisions only by constants in [1, 2], `exp` only of `tanh`, norms with
eps = 1e-2 (their gain 1/sqrt(var + eps) is at most 10), no `pow`/`log`/`sqrt`.
Comparisons and casts (whose results jump under a 1-ulp change) only take
"exact" values: those no matmul or norm contributed to, whose bits no pass changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from rlx import reference
from rlx.ir.graph import Graph, NodeId
from rlx.ir.shape import Dim

SAFE_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "neg", "abs", "sin", "cos")
NORM_EPS = 1e-2


@dataclass
class Case:
    graph: Graph
    inputs: dict[str, np.ndarray]
    params: dict[str, np.ndarray]

    def __repr__(self) -> str:  # hypothesis prints this for a failing example
        return f"Case(\n{self.graph}\n)"


@dataclass
class _Builder:
    draw: Callable
    rng: np.random.Generator
    g: Graph
    b: Dim
    s: Dim
    n: int
    values: list[NodeId] = field(default_factory=list)
    exact: set[NodeId] = field(default_factory=set)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    counter: int = 0

    # ── helpers ──
    def shape(self, v: NodeId):
        return self.g.node(v).shape

    def pick(self, pred: Callable[[NodeId], bool] = lambda v: True) -> NodeId | None:
        cands = [v for v in self.values if pred(v)]
        if not cands:
            return None
        return cands[self.draw(st.integers(0, len(cands) - 1))]

    def is_float(self, v: NodeId) -> bool:
        return self.shape(v).dtype.is_float

    def full(self, v: NodeId) -> bool:
        s = self.shape(v)
        return s.rank == 3 and s.dtype.is_float and s.dims[:2] == (self.b, self.s)

    def push(self, v: NodeId, exact: bool) -> NodeId:
        self.values.append(v)
        if exact:
            self.exact.add(v)
        return v

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def param(self, dims: list[int], kind: str = "w") -> NodeId:
        name = self.fresh(kind)
        if kind == "w":
            arr = self.rng.standard_normal(dims) / np.sqrt(dims[-2] if len(dims) > 1 else 1)
        elif kind == "gamma":
            arr = 1.0 + 0.1 * self.rng.standard_normal(dims)
        else:
            arr = 0.1 * self.rng.standard_normal(dims)
        self.params[name] = arr.astype(np.float32)
        return self.g.param(name, dims)

    def vector(self, n: int) -> NodeId:
        """A [n] vector: a param or a constant."""
        if self.draw(st.booleans()):
            return self.param([n], "bias")
        return self.g.constant(self.rng.standard_normal(n).astype(np.float32) * 0.5)

    def partner(self, a: NodeId) -> tuple[NodeId, bool]:
        """A value that broadcasts against `a` to `a`'s shape, and whether it is exact."""
        dims = self.shape(a).dims
        choice = self.draw(st.sampled_from(["same", "vector", "scalar"]))
        if choice == "same":
            other = self.pick(lambda v: self.shape(v).dims == dims and self.is_float(v) and v != a)
            if other is not None:
                return other, other in self.exact
        if choice == "vector" and dims and dims[-1].is_static:
            return self.vector(dims[-1].value), True
        return self.g.constant(float(self.rng.uniform(0.5, 1.5))), True

    # ── ops ──
    def op_unary(self) -> None:
        x = self.pick(self.is_float)
        fn = self.draw(st.sampled_from(SAFE_ACTIVATIONS))
        self.push(self.g.activation(fn, x), x in self.exact)

    def op_exp(self) -> None:
        x = self.pick(self.is_float)
        self.push(self.g.activation("exp", self.g.activation("tanh", x)), x in self.exact)

    def op_binary(self) -> None:
        a = self.pick(self.is_float)
        b, b_exact = self.partner(a)
        fn = self.draw(st.sampled_from(["add", "sub", "mul", "max", "min"]))
        if self.draw(st.booleans()):
            a, b = b, a
        self.push(self.g.binary(fn, a, b), a in self.exact and b_exact)

    def op_identity(self) -> None:
        x = self.pick(self.is_float)
        fn, value = self.draw(st.sampled_from([("mul", 1.0), ("add", 0.0), ("sub", 0.0), ("div", 1.0),
                                               ("pow", 1.0)]))
        dims = self.shape(x).dims
        form = self.draw(st.sampled_from(["scalar", "vector", "broadcasting"]))
        if form == "vector" and dims and dims[-1].is_static:
            c = self.g.constant(np.full(dims[-1].value, value, np.float32))
        elif form == "broadcasting" and all(d.is_static for d in dims):
            # A constant with more dims than x: the "identity" changes the shape and must stay.
            c = self.g.constant(np.full((2, *[d.value for d in dims]), value, np.float32))
        else:
            c = self.g.constant(value)
        left = fn in ("mul", "add") and self.draw(st.booleans())
        v = self.g.binary(fn, c, x) if left else self.g.binary(fn, x, c)
        self.push(v, x in self.exact)

    def op_div_const(self) -> None:
        x = self.pick(self.is_float)
        self.push(self.g.div(x, self.g.constant(float(self.rng.uniform(1.0, 2.0)))), x in self.exact)

    def op_where(self) -> None:
        a = self.pick(lambda v: v in self.exact and self.is_float(v))
        if a is None:
            return
        fn = self.draw(st.sampled_from(["lt", "le", "gt", "ge", "eq", "ne"]))
        cond = self.g.compare(fn, a, self.g.constant(float(self.rng.uniform(-0.5, 0.5))))
        b = self.pick(lambda v: self.is_float(v) and self.shape(v).dims == self.shape(a).dims)
        other, other_exact = self.partner(a)
        self.push(self.g.where(cond, b, other), b in self.exact and other_exact)

    def op_cast(self) -> None:
        x = self.pick(lambda v: v in self.exact and self.is_float(v))
        if x is None:
            return
        via = self.draw(st.sampled_from(["f32", "f16", "bf16", "i32", "f64"]))
        self.push(self.g.cast(self.g.cast(x, via), "f32"), True)

    def weight(self, k: int, m: int) -> NodeId:
        """A [k, m] weight, often stored [m, k] and transposed (the layout pass's target)."""
        if self.draw(st.booleans()):
            return self.g.transpose(self.param([m, k]), [1, 0])
        return self.param([k, m])

    def op_matmul(self) -> None:
        x = self.pick(lambda v: self.full(v) and self.shape(v).dims[2].is_static)
        if x is None:
            return
        k = self.shape(x).dims[2].value
        m = self.draw(st.sampled_from([self.n, self.n + 2]))
        y = self.g.matmul(x, self.weight(k, m))
        if self.draw(st.booleans()):
            bias = self.vector(m)
            y = self.g.add_(y, bias) if self.draw(st.booleans()) else self.g.add_(bias, y)
        if self.draw(st.booleans()):
            y = self.g.activation(self.draw(st.sampled_from(SAFE_ACTIVATIONS)), y)
        self.push(y, False)

    def op_swiglu(self) -> None:
        x = self.pick(lambda v: self.full(v) and self.shape(v).dims[2].is_static)
        if x is None:
            return
        k = self.shape(x).dims[2].value
        gate = self.g.activation("silu", self.g.matmul(x, self.weight(k, self.n)))
        up = self.g.matmul(x, self.weight(k, self.n))
        self.push(self.g.mul(gate, up) if self.draw(st.booleans()) else self.g.mul(up, gate), False)

    def op_norm(self) -> None:
        a = self.pick(lambda v: self.full(v) and self.shape(v).dims[2].is_static)
        if a is None:
            return
        n = self.shape(a).dims[2].value
        b = self.pick(lambda v: self.shape(v) == self.shape(a))
        h = self.g.add_(a, b) if self.draw(st.booleans()) else a
        if self.draw(st.booleans()):
            h = self.g.add_(h, self.vector(n))
        if self.draw(st.booleans()):
            y = self.g.layer_norm(h, self.param([n], "gamma"), self.param([n], "beta"), eps=NORM_EPS)
        else:
            y = self.g.rms_norm(h, self.param([n], "gamma"), eps=NORM_EPS)
        self.push(y, False)

    def op_reshape(self) -> None:
        x = self.pick(self.full)
        if x is None:
            return
        d = self.shape(x).dims
        flat = self.g.reshape(x, [d[0] * d[1], d[2]])
        if self.draw(st.booleans()):
            flat = self.g.reshape(flat, [-1])
        self.push(self.g.reshape(flat, list(d)), x in self.exact)

    def op_transpose(self) -> None:
        x = self.pick(lambda v: self.shape(v).rank == 3)
        if x is None:
            return
        p = self.draw(st.permutations([0, 1, 2]))
        q = self.draw(st.permutations([0, 1, 2]))
        t = self.g.transpose(x, p)
        self.values.append(t)  # may stay alive as an odd-shaped value
        if x in self.exact:
            self.exact.add(t)
        self.push(self.g.transpose(t, q), x in self.exact)

    def op_softmax(self) -> None:
        x = self.pick(self.is_float)
        if self.shape(x).rank == 0:
            return
        self.push(self.g.softmax(x, -1), x in self.exact)

    def op_reduce(self) -> None:
        x = self.pick(lambda v: self.is_float(v) and self.shape(v).rank >= 1)
        if x is None:
            return
        fn = self.draw(st.sampled_from(["sum", "mean", "max", "min"]))
        r = self.g.reduce(fn, x, [-1], keep_dim=True)
        self.push(self.g.sub(x, r), x in self.exact)

    def op_constants(self) -> None:
        x = self.pick(lambda v: self.is_float(v) and self.shape(v).rank >= 1 and self.shape(v).dims[-1].is_static)
        if x is None:
            return
        n = self.shape(x).dims[-1].value
        c1 = self.g.constant(self.rng.uniform(-1, 1, n).astype(np.float32))
        c2 = self.g.expand(self.g.constant(float(self.rng.uniform(0.5, 1.5))), [n])
        c = self.g.activation("tanh", self.g.mul(c1, c2))
        self.push(self.g.add_(x, c), x in self.exact)

    def op_duplicate(self) -> None:
        x = self.pick(self.is_float)
        fn = self.draw(st.sampled_from(SAFE_ACTIVATIONS))
        a, b = self.g.activation(fn, x), self.g.activation(fn, x)
        self.push(self.g.add_(a, b) if self.draw(st.booleans()) else self.g.mul(b, a), x in self.exact)

    def op_narrow(self) -> None:
        x = self.pick(lambda v: self.is_float(v) and self.shape(v).rank >= 1 and self.shape(v).dims[-1].is_static)
        if x is None:
            return
        n = self.shape(x).dims[-1].value
        if self.draw(st.booleans()) or n < 2:
            y = self.g.narrow(x, -1, 0, n)  # the whole axis: removed by simplify
        else:
            start = self.draw(st.integers(0, n - 2))
            y = self.g.narrow(x, -1, start, self.draw(st.integers(1, n - start)))
        self.push(y, x in self.exact)

    def op_expand(self) -> None:
        x = self.pick(self.is_float)
        self.push(self.g.expand(x, list(self.shape(x).dims)), x in self.exact)

    def op_concat(self) -> None:
        x = self.pick(lambda v: self.is_float(v) and self.shape(v).rank >= 1 and self.shape(v).dims[-1].is_static)
        if x is None:
            return
        y = self.pick(lambda v: self.shape(v) == self.shape(x))
        self.push(self.g.concat([x, y], -1), x in self.exact and y in self.exact)

    def op_attention(self) -> None:
        x = self.pick(lambda v: self.full(v) and self.shape(v).dims[2].is_static)
        if x is None:
            return
        n = self.shape(x).dims[2].value
        heads = 2 if n % 2 == 0 else 1
        mask = self.draw(st.sampled_from(["none", "causal"]))
        self.push(self.g.attention(x, x, x, num_heads=heads, head_dim=n // heads, mask=mask), False)


OPS = ("unary", "exp", "binary", "identity", "div_const", "where", "cast", "matmul", "swiglu", "norm",
       "reshape", "transpose", "softmax", "reduce", "constants", "duplicate", "narrow", "expand", "concat",
       "attention")
#: What the generator samples: the fusion patterns weighted up so that every pass sees them often.
_WEIGHTED = OPS + ("matmul",) * 3 + ("swiglu",) * 2 + ("norm",) * 3 + ("binary", "unary")


@st.composite
def random_cases(draw: Callable, max_ops: int = 10) -> Case:
    """A random graph with concrete inputs and params."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dynamic = draw(st.booleans())
    b = Dim.dynamic("batch", max=3) if dynamic else Dim(draw(st.integers(1, 2)))
    s = Dim.dynamic("seq", max=4) if dynamic else Dim(draw(st.integers(1, 3)))
    n = draw(st.sampled_from([2, 3, 4]))
    bld = _Builder(draw, rng, Graph("random"), b, s, n)
    g = bld.g
    bv = draw(st.integers(1, 3)) if dynamic else b.value
    sv = draw(st.integers(1, 4)) if dynamic else s.value
    inputs: dict[str, np.ndarray] = {}

    bld.push(g.input("x", [b, s, n]), True)
    inputs["x"] = rng.standard_normal((bv, sv, n)).astype(np.float32)
    if draw(st.booleans()):
        bld.push(g.input("y", [b, s, n]), True)
        inputs["y"] = rng.standard_normal((bv, sv, n)).astype(np.float32)
    if draw(st.booleans()):
        ids = g.input("ids", [b, s], "i32")
        inputs["ids"] = rng.integers(0, 5, (bv, sv)).astype(np.int32)
        bld.push(g.gather(bld.param([5, n], "w"), ids), True)
    if draw(st.booleans()):
        g.param("unused", [3])  # part of the ABI even though nothing reads it
        bld.params["unused"] = np.zeros(3, np.float32)

    for _ in range(draw(st.integers(1, max_ops))):
        getattr(bld, "op_" + draw(st.sampled_from(_WEIGHTED)))()

    n_out = draw(st.integers(1, 3))
    outs = [bld.values[-1]] + [bld.values[draw(st.integers(0, len(bld.values) - 1))] for _ in range(n_out - 1)]
    g.set_outputs(outs)
    g.verify()
    return Case(g, inputs, bld.params)


# ── BERT ───────────────────────────────────────────────────────────────


def bert_graph(layers: int = 6, hidden: int = 384, heads: int = 12, ffn: int = 1536, vocab: int = 1000,
               max_batch: int = 32, max_seq: int = 128) -> Graph:
    """A BERT encoder as the Graph builder writes it (weights in PyTorch's [out, in] layout).

    Embeddings (word + position + type, layer norm), then per layer: q/k/v
    projections with bias, attention with a padding mask, output projection,
    residual + layer norm, gelu FFN, residual + layer norm.
    """
    g = Graph("bert")
    b = Dim.dynamic("batch", max=max_batch)
    s = Dim.dynamic("seq", max=max_seq)
    ids = g.input("input_ids", [b, s], "i32")
    mask = g.input("attention_mask", [b, s])
    pos_ids = g.input("position_ids", [b, s], "i32")

    def linear(x: NodeId, prefix: str, n_in: int, n_out: int) -> NodeId:
        w = g.param(f"{prefix}.weight", [n_out, n_in])
        bias = g.param(f"{prefix}.bias", [n_out])
        return g.add_(g.matmul(x, g.transpose(w, [1, 0])), bias)

    def layer_norm(x: NodeId, prefix: str) -> NodeId:
        return g.layer_norm(x, g.param(f"{prefix}.weight", [hidden]), g.param(f"{prefix}.bias", [hidden]), eps=1e-12)

    h = g.add_(g.gather(g.param("embeddings.word", [vocab, hidden]), ids),
               g.gather(g.param("embeddings.position", [max_seq, hidden]), pos_ids))
    h = g.add_(h, g.param("embeddings.token_type", [hidden]))
    h = layer_norm(h, "embeddings.ln")
    for i in range(layers):
        p = f"layer{i}"
        q = linear(h, f"{p}.q", hidden, hidden)
        k = linear(h, f"{p}.k", hidden, hidden)
        v = linear(h, f"{p}.v", hidden, hidden)
        a = g.attention(q, k, v, num_heads=heads, head_dim=hidden // heads, mask="padding", mask_input=mask)
        h = layer_norm(g.add_(linear(a, f"{p}.attn_out", hidden, hidden), h), f"{p}.ln1")
        f = g.activation("gelu", linear(h, f"{p}.ffn_in", hidden, ffn))
        h = layer_norm(g.add_(linear(f, f"{p}.ffn_out", ffn, hidden), h), f"{p}.ln2")
    g.set_outputs({"last_hidden_state": h})
    return g


# ── checking ───────────────────────────────────────────────────────────


def kinds(graph: Graph) -> list[str]:
    return [n.kind for n in graph.nodes]


def count(graph: Graph, kind: str) -> int:
    return sum(n.kind == kind for n in graph.nodes)


def assert_equivalent(before: Graph, after: Graph, case: Case, *, exact: bool) -> None:
    """Same reference outputs (names, shapes, dtypes, values) on the case's data.

    `exact`: bit-identical (NaN matching NaN). Otherwise the tolerance of the
    fused ops: they skip at most two f32 roundings of an intermediate (2**-24
    relative each) and reassociate sums, and the generator keeps every later
    op's gain small (see the module docstring), so differences stay below
    1e-5 of the largest output magnitude, ~100x the roundings themselves.
    """
    want = reference.run(before, case.inputs, case.params)
    got = reference.run(after, case.inputs, case.params)
    assert after.output_names == before.output_names
    for name, w, o in zip(before.output_names, want, got):
        assert o.shape == w.shape and o.dtype == w.dtype, name
        if exact:
            np.testing.assert_array_equal(o, w, err_msg=name)
        else:
            scale = max(1.0, float(np.nanmax(np.abs(w), initial=0.0)))
            np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5 * scale, equal_nan=True, err_msg=name)

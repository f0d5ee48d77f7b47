"""Unit tests of the fusion passes: which patterns fuse, which must not, and that values hold."""

from __future__ import annotations

import numpy as np
import pytest
from graphs import Case, assert_equivalent, count, kinds

from rlx import reference
from rlx.ir import ops as O
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.opt.fusion import (
    MAX_REGION_INPUTS,
    fuse,
    fuse_elementwise,
    fuse_matmul_epilogue,
    fuse_residual_norm,
    fuse_swiglu,
)
from rlx.opt.pipeline import optimize
from rlx.trace import trace


def _case(g: Graph, rng: np.random.Generator, **dims: int) -> Case:
    inputs = {n.op.name: rng.standard_normal(n.op.shape.concrete(dims)).astype(n.op.shape.dtype.np)
              for n in g.inputs()}
    params = {n.op.name: (rng.standard_normal(n.op.user_shape.static_dims) * 0.5).astype(np.float32)
              for n in g.params()}
    return Case(g, inputs, params)


def _root(g: Graph, i: int = 0) -> O.Op:
    return g.node(g.outputs[i]).op


# ── matmul epilogue ────────────────────────────────────────────────────


def test_traced_linear_gelu_becomes_one_op(rng) -> None:
    def mlp(t):
        x = t.input("x", [Dim.dynamic("b", max=8), 16])
        w = t.param("w", [32, 16])  # PyTorch [out, in]
        b = t.param("b", [32])
        return (x @ w.t() + b).gelu()

    g = trace("mlp", mlp)
    out = optimize(g, 2, debug=True)
    assert kinds(out) == ["input", "param", "param", "fused_matmul_bias_act"]
    assert _root(out) == O.FusedMatMulBiasAct("gelu")
    assert out.params()[0].op.layout == (1, 0)
    assert_equivalent(g, out, _case(g, rng, b=5), exact=False)


@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("act", [None, "relu", "silu", "tanh"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_epilogue_variants(bias_first: bool, act: str | None, with_bias: bool, rng) -> None:
    g = Graph("m")
    x, w, b = g.input("x", [2, 3, 4]), g.param("w", [4, 5]), g.param("b", [5])
    y = g.matmul(x, w)
    if with_bias:
        y = g.add_(b, y) if bias_first else g.add_(y, b)
    if act:
        y = g.activation(act, y)
    g.set_outputs([y])
    out = fuse_matmul_epilogue(g)
    if not with_bias and not act:
        assert str(out) == str(g)  # a bare matmul stays a matmul
        return
    assert kinds(out) == ["input", "param", "param", "fused_matmul_bias_act"]
    assert _root(out) == O.FusedMatMulBiasAct(act)
    assert out.node(out.outputs[0]).inputs == ((0, 1, 2) if with_bias else (0, 1))
    assert_equivalent(g, out, _case(g, rng), exact=False)


def test_matmul_epilogue_refuses_non_vector_bias_and_shared_values(rng) -> None:
    g = Graph("m")
    x = g.input("x", [3, 4])
    w = g.param("w", [4, 5])
    full_bias = g.param("fb", [3, 5])
    row_bias = g.param("rb", [1, 5])
    y1 = g.add_(g.matmul(x, w), full_bias)  # not [N]
    y2 = g.add_(g.matmul(x, w), row_bias)  # [1, N] is not [N]
    mm = g.matmul(x, w)
    y3 = g.activation("relu", mm)  # mm also an output: cannot absorb
    mm2 = g.matmul(x, w)
    y4 = g.add_(g.activation("relu", mm2), g.activation("tanh", mm2))  # two consumers
    g.set_outputs([y1, y2, y3, mm, y4])
    out = fuse_matmul_epilogue(g)
    assert count(out, "fused_matmul_bias_act") == 0 and count(out, "matmul") == 4
    assert_equivalent(g, out, _case(g, rng), exact=True)


def test_matmul_epilogue_keeps_bias_add_when_add_has_other_users(rng) -> None:
    g = Graph("m")
    x, w, b = g.input("x", [3, 4]), g.param("w", [4, 5]), g.param("b", [5])
    h = g.add_(g.matmul(x, w), b)
    g.set_outputs([g.activation("gelu", h), g.mul(h, h)])
    out = fuse_matmul_epilogue(g)
    # matmul + bias fuses (the add's value is still produced once); gelu stays separate.
    assert _root(out) == O.Activation("gelu") and count(out, "fused_matmul_bias_act") == 1
    assert count(out, "binary") == 1
    assert_equivalent(g, out, _case(g, rng), exact=False)


# ── residual norms ─────────────────────────────────────────────────────


def _bert_block(g: Graph, x: int, res: int, hidden: int) -> int:
    w, b = g.param("dense.weight", [hidden, hidden]), g.param("dense.bias", [hidden])
    gamma, beta = g.param("ln.weight", [hidden]), g.param("ln.bias", [hidden])
    h = g.add_(g.matmul(x, g.transpose(w, [1, 0])), b)
    return g.layer_norm(g.add_(h, res), gamma, beta, eps=1e-12)


def test_bert_residual_layer_norm(rng) -> None:
    g = Graph("bert_out")
    s = Dim.dynamic("seq", max=16)
    x, res = g.input("x", [2, s, 8]), g.input("res", [2, s, 8])
    g.set_outputs([_bert_block(g, x, res, 8)])
    out = optimize(g, 2, debug=True)
    assert kinds(out) == ["input", "input", "param", "param", "param", "param",
                          "fused_matmul_bias_act", "fused_residual_layer_norm"]
    fmba, frln = out.nodes[-2], out.nodes[-1]
    assert frln.op == O.FusedResidualLayerNorm(1e-12)
    assert frln.inputs == (fmba.id, 1, 4, 5)
    assert_equivalent(g, out, _case(g, rng, seq=7), exact=False)


@pytest.mark.parametrize("order", ["(x+r)+b", "b+(r+x)", "(x+b)+r", "r+(b+x)"])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_residual_norm_with_bias(order: str, norm: str, rng) -> None:
    g = Graph("r")
    x, r = g.input("x", [3, 6]), g.input("r", [3, 6])
    b, gamma, beta = g.param("b", [6]), g.param("g", [6]), g.param("be", [6])
    h = {"(x+r)+b": lambda: g.add_(g.add_(x, r), b), "b+(r+x)": lambda: g.add_(b, g.add_(r, x)),
         "(x+b)+r": lambda: g.add_(g.add_(x, b), r), "r+(b+x)": lambda: g.add_(r, g.add_(b, x))}[order]()
    y = g.layer_norm(h, gamma, beta) if norm == "layer_norm" else g.rms_norm(h, gamma)
    g.set_outputs([y])
    out = fuse_residual_norm(g)
    fused = out.node(out.outputs[0])
    want = O.FusedResidualLayerNorm(1e-5) if norm == "layer_norm" else O.FusedResidualRmsNorm(1e-6)
    assert fused.op == want and count(out, "binary") == 0
    assert set(fused.inputs[:2]) == {0, 1} and fused.inputs[2] == 2
    assert_equivalent(g, out, _case(g, rng), exact=False)


def test_residual_norm_refuses_broadcast_and_shared_sum(rng) -> None:
    g = Graph("r")
    x, r_row = g.input("x", [3, 6]), g.input("r", [1, 6])
    gamma = g.param("g", [6])
    y1 = g.rms_norm(g.add_(x, r_row), gamma)  # residual broadcasts: not a residual
    h = g.add_(x, x)
    y2 = g.rms_norm(h, gamma)  # pre-norm: h is also needed by the next residual
    g.set_outputs([y1, g.add_(h, y2)])
    out = fuse_residual_norm(g)
    assert count(out, "fused_residual_rms_norm") == 0
    assert_equivalent(g, out, _case(g, rng), exact=True)


# ── SwiGLU ─────────────────────────────────────────────────────────────


@pytest.mark.parametrize("swap", [False, True])
def test_swiglu(swap: bool, rng) -> None:
    g = Graph("ffn")
    x = g.input("x", [2, Dim.dynamic("s", max=8), 8])
    wg, wu, wd = g.param("gate", [16, 8]), g.param("up", [16, 8]), g.param("down", [8, 16])
    gate = g.activation("silu", g.matmul(x, g.transpose(wg, [1, 0])))
    up = g.matmul(x, g.transpose(wu, [1, 0]))
    h = g.mul(up, gate) if swap else g.mul(gate, up)
    g.set_outputs([g.matmul(h, g.transpose(wd, [1, 0]))])
    out = optimize(g, 2, debug=True)
    assert kinds(out)[4:] == ["fused_swiglu", "matmul"]
    assert out.nodes[4].inputs == (0, 1, 2)
    assert_equivalent(g, out, _case(g, rng, s=3), exact=False)


def test_swiglu_needs_the_same_x_and_private_values(rng) -> None:
    g = Graph("ffn")
    x, x2 = g.input("x", [2, 8]), g.input("x2", [2, 8])
    wg, wu = g.param("gate", [8, 16]), g.param("up", [8, 16])
    y1 = g.mul(g.activation("silu", g.matmul(x, wg)), g.matmul(x2, wu))  # different x
    gate = g.activation("silu", g.matmul(x, wg))
    y2 = g.mul(gate, g.matmul(x, wu))
    g.set_outputs([y1, y2, gate])  # gate is an output
    out = fuse_swiglu(g)
    assert count(out, "fused_swiglu") == 0
    assert_equivalent(g, out, _case(g, rng), exact=True)


# ── elementwise regions ────────────────────────────────────────────────


def test_elementwise_chain_and_tree(rng) -> None:
    g = Graph("e")
    x, b = g.input("x", [2, 3, 4]), g.input("b", [4])
    t = g.add_(x, b)  # broadcasting input
    u = g.mul(t, g.activation("sigmoid", t))  # t used twice, both inside the region
    m = g.compare("gt", x, g.constant(0.0))
    y = g.where(m, u, g.cast(g.cast(x, "f16"), "f32"))
    g.set_outputs([g.activation("tanh", y)])
    out = fuse_elementwise(g)
    assert kinds(out) == ["input", "input", "constant", "elementwise_region"]
    region = _root(out)
    assert isinstance(region, O.ElementwiseRegion) and len(region.steps) == 8
    assert len(out.node(out.outputs[0]).inputs) == 3
    assert_equivalent(g, out, _case(g, rng), exact=True)


def test_elementwise_region_respects_outputs_consumers_and_dims(rng) -> None:
    g = Graph("e")
    x, v = g.input("x", [3, 4]), g.input("v", [4])
    small = g.activation("exp", g.activation("neg", v))  # [4]: a region of its own
    a = g.add_(x, small)  # [3, 4]: must not recompute `small` per row
    shared = g.activation("relu", a)  # two consumers outside one region
    o1 = g.activation("tanh", shared)
    o2 = g.matmul(shared, g.param("w", [4, 4]))
    visible = g.activation("sigmoid", x)  # a graph output
    o3 = g.mul(visible, x)
    g.set_outputs([o1, o2, o3, visible])
    out = fuse_elementwise(g)
    regions = [n for n in out.nodes if n.kind == "elementwise_region"]
    dims = sorted(str(n.shape) for n in regions)
    assert dims == ["f32[3,4]", "f32[4]"]
    steps = {str(n.shape): [s.op for s in n.op.steps] for n in regions}
    assert steps == {"f32[4]": [O.Activation("neg"), O.Activation("exp")],
                     "f32[3,4]": [O.Binary("add"), O.Activation("relu")]}
    # tanh (its input has two users), sigmoid (an output) and the mul using it stay alone.
    assert [n.op for n in out.nodes if n.kind in ("activation", "binary")] == \
        [O.Activation("tanh"), O.Activation("sigmoid"), O.Binary("mul")]
    assert_equivalent(g, out, _case(g, rng), exact=True)


def test_elementwise_region_input_limit() -> None:
    g = Graph("wide")
    xs = [g.input(f"x{i}", [2]) for i in range(MAX_REGION_INPUTS + 10)]
    acc = xs[0]
    for x in xs[1:]:
        acc = g.add_(acc, x)
    g.set_outputs([acc])
    out = fuse_elementwise(g)
    for n in out.nodes:
        assert len(n.inputs) <= MAX_REGION_INPUTS
    assert count(out, "elementwise_region") == 2
    vals = {f"x{i}": np.full(2, i, np.float32) for i in range(len(xs))}
    assert reference.run(out, vals)[0].tolist() == reference.run(g, vals)[0].tolist()


def test_matmul_epilogue_wins_over_elementwise_region(rng) -> None:
    g = Graph("order")
    x, w, b = g.input("x", [2, 4]), g.param("w", [4, 4]), g.param("b", [4])
    y = g.activation("gelu", g.add_(g.matmul(x, w), b))
    g.set_outputs([g.mul(g.activation("tanh", y), x)])
    out = fuse(g)
    assert kinds(out) == ["input", "param", "param", "fused_matmul_bias_act", "elementwise_region"]
    assert out.nodes[3].op == O.FusedMatMulBiasAct("gelu")
    assert_equivalent(g, out, _case(g, rng), exact=False)


def test_region_rounds_every_step_like_unfused_f16(rng) -> None:
    """The region's reference rounds each step to its dtype, mixed dtypes included."""
    g = Graph("h")
    x, y = g.input("x", [64], "f16"), g.input("y", [64], "f32")
    t = g.mul(g.add_(x, g.cast(y, "f16")), g.constant(np.float16(1.37), "f16"))
    g.set_outputs([g.cast(g.activation("tanh", t), "f32")])
    out = fuse_elementwise(g)
    assert count(out, "elementwise_region") == 1
    case = Case(g, {"x": rng.standard_normal(64).astype(np.float16), "y": rng.standard_normal(64).astype(np.float32)},
                {})
    assert_equivalent(g, out, case, exact=True)


def test_fusion_never_mutates_input() -> None:
    g = Graph("m")
    x, w, b = g.input("x", [2, 4]), g.param("w", [4, 4]), g.param("b", [4])
    g.set_outputs([g.activation("gelu", g.add_(g.matmul(x, w), b))])
    text = str(g)
    fuse(g)
    assert str(g) == text

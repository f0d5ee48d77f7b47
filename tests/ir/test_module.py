"""GraphModule: stages, accessors, lowering HIR → MIR → LIR, inspection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx import reference
from rlx.errors import IRError
from rlx.ir.graph import Graph
from rlx.ir.hir import HirModule
from rlx.ir.lir import LirModule
from rlx.ir.module import GraphModule
from rlx.opt.memplan import plan


def build_ffn(h: HirModule) -> int:
    x = h.input("x", [2, 8])
    w = h.param("w", [16, 8])
    b = h.param("b", [16])
    return h.linear(x, w, b, activation="gelu", transpose_weight=True, name="fc")


def test_define_is_hir_and_accessors_guard_the_stage():
    m = GraphModule.define("ffn", build_ffn)
    assert m.stage == "hir" and m.name == "ffn"
    assert isinstance(m.hir, HirModule)
    assert m.hir.output_names == ["out0"]
    with pytest.raises(IRError, match=r"'ffn' is at the HIR stage, not MIR; call \.lower\(\) first"):
        m.graph  # noqa: B018
    with pytest.raises(IRError, match=r"at the HIR stage, not LIR; call \.plan\(\)"):
        m.lir  # noqa: B018


@pytest.mark.parametrize("ret, names", [
    (lambda h, a, b: a, ["out0"]),
    (lambda h, a, b: (a, b), ["out0", "out1"]),
    (lambda h, a, b: {"first": a, "second": b}, ["first", "second"]),
    (lambda h, a, b: h.set_outputs({"set": b}), ["set"]),
])
def test_define_accepts_every_output_form(ret, names):
    def build(h):
        x = h.input("x", [4])
        return ret(h, h.activation("relu", x), h.activation("neg", x))

    assert GraphModule.define("m", build).hir.output_names == names


def test_define_rejects_missing_or_bad_outputs():
    with pytest.raises(IRError, match="returned no outputs"):
        GraphModule.define("m", lambda h: None)
    with pytest.raises(IRError, match="must return node id"):
        GraphModule.define("m", lambda h: "x")
    with pytest.raises(IRError, match="has no node"):
        GraphModule.define("m", lambda h: 7)


def test_lower_returns_a_new_mir_module_and_keeps_the_hir(rng):
    m = GraphModule.define("ffn", build_ffn)
    mir = m.lower()
    assert mir.stage == "mir" and m.stage == "hir"
    assert [n.kind for n in mir.graph.nodes] == ["input", "param", "param", "transpose", "matmul", "binary",
                                                  "activation"]
    with pytest.raises(IRError, match="at the MIR stage, not HIR"):
        mir.hir  # noqa: B018
    assert mir.lower() is mir and mir.lower("mir") is mir
    with pytest.raises(IRError, match="cannot go back to HIR"):
        mir.lower("hir")
    with pytest.raises(IRError, match="stage must be one of"):
        m.lower("asm")

    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 8), (16, 8), (16,)))
    got = reference.run(mir.graph, {"x": x}, {"w": w, "b": b})[0]
    lin = x.astype(np.float64) @ w.T + b
    want = 0.5 * lin * (1 + np.vectorize(math.erf)(lin / np.sqrt(2)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_hir_and_mir_constructors():
    h = GraphModule.hir("blk")
    assert h.stage == "hir" and len(h.hir) == 0
    x = h.hir.input("x", [2, 4])
    h.hir.set_outputs([h.hir.rms_norm(x, h.hir.param("g", [4]))])
    assert [n.kind for n in h.lower().graph.nodes] == ["input", "param", "rms_norm"]

    m = GraphModule.mir("raw")
    assert m.stage == "mir" and type(m.graph) is Graph
    m.graph.set_outputs([m.graph.input("x", [3])])
    assert len(m.graph) == 1


def test_from_graph_picks_the_stage_from_the_class():
    assert GraphModule.from_graph(HirModule("h")).stage == "hir"
    assert GraphModule.from_graph(Graph("g")).stage == "mir"
    with pytest.raises(IRError, match="takes a Graph"):
        GraphModule.from_graph("graph")
    with pytest.raises(IRError, match="takes a LirModule"):
        GraphModule.from_lir(Graph("g"))
    with pytest.raises(IRError, match="holds a HirModule, Graph or LirModule"):
        GraphModule(42)


def test_lir_stage_from_a_planned_graph():
    g = GraphModule.define("ffn", build_ffn).lower().graph
    m = GraphModule.from_lir(plan(g))
    assert m.stage == "lir" and isinstance(m.lir, LirModule)
    assert m.graph is m.lir.graph
    with pytest.raises(IRError, match="cannot go back to MIR"):
        m.lower("mir")
    assert m.plan() is m
    text = m.inspect()
    assert text.startswith(f"lir ffn: hash {m.lir.hash()[:16]}")
    assert "buffer plan for ffn:" in text and "arena:" in text


def test_inspect_is_readable_at_hir_and_mir():
    m = GraphModule.define("ffn", build_ffn)
    hir_text = m.inspect()
    assert hir_text.splitlines()[0] == "hir ffn: 4 nodes, 1 blocks (hir.linear x1)"
    assert "hir.linear[activation=gelu, transpose_weight=True](%0, %1, %2)  # fc" in hir_text
    mir_text = m.lower().inspect()
    assert mir_text.splitlines()[0] == ("mir ffn: 7 nodes (activation x1, binary x1, input x1, matmul x1, "
                                        "param x2, transpose x1)")
    assert "graph ffn {" in mir_text and "activation[fn=gelu](%5)  # fc" in mir_text
    assert str(m) == hir_text
    assert repr(m) == "<GraphModule 'ffn' stage=hir nodes=4>"


def test_plan_runs_the_optimizer_at_the_requested_level(monkeypatch):
    from rlx.opt import pipeline

    calls = []

    def optimize(graph, level=None, **_):
        calls.append(level)
        return graph

    # The driver registers GraphModule's LIR lowering; it calls rlx.opt.pipeline.optimize at call time.
    monkeypatch.setattr(pipeline, "optimize", optimize)
    m = GraphModule.define("ffn", build_ffn)
    lir = m.plan(level=1)
    assert calls == [1] and lir.stage == "lir"
    assert [n.kind for n in lir.graph.nodes] == [n.kind for n in m.lower().graph.nodes]
    m.lower("lir")
    assert calls == [1, None]  # None: the optimizer reads RLX_OPT_LEVEL


@pytest.mark.parametrize("level", [0, 2])
def test_plan_with_the_real_optimizer_preserves_results(rng, level):
    pytest.importorskip("rlx.opt.pipeline", reason="optimizer pipeline not present in this checkout")
    m = GraphModule.define("ffn", build_ffn)
    lir = m.plan(level=level)
    assert lir.stage == "lir"
    assert [s.name for s in lir.lir.inputs] == ["x"]
    assert [s.name for s in lir.lir.params] == ["w", "b"]
    assert [s.name for s in lir.lir.outputs] == ["out0"]
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 8), (16, 8), (16,)))
    want = reference.run(m.lower().graph, {"x": x}, {"w": w, "b": b})[0]
    got = reference.run(lir.graph, {"x": x}, {"w": w, "b": b})[0]
    # Fusion changes how often f32 rounding happens, not the math: a few ulps.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_hf_linear_plans_to_one_fused_op_over_a_pretransposed_param():
    pytest.importorskip("rlx.opt.pipeline", reason="optimizer pipeline not present in this checkout")
    lir = GraphModule.define("ffn", build_ffn).plan(level=2).lir
    assert [n.kind for n in lir.graph.nodes] == ["input", "param", "param", "fused_matmul_bias_act"]
    w = lir.graph.params()[0].op
    assert w.layout == (1, 0) and str(w.user_shape) == "f32[16,8]"

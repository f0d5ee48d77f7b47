"""The pass manager: levels, the report, debug verification, configuration."""

from __future__ import annotations

import numpy as np
import pytest
from graphs import kinds

import rlx
from rlx.errors import IRError, RlxError
from rlx.ir import ops as O
from rlx.ir.graph import Graph
from rlx.opt.pipeline import PIPELINES, optimize, optimize_with_report


def _mlp() -> Graph:
    g = Graph("mlp")
    x = g.input("x", [4, 8])
    w, b = g.param("w", [16, 8]), g.param("b", [16])
    h = g.add_(g.matmul(x, g.transpose(w, [1, 0])), b)
    h = g.mul(g.activation("gelu", h), g.constant(1.0))  # an identity to simplify away
    _dead = g.activation("exp", x)
    g.set_outputs({"y": h})
    return g


def test_exported() -> None:
    assert rlx.optimize is optimize


def test_level0_only_verifies_and_copies() -> None:
    g = _mlp()
    out, report = optimize_with_report(g, 0)
    assert out is not g and str(out) == str(g) and report.passes == ()
    assert report.nodes_before == report.nodes_after == len(g)


def test_levels_progress() -> None:
    g = _mlp()
    l1, l2, l3 = (optimize(g, lv) for lv in (1, 2, 3))
    assert kinds(l1) == ["input", "param", "param", "transpose", "matmul", "binary", "activation"]
    assert kinds(l2) == ["input", "param", "param", "fused_matmul_bias_act"]
    assert str(l3) == str(l2)
    assert PIPELINES[1] == ("bodies", "fold", "simplify", "cse", "dce")


def test_report_records_every_pass() -> None:
    g = _mlp()
    out, report = optimize_with_report(g, 2, debug=True)
    assert [p.name for p in report.passes] == list(PIPELINES[2])
    by = {p.name: p for p in report.passes}
    assert by["simplify"].removed == (("binary", 1),) and not by["fold"].changed
    assert by["dce"].removed == (("activation", 1), ("constant", 1))
    assert by["layout"].removed == (("transpose", 1),) and by["layout"].nodes_after == by["layout"].nodes_before - 1
    mm = by["fuse_matmul_epilogue"]
    assert mm.created == (("fused_matmul_bias_act", 1),)
    assert mm.removed == (("activation", 1), ("binary", 1), ("matmul", 1))
    assert (mm.nodes_before, mm.nodes_after) == (6, 4)
    assert not by["fuse_swiglu"].changed and by["fuse_swiglu"].created == ()
    assert report.passes[-1].mir == str(out)
    for a, b in zip(report.passes, report.passes[1:]):
        assert a.nodes_after == b.nodes_before
    text = report.inspect()
    assert "── after fuse_matmul_epilogue ──" in text and "── after fuse_swiglu ──" not in text
    assert report.summary().splitlines()[0] == f"optimize level 2: {len(g)} -> {len(out)} nodes"


def test_debug_catches_broken_passes() -> None:
    g = _mlp()

    def drop_input(graph: Graph) -> Graph:
        out = Graph(graph.name)
        x = out.input("renamed", [4, 8])
        out.set_outputs({"y": x})
        return out

    def change_output_shape(graph: Graph) -> Graph:
        out = graph.copy()
        out.set_outputs({"y": 0})
        return out

    def identity(graph: Graph) -> Graph:
        return graph

    with pytest.raises(IRError, match="pass 'drop' changed the graph's inputs"):
        optimize_with_report(g, 2, debug=True, passes=[("drop", drop_input)])
    with pytest.raises(IRError, match="pass 'reshape_out' changed the graph's outputs"):
        optimize_with_report(g, 2, debug=True, passes=["dce", ("reshape_out", change_output_shape)])
    with pytest.raises(IRError, match="returned its input graph"):
        optimize_with_report(g, 2, passes=[("id", identity)])
    # Without debug the ABI check is skipped (the pass is trusted).
    optimize_with_report(g, 2, debug=False, passes=[("drop", drop_input)])


def test_debug_verifies_after_each_pass() -> None:
    def corrupt(graph: Graph) -> Graph:
        out = graph.copy()
        bad = out.nodes[-1]
        out.nodes[-1] = type(bad)(bad.id, O.Activation("relu"), bad.inputs, bad.shape.with_dtype("f16"), bad.name)
        return out

    with pytest.raises(IRError, match="after pass 'corrupt'"):
        optimize_with_report(_mlp(), debug=True, passes=[("corrupt", corrupt)])


def test_bad_levels_and_pass_names() -> None:
    for level in (-1, 4, "2", True, 2.0):
        with pytest.raises(IRError, match="optimization level"):
            optimize(_mlp(), level)
    with pytest.raises(IRError, match="unknown pass 'nope'"):
        optimize_with_report(_mlp(), passes=["nope"])
    g = Graph("empty")
    with pytest.raises(IRError, match="no outputs"):
        optimize(g)


def test_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _mlp()
    monkeypatch.setenv("RLX_OPT_LEVEL", "1")
    assert kinds(optimize(g, None)) == kinds(optimize(g, 1))
    monkeypatch.setenv("RLX_OPT_LEVEL", "9")
    with pytest.raises(RlxError, match="RLX_OPT_LEVEL"):
        optimize(g, None)
    monkeypatch.setenv("RLX_OPT_LEVEL", "2")
    monkeypatch.setenv("RLX_DEBUG", "1")

    def drop(graph: Graph) -> Graph:
        out = Graph(graph.name)
        out.set_outputs({"y": out.input("z", [4, 16])})
        return out

    with pytest.raises(IRError, match="changed the graph's inputs"):
        optimize_with_report(g, 2, passes=[("drop", drop)])


def test_optimized_outputs_match_reference() -> None:
    g = _mlp()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32)}
    params = {"w": rng.standard_normal((16, 8)).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}
    want = rlx.reference.run(g, feeds, params)[0]
    got = rlx.reference.run(optimize(g), feeds, params)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

"""Params stored in a narrower precision: half the bytes, f32 accumulation, one rounding of the weights."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
import rlx.opt.pipeline  # the test calls rlx.opt.pipeline.optimize: imported here, not by whatever ran before
from rlx.ir.dtype import BFLOAT16, DType
from rlx.opt.precision import store_params_in
from rlx.toolchain.isa import cpu_flags

#: The CPU build multiplies bf16 weights with vdpbf16ps (activations rounded to bf16) on this host.
BF16_DOT = "avx512_bf16" in (cpu_flags() or ())


def _mlp(round_activations: bool = False) -> rlx.Graph:
    """A two-layer MLP; `round_activations`: each GEMM's left operand rounded to bf16 first."""
    g = rlx.Graph("mlp")

    def left(v):
        return g.cast(g.cast(v, "bf16"), "f32") if round_activations else v

    x = g.input("x", [rlx.Dim.dynamic("b", max=4), 16])
    h = g.activation("gelu", g.add_(g.matmul(left(x), g.param("w1", [16, 32])), g.param("b1", [32])))
    g.set_outputs([g.matmul(left(h), g.param("w2", [32, 8]))])
    return g


def test_params_become_narrow_and_are_widened_where_read():
    out = store_params_in(_mlp(), "bf16")
    params = list(out.params())
    assert [p.shape.dtype for p in params] == [DType.BF16] * 3
    users = out.users()
    # GEMM weights are read as stored (matmul(f32, bf16) -> f32); the bias is widened
    assert {p.op.name: [out.node(u).kind for u in users[p.id]] for p in params} == {
        "w1": ["matmul"], "b1": ["cast"], "w2": ["matmul"]}
    assert all(out.node(u).shape.dtype is DType.F32 for p in params for u in users[p.id])
    assert store_params_in(_mlp(), "f32").params()[0].shape.dtype is DType.F32
    with pytest.raises(rlx.IRError, match="not i8"):
        store_params_in(_mlp(), "i8")


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_cpu_session_precision_matches_the_reference_on_rounded_weights(precision):
    rng = np.random.default_rng(0)
    g = _mlp()
    weights = {"w1": rng.uniform(-1, 1, (16, 32)), "b1": rng.uniform(-1, 1, 32), "w2": rng.uniform(-1, 1, (32, 8))}
    weights = {k: v.astype(np.float32) for k, v in weights.items()}
    narrow = BFLOAT16 if precision == "bf16" else np.float16
    cg = rlx.Session(rlx.Device.CPU, precision=precision).compile(g)
    assert cg.manifest["params"][0]["dtype"] == precision  # stored in the session's precision
    for k, v in weights.items():
        cg.set_param(k, v.astype(narrow))
    x = rng.uniform(-1, 1, (3, 16)).astype(np.float32)
    got = cg.run(x=x)[0]
    # the meaning: the f32 graph on the weights rounded once to the precision, and with bf16 on a
    # host with AVX512_BF16 each GEMM's activations rounded to bf16 too (bf16 x bf16 products, f32 sums)
    meaning = _mlp(round_activations=precision == "bf16" and BF16_DOT)
    want = rlx.reference.run(meaning, {"x": x}, {k: v.astype(narrow).astype(np.float32) for k, v in weights.items()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_lookups_read_the_narrow_table_and_widen_only_their_rows():
    g = rlx.Graph("emb")
    table = g.param("table", [100, 8])
    rows = g.gather(table, g.input("ids", [3], "i64"))
    g.set_outputs([g.add_(rows, g.reshape(g.narrow(table, 0, 0, 1), [8])), table])
    out = store_params_in(g, "bf16")
    kinds = {n.kind: n for n in out.nodes}
    assert out.node(kinds["gather"].inputs[0]).kind == "param" and kinds["gather"].shape.dtype is DType.BF16
    assert out.node(kinds["narrow"].inputs[0]).kind == "param"
    assert out.node(out.outputs[1]).kind == "cast"  # the table as an output: widened
    rng = np.random.default_rng(1)
    t = rng.uniform(-1, 1, (100, 8)).astype(np.float32)
    ids = np.array([3, 99, 0])
    want = rlx.reference.run(g, {"ids": ids}, {"table": t.astype(BFLOAT16).astype(np.float32)})
    got = rlx.reference.run(out, {"ids": ids}, {"table": t})
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_a_fused_swiglu_reads_its_narrow_weights_as_stored(precision):
    """No per-call cast of a whole weight matrix: the fused SwiGLU becomes two mixed GEMMs."""
    g = rlx.Graph("ffn")
    x = g.input("x", [rlx.Dim.dynamic("b", max=4), 16])
    wg, wu = g.param("wg", [16, 24]), g.param("wu", [16, 24])
    g.set_outputs([g.mul(g.activation("silu", g.matmul(x, wg)), g.matmul(x, wu))])
    fused = rlx.opt.pipeline.optimize(g)
    assert "fused_swiglu" in [n.kind for n in fused.nodes]
    out = store_params_in(fused, precision)
    assert "cast" not in [n.kind for n in out.nodes] and "fused_swiglu" not in [n.kind for n in out.nodes]
    assert [out.node(n.inputs[1]).shape.dtype.value for n in out.nodes if n.kind == "matmul"] == [precision] * 2
    rng = np.random.default_rng(2)
    narrow = BFLOAT16 if precision == "bf16" else np.float16
    w = {k: rng.uniform(-1, 1, (16, 24)).astype(np.float32).astype(narrow).astype(np.float32) for k in ("wg", "wu")}
    xv = rng.uniform(-1, 1, (3, 16)).astype(np.float32)
    np.testing.assert_allclose(rlx.reference.run(out, {"x": xv}, w)[0], rlx.reference.run(g, {"x": xv}, w)[0],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_bias_vectors_are_widened_once_at_set_param(precision, tmp_path, monkeypatch):
    """A narrow-stored bias read only through its cast is kept as f32 from set_param on: the LIR
    records it, the program renders no cast for it, and results are those of the per-call cast."""
    from rlx.codegen.cpu import emit as c
    from rlx.driver import lower_to_lir
    from rlx.ir.decisions import WidenedParam
    from rlx.opt.lowering import lower_for

    lir = lower_for(lower_to_lir(_mlp(), backend="cpu", params_in=precision), "cpu")
    widened = lir.decided(WidenedParam)
    assert [lir.graph.node(d.node).op.name for d in widened] == ["b1"]
    assert "widened to f32 once at set_param" in lir.inspect()
    source = c.render_c(lir, c.CTarget(), {"name": "mlp"})
    assert f"no code: %{widened[0].node} widened once at set_param" in source
    assert f"RLX_PARAM_WIDEN_{precision.upper()}, 2," in source  # the param table's row

    rng = np.random.default_rng(3)
    narrow = BFLOAT16 if precision == "bf16" else np.float16
    weights = {"w1": rng.uniform(-1, 1, (16, 32)), "b1": rng.uniform(-1, 1, 32), "w2": rng.uniform(-1, 1, (32, 8))}
    weights = {k: v.astype(np.float32).astype(narrow) for k, v in weights.items()}
    cg = rlx.Session(rlx.Device.CPU, precision=precision).compile(_mlp())
    for k, v in weights.items():
        cg.set_param(k, v)
    x = rng.uniform(-1, 1, (3, 16)).astype(np.float32)
    # the same program with the cast run per call (the pass turned off): bit for bit the same
    import rlx.opt.lowering as lowering

    monkeypatch.setattr(lowering, "widen_params", lambda lir: ())
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))  # a cache of its own: not the build above
    per_call = rlx.Session(rlx.Device.CPU, precision=precision).compile(_mlp())
    assert per_call.source is None or "widened once at set_param" not in per_call.source
    for k, v in weights.items():
        per_call.set_param(k, v)
    np.testing.assert_array_equal(cg.run(x=x)[0], per_call.run(x=x)[0])


def test_moe_experts_are_read_as_stored():
    """A `moe_matmul` reads narrow-stored experts directly (no per-call cast of every expert); the router's
    weight, read by a GEMM, stays narrow too; block experts (u8) are left alone."""
    from rlx.models.moe import MoeConfig, moe_block

    g = rlx.Graph("moe")
    moe_block(g, g.input("x", [2, 16]), MoeConfig(16, 4, 2, 8, True), "mlp")
    g.set_outputs([g.nodes[-1].id])
    out = store_params_in(g, "f16")
    users = out.users()
    kinds = {p.op.name: sorted({out.node(u).kind for u in users[p.id]}) for p in out.params()}
    assert kinds["mlp.experts.gate_up_proj"] == kinds["mlp.experts.down_proj"] == ["moe_matmul"]
    assert all(p.shape.dtype is DType.F16 for p in out.params())

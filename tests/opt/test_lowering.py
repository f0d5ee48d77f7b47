"""CPU lowering decisions: a transpose folded into its GEMMs only while its source is still intact."""

from __future__ import annotations

import numpy as np

import rlx
from rlx.ir.decisions import AbsorbedTranspose
from rlx.opt.lowering import lower_for
from rlx.opt.memplan import plan


def _widened_weight_linear() -> rlx.Graph:
    # x @ transpose(cast(w)): the cast's arena buffer dies at the transpose in the memory plan,
    # and the matmul's output reuses it; folding the transpose would read overwritten bytes.
    g = rlx.Graph("lin")
    x = g.input("x", [2, 6])
    w = g.cast(g.param("w", [4, 6], "bf16"), "f32")
    g.set_outputs([g.activation("relu", g.matmul(x, g.transpose(w, [1, 0])))])
    return g


def test_transpose_of_a_reused_arena_buffer_is_not_absorbed():
    planned = plan(_widened_weight_linear())
    assert planned.buffers[4].offset == planned.buffers[2].offset == 0  # the matmul writes over the cast
    lir = lower_for(planned, "cpu")
    assert not [d for d in lir.decisions if isinstance(d, AbsorbedTranspose)]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    w = rng.standard_normal((4, 6)).astype(rlx.ir.dtype.BFLOAT16)
    cg = rlx.Session().compile(_widened_weight_linear(), opt_level=0)
    cg.set_param("w", w)
    np.testing.assert_allclose(cg.run(x=x)[0], np.maximum(x @ w.astype(np.float32).T, 0), rtol=1e-5, atol=1e-6)


def test_transpose_of_a_param_is_still_absorbed():
    g = rlx.Graph("lin")
    g.set_outputs([g.matmul(g.input("x", [2, 6]), g.transpose(g.param("w", [4, 6]), [1, 0]))])
    lir = lower_for(plan(g), "cpu")
    assert [d for d in lir.decisions if isinstance(d, AbsorbedTranspose)]


# ── norms at a packed GEMM's store ───────────────────────────────────────────


def _linear_norm(k: int, n: int) -> rlx.Graph:
    from rlx.ir import ops as O

    g = rlx.Graph("linear_norm")
    x = g.input("x", [8, k])
    y = g.add(O.FusedMatMulBiasAct("relu"), [g.activation("tanh", x), g.param("w", [k, n]), g.param("b", [n])])
    out = g.add(O.FusedResidualLayerNorm(1e-5), [y, g.input("r", [8, n]), g.param("g", [n]), g.param("be", [n])])
    g.set_outputs([g.activation("relu", out)])
    return g


def test_norm_after_a_packed_gemm_runs_at_its_store():
    from rlx.ir.decisions import NormInPgemm

    lir = lower_for(plan(_linear_norm(48, 16), hold_gemm_inputs=True), "cpu")
    (d,) = lir.decided(NormInPgemm)
    assert lir.graph.node(d.gemm).kind == "fused_matmul_bias_act"
    assert lir.graph.node(d.norm).kind == "fused_residual_layer_norm"
    assert "at the store of" in d.describe()


def test_norm_output_over_rows_of_the_gemm_input_is_not_fused():
    """Without the plan's hold the norm's output takes the bytes of the GEMM's A (tanh's output, 48 floats a row
    against the norm's 16): row block b's norm would write over rows of A another block still reads."""
    from rlx.ir.decisions import NormInPgemm

    loose = plan(_linear_norm(48, 16))
    tanh = next(n.id for n in loose.graph.nodes if n.kind == "activation" and n.op.fn == "tanh")
    norm = next(n.id for n in loose.graph.nodes if n.kind == "fused_residual_layer_norm")
    assert loose.buffers[norm].storage == "arena" and loose.buffers[norm].offset == loose.buffers[tanh].offset
    assert not lower_for(loose, "cpu").decided(NormInPgemm)
    # the same rows of a buffer (A as wide as the norm's rows): safe, fused
    same = plan(_linear_norm(16, 16))
    assert same.buffers[norm].offset == same.buffers[tanh].offset
    assert lower_for(same, "cpu").decided(NormInPgemm)

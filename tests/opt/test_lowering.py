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

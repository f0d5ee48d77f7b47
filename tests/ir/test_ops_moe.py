"""The MoE ops' shape rules and reference meaning (`rlx/ir/ops_moe.py`, `rlx/reference.py`).

The reference router is checked against torch (`softmax`, `topk`, the renormalization transformers'
Mixtral / Qwen3-MoE routers apply) on random shapes; the expert matmul against a loop over pairs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.errors import ShapeError
from rlx.ir.quant import row_bytes
from rlx.reference import moe_expert_matmul, moe_gate_weights, moe_topk_ids
from rlx.reference import run as reference_run

torch = pytest.importorskip("torch")


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 9), experts=st.integers(1, 70), data=st.data(), normalize=st.booleans(),
       seed=st.integers(0, 2**31))
def test_router_equals_torch(tokens, experts, data, normalize, seed):
    top_k = data.draw(st.integers(1, experts))
    logits = np.random.default_rng(seed).standard_normal((tokens, experts)).astype(np.float32) * 3
    probs = torch.softmax(torch.from_numpy(logits), dim=-1)
    value, index = torch.topk(probs, top_k, dim=-1)
    if normalize:
        value = value / value.sum(dim=-1, keepdim=True)
    g = rlx.Graph("router")
    ids, weights = g.moe_router(g.input("logits", [tokens, experts]), top_k=top_k, normalize=normalize)
    g.set_outputs([ids, weights])
    got_ids, got_w = reference_run(g, {"logits": logits})
    np.testing.assert_array_equal(got_ids, index.numpy())
    np.testing.assert_allclose(got_w, value.numpy(), rtol=2e-6, atol=1e-7)


def test_topk_ties_and_nan():
    logits = np.array([[1.0, 3.0, 3.0, np.nan, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    assert moe_topk_ids(logits, 3).tolist() == [[3, 1, 2], [0, 1, 2]]
    w = moe_gate_weights(logits[1:], moe_topk_ids(logits[1:], 2), normalize=True)
    np.testing.assert_allclose(w, [[0.5, 0.5]])


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 6), experts=st.integers(1, 5), n=st.integers(1, 7), k=st.integers(1, 9),
       per_pair=st.booleans(), seed=st.integers(0, 2**31))
def test_expert_matmul_is_a_loop_over_pairs(tokens, experts, n, k, per_pair, seed):
    rng = np.random.default_rng(seed)
    top_k = int(rng.integers(1, experts + 1))
    ids = rng.integers(0, experts, size=(tokens, top_k))
    w = rng.standard_normal((experts, n, k))
    x = rng.standard_normal((tokens, top_k, k) if per_pair else (tokens, k))
    want = np.zeros((tokens, top_k, n))
    for t in range(tokens):
        for s in range(top_k):
            want[t, s] = w[ids[t, s]] @ (x[t, s] if per_pair else x[t])
    np.testing.assert_allclose(moe_expert_matmul(x, ids, w), want, rtol=1e-12, atol=1e-12)


def test_shape_inference_and_errors():
    g = rlx.Graph("shapes")
    t = rlx.Dim.dynamic("t", 8)
    logits = g.input("logits", [t, 4])
    x = g.input("x", [t, 64])
    ids, w = g.moe_router(logits, top_k=2, normalize=False)
    assert str(g.shape(ids)) == "i32[t,2]" and str(g.shape(w)) == "f32[t,2]"
    y = g.moe_matmul(x, ids, g.param("w", [4, 10, 64], "f16"))
    assert str(g.shape(y)) == "f32[t,2,10]"
    yq = g.moe_matmul(x, ids, g.param("wq", [4, 10, row_bytes("q4_0", 64)], "u8"), quant="q4_0")
    assert str(g.shape(yq)) == "f32[t,2,10]"
    with pytest.raises(ShapeError, match="top_k=5 is more than the 4 experts"):
        g.moe_router(logits, top_k=5, normalize=True)
    with pytest.raises(ShapeError, match="top_k must be an int >= 1"):
        g.moe_router(logits, top_k=0, normalize=True)
    with pytest.raises(ShapeError, match=r"must be \[experts, N, 64\]"):
        g.moe_matmul(x, ids, g.param("bad_k", [4, 10, 32]))
    with pytest.raises(ShapeError, match=r"u8\[experts, N, 36\]"):
        g.moe_matmul(x, ids, g.param("bad_rb", [4, 10, 40], "u8"), quant="q4_0")
    with pytest.raises(ShapeError, match="ids must be i32"):
        g.moe_matmul(x, w, g.param("w2", [4, 10, 64]))
    with pytest.raises(ShapeError, match="does not match ids"):
        g.moe_matmul(g.input("x3", [t, 3, 64]), ids, g.param("w3", [4, 10, 64]))
    with pytest.raises(ShapeError, match="unknown quantization"):
        g.moe_matmul(x, ids, g.param("w4", [4, 10, 36], "u8"), quant="q3_x")

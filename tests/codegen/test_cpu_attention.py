"""CPU backend parity for the transformer blocks: fused attention (every mask kind, grouped-query,
decode with Sq=1, dynamic lengths from one build) and rotary embeddings.

Tolerance for attention: scores are f32 dot products of length D (error <= (D+2) u |q||k|), exp
is <= 2 ulp, the softmax sum is double and the weighted sum of V is another f32 accumulation
over Skv terms of a convex combination. With unit-normal inputs, D <= 32 and Skv <= 80 that
stays well below 2e-6 absolute on outputs of magnitude ~1; we allow rtol 1e-5 + atol 2e-6.
Rope is two products and a sum per element: rtol 4 ulp + atol 1e-7.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import check, compile_graph, cpu_flags

import rlx
from rlx.ir.decisions import AttentionPlan

ATTN_TOL = {"rtol": 1e-5, "atol": 2e-6}


def _qkv(rng, b, sq, skv, h, hkv, d):
    return {"q": rng.standard_normal((b, sq, h * d)).astype(np.float32),
            "k": rng.standard_normal((b, skv, hkv * d)).astype(np.float32),
            "v": rng.standard_normal((b, skv, hkv * d)).astype(np.float32)}


@pytest.mark.parametrize("mask", ["none", "causal", "padding", "bias"])
def test_attention_masks(rng, mask):
    b, sq, skv, h, d = 2, 70, 70, 4, 16  # 70 rows: a full query block of 64 and a partial one
    g = rlx.Graph(f"attn_{mask}")
    q = g.input("q", [b, sq, h * d])
    k = g.input("k", [b, skv, h * d])
    v = g.input("v", [b, skv, h * d])
    feed = _qkv(rng, b, sq, skv, h, h, d)
    m = None
    if mask == "padding":
        m = g.input("m", [b, skv], "i32")
        mv = np.ones((b, skv), np.int32)
        mv[0, 50:] = 0
        mv[1, :] = 0  # a fully padded sequence: its rows must be zeros, not NaN
        feed["m"] = mv
    elif mask == "bias":
        m = g.input("m", [1, h, sq, skv])
        bias = rng.standard_normal((1, h, sq, skv)).astype(np.float32)
        bias[0, 0, 3, :] = -np.inf
        feed["m"] = bias
    g.set_outputs([g.attention(q, k, v, num_heads=h, head_dim=d, mask=mask, mask_input=m)])
    got = check(g, feed, **ATTN_TOL)
    assert np.all(np.isfinite(got[0]))


def test_attention_padding_rows_that_keep_every_key(rng):
    """A batch row whose padding mask keeps every key skips the mask in its softmax: the same outputs, bit for bit,
    as the unmasked attention of that row; rows with dropped keys still drop them (against the reference)."""
    b, s, h, d = 3, 70, 4, 16
    feed = _qkv(rng, b, s, s, h, h, d)
    mv = np.ones((b, s), np.int32)
    mv[1, 40:] = 0
    mv[2, 1:] = 0  # one key left
    feed["m"] = mv
    outs = {}
    for mask in ("padding", "none"):
        g = rlx.Graph(f"attn_keep_{mask}")
        q, k, v = (g.input(n, [b, s, h * d]) for n in "qkv")
        m = g.input("m", [b, s], "i32") if mask == "padding" else None
        g.set_outputs([g.attention(q, k, v, num_heads=h, head_dim=d, mask=mask, mask_input=m)])
        outs[mask] = check(g, feed if m is not None else {n: feed[n] for n in "qkv"}, **ATTN_TOL)[0]
    assert np.array_equal(outs["padding"][0], outs["none"][0])
    assert not np.allclose(outs["padding"][1:], outs["none"][1:], **ATTN_TOL)


def test_attention_softmax_extremes(rng):
    """The softmax's exp at the ends of its range (the vector rows: 16 lanes on AVX-512, 8 on AVX2,
    21 keys leaving a tail): scores far below the row's max underflow to 0 (exp argument < -104),
    one dominant key takes all the weight, and rows spread over the whole range."""
    b, s, h, d = 1, 21, 2, 16
    g = rlx.Graph("attn_extremes")
    q = g.input("q", [b, s, h * d])
    k = g.input("k", [b, s, h * d])
    v = g.input("v", [b, s, h * d])
    m = g.input("m", [1, h, s, s])
    g.set_outputs([g.attention(q, k, v, num_heads=h, head_dim=d, mask="bias", mask_input=m)])
    feed = _qkv(rng, b, s, s, h, h, d)
    bias = rng.standard_normal((1, h, s, s)).astype(np.float32)
    bias[0, 0, :, ::3] = -1e4  # exp(-1e4 - max): far past the underflow bound
    bias[0, 1, 5, 17] = 300.0  # one key dominates its row: every other weight underflows
    bias[0, 1, 7, :] = rng.uniform(-150.0, 0.0, s).astype(np.float32)  # weights across the whole range
    feed["m"] = bias
    check(g, feed, **ATTN_TOL)


def test_attention_gqa_decode_and_bias_broadcast(rng):
    """Grouped-query (8 heads over 2 kv heads), Sq=1 against a long cache, a [Skv] bias row."""
    b, sq, skv, h, hkv, d = 2, 1, 80, 8, 2, 32
    g = rlx.Graph("attn_gqa")
    q = g.input("q", [b, sq, h * d])
    k = g.input("k", [b, skv, hkv * d])
    v = g.input("v", [b, skv, hkv * d])
    m = g.input("m", [skv])
    causal = g.attention(q, k, v, num_heads=h, head_dim=d, mask="causal", num_kv_heads=hkv)
    biased = g.attention(q, k, v, num_heads=h, head_dim=d, mask="bias", mask_input=m, num_kv_heads=hkv, scale=0.3)
    g.set_outputs([causal, biased])
    feed = _qkv(rng, b, sq, skv, h, hkv, d)
    feed["m"] = rng.standard_normal(skv).astype(np.float32)
    check(g, feed, **ATTN_TOL)


def test_attention_dynamic_lengths_one_build(rng):
    """Prefill and decode shapes from the same library: Sq and Skv are independent symbols."""
    sq = rlx.Dim.dynamic("sq", max=40)
    skv = rlx.Dim.dynamic("skv", max=48)
    h, d = 2, 8
    g = rlx.Graph("attn_dyn")
    q = g.input("q", [1, sq, h * d])
    k = g.input("k", [1, skv, h * d])
    v = g.input("v", [1, skv, h * d])
    g.set_outputs([g.attention(q, k, v, num_heads=h, head_dim=d, mask="causal")])
    cg = compile_graph(g)
    for s_q, s_kv in ((40, 40), (1, 48), (5, 20), (33, 33)):
        check(g, _qkv(rng, 1, s_q, s_kv, h, h, d), cg=cg, **ATTN_TOL)


@pytest.mark.parametrize(("b", "sq", "skv", "h", "hkv", "d", "mask"),
                         [(1, 16, 16, 12, 12, 32, "padding"), (3, 13, 13, 4, 4, 32, "padding"),
                          (2, 45, 45, 2, 2, 64, "none"), (1, 1, 1, 2, 2, 32, "none"),
                          (2, 129, 129, 2, 1, 32, "padding"), (2, 7, 70, 4, 2, 32, "none")])
def test_attention_rows_form(rng, b, sq, skv, h, hkv, d, mask):
    """Heads of a multiple of 32 with no mask or a padding mask: the LIR's AttentionPlan is rows where the target has
    AVX-512 (blocks elsewhere); either way the reference's values, over odd lengths, batch 1, one query row against
    one key, grouped-query heads, rows with keys dropped and a fully padded row."""
    g = rlx.Graph("attn_rows")
    q = g.input("q", [b, sq, h * d])
    k = g.input("k", [b, skv, hkv * d])
    v = g.input("v", [b, skv, hkv * d])
    feed = _qkv(rng, b, sq, skv, h, hkv, d)
    m = None
    if mask == "padding":
        m = g.input("m", [b, skv], "i32")
        mv = np.ones((b, skv), np.int32)
        if b > 1:
            mv[0, skv // 2:] = 0
            mv[-1, :] = 0  # a fully padded sequence: zeros
        feed["m"] = mv
    g.set_outputs([g.attention(q, k, v, num_heads=h, head_dim=d, mask=mask, mask_input=m, num_kv_heads=hkv)])
    cg = compile_graph(g)
    (plan,) = cg.lir.decided(AttentionPlan)
    assert plan.form == ("rows" if "avx512f" in cpu_flags() else "blocks")
    got = check(g, feed, cg=cg, **ATTN_TOL)
    if mask == "padding" and b > 1:
        assert np.all(got[0][-1] == 0.0)


@pytest.mark.parametrize("variant", ["neox", "interleaved"])
def test_rope(rng, variant):
    seq = rlx.Dim.dynamic("seq", max=16)
    g = rlx.Graph(f"rope_{variant}")
    x = g.input("x", [2, seq, 3 * 8])
    cos = g.input("cos", [seq, 3])
    sin = g.input("sin", [seq, 3])
    xf = g.input("xf", [2, seq, 2 * 8])
    cf = g.input("cf", [seq, 4])
    sf = g.input("sf", [seq, 4])
    partial = g.rope(x, cos, sin, head_dim=8, n_rot=6, variant=variant)  # last 2 dims of each head pass through
    full = g.rope(xf, cf, sf, head_dim=8, variant=variant)
    g.set_outputs([partial, full])
    cg = compile_graph(g)
    for s in (1, 16):
        ang = rng.uniform(0, 6.3, (s, 4))
        feed = {"x": rng.standard_normal((2, s, 24)).astype(np.float32),
                "cos": np.cos(ang[:, :3]).astype(np.float32), "sin": np.sin(ang[:, :3]).astype(np.float32),
                "xf": rng.standard_normal((2, s, 16)).astype(np.float32),
                "cf": np.cos(ang).astype(np.float32), "sf": np.sin(ang).astype(np.float32)}
        check(g, feed, cg=cg, rtol=5e-7, atol=1e-7)

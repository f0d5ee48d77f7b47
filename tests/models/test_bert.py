"""The BERT graph on a tiny random-weight config: structure, semantics, optimizer, compiled CPU graph."""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.errors import ExecutionError, IRError
from rlx.models import bert as B
from rlx.opt.pipeline import optimize

CFG = B.BertConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                   max_position_embeddings=40)
W = B.random_weights(CFG, seed=7)


def _batch(rng, lengths, seq=None):
    """Token ids [CLS] x.. [SEP] per length, right-padded with 0, and the mask."""
    seq = seq or max(lengths)
    ids = np.zeros((len(lengths), seq), np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = np.concatenate([[2], rng.integers(4, CFG.vocab_size, n - 2), [3]])
        mask[i, :n] = 1
    return ids, mask


def numpy_bert(ids, mask, w=W, cfg=CFG):
    """BERT written directly in numpy (float64), independent of the graph builder."""
    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg.layer_norm_eps) * w[p + ".weight"] + w[p + ".bias"]

    def lin(x, p):
        return x @ w[p + ".weight"].astype(np.float64).T + w[p + ".bias"]

    from math import erf, sqrt
    gelu = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / sqrt(2))))
    b, s = ids.shape
    nh, hd = cfg.num_heads, cfg.head_dim
    x = (w["embeddings.word_embeddings.weight"][ids].astype(np.float64)
         + w["embeddings.position_embeddings.weight"][:s] + w["embeddings.token_type_embeddings.weight"][0])
    x = ln(x, "embeddings.LayerNorm")
    for i in range(cfg.num_layers):
        p = f"encoder.layer.{i}."
        q, k, v = (lin(x, p + f"attention.self.{n}").reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
                   for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        scores = np.where(mask[:, None, None, :] != 0, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, -1)
        x = ln(lin(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        x = ln(lin(gelu(lin(x, p + "intermediate.dense")), p + "output.dense") + x, p + "output.LayerNorm")
    pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    return x, pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def test_graph_structure():
    g = B.build_bert(CFG, max_batch=8, max_seq=32)
    kinds = [n.kind for n in g.nodes]
    assert kinds.count("attention") == CFG.num_layers
    assert kinds.count("layer_norm") == 2 * CFG.num_layers + 1
    assert kinds.count("matmul") == 6 * CFG.num_layers + 1  # + the masked-mean pooling product
    assert {n.op.name for n in g.params()} == set(CFG.param_shapes())
    assert g.symbols() == {"batch": 8, "seq": 32}
    assert g.output_names == ["embeddings"]
    hir = B.bert_hir(CFG, max_batch=8, max_seq=32)
    assert sum(n.kind == "hir.linear" for n in hir.nodes) == 6 * CFG.num_layers


def test_optimizer_fuses_bert_patterns():
    g = optimize(B.build_bert(CFG, max_batch=8, max_seq=32), 2)
    kinds = [n.kind for n in g.nodes]
    assert kinds.count("fused_matmul_bias_act") == 6 * CFG.num_layers
    assert sum(n.kind == "fused_matmul_bias_act" and n.op.activation == "gelu" for n in g.nodes) == CFG.num_layers
    assert kinds.count("fused_residual_layer_norm") == 2 * CFG.num_layers
    assert "transpose" not in kinds  # HF [out, in] weights became pre-transposed params


def test_reference_matches_independent_numpy(rng):
    ids, mask = _batch(rng, [7, 4, 9])
    feed = B.bert_inputs(ids, mask)
    tokens = reference.run(B.build_bert(CFG, max_batch=4, max_seq=16, output="tokens"), feed, W)[0]
    pooled = reference.run(B.build_bert(CFG, max_batch=4, max_seq=16), feed, W)[0]
    want_tokens, want_pooled = numpy_bert(ids, mask)
    valid = mask.astype(bool)  # padded positions' hidden states are never used; compare real tokens
    # The reference rounds to f32 after every op; hidden states reach |x| ~ 3 (f32 ulp 2.4e-7):
    # allow ~8 ulp of accumulated rounding over the two layers.
    np.testing.assert_allclose(tokens[valid], want_tokens[valid], atol=2e-6)
    np.testing.assert_allclose(pooled, want_pooled, atol=5e-7)


def test_optimized_graph_matches_reference(rng):
    ids, mask = _batch(rng, [5, 8])
    g = B.build_bert(CFG, max_batch=4, max_seq=16)
    feed = B.bert_inputs(ids, mask)
    np.testing.assert_allclose(reference.run(optimize(g, 2), feed, W)[0], reference.run(g, feed, W)[0], atol=1e-6)


def test_padding_does_not_change_embeddings(rng):
    g = B.build_bert(CFG, max_batch=4, max_seq=16)
    ids, mask = _batch(rng, [9, 3, 6])
    together = reference.run(g, B.bert_inputs(ids, mask), W)[0]
    for i, n in enumerate([9, 3, 6]):
        alone = reference.run(g, B.bert_inputs(ids[i:i + 1, :n], mask[i:i + 1, :n]), W)[0]
        np.testing.assert_allclose(together[i], alone[0], atol=1e-6)


def test_token_types_input():
    g0 = B.build_bert(CFG, max_batch=2, max_seq=8)
    gt = B.build_bert(CFG, max_batch=2, max_seq=8, token_types=True)
    ids = np.array([[2, 10, 11, 3, 12, 3]])
    mask = np.ones_like(ids)
    base = reference.run(g0, B.bert_inputs(ids, mask), W)[0]
    zeros = reference.run(gt, B.bert_inputs(ids, mask, np.zeros_like(ids)), W)[0]
    np.testing.assert_allclose(zeros, base, atol=1e-7)
    pair = reference.run(gt, B.bert_inputs(ids, mask, np.array([[0, 0, 0, 0, 1, 1]])), W)[0]
    assert np.abs(pair - base).max() > 1e-3


def test_cls_pooling_and_unnormalized():
    ids = np.array([[2, 10, 11, 3], [2, 13, 3, 0]])
    mask = (ids != 0).astype(np.int64)
    feed = B.bert_inputs(ids, mask)
    tokens = reference.run(B.build_bert(CFG, max_batch=2, max_seq=8, output="tokens"), feed, W)[0]
    cls = reference.run(B.build_bert(CFG, max_batch=2, max_seq=8, pooling="cls", normalize=False), feed, W)[0]
    np.testing.assert_allclose(cls, tokens[:, 0], atol=1e-7)
    mean = reference.run(B.build_bert(CFG, max_batch=2, max_seq=8, normalize=False), feed, W)[0]
    np.testing.assert_allclose(mean[1], tokens[1, :3].mean(0), atol=1e-6)


def test_any_config_and_activation():
    cfg = B.BertConfig(vocab_size=30, hidden_size=24, num_layers=1, num_heads=3, intermediate_size=40,
                       max_position_embeddings=10, type_vocab_size=1, layer_norm_eps=1e-5, hidden_act="gelu_new")
    g = B.build_bert(cfg, max_batch=2, max_seq=10)
    assert any(n.kind == "activation" and n.op.fn == "gelu_tanh" for n in g.nodes)
    out = reference.run(g, B.bert_inputs(np.array([[1, 2, 3]]), np.ones((1, 3))), B.random_weights(cfg))[0]
    assert out.shape == (1, 24)


def test_build_errors():
    with pytest.raises(IRError, match=r"max_seq must be an int in \[1, 40\]"):
        B.build_bert(CFG, max_batch=2, max_seq=41)
    with pytest.raises(IRError, match="unknown BERT output"):
        B.build_bert(CFG, max_batch=2, max_seq=8, output="logits")
    with pytest.raises(IRError, match="unsupported pooling"):
        B.build_bert(CFG, max_batch=2, max_seq=8, pooling="max")
    with pytest.raises(IRError, match="upper bound"):
        B.build_bert(CFG, max_batch=0, max_seq=8)


def test_reference_rejects_sequence_over_bound():
    g = B.build_bert(CFG, max_batch=2, max_seq=8)
    ids = np.ones((1, 9), np.int64)
    with pytest.raises(ExecutionError, match="seq=9 exceeds its bound 8"):
        reference.run(g, B.bert_inputs(ids, ids), W)


def test_torch_forward_matches_reference(rng):
    pytest.importorskip("torch")
    from rlx.models.torch_bert import TorchBert

    ids, mask = _batch(rng, [6, 9, 4])
    want = reference.run(B.build_bert(CFG, max_batch=4, max_seq=16), B.bert_inputs(ids, mask), W)[0]
    got = TorchBert(CFG, W).embed(ids, mask).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_torch_sdpa_attention_matches_reference(rng):
    """The benchmark's SDPA peers compute the same function: with the mask, and unmasked on an unpadded batch."""
    torch = pytest.importorskip("torch")
    from rlx.models.torch_bert import TorchBert

    tb = TorchBert(CFG, W)
    ids, mask = _batch(rng, [6, 9, 4])
    want = reference.run(B.build_bert(CFG, max_batch=4, max_seq=16), B.bert_inputs(ids, mask), W)[0]
    t_ids, t_mask = torch.as_tensor(ids), torch.as_tensor(mask)
    with torch.inference_mode():
        np.testing.assert_allclose(tb.forward(t_ids, t_mask, attention="sdpa").numpy(), want, atol=1e-5)
        full = np.ones_like(mask)
        want_full = reference.run(B.build_bert(CFG, max_batch=4, max_seq=16), B.bert_inputs(ids, full), W)[0]
        got = tb.forward(t_ids, torch.as_tensor(full), attention="sdpa_unmasked").numpy()
    np.testing.assert_allclose(got, want_full, atol=1e-5)
    with pytest.raises(ValueError, match="attention must be"):
        tb.forward(t_ids, t_mask, attention="flash")


def test_flops_count():
    h, f = CFG.hidden_size, CFG.intermediate_size
    assert CFG.flops(1, 1) == CFG.num_layers * (2 * h * (4 * h + 2 * f) + 4 * h)

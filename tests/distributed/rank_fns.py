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


def decoder_rank_fed(rank, sharded, prompt, n_new):
    """One rank of a tensor-parallel decoder stepping with device-side token feedback (each step's token taken from
    the slot the step before stored it in): whether it has the feedback, and its greedy tokens."""
    lm = sharded.load(rank, threads=1)
    cache = lm.new_cache()
    slots = np.zeros(1, np.int32)
    chunk = lm.prefill_chunk
    for start in range(0, len(prompt) - chunk, chunk):  # the prompt in chunks; the last one's token stored
        lm.step(np.array([prompt[start:start + chunk]]), cache, [chunk - 1])
    last = prompt[(len(prompt) - 1) // chunk * chunk:]
    tokens = [int(lm.step_greedy(np.array([last]), cache, [len(last) - 1], token_dst=slots)[0])]
    for _ in range(n_new - 1):
        step = lm.launch_greedy(np.zeros((1, 1), np.int32), cache, [0], token_src=slots, token_dst=slots)
        tokens.append(int(step.result()[0]))
    return lm.token_feedback, tokens


def cuda_decoder_rank_generate(rank, sharded, config, tensors, options, prompt, n_new):
    """One GPU rank (tp=1 when `sharded` is None): `generate`'s greedy tokens (on CUDA each step launched before
    the one before is taken: `launch_ahead`), and whether the model launches ahead."""
    from rlx.models.causal_lm import CausalLM

    lm = CausalLM(config, tensors, device="cuda", **options) if sharded is None else sharded.load(rank, device="cuda")
    return lm.generate(prompt, n_new).token_ids, lm.launch_ahead and lm.token_feedback


def encoder_rank(rank, sharded, feed):
    """One rank of a tensor-parallel BERT encoder: its (whole) output."""
    return sharded.load(rank, num_threads=1).run(feed)[0]


def stuck_on_rank_one(rank) -> list[float]:
    if rank.rank == 1:
        import time

        time.sleep(60)  # neither fails nor reaches the collective
    return compiled_sum(rank)


def cuda_decoder_rank_path(rank, sharded, config, options, prompt, n_new):
    """`cuda_decoder_rank` of a sharded decoder, with how its small all-reduces ran ("p2p" or "nccl") and the
    launches of the reduces that make sums over the clique (rlx_dgemv_reduce_ar, AllReduceP2P.gemv) in its source."""
    from rlx.runtime.nccl import all_reduce_path

    lm = sharded.load(rank, device="cuda")
    tokens, logits = _greedy(lm, prompt, n_new)
    launches = (lm._compiled.source or "").count("rlx_launch_pdl(c->pdl, rlx_dgemv_reduce_ar<")
    return tokens, logits, all_reduce_path(lm._compiled), launches


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

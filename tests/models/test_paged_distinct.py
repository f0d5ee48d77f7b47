"""`KvCache.distinct` (the paged decoder's `rows_distinct` hint, `ops.CachedAttention`'s 8th input): a step of
distinct sequences computes the same with and without it (the reference and the CPU read no value of it; CUDA's
kernels are checked in tests/gpu/test_cuda_paged.py), and a step whose rows are one sequence's tokens is refused
with the hint rather than computed wrong."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.errors import ExecutionError
from rlx.models.causal_lm import CausalLM, KvCache, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import ROWS_DISTINCT, random_specs

CONFIG = DecoderConfig(arch="llama", vocab_size=96, hidden_size=48, num_layers=2, num_heads=6, num_kv_heads=2,
                       head_dim=8, ffn_size=64, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=8, context_length=64, tie_embeddings=True, bos_id=1, eos_id=-1)
TENSORS = random_tensors(random_specs(CONFIG), seed=5, scale=2.0)


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    return CausalLM(CONFIG, TENSORS, max_context=32, max_batch=4, prefill_chunk=1, kv_pages=16, page_size=8)


def _steps(lm: CausalLM, distinct: bool) -> np.ndarray:
    base = lm.new_cache()
    tables = np.arange(16, dtype=np.int32).reshape(4, 4)[[0, 1, 2, 2]]  # the last row repeats the third
    positions = np.array([0, 5, 9, 9], np.int32)
    tokens = np.array([[7], [30], [51], [51]])
    return np.stack([lm.step(tokens, KvCache(base.arrays, positions + s, 32, block_table=tables, distinct=distinct),
                             np.arange(4)) for s in range(3)])


def test_a_step_of_distinct_sequences_is_the_same_with_the_hint(lm: CausalLM) -> None:
    assert ROWS_DISTINCT in {n.op.name for n in lm.graph.inputs()}
    np.testing.assert_array_equal(_steps(lm, True), _steps(lm, False))


def test_one_sequence_s_tokens_with_the_hint_are_refused(lm: CausalLM) -> None:
    cache = lm.new_cache()
    table = np.zeros((2, 4), np.int32)  # one sequence, its tokens 3 and 4 in one step
    with pytest.raises(ExecutionError, match="rows 0 and 1 write into page 0 at positions 3 and 4"):
        lm.step(np.array([[5], [6]]), KvCache(cache.arrays, np.array([3, 4], np.int32), 32, block_table=table,
                                              distinct=True), [0, 1])
    with pytest.raises(ExecutionError, match="rows 0 and 1 write into page 0 at positions 3 and 3"):
        # the same position of one sequence with two different tokens: two values for one cache row
        lm.step(np.array([[5], [6]]), KvCache(cache.arrays, np.array([3, 3], np.int32), 32, block_table=table,
                                              distinct=True), [0, 1])
    # the same rows without the hint run (the append first: each row reads what the other stored)
    out = lm.step(np.array([[5], [6]]), KvCache(cache.arrays, np.array([3, 4], np.int32), 32, block_table=table),
                  [0, 1])
    assert out.shape == (2, CONFIG.vocab_size) and np.isfinite(out).all()

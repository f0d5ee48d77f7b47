"""The paged KV cache on a GPU (run by the lead on the device): a paged CausalLM on CUDA generates what the
contiguous one generates, and the serving engine over a CUDA `PagedRunner` (decode rows and prefill tokens in one
step, pages shared by a repeated prefix) generates what it generates on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.models.causal_lm import CausalLM
from rlx.toolchain.cuda import visible_gpu_arch
from tests.gpu.decoder_common import TINY_LLAMA, tiny_llama_tensors

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

CONFIG = TINY_LLAMA
TENSORS = tiny_llama_tensors()


@pytest.mark.parametrize("kv_dtype", [None, "f8e4m3fn"])
def test_paged_causal_lm_on_cuda_generates_what_the_contiguous_one_does(kv_dtype: str | None) -> None:
    # the default block table of a paged cache: row b's pages b*per..: the contiguous rows, through pages (an
    # f8e4m3fn pool too: the paged append rounds and saturates as the contiguous kernels do)
    paged = CausalLM(CONFIG, TENSORS, device="cuda", max_context=96, max_batch=2, prefill_chunk=16, kv_pages=12,
                     page_size=16, kv_dtype=kv_dtype)
    flat = CausalLM(CONFIG, TENSORS, device="cuda", max_context=96, max_batch=2, prefill_chunk=16, kv_dtype=kv_dtype)
    prompts = [[5, 17, 33, 8], list(range(10, 31))]
    assert [g.token_ids for g in paged.generate_batch(prompts, 40)] == \
        [g.token_ids for g in flat.generate_batch(prompts, 40)]


def test_engine_over_a_cuda_paged_runner_matches_the_cpu_and_frees_its_pages() -> None:
    """Greedy requests alone on the CUDA engine give the CPU paged engine's tokens (batch invariance on CUDA is
    not claimed: the attention's split count follows the step's row count); together they all finish, the
    repeated prefix is shared, and no page stays held."""
    from rlx.serving.engine import Engine, SamplingParams
    from rlx.serving.runner import PagedRunner

    rng = np.random.default_rng(0)
    system = rng.integers(0, 96, 33).tolist()  # two full pages shared through the prefix cache
    prompts = [system + rng.integers(0, 96, int(rng.integers(1, 20))).tolist() for _ in range(8)]
    params = SamplingParams(max_tokens=20)
    runners = [PagedRunner.build(CONFIG, TENSORS, device=d, slots=8, max_context=96, page_size=16)
               for d in ("cuda", "cpu")]
    # steps of 1-4 rows, then multiples of 8 up to 256 and of 64 up to CUDA_STEP_ROWS = 1024 (padded by repeating
    # the last row), captured before any request
    assert runners[0].max_rows == 1024 and runners[1].max_rows == 16
    # (and again with the distinct-rows hint up to a row a slot: 1-4 and 8)
    assert runners[0].capture_steps() == 4 + 256 // 8 + (1024 - 256) // 64 + 5 and runners[1].capture_steps() == 0
    engines = [Engine(r, prefix_cache_bytes=1 << 20) for r in runners]
    gpu, cpu = ([e.generate(p, params).token_ids for p in prompts] for e in engines)
    assert gpu == cpu
    engine = engines[0]
    requests = [engine.submit(p, params) for p in prompts]
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    assert all(r._seq.finish_reason == "length" and len(r._seq.generated) == 20 for r in requests)
    assert engine.prefix.hits >= 32 * 7
    assert engine.kv.used_pages == 0


def test_deterministic_cuda_runner_gives_each_request_its_tokens_alone() -> None:
    """`deterministic=True` (`rlxc serve --device cuda --deterministic`): every row is a call of its own, so 8
    greedy requests together, prefill chunks beside decode rows, get token for token what each gets alone."""
    from rlx.serving.engine import Engine, SamplingParams
    from rlx.serving.runner import PagedRunner

    runner = PagedRunner.build(CONFIG, TENSORS, device="cuda", slots=8, max_context=96, page_size=16,
                               deterministic=True)
    assert runner.call_rows == 1
    engine = Engine(runner)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 96, int(rng.integers(2, 30))).tolist() for _ in range(8)]
    params = SamplingParams(max_tokens=24)
    alone = [engine.generate(p, params).token_ids for p in prompts]
    requests = [engine.submit(p, params) for p in prompts]
    while any(r._seq.finish_reason is None for r in requests):
        engine.step()
    assert [list(r._seq.generated) for r in requests] == alone
    assert engine.kv.used_pages == 0


def test_distinct_rows_hint_stores_the_same_keys_without_the_append_launch() -> None:
    """Paged steps of distinct sequences (plus a padding row repeating the last) with the distinct-rows hint
    (`KvCache.distinct`: rlx_kv_decode stores each row's keys, no append launch) give the logits the steps without
    it give, bit for bit, over three steps (each reading the keys the steps before stored)."""
    from rlx.models.causal_lm import KvCache

    lm = CausalLM(CONFIG, TENSORS, device="cuda", max_context=96, max_batch=8, prefill_chunk=1, kv_pages=40,
                  page_size=16)
    rng = np.random.default_rng(3)
    tables = rng.permutation(40)[:36].reshape(6, 6).astype(np.int32)
    slots = np.array([0, 1, 2, 3, 4, 5, 5], np.int64)  # the last row again, as a CUDA runner pads
    positions = np.array([3, 17, 40, 0, 63, 9, 9], np.int32)
    tokens = rng.integers(0, CONFIG.vocab_size, (3, 7, 1))
    tokens[:, 6] = tokens[:, 5]
    logits = {}
    for distinct in (False, True):
        base = lm.new_cache()
        logits[distinct] = np.stack([
            lm.step(tokens[step], KvCache(base.arrays, positions + step, 96, block_table=tables[slots],
                                          distinct=distinct), np.arange(7))
            for step in range(3)])
    np.testing.assert_array_equal(logits[True], logits[False])

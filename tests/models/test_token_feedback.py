"""Device-side token feedback in the decoder graph (`build_decoder(token_feedback=True)`, `rlx.ir.ops_feedback`):
with every `token_src` / `token_dst` -1 a step computes what the graph without feedback computes; a step fed from
the `last_tokens` state the last step stored its ids in generates what host-fed steps generate (reference, CPU,
contiguous and paged caches); a prefill chunk's source replaces its last token; bad slots are refused. The CUDA
kernels compile in tests/codegen/test_cuda_feedback.py and run in tests/gpu/test_cuda_feedback.py."""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.errors import ExecutionError
from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import FEEDBACK_STATE, build_decoder, decoder_params, random_specs, rope_tables

CONFIG = DecoderConfig(arch="llama", vocab_size=96, hidden_size=48, num_layers=2, num_heads=6, num_kv_heads=2,
                       head_dim=8, ffn_size=64, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=8, context_length=64, tie_embeddings=True, bos_id=1, eos_id=-1)
TENSORS = random_tensors(random_specs(CONFIG), seed=3, scale=2.0)
PROMPTS = np.array([[5, 17, 33, 8], [9, 10, 11, 12], [60, 2, 3, 4]], np.int32)


def test_all_minus_one_leaves_the_step_unchanged() -> None:
    specs = {name: spec for name, (spec, _) in TENSORS.items()}
    plain = build_decoder(CONFIG, specs, max_batch=3, max_seq=4, capacity=16)
    fed = build_decoder(CONFIG, specs, max_batch=3, max_seq=4, capacity=16, token_feedback=True)
    extra = {n.op.name for n in fed.inputs()} - {n.op.name for n in plain.inputs()}
    assert extra == {"token_src", "token_dst", FEEDBACK_STATE}
    kinds = [n.kind for n in fed.nodes]
    assert kinds.count("token_feed") == 1 and kinds.count("token_store") == 1
    params = decoder_params(TENSORS, plain)
    cos, sin = rope_tables(np.zeros(3, np.int64), 4, CONFIG)
    rows = np.array([3, 7, 11], np.int32)

    def feed(graph) -> dict:
        out = {"tokens": PROMPTS, "positions": np.zeros(3, np.int32), "rope_cos": cos, "rope_sin": sin, "rows": rows,
               "sample_u": np.zeros(3), "sample_settings": np.array([0.0, 1.0, 1.0])}
        for n in graph.inputs():
            if n.op.state:
                out[n.op.name] = np.zeros(n.shape.static_dims, n.shape.dtype.np)
        if graph is fed:
            out["token_src"], out["token_dst"] = np.full(3, -1, np.int32), np.full(3, -1, np.int32)
        return out

    f = feed(fed)
    want, got = reference.run(plain, feed(plain), params), reference.run(fed, f, params)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    assert not f[FEEDBACK_STATE].any()  # nothing stored


@pytest.mark.parametrize("device", ["reference", "cpu"])
@pytest.mark.parametrize("paged", [False, True])
def test_steps_fed_on_the_device_generate_what_host_fed_steps_do(device: str, paged: bool) -> None:
    kw = {"kv_pages": 16, "page_size": 8} if paged else {}  # row b's pages 4b..4b+3
    lm = CausalLM(CONFIG, TENSORS, device=device, max_context=32, max_batch=4, prefill_chunk=4, **kw)
    assert lm.token_feedback

    def run(feedback: bool) -> tuple[np.ndarray, np.ndarray]:
        cache = lm.new_cache()
        # row 0 stores into slot 2, row 1 into slot 0, row 2 into slot 3: the slots are names, not rows
        slots = np.array([2, 0, 3])
        ids = lm.step_greedy(PROMPTS, cache, [3, 7, 11], token_dst=slots if feedback else None)
        out = [ids]
        for _ in range(8):
            if feedback:  # the tokens column is ignored where a row has a source
                ids = lm.launch_greedy(np.zeros((3, 1), np.int32), cache, np.arange(3), token_src=slots,
                                       token_dst=slots).result()
            else:
                ids = lm.step_greedy(ids[:, None], cache, np.arange(3))
            out.append(ids)
        assert FEEDBACK_STATE not in cache.arrays  # (the layers' states only)
        return np.array(out), np.asarray(cache.tokens)

    (want, untouched), (got, state) = run(False), run(True)
    np.testing.assert_array_equal(got, want)
    assert not untouched.any() and state[[2, 0, 3]].tolist() == want[-1].tolist() and state[1] == 0
    assert len({tuple(r) for r in want.T.tolist()}) == 3  # the rows differ: a mixed-up source would show


def test_a_prefill_chunk_takes_its_source_as_its_last_token() -> None:
    lm = CausalLM(CONFIG, TENSORS, device="cpu", max_context=32, max_batch=3, prefill_chunk=4)
    cache = lm.new_cache()
    first = lm.step_greedy(PROMPTS[:, :1], cache, np.arange(3), token_dst=np.array([0, 1, 2]))
    chunk = np.concatenate([PROMPTS[:, 1:], np.zeros((3, 1), np.int32)], axis=1)  # its last column from the state
    got = lm.step_greedy(chunk, cache, [3, 7, 11], token_src=np.array([0, -1, 2]))
    ref = lm.new_cache()
    lm.step_greedy(PROMPTS[:, :1], ref, np.arange(3))
    real = chunk.copy()
    real[[0, 2], 3] = first[[0, 2]]
    np.testing.assert_array_equal(got, lm.step_greedy(real, ref, [3, 7, 11]))


@pytest.mark.parametrize(("kw", "match"), [({"token_src": [0, 1]}, "token_src must be 3 slot numbers"),
                                           ({"token_dst": [0, 4, 1]}, "token_dst must be 3 slot numbers"),
                                           ({"token_src": [-2, 0, 0]}, "token_src must be 3 slot numbers")])
def test_bad_slots_are_refused(kw: dict, match: str) -> None:
    lm = CausalLM(CONFIG, TENSORS, device="reference", max_context=32, max_batch=4, prefill_chunk=4)
    with pytest.raises(ExecutionError, match=match):
        lm.step_greedy(PROMPTS[:, :1], lm.new_cache(), np.arange(3), **kw)


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_greedy_generation_launching_ahead_equals_one_step_at_a_time(device: str) -> None:
    """`launch_ahead` (on by default on CUDA only) takes each decode step's tokens from the slots the step before
    stored them in, launched before that step's tokens are taken: the same tokens and finish reasons as one step
    at a time, at the length limit, at a stop token (the step launched past it dropped), at the context's end,
    and when the caller stops reading a stream; the cache's lengths after it as after the plain loop."""
    lm = CausalLM(CONFIG, TENSORS, device=device, max_context=16, max_batch=3, prefill_chunk=4)
    assert lm.token_feedback and not lm.launch_ahead
    prompts = [PROMPTS[0].tolist(), PROMPTS[1, :3].tolist(), PROMPTS[2, :2].tolist()]

    def both(rows: int = 3, **kw) -> list:
        out = []
        for ahead in (False, True):
            lm.launch_ahead = ahead
            gens = lm.generate_batch(prompts[:rows], **kw)
            out.append(([g.token_ids for g in gens], [g.finish_reason for g in gens],
                        lm._cache.lengths.tolist()))
        lm.launch_ahead = False
        return out

    for max_new in (1, 2, 7):
        plain, ahead = both(max_new_tokens=max_new)
        assert plain == ahead and plain[1] == ["length"] * 3 and len(plain[0][0]) == max_new
    plain, ahead = both(max_new_tokens=40)  # 16 tokens of context: every row ends there
    assert plain == ahead and set(plain[1]) == {"context"}
    tokens = plain[0]
    assert len({tuple(t) for t in tokens}) == 3  # the rows differ: a mixed-up slot would show
    lm.eos_ids = frozenset({tokens[0][2]})  # row 0 stops at its third token, the others at theirs or the limit
    try:
        plain, ahead = both(max_new_tokens=8)
        alone, alone_ahead = both(rows=1, max_new_tokens=8)  # every row stopped with a step in flight
    finally:
        lm.eos_ids = frozenset()
    assert plain == ahead and plain[1][0] == "stop" and len(plain[0][0]) == 2
    assert alone == alone_ahead and alone[1] == ["stop"] and alone[2][0] == len(prompts[0]) + 2

    lm.launch_ahead = True  # a stream read for two tokens, then dropped: the step in flight is taken
    first_two = [event.token_id for _, event in zip(range(2), lm.stream(prompts[0], max_new_tokens=8))]
    assert first_two == tokens[0][:2]
    assert lm.generate(prompts[0], max_new_tokens=3).token_ids == tokens[0][:3]  # and the next call runs

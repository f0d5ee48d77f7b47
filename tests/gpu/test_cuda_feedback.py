"""Device-side token feedback on a GPU (run by the lead on the device): steps launched before the last step's
tokens reached the host (`HostStep.launch` / `finish`, `CausalLM.launch_greedy`), their tokens gathered on the
device from the ones that step stored, generate what host-fed steps generate; two steps of different shapes may
be in flight; a third launch is refused clearly; a step's device error is raised at its finish; and the
pipelined engine (`Engine(feedback=True)`) over a CUDA `PagedRunner` gives the plain engine's tokens."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.driver import Device, Session
from rlx.errors import ExecutionError
from rlx.models.causal_lm import CausalLM
from rlx.toolchain.cuda import visible_gpu_arch
from tests.gpu.decoder_common import TINY_LLAMA, tiny_llama_tensors

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

CONFIG = TINY_LLAMA
TENSORS = tiny_llama_tensors()
PROMPTS = np.array([[5, 17, 33, 8], [9, 10, 11, 12], [60, 2, 3, 4]], np.int32)


@pytest.mark.parametrize("paged", [False, True])
def test_pipelined_feedback_steps_generate_what_host_fed_steps_do(paged: bool) -> None:
    kw = {"kv_pages": 16, "page_size": 16} if paged else {}
    lm = CausalLM(CONFIG, TENSORS, device="cuda", max_context=64, max_batch=4, prefill_chunk=4, **kw)
    slots = np.array([2, 0, 3])

    def host_fed() -> np.ndarray:
        cache = lm.new_cache()
        ids = lm.step_greedy(PROMPTS, cache, [3, 7, 11])
        out = [ids]
        for _ in range(12):
            ids = lm.step_greedy(ids[:, None], cache, np.arange(3))
            out.append(ids)
        return np.array(out)

    def pipelined() -> np.ndarray:
        cache = lm.new_cache()
        placeholder = np.zeros((3, 1), np.int32)
        pending = lm.launch_greedy(PROMPTS, cache, [3, 7, 11], token_dst=slots)
        out = []
        for _ in range(12):  # the next step is queued before this one's ids are taken: two in flight
            after = lm.launch_greedy(placeholder, cache, np.arange(3), token_src=slots, token_dst=slots)
            out.append(pending.result())
            pending = after
        out.append(pending.result())
        return np.array(out)

    want = host_fed()
    np.testing.assert_array_equal(pipelined(), want)
    np.testing.assert_array_equal(host_fed(), want)  # the one-call path after the split one


def test_greedy_generation_launches_ahead_on_cuda_with_the_same_tokens() -> None:
    """`generate_batch` on CUDA launches each decode step before the last one's tokens are taken (`launch_ahead`):
    the same tokens, finish reasons and cache lengths as one step at a time, at the limit and at a stop token."""
    lm = CausalLM(CONFIG, TENSORS, device="cuda", max_context=64, max_batch=4, prefill_chunk=4)
    assert lm.launch_ahead
    prompts = [PROMPTS[0].tolist(), PROMPTS[1, :3].tolist(), PROMPTS[2, :2].tolist()]

    def both(rows: int, max_new: int) -> list:
        out = []
        for ahead in (False, True):
            lm.launch_ahead = ahead
            gens = lm.generate_batch(prompts[:rows], max_new_tokens=max_new)
            out.append(([g.token_ids for g in gens], [g.finish_reason for g in gens], lm._cache.lengths.tolist()))
        lm.launch_ahead = True
        return out

    plain, ahead = both(3, 20)
    assert plain == ahead and plain[1] == ["length"] * 3
    lm.eos_ids = frozenset({plain[0][0][4]})  # row 0 ends at its fifth token, with a step in flight
    plain, ahead = both(1, 20)
    assert plain == ahead and plain[1] == ["stop"] and len(plain[0][0]) <= 4


def test_two_shapes_in_flight_and_a_third_launch_refused() -> None:
    lm = CausalLM(CONFIG, TENSORS, device="cuda", max_context=64, max_batch=4, prefill_chunk=4)
    cache = lm.new_cache()
    first = lm.step_greedy(PROMPTS, cache, [3, 7, 11], token_dst=np.array([0, 1, 2]))
    # three rows, then two of them (another binding, another captured graph; row 2 sits it out) fed from the
    # tokens the three-row step stores
    a = lm.launch_greedy(np.zeros((3, 1), np.int32), cache, np.arange(3), token_src=np.arange(3),
                         token_dst=np.arange(3))
    b = lm.launch_greedy(np.zeros((2, 1), np.int32), cache, np.arange(2), token_src=np.arange(2),
                         token_dst=np.arange(2))
    with pytest.raises(ExecutionError, match="in flight already"):
        lm.launch_greedy(np.zeros((3, 1), np.int32), cache, np.arange(3))
    got_a, got_b = a.result(), b.result()
    ref = lm.new_cache()
    want_first = lm.step_greedy(PROMPTS, ref, [3, 7, 11])
    want_a = lm.step_greedy(want_first[:, None], ref, np.arange(3))
    want_b = lm.step_greedy(want_a[:2, None], ref, np.arange(2))
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(got_a, want_a)
    np.testing.assert_array_equal(got_b, want_b)
    cache.release()
    assert np.asarray(cache.tokens.numpy())[:3].tolist() == [*want_b.tolist(), want_a[2]]


def test_a_launched_steps_device_error_is_raised_at_its_finish() -> None:
    g = rlx.Graph("feedback_flag")
    m = rlx.Dim.dynamic("m", 6)
    ids = g.input("ids", [m], "i32")
    s = g.state("s", [10, 4])
    g.set_outputs([g.gather(s, ids)])
    cg = Session(Device.CUDA).compile(g)
    step = cg.bind_host_step({"ids": np.array([1, 2, 3], np.int32), "s": cg.to_device(np.ones((10, 4), np.float32))})
    good = step.launch()
    step.inputs["ids"][...] = [1, 99, 3]  # read at the launch: the first step keeps its own ids
    bad = step.launch()
    np.testing.assert_array_equal(step.finish(good)["out0"], np.ones((3, 4), np.float32))
    with pytest.raises(ExecutionError, match="gather index out of range"):
        step.finish(bad)
    with pytest.raises(ExecutionError, match="no host step in flight has ticket"):
        step.finish(bad)
    step.inputs["ids"][...] = [0, 1, 2]
    np.testing.assert_array_equal(step()["out0"], np.ones((3, 4), np.float32))  # the context goes on
    cg.release_states()


def test_pipelined_engine_over_a_cuda_paged_runner_gives_the_plain_engines_tokens() -> None:
    from rlx.serving.engine import Engine, SamplingParams
    from rlx.serving.runner import PagedRunner

    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 96, int(rng.integers(3, 30))).tolist() for _ in range(12)]
    runner = PagedRunner.build(CONFIG, TENSORS, device="cuda", slots=12, max_context=96, page_size=16)
    runner.capture_steps()

    def run(engine: Engine) -> list[list[int]]:
        requests = [engine.submit(p, SamplingParams(max_tokens=24)) for p in prompts]
        while any(r._seq.finish_reason is None for r in requests):
            engine.step()
        engine.settle()
        assert engine.kv.used_pages == 0
        return [[e.token_id for e in r if e.token_id is not None] for r in requests]

    plain, piped = Engine(runner), Engine(runner, feedback=True)
    want = run(plain)
    assert run(piped) == want and all(len(t) == 24 for t in want)
    assert piped.ahead_steps > 10

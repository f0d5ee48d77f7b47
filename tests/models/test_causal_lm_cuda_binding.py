"""`CausalLM._run_cuda` without a GPU: a stand-in for the compiled CUDA graph records what the model binds
(`bind_host_step`) and writes per step, and answers each step from rlx.reference, so the binding logic (one
binding per cache, output and step shape; inputs written in place; a new binding when the cache changes) is
checked here and the tokens are the reference's."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from rlx import reference
from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import random_specs

CONFIG = DecoderConfig(arch="llama", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=8, ffn_size=48, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=8, context_length=64, tie_embeddings=True, bos_id=1, eos_id=2)


class _Buffer:
    """A device buffer stand-in: the cache array it holds."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


class _Step:
    def __init__(self, graph, params, feed, outputs):
        self.graph, self.params, self.calls = graph, params, 0
        self.states = {k: v for k, v in feed.items() if isinstance(v, _Buffer)}
        self.inputs = MappingProxyType({k: np.array(v) for k, v in feed.items() if isinstance(v, np.ndarray)})
        self.names = outputs

    def __call__(self):
        self.calls += 1
        run = {**{k: v.array for k, v in self.states.items()}, **{k: v.copy() for k, v in self.inputs.items()}}
        outs = reference.run(self.graph, run, self.params)  # updates the cache arrays in place, as the GPU does
        names = ["logits", "next_token", "sampled_token"]
        return {n: outs[names.index(n)] for n in self.names}


class _Compiled:
    output_names = ("logits", "next_token", "sampled_token")

    def __init__(self, lm: CausalLM) -> None:
        self.lm, self.bound = lm, []

    def to_device(self, array: np.ndarray) -> _Buffer:
        return _Buffer(array)

    def release_states(self) -> None:  # as CudaCompiledGraph: nothing resident here (host buffers)
        pass

    def bind_host_step(self, feed, outputs):
        step = _Step(self.lm.graph, self.lm._params, feed, outputs)
        self.bound.append(step)
        return step


def test_run_cuda_binds_once_per_cache_and_shape_and_matches_reference() -> None:
    tensors = random_tensors(random_specs(CONFIG), seed=1)
    ref = CausalLM(CONFIG, tensors, device="reference", max_context=32, prefill_chunk=8)
    lm = CausalLM(CONFIG, tensors, device="reference", max_context=32, prefill_chunk=8)
    fake = _Compiled(lm)
    lm._compiled, lm.device = fake, "cuda"
    caches = [lm.new_cache(), lm.new_cache()]
    ref_caches = [ref.new_cache(), ref.new_cache()]
    prompt = np.array([[3, 9, 27, 17]])
    for c, rc in zip(caches, ref_caches):
        assert lm.step_greedy(prompt, c, [3])[0] == ref.step_greedy(prompt, rc, [3])[0]
    token = 5
    for step in range(6):
        for c, rc in zip(caches, ref_caches):  # alternate: each cache change rebinds
            got = lm.step_greedy(np.array([[token]]), c, [0])
            want = ref.step_greedy(np.array([[token]]), rc, [0])
            assert got.tolist() == want.tolist(), step
        np.testing.assert_allclose(lm.step(np.array([[token]]), caches[0], [0]),
                                   ref.step(np.array([[token]]), ref_caches[0], [0]), rtol=1e-6, atol=1e-6)
        token = int(want[0])
    # every cache change binds anew (prefill x 2, then per round: greedy on each cache, logits on the first)
    assert len(fake.bound) == 2 + 6 * 3
    assert [s.names for s in fake.bound[-3:]] == [["next_token"], ["next_token"], ["logits"]]
    assert all(s.calls == 1 for s in fake.bound)
    # without a cache change a binding is reused, its inputs written in place
    for _ in range(3):
        lm.step_greedy(np.array([[token]]), caches[1], [0])
    assert len(fake.bound) == 2 + 6 * 3 + 1 and fake.bound[-1].calls == 3
    assert fake.bound[-1].inputs["tokens"].tolist() == [[token]]
    assert fake.bound[-1].inputs["positions"].tolist() == [int(caches[1].lengths[0]) - 1]


def test_run_cuda_samples_through_the_binding_with_fresh_uniforms() -> None:
    """A sampled decode step writes its u and settings into the bound step's inputs (one binding reused):
    the tokens equal the reference model's for the same seed, and only `sampled_token` is asked for."""
    tensors = random_tensors(random_specs(CONFIG), seed=2, scale=2.0)
    ref = CausalLM(CONFIG, tensors, device="reference", max_context=32, prefill_chunk=8)
    lm = CausalLM(CONFIG, tensors, device="reference", max_context=32, prefill_chunk=8)
    fake = _Compiled(lm)
    lm._compiled, lm.device = fake, "cuda"
    kw = dict(max_new_tokens=12, temperature=1.5, top_k=30, top_p=0.95, seed=4)
    got = lm.generate([3, 9, 27], **kw).token_ids
    assert got == ref.generate([3, 9, 27], **kw).token_ids and len(set(got)) > 3
    assert all(s.names == ["sampled_token"] for s in fake.bound)
    assert len(fake.bound) == 2 and fake.bound[-1].calls == len(got) - 1  # prefill, then one decode binding
    assert fake.bound[-1].inputs["sample_settings"].tolist() == [1.5, 30.0, 0.95]

"""CausalLM on a small random LLaMA: logits against an independent numpy model, the KV cache against
re-running prefill, batching, chunking, sampling and bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.errors import ExecutionError, RlxError
from rlx.ir.ops_sample import sample_rows
from rlx.models import llama as L
from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import random_specs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_numpy import llama_logits

CONFIG = DecoderConfig(arch="llama", vocab_size=96, hidden_size=48, num_layers=2, num_heads=6, num_kv_heads=2,
                       head_dim=8, ffn_size=80, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=8, context_length=128, tie_embeddings=True, bos_id=1, eos_id=2)


@pytest.fixture(scope="module")
def tensors() -> dict:
    # scale 2: weights large enough that greedy decoding wanders through the vocabulary
    return random_tensors(random_specs(CONFIG), seed=3, scale=2.0)


@pytest.fixture(scope="module")
def lm(tensors: dict) -> CausalLM:
    return CausalLM(CONFIG, tensors, device="cpu", max_context=96, max_batch=3, prefill_chunk=16)


def _weights(tensors: dict) -> dict:
    return {name: data for name, (_, data) in tensors.items()}


@pytest.mark.parametrize("variant", ["interleaved", "neox"])
def test_logits_match_an_independent_numpy_llama(variant: str, tensors: dict) -> None:
    import dataclasses

    config = dataclasses.replace(CONFIG, rope_variant=variant)
    model = CausalLM(config, tensors, device="cpu", max_context=64, prefill_chunk=16)
    ids = list(np.random.default_rng(0).integers(0, CONFIG.vocab_size, 37))  # three chunks
    got = model.logits(ids)
    want = llama_logits(config, _weights(tensors), ids)
    cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.99999
    np.testing.assert_array_equal(got.argmax(axis=1), want.argmax(axis=1))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_greedy_through_the_cache_equals_rerunning_prefill(lm: CausalLM) -> None:
    prompt = [5, 17, 33, 8]
    fast = lm.generate(prompt, max_new_tokens=64)
    ids = list(prompt)
    for _ in range(len(fast.token_ids)):
        ids.append(int(lm.logits(ids)[-1].argmax()))
    assert fast.token_ids == ids[len(prompt):]
    assert len(set(fast.token_ids)) > 3  # not a degenerate repetition


def test_interleaved_caches_decode_as_each_alone(lm: CausalLM) -> None:
    """Steps switching between two caches (a switch rebinds the CPU's bound run, repeated steps on one
    cache reuse it) return the logits of each cache's own sequence, and a returned array is not
    overwritten by later steps."""
    a, b = lm.new_cache(), lm.new_cache()
    seqs = {id(a): [5, 17, 33], id(b): [44, 2]}
    for cache in (a, b):
        lm.step(np.array([seqs[id(cache)]]), cache, [0])
    kept = []
    for t in range(8):
        cache = (a, a, b, b, b, a, b, a)[t]
        seq = seqs[id(cache)]
        seq.append(7 + 3 * t + len(seq))
        got = lm.step(np.array([[seq[-1]]]), cache, [0])
        kept.append((got, got.copy(), list(seq)))
    for got, copy, seq in kept:
        np.testing.assert_array_equal(got, copy)
        np.testing.assert_allclose(got[0], lm.logits(seq)[-1], rtol=1e-4, atol=1e-4)


def test_batch_rows_at_different_lengths_match_single_runs(lm: CausalLM) -> None:
    prompts = [[5, 17, 33, 8], list(range(10, 31)), [44]]
    together = lm.generate_batch(prompts, max_new_tokens=12)
    for prompt, result in zip(prompts, together):
        assert result.token_ids == lm.generate(prompt, max_new_tokens=12).token_ids
        assert result.prompt_tokens == len(prompt)


def test_seeded_sampling_is_reproducible(lm: CausalLM) -> None:
    def run(seed: int) -> list[int]:
        return lm.generate([5, 6, 7], max_new_tokens=16, temperature=0.8, top_k=20, top_p=0.9, seed=seed).token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_stream_yields_the_generated_tokens(lm: CausalLM) -> None:
    assert [e.token_id for e in lm.stream([5, 6, 7], max_new_tokens=9)] == lm.generate([5, 6, 7], 9).token_ids


def test_generation_stops_at_the_context_limit(tensors: dict) -> None:
    small = CausalLM(CONFIG, tensors, device="cpu", max_context=12, prefill_chunk=8)
    out = small.generate(list(range(3, 11)), max_new_tokens=50)
    assert out.finish_reason == "context" and len(out.token_ids) == 12 - 8 + 1


def test_a_stream_says_why_it_stopped_once_exhausted(tensors: dict) -> None:
    small = CausalLM(CONFIG, tensors, device="cpu", max_context=12, prefill_chunk=8)
    stream = small.stream(list(range(3, 11)), max_new_tokens=50)
    first = next(stream)
    assert stream.finish_reason is None  # still running
    events = [first, *stream]
    assert stream.finish_reason == "context"
    assert [e.token_id for e in events] == small.generate(list(range(3, 11)), max_new_tokens=50).token_ids
    short = small.stream(list(range(3, 11)), max_new_tokens=2)
    assert len(list(short)) == 2 and short.finish_reason == "length"


def test_cache_reset_and_truncate(lm: CausalLM) -> None:
    cache = lm.new_cache()
    first = lm.step(np.array([[5, 6, 7, 8]]), cache, [3])
    cache.truncate(2)
    again = lm.step(np.array([[7, 8]]), cache, [1])
    np.testing.assert_allclose(again, first, rtol=1e-5, atol=1e-5)
    cache.reset()
    assert not cache.lengths.any()


def test_bad_input_is_refused(lm: CausalLM) -> None:
    with pytest.raises(ExecutionError, match="max_context is 96"):
        lm.logits([3] * 97)
    with pytest.raises(ExecutionError, match="non-empty"):
        lm.logits([])
    with pytest.raises(ExecutionError, match=r"\[0, 96\)"):
        lm.logits([3, 96])
    with pytest.raises(ExecutionError, match=r"\[0, 96\)"):
        lm.generate([-1])
    with pytest.raises(RlxError, match=r"1\.\.3 prompts"):
        lm.generate_batch([[3]] * 4)
    with pytest.raises(RlxError, match="temperature"):
        lm.generate([3], temperature=-1)


def test_default_quant_act_follows_the_cpu_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """int16 activations only where the build has AVX-512 VNNI (their kernels); f32 otherwise and off the CPU."""
    from rlx.models.causal_lm import Q16_FEATURES, default_quant_act
    from rlx.toolchain.isa import required_features

    monkeypatch.setenv("RLX_CPU_TARGET", "x86-64-v3")  # AVX2: no VNNI kernels
    assert default_quant_act("cpu") == "f32"
    monkeypatch.setenv("RLX_CPU_TARGET", "native")
    native = set(required_features("native"))
    assert default_quant_act("cpu") == ("q16" if native.issuperset(Q16_FEATURES) else "f32")
    assert default_quant_act("cuda") == "f32"
    with pytest.raises(RlxError, match="quant_act"):
        CausalLM(CONFIG, random_tensors(random_specs(CONFIG), seed=1), device="reference", quant_act="q4")


# ── sampling in the graph (sample_top_k) and on the host ───────────────────────────────────────────────


def test_sampling_on_the_device_equals_the_host_path(lm: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """temperature 0.8, top_k 40: the graph samples and a decode step reads back token ids only; the host
    path (logits read back, Sampler.pick) gives the same tokens for the same seed, also for a batch."""
    calls = {"logits": 0, "sample": 0}
    step, step_sample = lm.step, lm.step_sample
    monkeypatch.setattr(lm, "step", lambda *a: (calls.__setitem__("logits", calls["logits"] + 1), step(*a))[1])
    monkeypatch.setattr(lm, "step_sample",
                        lambda *a: (calls.__setitem__("sample", calls["sample"] + 1), step_sample(*a))[1])
    device = lm.generate([5, 6, 7], max_new_tokens=24, temperature=0.8, top_k=40, seed=3).token_ids
    assert calls == {"logits": 0, "sample": 24}  # prefill + 23 decode steps, never the logits
    assert device == lm.generate([5, 6, 7], max_new_tokens=24, temperature=0.8, top_k=40, seed=3).token_ids
    assert len(set(device)) > 3
    prompts = [[5, 17, 33, 8], list(range(10, 31)), [44]]
    batch_device = lm.generate_batch(prompts, max_new_tokens=10, temperature=1.2, top_k=60, top_p=0.9, seed=11)
    monkeypatch.setattr(lm, "device_sampling", False)
    calls.update(logits=0, sample=0)
    host = lm.generate([5, 6, 7], max_new_tokens=24, temperature=0.8, top_k=40, seed=3).token_ids
    assert calls == {"logits": 24, "sample": 0}
    assert host == device
    batch_host = lm.generate_batch(prompts, max_new_tokens=10, temperature=1.2, top_k=60, top_p=0.9, seed=11)
    assert [r.token_ids for r in batch_host] == [r.token_ids for r in batch_device]


@pytest.mark.parametrize(("top_k", "top_p"), [(None, 0.9), (300, None), (None, None)])
def test_settings_beyond_the_op_fall_back_to_the_host(lm: CausalLM, monkeypatch: pytest.MonkeyPatch, top_k,
                                                      top_p) -> None:
    """top_k above SAMPLE_TOP_K_MAX (256), or top_p / temperature without top_k, sample on the host from the
    read-back logits: reproducible, and equal to sampling those logits with the same seed's Sampler."""
    from rlx.models.sampling import Sampler

    monkeypatch.setattr(lm, "step_sample", lambda *a: pytest.fail("sampled in the graph"))
    out = lm.generate([9, 4], max_new_tokens=6, temperature=1.1, top_k=top_k, top_p=top_p, seed=5).token_ids
    assert out == lm.generate([9, 4], max_new_tokens=6, temperature=1.1, top_k=top_k, top_p=top_p, seed=5).token_ids
    sampler, ids = Sampler(1.1, top_k, top_p, seed=5), [9, 4]
    for _ in range(len(out)):
        ids.append(int(sampler.pick(lm.logits(ids)[-1:])[0]))
    assert ids[2:] == out


def test_step_sample_equals_sampling_the_step_logits(lm: CausalLM) -> None:
    u = np.array([0.0, 0.3, float(np.nextafter(1.0, 0.0))])
    tokens = np.array([[5, 6], [7, 8], [9, 10]])
    for settings in ([0.7, 30, 1.0], [1.5, 256, 0.8], [0.0, 1, 1.0]):
        logits = lm.step(tokens, lm.new_cache(), [1, 3, 5])
        ids = lm.step_sample(tokens, lm.new_cache(), [1, 3, 5], u, np.array(settings))
        np.testing.assert_array_equal(ids, sample_rows(logits, u, settings[0], int(settings[1]), settings[2]))
    with pytest.raises(ExecutionError, match="one u per row"):
        lm.step_sample(tokens, lm.new_cache(), [1, 3, 5], u[:2], np.array([0.7, 30, 1.0]))
    with pytest.raises(ExecutionError, match="top_k 300 is above the op's cap 256"):
        lm.step_sample(tokens, lm.new_cache(), [1, 3, 5], u, np.array([0.7, 300, 1.0]))


@pytest.mark.parametrize(("kwargs", "match"), [({"top_k": 0}, "top_k"), ({"top_p": 1.5}, "top_p"),
                                               ({"top_p": 0.0}, "top_p"), ({"temperature": -0.1}, "temperature")])
def test_bad_sampling_settings_are_refused(lm: CausalLM, kwargs: dict, match: str) -> None:
    with pytest.raises(RlxError, match=match):
        lm.generate([3], max_new_tokens=2, **{"temperature": 1.0, **kwargs})


def _linear_inputs_rounded(graph):
    """`graph` with the left operand of every matmul on a param rounded to bf16 and back: the meaning
    of the CPU's bf16 GEMMs on a host with AVX512_BF16 (bf16 x bf16 products, f32 sums)."""
    from rlx.ir import ops as O
    from rlx.ir.dtype import DType
    from rlx.opt.rewrite import Rewriter

    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.kind == "matmul" and graph.node(node.inputs[1]).kind == "param":
            a = rw.dst.add(O.Cast(DType.BF16), [rw.arg(node.inputs[0])])
            rw.emit(node, node.op, [rw.dst.add(O.Cast(DType.F32), [a]), rw.arg(node.inputs[1])])
        else:
            rw.copy(node)
    return rw.finish()


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_f16_bf16_gguf_weights_stay_narrow(kind: str, tmp_path: Path) -> None:
    """F16/BF16 GGUF matrices are held in their own precision on the CPU (issue 14: no widening at
    load): half the bytes of f32, multiplied by the mixed GEMMs with f32 accumulation."""
    from rlx.driver import Session
    from rlx.ir.dtype import BFLOAT16
    from rlx.models.gguf import GgufTensor, config_metadata, read_gguf, write_gguf
    from rlx.models.llama import build_decoder
    from rlx.toolchain.isa import cpu_flags

    f32 = random_tensors(random_specs(CONFIG), seed=3, scale=2.0)
    stored: dict = {}
    for name, (_, data) in f32.items():
        if data.ndim == 1:
            stored[name] = data  # norm gains stay f32, as GGUF files keep them
        elif kind == "f16":
            stored[name] = data.astype(np.float16)
        else:
            stored[name] = GgufTensor(name, "bf16", data.shape, data.astype(BFLOAT16).view(np.uint16))
    path = tmp_path / f"tiny-{kind}.gguf"
    write_gguf(path, config_metadata(CONFIG), stored)
    model = read_gguf(path)
    tensors = {n: (L.WeightSpec(t.ggml_type, tuple(t.shape)), t.data) for n, t in model.tensors.items()}
    lm = CausalLM(model.config, tensors, device="cpu", max_context=64, prefill_chunk=16)

    # in memory: every matrix a param of its stored dtype; the params take about half of f32's bytes
    dtypes = {p["name"]: p["dtype"] for p in lm._compiled.manifest["params"]}
    assert {d for n, d in dtypes.items() if not n.endswith("_norm.weight")} == {kind}
    assert {d for n, d in dtypes.items() if n.endswith("_norm.weight")} == {"f32"}
    specs = {n: spec for n, (spec, _) in tensors.items()}
    wide = build_decoder(CONFIG, specs, max_seq=16, capacity=64)
    narrow_bytes, wide_bytes = lm._compiled.memory()["params"], Session("cpu").estimate(wide).params
    # (half, plus the f32 norm gains and each packed param's padding to whole 64-byte lines)
    assert 0.45 * wide_bytes < narrow_bytes < 0.55 * wide_bytes

    ids = list(np.random.default_rng(0).integers(0, CONFIG.vocab_size, 37))  # three chunks
    got = lm.logits(ids)
    exact = {n: np.asarray(t.data if not isinstance(t, np.ndarray) else t) for n, t in stored.items()}
    exact = {n: (a.view(BFLOAT16) if a.dtype == np.uint16 else a).astype(np.float32) for n, a in exact.items()}
    want = llama_logits(CONFIG, exact, ids)
    if kind == "f16" or "avx512_bf16" not in (cpu_flags() or ()):
        # the weights are read exactly (widened per panel) and multiplied in f32: as the f32 model
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        np.testing.assert_array_equal(got.argmax(axis=1), want.argmax(axis=1))
    else:
        # vdpbf16ps rounds each GEMM's activations to bf16 (2^-8 relative): the reference with
        # those roundings moves the logits from `want`; a rounding is a step function of values the
        # reference computes in float64, so the two agree to the size of that effect
        ref = CausalLM(model.config, tensors, device="reference", max_context=64, prefill_chunk=16)
        ref.graph = _linear_inputs_rounded(ref.graph)
        meant = ref.logits(ids)
        effect = np.abs(meant - want).max()
        assert 1e-5 * np.abs(want).max() < effect < 0.05 * np.abs(want).max()
        assert np.abs(got - meant).max() <= 2 * effect


def test_kv_dtype_is_checked(tensors: dict) -> None:
    """A narrow KV cache runs on CUDA only (tests/gpu/test_cuda_long_context.py); an unknown dtype is named; both
    before any build. build_decoder declares the cache states in the dtype asked for."""
    with pytest.raises(RlxError, match="kv_dtype 'f16' is not one 'cpu' runs"):
        CausalLM(CONFIG, tensors, device="cpu", kv_dtype="f16")
    with pytest.raises(RlxError, match="kv_dtype 'q8' is not one 'cuda' runs"):
        CausalLM(CONFIG, tensors, device="cuda", kv_dtype="q8")
    with pytest.raises(RlxError, match="kv_dtype 'f8e4m3fn' is not one 'cpu' runs"):
        CausalLM(CONFIG, tensors, device="cpu", kv_dtype="f8e4m3fn")
    for kv in ("f16", "f8e4m3fn"):
        g = L.build_decoder(CONFIG, random_specs(CONFIG), max_seq=8, capacity=16, kv_dtype=kv)
        assert {n.shape.dtype.value for n in g.inputs() if n.op.state} == {kv}
    assert CausalLM(CONFIG, tensors, device="reference", max_context=16).kv_dtype == "f32"


def test_step_bindings_are_evicted_least_recently_used_first(lm: CausalLM) -> None:
    """A model keeps `max_bindings` step bindings of a cache (a serving engine steps through every row count):
    past them the least recently used goes, not all of them; a binding in use all along is kept, and its
    step's result stays what it was."""
    cache = lm.new_cache()
    ids = np.arange(3, 3 + 16, dtype=np.int32)

    def run(n: int, r: int) -> np.ndarray:
        cache.reset()
        return lm.step(ids[None, :n], cache, list(range(r)))

    first = run(4, 1)
    shapes = [(n, r) for n in range(5, 17) for r in range(1, n + 1)][:lm.max_bindings + 4]
    for n, r in shapes:  # a new step shape each, the first one used again after every one
        run(n, r)
        np.testing.assert_array_equal(run(4, 1), first)
    assert len(lm._cpu_bound) == lm.max_bindings
    assert (id(cache.arrays), (1, 4), (1,), False) in lm._cpu_bound  # (not a distinct-rows step)

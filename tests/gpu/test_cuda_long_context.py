"""Long-context decode attention on a GPU: `cached_attention` decode steps (rlx_kv_decode, kernels/kv_decode.cuh:
a block per KV head for its query heads, 16-byte K/V loads, flash-decoding splits) over 1k, 4k and 16k keys
against rlx.reference and the CPU backend; GQA groups of 1 to 8; sliding windows; f16 / bf16 KV caches beside f32
compute (their error against an f32 cache reported); and a small CausalLM over a 3,000-token prompt whose CUDA
logits and greedy tokens equal the CPU's. Skipped without an NVIDIA GPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rlx import reference
from rlx.driver import Device, Session
from rlx.ir import ops as O
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import random_specs
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

#: (query heads, KV heads, head dim): SmolLM2-135M's attention, Llama-3-8B's
SMOL, LLAMA8B = (9, 3, 64), (32, 8, 128)
CONTEXTS = (1024, 4096, 16384)
#: What an f8e4m3fn cache may cost the attention output against an f32 cache, relative to its largest value (3
#: mantissa bits: a stored value is within 2^-4 of itself, relative; the weights sum to 1).
F8_ATTENTION_ERROR = 0.0625


def _graph(heads: int, kv_heads: int, hd: int, cap: int, *, window: int | None = None, cache: str = "f32",
           batch: int = 2) -> Graph:
    g = Graph(f"kv_long_{heads}_{kv_heads}_{hd}_{cap}_{window}_{cache}")
    b, s = Dim.dynamic("batch", max=batch), Dim.dynamic("seq", max=4)
    q = g.input("q", [b, s, heads * hd])
    k = g.input("k", [b, s, kv_heads * hd])
    v = g.input("v", [b, s, kv_heads * hd])
    kc = g.state("k_cache", [batch, cap, kv_heads * hd], cache)
    vc = g.state("v_cache", [batch, cap, kv_heads * hd], cache)
    pos = g.input("pos", [b], "i32")
    g.set_outputs([g.cached_attention(q, k, v, kc, vc, pos, num_heads=heads, head_dim=hd, num_kv_heads=kv_heads,
                                      window=window)])
    return g


def _attention(graph: Graph) -> O.CachedAttention:
    return next(n for n in graph.nodes if n.kind == "cached_attention").op


def _cache_shape(graph: Graph):
    return next(n for n in graph.inputs() if n.op.name == "k_cache").shape


def _feed(graph: Graph, positions: list[int], sq: int, seed: int, cache: type = np.float32) -> dict:
    """Random queries, new keys and values, and a cache already holding a (random) past."""
    r = np.random.default_rng(seed)
    att = _attention(graph)
    full, cap = (d.value for d in _cache_shape(graph).dims[:2])
    batch = len(positions)
    qw, kw = att.num_heads * att.head_dim, att.kv_heads * att.head_dim
    caches = [r.standard_normal((full, cap, kw), dtype=np.float32).astype(cache) for _ in range(2)]
    return {"q": r.standard_normal((batch, sq, qw), dtype=np.float32),
            "k": r.standard_normal((batch, sq, kw), dtype=np.float32),
            "v": r.standard_normal((batch, sq, kw), dtype=np.float32),
            "k_cache": caches[0], "v_cache": caches[1], "pos": np.array(positions, np.int32)}


def _want(graph: Graph, feed: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """rlx.reference's output and caches after the step (on copies of the feed's caches)."""
    att = _attention(graph)
    kc, vc = feed["k_cache"].copy(), feed["v_cache"].copy()
    b = len(feed["pos"])
    out = reference.cached_attention(feed["q"], feed["k"], feed["v"], kc[:b], vc[:b], feed["pos"], att)
    return out, kc, vc


def _run(cg, feed: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One run on copies of the feed's caches (the run writes them back): output, caches."""
    mine = {**feed, "k_cache": feed["k_cache"].copy(), "v_cache": feed["v_cache"].copy()}
    (out,) = cg.run(mine)
    return out, mine["k_cache"], mine["v_cache"]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _check(cg, graph: Graph, feed: dict, rtol: float, what: str) -> np.ndarray:
    out, kc, vc = _run(cg, feed)
    want, ref_kc, ref_vc = _want(graph, feed)
    err = _rel(out, want)
    print(f"{what}: max |out - ref| / max |ref| = {err:.2e}")
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"
    np.testing.assert_array_equal(kc, ref_kc, err_msg=f"{what}: the step's keys appended at each row's position")
    np.testing.assert_array_equal(vc, ref_vc, err_msg=f"{what}: the step's values appended")
    return out


@pytest.fixture(scope="module", params=[SMOL, LLAMA8B], ids=["smollm2", "llama3_8b"])
def long_graph(request: pytest.FixtureRequest) -> tuple[Graph, object]:
    heads, kv_heads, hd = request.param
    graph = _graph(heads, kv_heads, hd, max(CONTEXTS), batch=2 if hd == 64 else 1)
    return graph, Session(Device.CUDA).compile(graph)


@pytest.mark.parametrize("context", CONTEXTS)
def test_decode_matches_reference_and_cpu(long_graph: tuple[Graph, object], context: int) -> None:
    """One decode query per row (and a 2-row speculative step) over `context` keys: the reference's output within
    f32 rounding, the CPU backend's too; the caches gain the step's rows."""
    graph, cg = long_graph
    batch = _cache_shape(graph).dims[0].value
    positions = [context - 1, context // 3][:batch]
    _check(cg, graph, _feed(graph, positions, 1, context), 2e-5, f"{graph.name} decode at {context}")
    _check(cg, graph, _feed(graph, [p - 1 for p in positions], 2, context + 1), 2e-5,
           f"{graph.name} 2-row step at {context}")
    if context == CONTEXTS[-1]:
        feed = _feed(graph, positions, 1, 7)
        cpu = Session(Device.CPU).compile(graph)
        (want,) = cpu.run({**feed, "k_cache": feed["k_cache"].copy(), "v_cache": feed["v_cache"].copy()})
        out, _, _ = _run(cg, feed)
        assert _rel(out, want) <= 2e-5, f"CUDA vs CPU at {context}: {_rel(out, want):.2e}"


@pytest.mark.parametrize(("heads", "kv_heads", "hd"), [(8, 8, 64), (32, 4, 128), (16, 2, 256), (6, 2, 96)])
def test_gqa_groups(heads: int, kv_heads: int, hd: int) -> None:
    """Groups of 1, 8 and 8 query heads per KV head (head dims 64, 128, 256) run rlx_kv_decode; head dim 96 (f32
    rows of 24 16-byte vectors do not tile a warp) runs rlx_kv_attend's split path: both equal the reference."""
    graph = _graph(heads, kv_heads, hd, 4096, batch=1)
    cg = Session(Device.CUDA).compile(graph)
    _check(cg, graph, _feed(graph, [4000], 1, hd), 2e-5, f"{graph.name} decode")
    _check(cg, graph, _feed(graph, [1500], 3, hd + 1), 2e-5, f"{graph.name} 3-row step")


@pytest.mark.parametrize("window", [1000, 4096])
def test_sliding_window(window: int) -> None:
    """A sliding window (1000 < the past, and one as long as the cache) in decode and prefill steps."""
    graph = _graph(*SMOL, 4096, window=window)
    cg = Session(Device.CUDA).compile(graph)
    _check(cg, graph, _feed(graph, [4000, 700], 1, 1), 2e-5, f"window {window} decode")
    _check(cg, graph, _feed(graph, [3000, 10], 4, 2), 2e-5, f"window {window} prefill (8 rows: rlx_kv_attend)")


def test_f16_kv_cache() -> None:
    """f32 compute over a narrow KV cache at 16k keys: equal to the reference run on that cache as stored, and the
    error the narrow cache itself adds, against an f32 cache of the same values, reported (and bounded)."""
    cap, positions = 16384, [16383, 9000]
    g32, g16 = _graph(*SMOL, cap), _graph(*SMOL, cap, cache="f16")
    c32, c16 = Session(Device.CUDA).compile(g32), Session(Device.CUDA).compile(g16)
    feed32 = _feed(g32, positions, 1, 11)
    feed16 = {**feed32, **{n: feed32[n].astype(np.float16) for n in ("k_cache", "v_cache")}}
    out16 = _check(c16, g16, feed16, 2e-5, "f16 KV cache (vs the reference on the f16 cache)")
    out32, _, _ = _run(c32, feed32)
    err = _rel(out16, out32)
    print(f"f16 KV cache vs f32 KV cache at {cap} keys: max relative error {err:.2e}")
    assert err < 5e-3


@pytest.mark.parametrize("sq", [1, 3])
def test_f8_kv_cache(sq: int) -> None:
    """An f8e4m3fn cache (one byte a value) beside f32 compute at 16k keys, steps of 1 and 3 tokens a row: equal to
    the reference run on the cache as stored (the appended rows rounded and saturated bit for bit), and the error
    the 8-bit cache adds against an f32 cache of the same values reported and bounded."""
    cap, positions = 16384, [16380, 9000]
    g32, g8 = _graph(*SMOL, cap), _graph(*SMOL, cap, cache="f8e4m3fn")
    c32, c8 = Session(Device.CUDA).compile(g32), Session(Device.CUDA).compile(g8)
    feed32 = _feed(g32, positions, sq, 13 + sq)
    feed8 = {**feed32, **{n: feed32[n].astype(ml_dtypes.float8_e4m3fn) for n in ("k_cache", "v_cache")}}
    out8 = _check(c8, g8, feed8, 2e-5, f"f8e4m3fn KV cache, {sq} token(s) a row (vs the reference on the f8 cache)")
    out32, _, _ = _run(c32, feed32)
    err = _rel(out8, out32)
    print(f"f8e4m3fn KV cache vs f32 KV cache at {cap} keys, {sq} token(s) a row: max relative error {err:.2e}")
    assert err < F8_ATTENTION_ERROR


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_low_precision_compute(precision: str) -> None:
    """f16 / bf16 compute (the cache stored in it too) at 16k keys: within that precision's rounding."""
    graph = _graph(*LLAMA8B, 16384, batch=1)
    cg = Session(Device.CUDA, precision=precision).compile(graph)
    feed = _feed(graph, [16383], 1, 12)
    out, _, _ = _run(cg, feed)
    want, _, _ = _want(graph, feed)
    err = _rel(out, want)
    print(f"{precision} compute at 16384 keys: max relative error {err:.2e}")
    assert err < (2e-2 if precision == "bf16" else 4e-3)


CONFIG = DecoderConfig(arch="llama", vocab_size=96, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=32, ffn_size=160, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=32, context_length=4096, tie_embeddings=True, bos_id=1, eos_id=2)


@pytest.mark.parametrize("window", [0, 512])
def test_causal_lm_long_prompt_matches_cpu(window: int) -> None:
    """A 3,000-token prompt (chunked prefill) then 16 greedy tokens: CUDA logits and tokens equal the CPU's, with a
    sliding window of 512 too; an f16 KV cache (f32 compute) keeps the logits within cos 0.999."""
    from dataclasses import replace

    config = replace(CONFIG, sliding_window=window)
    tensors = random_tensors(random_specs(config), seed=5, scale=2.0)
    ids = [int(t) for t in np.random.default_rng(9).integers(3, config.vocab_size, 3000)]
    kw = dict(max_context=3072, prefill_chunk=256)
    gpu = CausalLM(config, tensors, device="cuda", **kw)
    cpu = CausalLM(config, tensors, device="cpu", **kw)
    got, want = gpu.logits(ids)[-64:], cpu.logits(ids)[-64:]
    cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.9999, cos.min()
    assert gpu.generate(ids, 16).token_ids == cpu.generate(ids, 16).token_ids
    half = CausalLM(config, tensors, device="cuda", kv_dtype="f16", **kw)
    h = half.logits(ids)[-64:]
    cos16 = np.sum(h * want, axis=1) / np.linalg.norm(h, axis=1) / np.linalg.norm(want, axis=1)
    print(f"f16 KV cache, window {window}: min cos of the last 64 positions' logits vs f32 (CPU) {cos16.min():.6f}")
    assert cos16.min() > 0.999


def test_f8_kv_cache_in_causal_lm() -> None:
    """kv_dtype="f8e4m3fn": a byte a cached value on the device (half an f16 cache). A 1,500-token prompt's logits
    equal the reference's over the same 8-bit cache (f32 compute on both: the stored bytes round alike); what the
    8-bit cache costs against an f16 one on this random model is reported (benchmarks/kv_cache_error.py measures
    it on SmolLM2)."""
    tensors = random_tensors(random_specs(CONFIG), seed=7, scale=2.0)
    ids = [int(t) for t in np.random.default_rng(11).integers(3, CONFIG.vocab_size, 1500)]
    kw = dict(max_context=1600, prefill_chunk=256)
    f8 = CausalLM(CONFIG, tensors, device="cuda", kv_dtype="f8e4m3fn", **kw)
    half = CausalLM(CONFIG, tensors, device="cuda", kv_dtype="f16", **kw)
    ref = CausalLM(CONFIG, tensors, device="reference", kv_dtype="f8e4m3fn", **kw)
    caches = zip(f8.new_cache().arrays.values(), half.new_cache().arrays.values())
    assert all(a.nbytes * 2 == b.nbytes for a, b in caches)
    got, want, h = f8.logits(ids)[-64:], ref.logits(ids)[-64:], half.logits(ids)[-64:]

    def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    print(f"f8e4m3fn KV cache: min cos of the last 64 positions' logits vs the reference's f8 cache "
          f"{cos(got, want).min():.7f}; vs an f16 cache {cos(got, h).min():.6f} (argmax agreement "
          f"{np.mean(got.argmax(axis=1) == h.argmax(axis=1)):.3f})")
    assert cos(got, want).min() > 0.9999
    assert f8.generate(ids, 16).token_ids == ref.generate(ids, 16).token_ids


def test_bf16_kv_cache_in_causal_lm() -> None:
    """kv_dtype="bf16" beside f32 compute: the cache arrays are bf16 on the device, the logits near f32's."""
    tensors = random_tensors(random_specs(CONFIG), seed=6, scale=2.0)
    ids = [int(t) for t in np.random.default_rng(10).integers(3, CONFIG.vocab_size, 1500)]
    f32 = CausalLM(CONFIG, tensors, device="cuda", max_context=1600, prefill_chunk=256)
    bf = CausalLM(CONFIG, tensors, device="cuda", max_context=1600, prefill_chunk=256, kv_dtype="bf16")
    assert bf.kv_dtype == "bf16" and all(a.nbytes * 2 == b.nbytes for a, b in
                                         zip(bf.new_cache().arrays.values(), f32.new_cache().arrays.values()))
    got, want = bf.logits(ids)[-64:], f32.logits(ids)[-64:]
    cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    print(f"bf16 KV cache: min cos of the last 64 positions' logits vs an f32 cache {cos.min():.6f}")
    assert cos.min() > 0.995


def test_split_plan_is_recorded() -> None:
    """The lowered program names the decode kernel and its split (`DecodeSplitKv`), sized for the SMs."""
    from rlx.codegen.cuda import CudaTarget
    from rlx.ir.decisions_cuda import DecodeSplitKv
    from rlx.opt.memplan import plan
    from rlx.pipeline.cuda import decide_cuda

    lir = decide_cuda(plan(_graph(*SMOL, 16384)), CudaTarget(precision="f16"))
    (d,) = lir.decided(DecodeSplitKv)
    # 4 blocks an SM (the kernel's register bound at 3 heads x 8 dims a lane): 4 x 132 SMs / 3 KV heads = 176,
    # capped at KVD_MAX_SPLITS
    assert d.grouped and d.group == 3 and d.blocks_per_sm == 4 and d.max_splits == 128
    assert "rlx_kv_decode" in lir.inspect()

"""CPU `cached_attention`: appends to caller-owned KV caches in place and attends causally over them."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import compile_graph

import rlx
from rlx.errors import BuildError, ExecutionError, ShapeError
from rlx.reference import run as reference_run

H, KV, D, CAPACITY, MAX_BATCH = 4, 2, 16, 40, 2


def _graph(scale: float | None = None, window: int | None = None) -> rlx.Graph:
    g = rlx.Graph("kv_attention")
    seq, batch = rlx.Dim.dynamic("seq", 16), rlx.Dim.dynamic("batch", MAX_BATCH)
    q = g.input("q", [batch, seq, H * D])
    k = g.input("k", [batch, seq, KV * D])
    v = g.input("v", [batch, seq, KV * D])
    kc = g.state("k_cache", [MAX_BATCH, CAPACITY, KV * D])
    vc = g.state("v_cache", [MAX_BATCH, CAPACITY, KV * D])
    pos = g.input("pos", [batch], "i32")
    g.set_outputs([g.cached_attention(q, k, v, kc, vc, pos, num_heads=H, head_dim=D, num_kv_heads=KV,
                                      scale=scale, window=window)])
    return g


def _step(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    return {"q": rng.standard_normal((batch, seq, H * D)).astype(np.float32),
            "k": rng.standard_normal((batch, seq, KV * D)).astype(np.float32),
            "v": rng.standard_normal((batch, seq, KV * D)).astype(np.float32)}


def _caches() -> tuple[np.ndarray, np.ndarray]:
    return (np.zeros((MAX_BATCH, CAPACITY, KV * D), np.float32), np.zeros((MAX_BATCH, CAPACITY, KV * D), np.float32))


@pytest.mark.parametrize("batch", [1, 2])
def test_prefill_then_decode_matches_reference_and_updates_cache(batch: int) -> None:
    g = _graph()
    cg = compile_graph(g)
    rng = np.random.default_rng(batch)
    kc, vc = _caches()
    rk, rv = _caches()
    # rows at different positions: batched decoding of sequences of different lengths
    pos = np.array([0, 3][:batch], np.int32)
    for seq in (5, 1, 1, 9, 1, 16):
        ins = {**_step(rng, batch, seq), "pos": pos}
        out = cg.run({**ins, "k_cache": kc, "v_cache": vc})[0]
        want = reference_run(g, {**ins, "k_cache": rk, "v_cache": rv})[0]
        # softmax over <= 40 keys of 16-term dot products: a few f32 roundings
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)
        np.testing.assert_array_equal(kc, rk)
        np.testing.assert_array_equal(vc, rv)
        pos = pos + seq
    assert kc[0, :int(pos[0])].any() and not kc[0, int(pos[0]):].any()


@pytest.mark.parametrize("window", [1, 6])
def test_sliding_window_matches_reference(window: int) -> None:
    """Rows at different positions, prefill chunks longer and shorter than the window, then decode steps:
    each query sees only its last `window` keys (the prefill path and the split decode path)."""
    g = _graph(window=window)
    cg = compile_graph(g)
    rng = np.random.default_rng(window)
    kc, vc = _caches()
    rk, rv = _caches()
    pos = np.array([0, 3], np.int32)
    for seq in (9, 1, 1, 4, 1, 12, 1):
        ins = {**_step(rng, 2, seq), "pos": pos}
        out = cg.run({**ins, "k_cache": kc, "v_cache": vc})[0]
        want = reference_run(g, {**ins, "k_cache": rk, "v_cache": rv})[0]
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)
        pos = pos + seq


def test_reference_window_is_a_banded_causal_mask() -> None:
    """The oracle itself: token by token with window 4 == one attention over all tokens with a band mask."""
    rng = np.random.default_rng(3)
    steps = _step(rng, 1, 10)
    g = _graph(window=4)
    kc, vc = _caches()
    outs = [reference_run(g, {name: a[:, t:t + 1] for name, a in steps.items()} | {
        "pos": np.array([t], np.int32), "k_cache": kc, "v_cache": vc})[0] for t in range(10)]
    i, j = np.arange(10)[:, None], np.arange(10)[None, :]
    band = np.where((j <= i) & (i - j < 4), 0.0, -np.inf).astype(np.float32)
    full = rlx.Graph("band")
    q, k, v = (full.input(n, [1, 10, w * D]) for n, w in (("q", H), ("k", KV), ("v", KV)))
    bias = full.input("bias", [10, 10])
    full.set_outputs([full.attention(q, k, v, num_heads=H, head_dim=D, num_kv_heads=KV, mask="bias", mask_input=bias)])
    want = reference_run(full, {**steps, "bias": band})[0]
    np.testing.assert_allclose(np.concatenate(outs, axis=1), want, rtol=1e-6, atol=1e-7)


def test_decode_equals_attention_over_the_whole_sequence() -> None:
    """Token by token through the cache == one causal attention over all tokens (the cache is right)."""
    rng = np.random.default_rng(7)
    steps = _step(rng, 1, 12)
    cg = compile_graph(_graph())
    kc, vc = _caches()
    outs = [cg.run({name: a[:, t:t + 1] for name, a in steps.items()} | {
        "pos": np.array([t], np.int32), "k_cache": kc, "v_cache": vc})[0] for t in range(12)]
    full = rlx.Graph("full")
    q, k, v = (full.input(n, [1, 12, w * D]) for n, w in (("q", H), ("k", KV), ("v", KV)))
    full.set_outputs([full.attention(q, k, v, num_heads=H, head_dim=D, num_kv_heads=KV, mask="causal")])
    want = reference_run(full, steps)[0]
    np.testing.assert_allclose(np.concatenate(outs, axis=1), want, rtol=2e-5, atol=2e-6)


def test_overflowing_the_cache_is_a_clear_error() -> None:
    cg = compile_graph(_graph())
    kc, vc = _caches()
    ins = {**_step(np.random.default_rng(0), 1, 4), "k_cache": kc, "v_cache": vc}
    with pytest.raises(ExecutionError, match="exceeds the cache capacity 40"):
        cg.run({**ins, "pos": np.array([CAPACITY - 3], np.int32)})
    with pytest.raises(ExecutionError, match="exceeds the cache capacity"):
        cg.run({**ins, "pos": np.array([-1], np.int32)})
    assert not kc.any()  # nothing was written


def test_state_inputs_are_never_copied() -> None:
    cg = compile_graph(_graph())
    kc, vc = _caches()
    ins = {**_step(np.random.default_rng(0), 1, 1), "pos": np.array([0], np.int32)}
    for bad in (kc.astype(np.float64), kc[:, ::-1], np.zeros((1, CAPACITY, KV * D), np.float32)):
        with pytest.raises(ExecutionError, match="state input 'k_cache'"):
            cg.run({**ins, "k_cache": bad, "v_cache": vc})


def test_bad_shapes_are_refused() -> None:
    g = rlx.Graph("bad")
    q = g.input("q", [1, 4, H * D])
    k = g.input("k", [1, 4, KV * D])
    kc = g.state("kc", [1, 2, KV * D])  # capacity 2 < seq 4
    pos = g.input("pos", [1], "i32")
    with pytest.raises(ShapeError, match="exceed the cache"):
        g.cached_attention(q, k, k, kc, kc, pos, num_heads=H, head_dim=D, num_kv_heads=KV)
    with pytest.raises(ShapeError, match="static shape"):
        g.state("dyn", [rlx.Dim.dynamic("n", 4)])


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_rows_over_a_long_cache_match_reference(threads: int) -> None:
    """Steps of a few rows (the one-pass decode kernel of kernels/kv_decode.h): 3 query heads per kv
    head, a head size no multiple of 16, rows at different depths of a cache long enough for the
    team to split the kv heads."""
    heads, kv, hd, capacity = 6, 2, 20, 2304
    g = rlx.Graph("kv_decode")
    seq, batch = rlx.Dim.dynamic("seq", 4), rlx.Dim.dynamic("batch", 2)
    q = g.input("q", [batch, seq, heads * hd])
    k, v = (g.input(n, [batch, seq, kv * hd]) for n in ("k", "v"))
    kc, vc = (g.state(n, [2, capacity, kv * hd]) for n in ("k_cache", "v_cache"))
    pos_in = g.input("pos", [batch], "i32")
    g.set_outputs([g.cached_attention(q, k, v, kc, vc, pos_in, num_heads=heads, head_dim=hd, num_kv_heads=kv)])
    cg = compile_graph(g)
    cg.num_threads = threads
    rng = np.random.default_rng(threads)
    kc0, vc0 = (rng.standard_normal((2, capacity, kv * hd)).astype(np.float32) for _ in range(2))
    caches, ref_caches = (kc0.copy(), vc0.copy()), (kc0.copy(), vc0.copy())
    pos = np.array([2200, 0], np.int32)  # row 1 starts empty: one thread's range of its keys is empty
    for s in (1, 2, 1, 3):
        ins = {"q": rng.standard_normal((2, s, heads * hd)).astype(np.float32),
               "k": rng.standard_normal((2, s, kv * hd)).astype(np.float32),
               "v": rng.standard_normal((2, s, kv * hd)).astype(np.float32), "pos": pos}
        out = cg.run({**ins, "k_cache": caches[0], "v_cache": caches[1]})[0]
        want = reference_run(g, {**ins, "k_cache": ref_caches[0], "v_cache": ref_caches[1]})[0]
        # softmax over up to 2207 keys of 20-term dot products
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)
        np.testing.assert_array_equal(caches[0], ref_caches[0])
        pos = pos + s


def test_cpu_refuses_a_cache_narrower_than_the_compute() -> None:
    """An f16 KV cache beside f32 queries runs on CUDA only: the CPU says so before any build (legalization never
    widens a cache it would then update in place)."""
    g = rlx.Graph("kv16")
    q, k, v = (g.input(n, [1, 2, 16]) for n in "qkv")
    kc, vc = (g.state(n, [1, 8, 16], "f16") for n in ("k_cache", "v_cache"))
    g.set_outputs([g.cached_attention(q, k, v, kc, vc, g.input("pos", [1], "i32"), num_heads=2, head_dim=8)])
    with pytest.raises(BuildError, match="with f16 KV caches beside f32 queries"):
        rlx.Session("cpu").compile(g)


def test_metal_refuses_a_window_at_render() -> None:
    """Metal has no windowed kernel yet: a clear BuildError when rendering, before any build."""
    from rlx.codegen.metal import MetalTarget
    from rlx.driver import lower_to_lir, to_mir
    from rlx.pipeline.metal import render_metal

    lir = lower_to_lir(to_mir(_graph(window=4)), 0, backend="metal")
    with pytest.raises(BuildError, match=r"sliding window \(4\) has no Metal"):
        render_metal(lir, MetalTarget(), lir.manifest())


def test_cuda_renders_a_window() -> None:
    """CUDA runs windows (kernels/kv_attention.cuh and kv_decode.cuh; parity: tests/gpu, the emulator tests): the
    window reaches both launches."""
    from rlx.codegen.cuda import CudaTarget
    from rlx.driver import lower_to_lir, to_mir
    from rlx.pipeline.cuda import render_cuda

    src = render_cuda(lower_to_lir(to_mir(_graph(window=4)), 0, backend="cuda"), CudaTarget(), {"name": "w"})
    assert src.count("(int64_t)4, RLX_FLAG(c)") >= 2 and ", true, false>, dim3(" in src  # WINDOW, not PAGED

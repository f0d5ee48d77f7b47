"""The CUDA decoder attention (templates/cuda/kernels/kv_attention.cuh) runs on the CPU through the CUDA shim
(tests/codegen/cuda_emu/cuda_shim.h), against rlx.reference: queries over a long past split their keys over
several blocks (DecodeSplitKv, flash-decoding) and the last block merges the partials; the split count comes from
`rlx.opt.lowering_cuda.kv_splits`, the launch as templates/cuda/decoder.cu.j2 makes it. The grouped decode kernel
(templates/cuda/kernels/kv_decode.cuh: a block per KV head for its query heads, 16-byte loads, rotary embedding,
sliding window, f16 caches as _Float16, f8e4m3fn caches as the shim's e4m3 bytes) likewise. Needs g++ with C++20."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
from cuda_emu_build import build_emu

from rlx import reference
from rlx.ir import ops as O
from rlx.opt.lowering_cuda import KV_SPLIT_KEYS, KVD_MAX_SPLITS, KVD_SPLIT_KEYS, kv_splits, kvd_splits

F32P = ctypes.POINTER(ctypes.c_float)
I32P = ctypes.POINTER(ctypes.c_int32)
HEADS, KV_HEADS, HD, CAP = 4, 2, 64, 1100
#: the grouped decode tests' cache rows (fewer: each emulated block is 128 threads)
CAP_D = 160
#: the emulated decode kernels' cache argument for each cache dtype
_CACHES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(ml_dtypes.float8_e4m3fn): 2}


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "kv_emu.cpp")
    i64 = ctypes.c_int64
    lib.emu_kv_attend.restype = ctypes.c_int
    lib.emu_kv_attend.argtypes = [F32P] * 5 + [I32P, F32P, i64, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.c_float,
                                               ctypes.c_uint, i64, F32P, I32P, i64]
    return lib


def _p(a: np.ndarray) -> ctypes._Pointer:
    return a.ctypes.data_as(F32P)


def _run(emu: ctypes.CDLL, positions: list[int], sq: int, splits: int, seed: int) -> None:
    r = np.random.default_rng(seed)
    batch = len(positions)
    q = r.standard_normal((batch, sq, HEADS * HD)).astype(np.float32)
    k, v = (r.standard_normal((batch, sq, KV_HEADS * HD)).astype(np.float32) for _ in range(2))
    kc, vc = (r.standard_normal((batch, CAP, KV_HEADS * HD)).astype(np.float32) for _ in range(2))
    pos = np.array(positions, np.int32)
    op = O.CachedAttention(num_heads=HEADS, head_dim=HD, num_kv_heads=KV_HEADS)
    ref_kc, ref_vc = kc.copy(), vc.copy()
    want = reference.cached_attention(q, k, v, ref_kc, ref_vc, pos, op)
    out = np.full_like(q, np.nan)
    rows = batch * sq
    partials = np.full(rows * HEADS * splits * (HD + 2), np.nan, np.float32)
    counters = np.zeros(rows * HEADS, np.int32)
    flag = emu.emu_kv_attend(_p(q), _p(k), _p(v), _p(kc), _p(vc), pos.ctypes.data_as(I32P), _p(out), batch, sq,
                             CAP, HEADS, KV_HEADS, op.softmax_scale, splits, KV_SPLIT_KEYS, _p(partials),
                             counters.ctypes.data_as(I32P), 0)
    assert flag == 0
    np.testing.assert_array_equal(kc, ref_kc)  # the step's keys and values appended once, at each row's position
    np.testing.assert_array_equal(vc, ref_vc)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert not counters.any(), "the merging block leaves every counter at zero for the next launch"


@pytest.mark.parametrize(("positions", "sq"), [
    ([700, 1090], 1),  # 3 and 5 blocks of keys
    ([257, 511], 2),   # queries of one row across a split boundary
    ([0], 1),          # one key: one block, the output written directly
    ([255], 1),        # exactly one block's keys
    ([256], 1),        # one key more: two blocks
    ([1099], 1),       # the last cache row
])
def test_split_decode_matches_reference(emu: ctypes.CDLL, positions: list[int], sq: int) -> None:
    _run(emu, positions, sq, kv_splits(CAP), seed=sum(positions) + sq)


def test_unsplit_launch_matches_reference(emu: ctypes.CDLL) -> None:
    """gridDim.z == 1 (prefill steps, short caches): one block takes the whole past, as before splitting existed."""
    _run(emu, [600, 3], 2, 1, seed=7)


def test_more_keys_than_splits_allow(emu: ctypes.CDLL) -> None:
    """With fewer blocks than the past wants (the split cap), each block takes more than KV_SPLIT_KEYS keys."""
    _run(emu, [1000], 1, 2, seed=8)


def test_split_counts() -> None:
    assert kv_splits(CAP) == 5
    assert kv_splits(KV_SPLIT_KEYS) == 1


PAGE, MAX_PAGES, NUM_PAGES = 16, 20, 40  # 320 tokens a row: a decode query over more than 256 keys splits


def _paged(emu: ctypes.CDLL) -> ctypes._FuncPointer:
    i64 = ctypes.c_int64
    f = emu.emu_kv_attend_paged
    f.restype = ctypes.c_int
    f.argtypes = [F32P] * 5 + [I32P, F32P, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_uint, i64,
                               F32P, I32P, I32P, i64, i64, i64, i64]
    return f


def test_paged_layout_matches_the_reference_and_rows_read_each_others_keys(emu: ctypes.CDLL) -> None:
    """PAGED: rows over scattered pages (the split decode path for the long one), and rows 1, 2 two consecutive
    tokens of one sequence sharing its block table (row 2 reads the key row 1 appends)."""
    _paged_case(emu, None)


def test_paged_layout_with_a_sliding_window(emu: ctypes.CDLL) -> None:
    """PAGED and WINDOW together: each query's last 100 keys, read through its block table (split for the long row)."""
    _paged_case(emu, 100)


def _paged_case(emu: ctypes.CDLL, window: int | None) -> None:
    r = np.random.default_rng(11)
    positions = np.array([290, 20, 21], np.int32)
    table = np.zeros((3, MAX_PAGES), np.int32)
    pages = r.permutation(NUM_PAGES).astype(np.int32)
    table[0, :19] = pages[:19]
    table[1:, :2] = pages[19:21]
    q = r.standard_normal((3, 1, HEADS * HD)).astype(np.float32)
    k, v = (r.standard_normal((3, 1, KV_HEADS * HD)).astype(np.float32) for _ in range(2))
    kc, vc = (r.standard_normal((NUM_PAGES, PAGE, KV_HEADS * HD)).astype(np.float32) for _ in range(2))
    op = O.CachedAttention(num_heads=HEADS, head_dim=HD, num_kv_heads=KV_HEADS, page_size=PAGE, window=window)
    ref_kc, ref_vc = kc.copy(), vc.copy()
    want = reference.cached_attention(q, k, v, ref_kc, ref_vc, positions, op, table)
    splits = kv_splits(PAGE * MAX_PAGES)
    out = np.full_like(q, np.nan)
    partials = np.full(3 * HEADS * splits * (HD + 2), np.nan, np.float32)
    counters = np.zeros(3 * HEADS, np.int32)
    flag = _paged(emu)(_p(q), _p(k), _p(v), _p(kc), _p(vc), positions.ctypes.data_as(I32P), _p(out), 3, 1, HEADS,
                       KV_HEADS, op.softmax_scale, splits, KV_SPLIT_KEYS, _p(partials), counters.ctypes.data_as(I32P),
                       table.ctypes.data_as(I32P), PAGE, MAX_PAGES, NUM_PAGES, window or 0)
    assert flag == 0
    np.testing.assert_array_equal(kc, ref_kc)
    np.testing.assert_array_equal(vc, ref_vc)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_paged_page_outside_the_pool_raises_the_flag(emu: ctypes.CDLL) -> None:
    q = np.zeros((1, 1, HEADS * HD), np.float32)
    k = np.zeros((1, 1, KV_HEADS * HD), np.float32)
    kc = np.zeros((NUM_PAGES, PAGE, KV_HEADS * HD), np.float32)
    table = np.full((1, MAX_PAGES), NUM_PAGES, np.int32)
    out, counters = np.zeros_like(q), np.zeros(HEADS, np.int32)
    flag = _paged(emu)(_p(q), _p(k), _p(k), _p(kc), _p(kc.copy()), np.zeros(1, np.int32).ctypes.data_as(I32P), _p(out),
                       1, 1, HEADS, KV_HEADS, 1.0, 1, KV_SPLIT_KEYS, _p(np.zeros(HEADS * (HD + 2), np.float32)),
                       counters.ctypes.data_as(I32P), table.ctypes.data_as(I32P), PAGE, MAX_PAGES, NUM_PAGES, 0)
    assert flag == 4 and not kc.any()


# ── rlx_kv_decode (kernels/kv_decode.cuh): the grouped decode kernel, a block per (query, KV head) ──


@pytest.fixture(scope="module")
def kvd(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "kvd_emu.cpp")
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    lib.emu_kv_decode.restype = ctypes.c_int
    c_int = ctypes.c_int
    lib.emu_kv_decode.argtypes = [F32P] * 3 + [vp, vp, I32P, F32P, i64, i64, i64, c_int, c_int, ctypes.c_float, i64,
                                               F32P, F32P, c_int, c_int, c_int, ctypes.c_uint, i64, F32P, I32P]
    return lib


def _rope_tables(r: np.random.Generator, rows: tuple[int, ...], rot: int) -> tuple[np.ndarray, np.ndarray]:
    """Random rope tables `rows + [rot/2]` (cos, sin of the same angles)."""
    ang = r.uniform(0, 6, (*rows, rot // 2))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _rotated(q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray, rope: str | None,
             rot: int) -> tuple[np.ndarray, np.ndarray]:
    """q and k as the reference rotates them (`rope` None: as they are)."""
    if rope is None:
        return q, k
    rop = O.Rope(head_dim=HD, n_rot=rot, variant=rope)
    return tuple(reference.rope(x, cos, sin, rop).astype(np.float32) for x in (q, k))  # type: ignore[return-value]


def _decode(kvd: ctypes.CDLL, positions: list[int], sq: int, *, splits: int, window: int | None = None,
            rope: str | None = None, rot: int = HD, cache: type = np.float32, seed: int = 0,
            split_keys: int = KVD_SPLIT_KEYS, value_scale: float = 1.0) -> None:
    """One rlx_kv_decode launch against rlx.reference (rope: the queries and new keys rotated first, as
    `DecodeRope` has the kernel do), the caches compared bit for bit."""
    r = np.random.default_rng(seed)
    batch = len(positions)
    q = r.standard_normal((batch, sq, HEADS * HD)).astype(np.float32)
    k = r.standard_normal((batch, sq, KV_HEADS * HD)).astype(np.float32)
    v = (r.standard_normal((batch, sq, KV_HEADS * HD)) * value_scale).astype(np.float32)
    kc, vc = (r.standard_normal((batch, CAP_D, KV_HEADS * HD)).astype(cache) for _ in range(2))
    cos, sin = _rope_tables(r, (sq,), rot)
    pos = np.array(positions, np.int32)
    op = O.CachedAttention(num_heads=HEADS, head_dim=HD, num_kv_heads=KV_HEADS, window=window)
    rq, rk = _rotated(q, k, cos, sin, rope, rot)
    ref_kc, ref_vc = kc.copy(), vc.copy()
    want = reference.cached_attention(rq, rk, v, ref_kc, ref_vc, pos, op)
    out = np.full_like(q, np.nan)
    partials = np.full(batch * sq * HEADS * splits * (HD + 2), np.nan, np.float32)
    counters = np.zeros(batch * sq * KV_HEADS, np.int32)
    flag = kvd.emu_kv_decode(_p(q), _p(k), _p(v), kc.ctypes.data, vc.ctypes.data, pos.ctypes.data_as(I32P), _p(out),
                             batch, sq, CAP_D, HEADS, KV_HEADS, op.softmax_scale, window or 0, _p(cos), _p(sin), rot,
                             {None: 0, "interleaved": 1, "neox": 2}[rope], _CACHES[np.dtype(cache)], splits,
                             split_keys, _p(partials), counters.ctypes.data_as(I32P))
    assert flag == 0
    if rope is None:
        np.testing.assert_array_equal(kc, ref_kc)  # the step's rows appended once, rounded to the cache dtype
    else:  # rotated in f32 by the kernel, in f64 by the reference: equal up to the cache's rounding
        np.testing.assert_allclose(kc.astype(np.float32), ref_kc.astype(np.float32), rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(vc, ref_vc)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    assert not counters.any(), "the merging block leaves every counter at zero for the next launch"


@pytest.mark.parametrize(("positions", "sq", "sms"), [
    ([100, 150], 1, 4),   # 3 splits (4 SMs' worth) of ~50 keys, 2 of them for the shorter row
    ([130], 2, 132),      # two queries, their blocks split differently
    ([0], 1, 132),        # one key: one block, the output written directly
    ([156], 4, 2),        # 4 new rows up to the last cache row, 1 split
])
def test_grouped_decode_matches_reference(kvd: ctypes.CDLL, positions: list[int], sq: int, sms: int) -> None:
    _decode(kvd, positions, sq, splits=kvd_splits(CAP_D, KV_HEADS, sms), seed=sum(positions) + sq + sms)


@pytest.mark.parametrize(("positions", "split_keys"), [
    ([127], 1),       # 128 keys over the most splits, one key each: every lane of the merge holds 4 splits
    ([150, 20], 1),   # 76 splits of 2 keys and 21 of one key: partly filled lanes and a short last round
    ([90], 3),        # 31 splits: one split a lane, most warps' last round short
])
def test_grouped_decode_merges_many_splits(kvd: ctypes.CDLL, positions: list[int], split_keys: int) -> None:
    """The last block's merge over up to KVD_MAX_SPLITS partials (as a 16k-token context splits)."""
    _decode(kvd, positions, 1, splits=KVD_MAX_SPLITS, split_keys=split_keys, seed=sum(positions) + split_keys)


@pytest.mark.parametrize(("rope", "rot"), [("interleaved", HD), ("neox", 32)])
def test_grouped_decode_rotates_queries_and_new_keys(kvd: ctypes.CDLL, rope: str, rot: int) -> None:
    _decode(kvd, [120], 2, splits=kvd_splits(CAP_D, KV_HEADS, 132), rope=rope, rot=rot, seed=rot)


@pytest.mark.parametrize(("positions", "window"), [([150, 30], 70), ([5], 1)])
def test_grouped_decode_sliding_window(kvd: ctypes.CDLL, positions: list[int], window: int) -> None:
    """Only each query's last `window` keys; the split count from the window (`visible_keys`)."""
    _decode(kvd, positions, 1, splits=kvd_splits(window, KV_HEADS, 132), window=window, seed=window)


def test_grouped_decode_f16_cache(kvd: ctypes.CDLL) -> None:
    """f32 compute over an f16 cache: the new rows stored rounded, attention reading every row as stored."""
    _decode(kvd, [140, 40], 1, splits=kvd_splits(CAP_D, KV_HEADS, 132), cache=np.float16, seed=16)
    _decode(kvd, [90], 2, splits=kvd_splits(CAP_D, KV_HEADS, 132), rope="neox", cache=np.float16, seed=17)


def test_grouped_decode_f8_cache(kvd: ctypes.CDLL) -> None:
    """An f8e4m3fn cache (one byte a value, 16 a load): the new rows stored rounded, attention reading every row as
    stored; new values past 448 saturate there, as CUDA's conversion does."""
    _decode(kvd, [140, 40], 1, splits=kvd_splits(CAP_D, KV_HEADS, 132), cache=ml_dtypes.float8_e4m3fn, seed=18)
    _decode(kvd, [100], 3, splits=kvd_splits(CAP_D, KV_HEADS, 132), cache=ml_dtypes.float8_e4m3fn, seed=19,
            value_scale=300.0)


def test_attend_sliding_window(emu: ctypes.CDLL) -> None:
    """rlx_kv_attend (prefill steps) with a window: each query's last `window` keys, split or not."""
    r = np.random.default_rng(5)
    for positions, sq, splits, window in (([600, 3], 2, 1, 50), ([700], 1, kv_splits(CAP), 300)):
        batch = len(positions)
        q = r.standard_normal((batch, sq, HEADS * HD)).astype(np.float32)
        k, v = (r.standard_normal((batch, sq, KV_HEADS * HD)).astype(np.float32) for _ in range(2))
        kc, vc = (r.standard_normal((batch, CAP, KV_HEADS * HD)).astype(np.float32) for _ in range(2))
        pos = np.array(positions, np.int32)
        op = O.CachedAttention(num_heads=HEADS, head_dim=HD, num_kv_heads=KV_HEADS, window=window)
        ref_kc, ref_vc = kc.copy(), vc.copy()
        want = reference.cached_attention(q, k, v, ref_kc, ref_vc, pos, op)
        out = np.full_like(q, np.nan)
        partials = np.full(batch * sq * HEADS * splits * (HD + 2), np.nan, np.float32)
        counters = np.zeros(batch * sq * HEADS, np.int32)
        assert emu.emu_kv_attend(_p(q), _p(k), _p(v), _p(kc), _p(vc), pos.ctypes.data_as(I32P), _p(out), batch, sq,
                                 CAP, HEADS, KV_HEADS, op.softmax_scale, splits, KV_SPLIT_KEYS, _p(partials),
                                 counters.ctypes.data_as(I32P), window) == 0
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(kc, ref_kc)


# ── rlx_kv_decode over a paged cache, after rlx_kv_append_paged (the paged decoder's decode steps) ──

PAGE_D, MAX_PAGES_D, NUM_PAGES_D = 16, 12, 30


def _decode_paged_fn(kvd: ctypes.CDLL) -> ctypes._FuncPointer:
    i64, vp, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    f = kvd.emu_kv_decode_paged
    f.restype = c_int
    f.argtypes = [F32P] * 3 + [vp, vp, I32P, F32P, i64, c_int, c_int, ctypes.c_float, F32P, F32P, c_int, c_int, c_int,
                               ctypes.c_uint, i64, F32P, I32P, I32P, i64, i64, i64, c_int]
    return f


def _decode_paged(kvd: ctypes.CDLL, rope: str | None, cache: type, seed: int, rot: int = HD,
                  distinct: bool = False, inside: bool | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three one-token rows: a long one (its keys split over blocks) and two consecutive tokens of one sequence
    sharing a block table (the second reads the key the first appends); the keys rotated by the append kernel and
    the queries by the decode kernel, against rlx.reference. `distinct`: the third row is instead a copy of the
    second (a padding row: the same token of the same sequence), so the rows are distinct sequences as the
    distinct-rows hint allows, and the decode kernel stores the keys (no append launch; `inside` False: the append
    launch all the same). Returns out, kc, vc."""
    r = np.random.default_rng(seed)
    positions = np.array([150, 20, 20 if distinct else 21], np.int32)
    pages = r.permutation(NUM_PAGES_D).astype(np.int32)
    table = np.zeros((3, MAX_PAGES_D), np.int32)
    table[0, :10] = pages[:10]
    table[1:, :2] = pages[10:12]
    q = r.standard_normal((3, 1, HEADS * HD)).astype(np.float32)
    k, v = (r.standard_normal((3, 1, KV_HEADS * HD)).astype(np.float32) for _ in range(2))
    kc, vc = (r.standard_normal((NUM_PAGES_D, PAGE_D, KV_HEADS * HD)).astype(cache) for _ in range(2))
    cos, sin = _rope_tables(r, (3, 1), rot)  # one table row per batch row: each at its own position
    if distinct:
        q[2], k[2], v[2], cos[2], sin[2] = q[1], k[1], v[1], cos[1], sin[1]
    op = O.CachedAttention(num_heads=HEADS, head_dim=HD, num_kv_heads=KV_HEADS, page_size=PAGE_D)
    rq, rk = _rotated(q, k, cos, sin, rope, rot)
    ref_kc, ref_vc = kc.copy(), vc.copy()
    want = reference.cached_attention(rq, rk, v, ref_kc, ref_vc, positions, op, table)
    splits = kvd_splits(PAGE_D * MAX_PAGES_D, KV_HEADS, 132)
    assert splits > 1
    out = np.full_like(q, np.nan)
    partials = np.full(3 * HEADS * splits * (HD + 2), np.nan, np.float32)
    counters = np.zeros(3 * KV_HEADS, np.int32)
    flag = _decode_paged_fn(kvd)(_p(q), _p(k), _p(v), kc.ctypes.data, vc.ctypes.data, positions.ctypes.data_as(I32P),
                                 _p(out), 3, HEADS, KV_HEADS, op.softmax_scale, _p(cos), _p(sin), rot,
                                 {None: 0, "interleaved": 1, "neox": 2}[rope], _CACHES[np.dtype(cache)], splits,
                                 KVD_SPLIT_KEYS, _p(partials), counters.ctypes.data_as(I32P),
                                 table.ctypes.data_as(I32P), PAGE_D, MAX_PAGES_D, NUM_PAGES_D,
                                 int(distinct if inside is None else inside))
    assert flag == 0
    if rope is None:
        np.testing.assert_array_equal(kc, ref_kc)
    else:  # rotated in f32 by the append kernel, in f64 by the reference: equal up to the cache's rounding
        np.testing.assert_allclose(kc.astype(np.float32), ref_kc.astype(np.float32), rtol=1e-3, atol=1e-3)
        untouched = np.ones(NUM_PAGES_D, bool)
        untouched[[table[0, 9], table[1, 1]]] = False  # the pages of positions 150 and 20-21
        np.testing.assert_array_equal(kc[untouched], ref_kc[untouched])
    np.testing.assert_array_equal(vc, ref_vc)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    assert not counters.any()
    return out, kc, vc


@pytest.mark.parametrize(("rope", "rot"), [(None, HD), ("interleaved", HD), ("neox", 32)])
def test_paged_grouped_decode_matches_reference(kvd: ctypes.CDLL, rope: str | None, rot: int) -> None:
    _decode_paged(kvd, rope, np.float32, seed=rot + len(rope or ""), rot=rot)


def test_paged_grouped_decode_f16_cache(kvd: ctypes.CDLL) -> None:
    _decode_paged(kvd, "neox", np.float16, seed=5)


@pytest.mark.parametrize(("rope", "cache"), [(None, np.float32), ("interleaved", np.float32), ("neox", np.float16),
                                             (None, ml_dtypes.float8_e4m3fn)])
def test_paged_grouped_decode_stores_distinct_rows_itself(kvd: ctypes.CDLL, rope: str | None, cache: type) -> None:
    """The distinct-rows hint (`DecodeSplitKv.stores_rows`): with no append launch, rlx_kv_decode's blocks store each
    row's keys and values (a padding row storing the same ones twice) — against the reference, and bit for bit what
    the append kernel stores and the attention computes after it (the same rotation, the same rounding)."""
    seed = 9 + len(rope or "")
    inside = _decode_paged(kvd, rope, cache, seed=seed, distinct=True)
    appended = _decode_paged(kvd, rope, cache, seed=seed, distinct=True, inside=False)
    for a, b in zip(inside, appended):
        np.testing.assert_array_equal(a, b)


def test_paged_grouped_decode_f8_cache(kvd: ctypes.CDLL) -> None:
    """An f8e4m3fn pool: the appended keys and values rounded (and saturated) as rlx.reference stores them."""
    _decode_paged(kvd, None, ml_dtypes.float8_e4m3fn, seed=6)


@pytest.mark.parametrize("inside", [0, 1])
def test_paged_grouped_decode_over_many_small_pages(kvd: ctypes.CDLL, inside: int) -> None:
    """One unsplit block over 151 keys in 2-token pages (76 pages, scattered over the pool), with the append launch
    or the decode kernel storing the row: against the reference."""
    page, maxp, num_pages = 2, 100, 220
    r = np.random.default_rng(21)
    positions = np.array([150], np.int32)
    table = r.permutation(num_pages)[:maxp].astype(np.int32)[None]
    q = r.standard_normal((1, 1, HEADS * HD)).astype(np.float32)
    k, v = (r.standard_normal((1, 1, KV_HEADS * HD)).astype(np.float32) for _ in range(2))
    kc, vc = (r.standard_normal((num_pages, page, KV_HEADS * HD)).astype(np.float32) for _ in range(2))
    op = O.CachedAttention(num_heads=HEADS, head_dim=HD, num_kv_heads=KV_HEADS, page_size=page)
    ref_kc, ref_vc = kc.copy(), vc.copy()
    want = reference.cached_attention(q, k, v, ref_kc, ref_vc, positions, op, table)
    out = np.full_like(q, np.nan)
    cs = np.ones((1, HD // 2), np.float32)
    flag = _decode_paged_fn(kvd)(_p(q), _p(k), _p(v), kc.ctypes.data, vc.ctypes.data,
                                 positions.ctypes.data_as(I32P), _p(out), 1, HEADS, KV_HEADS, op.softmax_scale, _p(cs),
                                 _p(cs), HD, 0, 0, 1, KVD_SPLIT_KEYS, _p(np.zeros(HEADS * (HD + 2), np.float32)),
                                 np.zeros(KV_HEADS, np.int32).ctypes.data_as(I32P), table.ctypes.data_as(I32P),
                                 page, maxp, num_pages, inside)
    assert flag == 0
    np.testing.assert_array_equal(kc, ref_kc)
    np.testing.assert_array_equal(vc, ref_vc)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("inside", [0, 1])
def test_paged_grouped_decode_page_outside_the_pool_raises_the_flag(kvd: ctypes.CDLL, inside: int) -> None:
    """Either way (the append launch first, or the decode kernel storing the rows itself) nothing is stored."""
    q = np.zeros((1, 1, HEADS * HD), np.float32)
    k = np.ones((1, 1, KV_HEADS * HD), np.float32)
    kc = np.zeros((NUM_PAGES_D, PAGE_D, KV_HEADS * HD), np.float32)
    vc = kc.copy()
    table = np.full((1, MAX_PAGES_D), NUM_PAGES_D, np.int32)
    out = np.full_like(q, -7.0)
    cs = np.ones((1, HD // 2), np.float32)
    flag = _decode_paged_fn(kvd)(_p(q), _p(k), _p(k), kc.ctypes.data, vc.ctypes.data,
                                 np.zeros(1, np.int32).ctypes.data_as(I32P), _p(out), 1, HEADS, KV_HEADS, 1.0, _p(cs),
                                 _p(cs), HD, 1, 0, 1, KVD_SPLIT_KEYS, _p(np.zeros(HEADS * (HD + 2), np.float32)),
                                 np.zeros(KV_HEADS, np.int32).ctypes.data_as(I32P), table.ctypes.data_as(I32P),
                                 PAGE_D, MAX_PAGES_D, NUM_PAGES_D, inside)
    assert flag == 4 and not kc.any() and not vc.any() and (out == -7.0).all()

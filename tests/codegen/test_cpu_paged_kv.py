"""CPU `cached_attention` in the paged layout: the same outputs, bit for bit, as the contiguous layout (decode
and prefill steps), rows sharing pages and one sequence's tokens as one-token rows, and bad block tables refused."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import compile_graph

import rlx
from rlx.errors import ExecutionError
from rlx.reference import run as reference_run

H, KV, D, PAGE, MAX_PAGES, NUM_PAGES, ROWS = 4, 2, 16, 8, 5, 12, 3
CAPACITY = PAGE * MAX_PAGES


def _graph(paged: bool) -> rlx.Graph:
    g = rlx.Graph("paged_kv" if paged else "contiguous_kv")
    seq, batch = rlx.Dim.dynamic("seq", 16), rlx.Dim.dynamic("batch", ROWS)
    q = g.input("q", [batch, seq, H * D])
    k = g.input("k", [batch, seq, KV * D])
    v = g.input("v", [batch, seq, KV * D])
    shape = [NUM_PAGES, PAGE, KV * D] if paged else [ROWS, CAPACITY, KV * D]
    kc, vc = g.state("k_cache", shape), g.state("v_cache", shape)
    pos = g.input("pos", [batch], "i32")
    table = g.input("block_table", [batch, MAX_PAGES], "i32") if paged else None
    g.set_outputs([g.cached_attention(q, k, v, kc, vc, pos, num_heads=H, head_dim=D, num_kv_heads=KV,
                                      block_table=table, page_size=PAGE if paged else None)])
    return g


@pytest.fixture(scope="module")
def graphs():
    return _graph(False), compile_graph(_graph(False)), _graph(True), compile_graph(_graph(True))


def _step(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    return {n: rng.standard_normal((batch, seq, w * D)).astype(np.float32) for n, w in (("q", H), ("k", KV), ("v", KV))}


def test_paged_equals_contiguous_bit_for_bit_and_the_reference(graphs) -> None:
    _, flat, g_paged, paged = graphs
    rng = np.random.default_rng(0)
    # each row's pages scattered over the pool, in no order
    table = np.full((ROWS, MAX_PAGES), -1, np.int32)  # entries past a row's tokens are never read
    table[:, :3] = rng.permutation(NUM_PAGES)[:ROWS * 3].reshape(ROWS, 3)  # up to 24 tokens a row
    kc, vc = np.zeros((ROWS, CAPACITY, KV * D), np.float32), np.zeros((ROWS, CAPACITY, KV * D), np.float32)
    pk, pv = np.zeros((NUM_PAGES, PAGE, KV * D), np.float32), np.zeros((NUM_PAGES, PAGE, KV * D), np.float32)
    rk, rv = pk.copy(), pv.copy()
    pos = np.array([0, 2, 5], np.int32)
    for seq in (10, 1, 1, 1):  # a prefill step (packed attention, rows gathered), then decode steps
        ins = {**_step(rng, ROWS, seq), "pos": pos}
        want = flat.run({**ins, "k_cache": kc, "v_cache": vc})[0]
        got = paged.run({**ins, "block_table": table, "k_cache": pk, "v_cache": pv})[0]
        np.testing.assert_array_equal(got, want)
        ref = reference_run(g_paged, {**ins, "block_table": table, "k_cache": rk, "v_cache": rv})[0]
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
        pos = pos + seq
    for row in range(ROWS):  # the pages hold what the contiguous rows hold
        n = int(pos[row])
        gathered = pk[table[row, np.arange(n) // PAGE], np.arange(n) % PAGE]
        np.testing.assert_array_equal(gathered, kc[row, :n])
    np.testing.assert_array_equal(pk, rk)


def test_one_sequence_as_one_token_rows_sharing_a_prefix_page(graphs) -> None:
    """Rows 0..2 are tokens 8, 9, 10 of one sequence (one block table); its first page is a shared prefix another
    sequence wrote: each row sees the keys written by the rows before it in the same step, and equals the
    contiguous layout fed the same tokens one step at a time."""
    _, flat, _, paged = graphs
    rng = np.random.default_rng(1)
    prefix = _step(rng, 1, PAGE)
    pk, pv = np.zeros((NUM_PAGES, PAGE, KV * D), np.float32), np.zeros((NUM_PAGES, PAGE, KV * D), np.float32)
    table = np.zeros((ROWS, MAX_PAGES), np.int32)
    table[:, :2] = [7, 3]  # page 7: the shared prefix, page 3: this sequence's own
    paged.run({**prefix, "pos": np.zeros(1, np.int32), "block_table": table[:1], "k_cache": pk, "v_cache": pv})
    kc, vc = np.zeros((ROWS, CAPACITY, KV * D), np.float32), np.zeros((ROWS, CAPACITY, KV * D), np.float32)
    flat.run({**prefix, "pos": np.zeros(1, np.int32), "k_cache": kc, "v_cache": vc})
    tokens = _step(rng, 1, 3)
    rows = {n: a.reshape(3, 1, -1) for n, a in tokens.items()}
    got = paged.run({**rows, "pos": np.array([8, 9, 10], np.int32), "block_table": table, "k_cache": pk,
                     "v_cache": pv})[0]
    for i in range(3):
        one = {n: a[:, i:i + 1] for n, a in tokens.items()}
        want = flat.run({**one, "pos": np.array([8 + i], np.int32), "k_cache": kc, "v_cache": vc})[0]
        np.testing.assert_array_equal(got[i], want[0])


def test_bad_block_tables_and_positions_are_refused(graphs) -> None:
    _, _, _, paged = graphs
    rng = np.random.default_rng(2)
    pk, pv = np.zeros((NUM_PAGES, PAGE, KV * D), np.float32), np.zeros((NUM_PAGES, PAGE, KV * D), np.float32)
    table = np.full((1, MAX_PAGES), NUM_PAGES, np.int32)
    with pytest.raises(ExecutionError, match="outside the cache's 12 pages"):
        paged.run({**_step(rng, 1, 1), "pos": np.zeros(1, np.int32), "block_table": table, "k_cache": pk,
                   "v_cache": pv})
    with pytest.raises(ExecutionError, match="exceeds the cache capacity 40"):
        paged.run({**_step(rng, 1, 2), "pos": np.array([39], np.int32), "block_table": table * 0, "k_cache": pk,
                   "v_cache": pv})

"""The page pool and the paged KV store, alone (no model): reference counts, block tables, sharing a prefix,
copy-on-write, reclaiming cached pages when the pool runs short, and refusals."""

from __future__ import annotations

import pytest

from rlx.errors import RlxError
from rlx.serving.pages import PagedKv, PagePool


def test_pages_are_freed_when_their_last_holder_releases_them() -> None:
    pool = PagePool(num_pages=4, page_size=2)
    a = pool.take(3)
    assert a == [0, 1, 2] and pool.free == 1 and pool.take(2) is None and pool.free == 1
    pool.share(a[:2])
    pool.release(a)
    assert pool.used == 2 and list(pool.refs) == [1, 1, 0, 0]
    pool.release(a[:2])
    assert pool.free == 4
    with pytest.raises(RlxError, match="already free"):
        pool.release([0])
    with pytest.raises(RlxError, match="is free"):
        pool.share([0])


def test_block_tables_grow_by_pages_and_free_them() -> None:
    kv = PagedKv(PagePool(num_pages=6, page_size=4), max_seqs=2, max_context=16)
    a = kv.allocate(5)  # two pages
    b = kv.allocate(4)  # one
    assert (a, b) == (0, 1) and kv.tables[a, :2].tolist() == [0, 1] and kv.tables[b, 0] == 2
    assert kv.grow(a, 8) and kv.used_pages == 3  # still two pages
    assert kv.grow(a, 9) and kv.pages(a) == [0, 1, 3] and kv.tables[a, 2] == 3
    assert not kv.grow(a, 17)  # past max_context
    assert kv.allocate(1) is None  # no free slot
    kv.free(a)
    assert kv.used_pages == 1 and kv.free_pages == 5 and kv.used_slots == 1
    assert kv.grow(b, 16) and not kv.grow(b, 17)
    kv.free(b)
    assert kv.used_pages == 0 and kv.free_pages == 6


def test_shared_prefix_pages_are_copied_before_a_write() -> None:
    copies = []
    kv = PagedKv(PagePool(num_pages=8, page_size=4), max_seqs=2, max_context=16,
                 copy_page=lambda src, dst: copies.append((src, dst)))
    a = kv.allocate(8)
    shared = kv.pages(a)[:2]
    kv.pool.share(shared)  # a prefix cache keeps them too
    b = kv.allocate(10)  # three pages of its own, the first two replaced by the shared ones
    kv.adopt(b, shared)
    assert kv.pages(b)[:2] == shared and kv.tables[b, :2].tolist() == shared
    assert kv.used_pages == 3 and kv.cached_pages == 0 and list(kv.pool.refs[shared]) == [3, 3]
    assert kv.writable(b, 8, 10) and copies == []  # its own third page: nothing to copy
    assert kv.writable(b, 6, 9) and copies == [(shared[1], kv.pages(b)[1])]  # page 1 is shared: copied first
    assert kv.pages(b)[0] == shared[0] and kv.pool.refs[shared[1]] == 2
    kv.free(a)
    kv.free(b)
    assert kv.used_pages == 0 and kv.cached_pages == 2  # the prefix cache's hold remains
    kv.pool.release(shared)
    assert kv.free_pages == 8


def test_reclaim_is_asked_for_pages_when_the_pool_runs_short() -> None:
    asked = []
    pool = PagePool(num_pages=4, page_size=4)
    cached = pool.take(2)  # held by a prefix cache alone

    def reclaim(n: int) -> None:
        asked.append(n)
        pool.release([cached.pop()])

    kv = PagedKv(pool, max_seqs=2, max_context=12, reclaim=reclaim)
    assert kv.allocate(12) == 0 and asked == [1] and kv.cached_pages == 1


def test_refusals() -> None:
    with pytest.raises(RlxError, match="multiple of the page size"):
        PagedKv(PagePool(8, 4), max_seqs=1, max_context=10)
    with pytest.raises(RlxError, match="cannot hold one sequence"):
        PagedKv(PagePool(2, 4), max_seqs=1, max_context=12)
    with pytest.raises(RlxError, match="positive integer"):
        PagePool(0, 4)
    kv = PagedKv(PagePool(4, 4), max_seqs=1, max_context=8)
    with pytest.raises(RlxError, match="not allocated"):
        kv.grow(0, 4)

"""Paged KV storage: a pool of fixed-size pages with reference counts, and a block table per sequence.

`PagePool` hands out page ids and counts who holds each page (a sequence's block table, the prefix
cache): a page goes back to the free list when its last holder releases it. `PagedKv` is the
scheduler's `KvStore` over a pool: a sequence's slot is a row of the block tables `tables`
(`[max_seqs, max_context / page_size]`, i32, what the model's `block_table` input reads); it holds
ceil(tokens / page_size) pages. A prefix-cache hit `adopt`s shared pages at the front of a table
(copy-on-write: `writable` gives a sequence its own copy of a shared page before it is written);
when pages run out, `reclaim` (the prefix cache's eviction) is asked to free some first.

>>> kv = PagedKv(PagePool(num_pages=4, page_size=4), max_seqs=2, max_context=12)
>>> a = kv.allocate(6); b = kv.allocate(9); a, b, kv.used_pages, kv.free_pages
(0, None, 2, 2)
>>> kv.grow(a, 8), kv.grow(a, 9), kv.tables[a, :2].tolist()
(True, True, [0, 1])
>>> kv.free(a); kv.used_pages, kv.allocate(9)
(0, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rlx.errors import RlxError


class PagePool:
    """`num_pages` pages of `page_size` tokens; `take` pages (refcount 1), `share` and `release` them."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        for what, v in (("num_pages", num_pages), ("page_size", page_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise RlxError(f"{what} must be a positive integer, got {v!r}")
        self.num_pages, self.page_size = num_pages, page_size
        self.refs = np.zeros(num_pages, dtype=np.int64)
        self._free = list(range(num_pages - 1, -1, -1))  # popped from the end: lowest ids first

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.num_pages - len(self._free)

    def take(self, n: int) -> list[int] | None:
        """`n` free pages, each held once; None (and nothing taken) when fewer are free."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        self.refs[pages] = 1
        return pages

    def share(self, pages: Sequence[int]) -> None:
        """One more holder of each of `pages`."""
        for p in pages:
            if self.refs[p] < 1:
                raise RlxError(f"page {p} is free: it cannot be shared")
            self.refs[p] += 1

    def release(self, pages: Sequence[int]) -> None:
        """One holder fewer of each of `pages`; a page nobody holds is free again."""
        for p in pages:
            if self.refs[p] < 1:
                raise RlxError(f"page {p} is already free")
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self._free.append(int(p))


class PagedKv:
    """`KvStore` over a `PagePool` with a block table per sequence (see the module docstring).

    `reclaim(n)`: called when fewer than `n` pages are free, to free some (the prefix cache's LRU
    eviction); `copy_page(src, dst)`: copies a page's K/V in the model's caches (copy-on-write)."""

    def __init__(self, pool: PagePool, max_seqs: int, max_context: int,
                 reclaim: Callable[[int], None] | None = None,
                 copy_page: Callable[[int, int], None] | None = None) -> None:
        if max_context % pool.page_size:
            raise RlxError(f"max_context ({max_context}) must be a multiple of the page size ({pool.page_size})")
        if pool.num_pages < max_context // pool.page_size:
            raise RlxError(f"{pool.num_pages} pages of {pool.page_size} tokens cannot hold one sequence of "
                           f"max_context {max_context} tokens")
        self.pool, self.max_seqs, self.max_context = pool, max_seqs, max_context
        self.page_size = pool.page_size
        self.reclaim, self.copy_page = reclaim, copy_page
        # unused entries name page 0: never read (a row reads only the pages of its tokens), always in range
        self.tables = np.zeros((max_seqs, max_context // pool.page_size), dtype=np.int32)
        self._pages: list[list[int] | None] = [None] * max_seqs
        #: tokens each slot's pages hold (len(pages) * page_size; 0 for a free slot): the scheduler grows a slot
        #: only when its next token is past this
        self.capacity: list[int] = [0] * max_seqs

    # ── KvStore ───────────────────────────────────────────────────────

    @property
    def used_pages(self) -> int:
        """Pages held by sequences (each counted once, however many share it)."""
        return len({p for held in self._pages if held is not None for p in held})

    @property
    def cached_pages(self) -> int:
        """Pages only the prefix cache holds (freed on demand, see `reclaim`)."""
        return self.pool.used - self.used_pages

    @property
    def free_pages(self) -> int:
        return self.pool.free

    @property
    def used_tokens(self) -> int:
        return self.used_pages * self.page_size

    @property
    def free_tokens(self) -> int:
        return self.pool.free * self.page_size

    @property
    def used_slots(self) -> int:
        return sum(p is not None for p in self._pages)

    def pages(self, slot: int) -> list[int]:
        held = self._pages[slot]
        if held is None:
            raise RlxError(f"slot {slot} is not allocated")
        return held

    def _take(self, n: int) -> list[int] | None:
        if n > self.pool.free and self.reclaim is not None:
            self.reclaim(n - self.pool.free)
        return self.pool.take(n)

    def allocate(self, tokens: int) -> int | None:
        free = [s for s, p in enumerate(self._pages) if p is None]
        if not free or tokens > self.max_context:
            return None
        pages = self._take(-(-tokens // self.page_size))
        if pages is None:
            return None
        slot = free[0]
        self._pages[slot] = pages
        self.capacity[slot] = len(pages) * self.page_size
        self.tables[slot, :len(pages)] = pages
        return slot

    def grow(self, slot: int, tokens: int) -> bool:
        held = self.pages(slot)
        if tokens > self.max_context:
            return False
        more = -(-tokens // self.page_size) - len(held)
        if more > 0:
            pages = self._take(more)
            if pages is None:
                return False
            self.tables[slot, len(held):len(held) + more] = pages
            held.extend(pages)
            self.capacity[slot] = len(held) * self.page_size
        return True

    def truncate(self, slot: int, tokens: int) -> None:
        """Keep only the pages `slot`'s first `tokens` tokens fall in; the rest go back to the pool (the K/V of
        rejected speculative tokens: a later token's write lands in a page taken afresh).

        >>> kv = PagedKv(PagePool(num_pages=4, page_size=4), max_seqs=1, max_context=16)
        >>> s = kv.allocate(11); kv.truncate(s, 5); kv.pages(s), kv.free_pages
        ([0, 1], 2)
        """
        held = self.pages(slot)
        keep = -(-tokens // self.page_size)
        if keep < len(held):
            self.pool.release(held[keep:])
            self.tables[slot, keep:len(held)] = 0
            del held[keep:]
            self.capacity[slot] = keep * self.page_size

    def free(self, slot: int) -> None:
        held = self._pages[slot]
        if held is not None:
            self.pool.release(held)
            self._pages[slot] = None
            self.capacity[slot] = 0
            self.tables[slot] = 0

    # ── sharing ───────────────────────────────────────────────────────

    def adopt(self, slot: int, shared: Sequence[int]) -> None:
        """Make `shared` (pages another holder keeps: a cached prefix) the first pages of `slot`, in place of
        its own first pages, which are released."""
        held = self.pages(slot)
        if len(shared) > len(held):
            raise RlxError(f"{len(shared)} shared pages do not fit the {len(held)} pages of slot {slot}")
        self.pool.share(shared)
        self.pool.release(held[:len(shared)])
        held[:len(shared)] = shared
        self.tables[slot, :len(shared)] = shared

    def writable(self, slot: int, first: int, last: int) -> bool:
        """Before tokens first..last-1 of `slot` are written: each shared page they fall in is replaced by a
        copy of its own (copy-on-write); False when no page is free for a copy."""
        held = self.pages(slot)
        for i in range(first // self.page_size, -(-last // self.page_size)):
            page = held[i]
            if self.pool.refs[page] > 1:
                fresh = self._take(1)
                if fresh is None:
                    return False
                if self.copy_page is None:
                    raise RlxError("a shared page is written, and this store has no copy_page")
                self.copy_page(page, fresh[0])
                self.pool.release([page])
                held[i] = fresh[0]
                self.tables[slot, i] = fresh[0]
        return True

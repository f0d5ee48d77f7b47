"""Prefix caching: the K/V of full prompt blocks, keyed by their tokens, reused across requests (LRU).

A block is `block` tokens at an aligned position (the engine's prefill chunk, so a reused prefix
ends where a chunk would have ended, and what follows is computed exactly as without the cache).
Its key hashes the block's tokens together with the key of the block before it, so a key names
the whole prefix up to that block. `match` returns the longest run of cached blocks a context
starts with; `store` keeps a block's K/V (copies of the slot's rows, one array per cache state);
the least recently used blocks go once `max_bytes` is passed. With per-slot storage a hit copies
the blocks into the new sequence's slot; with paged storage a block is the ids of its pages (`sizeof`
their bytes), shared by the sequences that reuse them, and `on_evict` releases them when it goes.

>>> import numpy as np
>>> pc = PrefixCache(block=2, max_bytes=1 << 20)
>>> pc.store([1, 2, 3, 4], 0, {"k": np.ones((2, 3), np.float32)})
True
>>> pc.store([1, 2, 3, 4], 1, {"k": np.zeros((2, 3), np.float32)}), pc.store([1, 2], 0, {})
(True, False)
>>> [len(b) for b in pc.match([1, 2, 3, 4, 5])], pc.match([1, 2, 9, 9, 9]) != [], pc.match([7, 2, 3])
([1, 1], True, [])
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx.errors import RlxError


class PrefixCache:
    """Block K/V by prefix hash, least recently used first out (see the module docstring)."""

    def __init__(self, block: int, max_bytes: int, sizeof: Callable[[Any], int] | None = None,
                 on_evict: Callable[[Any], None] | None = None) -> None:
        if block < 1 or max_bytes < 0:
            raise RlxError(f"block must be >= 1 and max_bytes >= 0, got {block}, {max_bytes}")
        self.block, self.max_bytes = block, max_bytes
        self._sizeof = sizeof or (lambda kv: sum(a.nbytes for a in kv.values()))
        self._on_evict = on_evict
        self._blocks: OrderedDict[bytes, Any] = OrderedDict()
        self.bytes = 0
        self.hits = 0  # tokens reused
        self.evictions = 0  # blocks dropped (least recently used first)
        self.lookups = 0

    def _keys(self, tokens: Sequence[int], n_blocks: int) -> list[bytes]:
        keys, parent = [], b""
        ids = np.asarray(tokens[:n_blocks * self.block], dtype=np.int64)
        for i in range(n_blocks):
            parent = hashlib.blake2b(parent + ids[i * self.block:(i + 1) * self.block].tobytes(),
                                     digest_size=16).digest()
            keys.append(parent)
        return keys

    def match(self, tokens: Sequence[int]) -> list[Any]:
        """The cached blocks `tokens` starts with (each a `{state name: [block, width]}`, or what `store`
        was given), in order."""
        self.lookups += 1
        found = []
        for key in self._keys(tokens, len(tokens) // self.block):
            kv = self._blocks.get(key)
            if kv is None:
                break
            self._blocks.move_to_end(key)
            found.append(kv)
        self.hits += len(found) * self.block
        return found

    def store(self, tokens: Sequence[int], index: int, kv: Mapping[str, np.ndarray] | Any) -> bool:
        """Keep block `index` of `tokens` (its K/V `kv`, copied; or page ids, kept) unless it is cached already;
        whether it was added."""
        if (index + 1) * self.block > len(tokens):
            raise RlxError(f"block {index} of {self.block} tokens is not within the {len(tokens)} tokens given")
        key = self._keys(tokens, index + 1)[-1]
        if key in self._blocks:
            self._blocks.move_to_end(key)
            return False
        size = self._sizeof(kv)
        if size > self.max_bytes:
            return False
        self._blocks[key] = {name: np.array(a) for name, a in kv.items()} if isinstance(kv, Mapping) else kv
        self.bytes += size
        while self.bytes > self.max_bytes:
            self.evict()
        return True

    def evict(self) -> bool:
        """Drop the least recently used block; False when there is none."""
        if not self._blocks:
            return False
        _, old = self._blocks.popitem(last=False)
        self.bytes -= self._sizeof(old)
        self.evictions += 1
        if self._on_evict is not None:
            self._on_evict(old)
        return True

    def clear(self) -> None:
        while self.evict():
            pass

    def __len__(self) -> int:
        return len(self._blocks)

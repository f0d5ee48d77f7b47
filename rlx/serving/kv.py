"""Where the engine's sequences keep their K/V: a small interface, and slots of `CausalLM`'s per-row cache.

The scheduler sees KV storage only through `KvStore`: `allocate` a sequence's storage for a number
of tokens, `grow` it, `free` it, and how many tokens are used and free. `SlotKv` implements it
with the rows ("slots") of one `KvCache` of `max_seqs` rows, each `max_context` tokens long, and a
token budget shared by all slots (so the scheduler runs out of KV before it runs out of slots, as
it would with pages). A paged cache (a pool of fixed-size pages and a block table per sequence)
replaces `SlotKv` behind the same interface.

>>> kv = SlotKv(slots=2, max_context=8, token_budget=10)
>>> a = kv.allocate(6); b = kv.allocate(5); a, b, kv.free_tokens
(0, None, 4)
>>> kv.grow(a, 7), kv.grow(a, 11), kv.used_tokens
(True, False, 7)
>>> kv.free(a); kv.used_tokens, kv.allocate(5)
(0, 0)
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from rlx.errors import RlxError


class KvStore(Protocol):
    """KV storage as the scheduler sees it: one allocation per running sequence, counted in tokens."""

    @property
    def used_tokens(self) -> int: ...

    @property
    def free_tokens(self) -> int: ...

    def allocate(self, tokens: int) -> int | None:
        """Storage for a sequence of `tokens` tokens: its slot, or None when there is no room."""

    def grow(self, slot: int, tokens: int) -> bool:
        """Let `slot` hold `tokens` tokens; False (and nothing changed) when there is no room."""

    def free(self, slot: int) -> None:
        """Give `slot`'s storage back."""


class SlotKv:
    """`KvStore` over `slots` rows of `max_context` tokens with `token_budget` tokens among them all
    (None: every slot full). The lowest free slot goes first, so running rows stay packed at the
    front of the cache (a decode step runs rows 0..highest used)."""

    def __init__(self, slots: int, max_context: int, token_budget: int | None = None) -> None:
        for what, v in (("slots", slots), ("max_context", max_context)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise RlxError(f"{what} must be a positive integer, got {v!r}")
        budget = slots * max_context if token_budget is None else token_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < max_context:
            raise RlxError(f"token_budget must be an integer >= max_context ({max_context}) so that one "
                           f"sequence always fits, got {token_budget!r}")
        self.slots, self.max_context, self.token_budget = slots, max_context, budget
        self._held = np.full(slots, -1, dtype=np.int64)  # tokens held by each slot; -1 = free

    @property
    def used_tokens(self) -> int:
        return int(self._held[self._held > 0].sum())

    @property
    def free_tokens(self) -> int:
        return self.token_budget - self.used_tokens

    @property
    def used_slots(self) -> int:
        return int((self._held >= 0).sum())

    def allocate(self, tokens: int) -> int | None:
        free = np.flatnonzero(self._held < 0)
        if free.size == 0 or tokens > self.max_context or tokens > self.free_tokens:
            return None
        slot = int(free[0])
        self._held[slot] = tokens
        return slot

    def grow(self, slot: int, tokens: int) -> bool:
        held = int(self._held[slot])
        if held < 0:
            raise RlxError(f"slot {slot} is not allocated")
        if tokens > self.max_context or tokens - held > self.free_tokens:
            return False
        self._held[slot] = max(held, tokens)
        return True

    def free(self, slot: int) -> None:
        self._held[slot] = -1

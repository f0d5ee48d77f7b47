"""Choosing the next token from logits: greedy, or seeded sampling with temperature, top-k and top-p.

>>> import numpy as np
>>> logits = np.array([[0.0, 3.0, 1.0]], np.float32)
>>> Sampler().pick(logits).tolist()
[1]
>>> s = Sampler(temperature=1.0, top_k=1, seed=0)
>>> s.pick(logits).tolist()
[1]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlx.errors import RlxError


@dataclass
class Sampler:
    """Greedy when `temperature == 0`; otherwise softmax(logits / temperature) restricted to the
    `top_k` most likely tokens and to the smallest set whose probability reaches `top_p`,
    sampled from a generator seeded with `seed` (same seed, same tokens)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and np.isfinite(self.temperature)
                and self.temperature >= 0):
            raise RlxError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise RlxError(f"top_k must be a positive integer, got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise RlxError(f"top_p must be in (0, 1], got {self.top_p!r}")
        self._rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def pick(self, logits: np.ndarray) -> np.ndarray:
        """One token id per row of `logits` `[rows, vocab]`."""
        logits = np.asarray(logits, dtype=np.float32)
        if self.greedy:
            return np.argmax(logits, axis=-1).astype(np.int64)
        return np.array([self._sample_row(row) for row in logits], dtype=np.int64)

    def _sample_row(self, row: np.ndarray) -> int:
        scaled = row.astype(np.float64) / self.temperature
        order = np.argsort(-scaled, kind="stable")
        if self.top_k is not None:
            order = order[: self.top_k]
        probs = np.exp(scaled[order] - scaled[order[0]])
        probs /= probs.sum()
        if self.top_p is not None:
            # keep the most likely tokens until their mass reaches top_p (always at least one)
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p) + 1)
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return int(order[self._rng.choice(len(order), p=probs)])

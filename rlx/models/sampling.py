"""Choosing the next token from logits: greedy, or seeded sampling with temperature, top-k and top-p.

Sampling is inverse-CDF at one uniform number per row drawn from the seeded generator
(`uniforms`), with the exact arithmetic of the `sample_top_k` op (`rlx.ir.ops_sample.sample_rows`):
the host (`pick`, from logits) and a compiled graph (the decoder's `sampled_token` output, fed
`uniforms` and `settings`) give the same token for the same u.

>>> import numpy as np
>>> logits = np.array([[0.0, 3.0, 1.0]], np.float32)
>>> Sampler().pick(logits).tolist()
[1]
>>> s = Sampler(temperature=1.0, top_k=1, seed=0)
>>> s.pick(logits).tolist()
[1]
>>> Sampler(temperature=0.8, top_k=40).on_device, Sampler(temperature=0.8).on_device
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlx.errors import RlxError
from rlx.ir.ops_sample import SAMPLE_TOP_K_MAX, sample_rows


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
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise RlxError(f"top_k must be a positive integer, got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise RlxError(f"top_p must be in (0, 1], got {self.top_p!r}")
        self._rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def on_device(self) -> bool:
        """True when the `sample_top_k` op can sample with these settings (temperature > 0 and top_k at
        most `SAMPLE_TOP_K_MAX`); otherwise a sampling step reads back the logits and `pick`s here."""
        return not self.greedy and self.top_k is not None and self.top_k <= SAMPLE_TOP_K_MAX

    def settings(self) -> np.ndarray:
        """The `sample_top_k` settings input: f64 (temperature, top_k, top_p), top_p 1 when not given."""
        top_k = 1 if self.top_k is None else min(self.top_k, SAMPLE_TOP_K_MAX)
        return np.array([self.temperature, top_k, 1.0 if self.top_p is None else self.top_p], np.float64)

    def uniforms(self, rows: int) -> np.ndarray:
        """The next `rows` uniform numbers in [0, 1) (f64) of this sampler's generator: one per row."""
        return self._rng.random(rows)

    def pick(self, logits: np.ndarray, u: np.ndarray | None = None) -> np.ndarray:
        """One token id per row of `logits` `[rows, vocab]` (i64); sampling draws `u` (one per row) from
        the generator unless given."""
        logits = np.asarray(logits, dtype=np.float32)
        if self.greedy:
            return np.argmax(logits, axis=-1).astype(np.int64)
        if u is None:
            u = self.uniforms(logits.shape[0])
        return sample_rows(logits, u, self.temperature, self.top_k, self.top_p).astype(np.int64)

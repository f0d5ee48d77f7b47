"""`Sampler` (rlx/models/sampling.py): seeded and reproducible, the same tokens as the textbook
`Generator.choice` sampling it replaced, the `sample_top_k` op's math for a given u, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.errors import RlxError
from rlx.ir.ops_sample import SAMPLE_TOP_K_MAX, sample_rows
from rlx.models.sampling import Sampler


def _choice_sampler(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
                    seed: int) -> list[int]:
    """The previous host implementation: a full sort, normalized probabilities, `Generator.choice`."""
    rng = np.random.default_rng(seed)
    out = []
    for row in logits:
        scaled = row.astype(np.float64) / temperature
        order = np.argsort(-scaled, kind="stable")
        if top_k is not None:
            order = order[:top_k]
        probs = np.exp(scaled[order] - scaled[order[0]])
        probs /= probs.sum()
        if top_p is not None:
            keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        out.append(int(order[rng.choice(len(order), p=probs)]))
    return out


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.8, 40, None), (1.0, None, 0.9), (0.5, 20, 0.8),
                                                             (2.0, None, None)])
def test_same_tokens_as_generator_choice_for_the_same_seed(temperature, top_k, top_p) -> None:
    logits = (np.random.default_rng(0).standard_normal((300, 120)) * 3).astype(np.float32)
    s = Sampler(temperature, top_k, top_p, seed=7)
    got = [int(t) for row in logits for t in s.pick(row[None])]  # one row per call, as decode steps
    assert got == _choice_sampler(logits, temperature, top_k, top_p, seed=7)
    assert Sampler(temperature, top_k, top_p, seed=7).pick(logits).tolist() == got  # all rows at once: same


def test_seeded_and_explicit_u() -> None:
    logits = np.random.default_rng(1).standard_normal((8, 50)).astype(np.float32)
    a, b, c = Sampler(0.9, 10, 0.95, seed=3), Sampler(0.9, 10, 0.95, seed=3), Sampler(0.9, 10, 0.95, seed=4)
    ta, tb, tc = a.pick(logits), b.pick(logits), c.pick(logits)
    assert ta.tolist() == tb.tolist() and ta.tolist() != tc.tolist()
    u = Sampler(seed=3).uniforms(8)
    assert u.dtype == np.float64 and np.all((u >= 0) & (u < 1))
    np.testing.assert_array_equal(Sampler(0.9, 10, 0.95).pick(logits, u), ta)
    np.testing.assert_array_equal(ta, sample_rows(logits, u, 0.9, 10, 0.95))


def test_greedy_draws_nothing_and_settings() -> None:
    s = Sampler(seed=1)
    assert s.greedy and not s.on_device
    assert s.pick(np.array([[0.0, 2.0, 2.0]], np.float32)).tolist() == [1]
    assert s.uniforms(1)[0] == np.random.default_rng(1).random()  # the generator was not advanced
    assert Sampler(0.8, 40, 0.9).settings().tolist() == [0.8, 40.0, 0.9]
    assert Sampler(0.8, 40).settings().tolist() == [0.8, 40.0, 1.0]
    assert Sampler(0.8, SAMPLE_TOP_K_MAX).on_device and not Sampler(0.8, SAMPLE_TOP_K_MAX + 1).on_device
    assert not Sampler(0.8, None, 0.9).on_device  # top_p without top_k: the whole vocabulary, on the host


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": 1.0, "top_k": 0}, "top_k must be a positive integer"),
    ({"temperature": 1.0, "top_k": 2.5}, "top_k must be a positive integer"),
    ({"temperature": 1.0, "top_k": True}, "top_k must be a positive integer"),
    ({"temperature": 1.0, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"temperature": 1.0, "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
])
def test_bad_settings_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(RlxError, match=match):
        Sampler(**kwargs)

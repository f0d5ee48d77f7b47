"""Checks the GPU decoder tests share (test_cuda_hf_families.py, test_cuda_recurrent_decoder.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from hf_checkpoints import cosine


def assert_f16_greedy_tracks_f32(half: Any, cpu: Any, ids: list[int], what: str, n: int = 24) -> None:
    """f16 storage (f32 accumulation): `n` greedy tokens of `half` after `ids`, each a valid id, and on those
    tokens every step's logits point where the f32 CPU model's do (finite, cosine >= 0.999, the greedy token
    the row's largest logit)."""
    tokens = half.generate(ids, max_new_tokens=n).token_ids
    assert tokens and all(0 <= t < cpu.config.vocab_size for t in tokens), what
    hcache, ccache = half.new_cache(), cpu.new_cache()
    got, exp = half.step(np.array([ids]), hcache, [len(ids) - 1]), cpu.step(np.array([ids]), ccache, [len(ids) - 1])
    for step, token in enumerate(tokens):
        assert np.all(np.isfinite(got)), f"{what} f16 step {step}"
        assert cosine(got, exp) >= 0.999, f"{what} f16 step {step}"
        assert got[0, token] == got[0].max(), f"{what} f16 step {step}: not the greedy token"
        got, exp = half.step(np.array([[token]]), hcache, [0]), cpu.step(np.array([[token]]), ccache, [0])

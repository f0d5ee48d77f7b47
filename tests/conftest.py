"""Shared test setup: the repo's cache root, and helpers for optional peers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("RLX_CACHE_DIR", str(REPO / "build_cache"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)

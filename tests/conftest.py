"""Shared test setup.

The suite compiles through the cache rlx uses anyway (RLX_CACHE_DIR, else the per-user default), so
`make test` reuses what `make demo` and earlier runs built; tests about the cache itself give it a
root of their own under tmp_path.
"""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)

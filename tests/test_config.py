"""rlx/config.py: the RLX_RECORD settings (the other variables are checked against the README's table in
tests/test_readme.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx.config import Config
from rlx.errors import RlxError


def test_record_settings() -> None:
    assert Config.from_env({}).record_dir is None
    c = Config.from_env({"RLX_RECORD": "/tmp/rec", "RLX_RECORD_MAX_CALLS": "4", "RLX_RECORD_MAX_BYTES": "1000"})
    assert (c.record_dir, c.record_max_calls, c.record_max_bytes) == (Path("/tmp/rec"), 4, 1000)
    assert Config.from_env({"RLX_RECORD": "  "}).record_dir is None
    with pytest.raises(RlxError, match="RLX_RECORD_MAX_CALLS must be an integer"):
        Config.from_env({"RLX_RECORD_MAX_CALLS": "many"})

"""Every test file runs: pytest collects each `tests/**/test_*.py` (none lost to `norecursedirs`,
a name clash or an import error at collection time).

pytest skips directories named like `build` or `dist` without a word, and a module that fails to
import is only a collection error; either way tests silently stop running. This collects the
suite the way `make test` does (same rootdir, same pyproject options, no paths) in a subprocess
and compares the files it collected with the files on disk.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def collected_files() -> tuple[set[str], str]:
    """(test files pytest collected, its summary line)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # no -k/-m filters from outside
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pytest could not collect the suite:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    lines = proc.stdout.splitlines()
    files = {line.split("::", 1)[0] for line in lines if "::" in line}
    summary = next((line for line in reversed(lines) if "collected" in line), "")
    return files, summary


def test_every_test_file_is_collected() -> None:
    on_disk = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py")
               if "__pycache__" not in p.parts}
    collected, summary = collected_files()
    missing = sorted(on_disk - collected)
    assert not missing, f"test files pytest does not collect ({summary}): {missing}"
    assert "tests/test_collection.py" in collected  # the comparison is over the same paths

"""Where the Jinja templates live: `RLX_TEMPLATES_DIR`, the installed package, or the repo's templates/."""

from __future__ import annotations

import os
from pathlib import Path


def templates_dir() -> Path:
    """The directory holding `cpu/`, `cuda/` and `metal/` templates.

    `RLX_TEMPLATES_DIR` (read on every call) points at another copy, e.g. to try a template change
    without touching the installation; the cache keys follow, since they cover the rendered source
    and the compile index digests every template file.
    """
    from rlx.errors import BuildError

    override = os.environ.get("RLX_TEMPLATES_DIR", "").strip()
    if override:
        path = Path(override).expanduser().absolute()
        if not (path / "cpu").is_dir():
            raise BuildError(f"RLX_TEMPLATES_DIR={override!r} has no cpu/ templates directory")
        return path
    packaged = Path(__file__).resolve().parent / "templates"
    if (packaged / "cpu").is_dir():
        return packaged
    repo = Path(__file__).resolve().parent.parent / "templates"
    if (repo / "cpu").is_dir():
        return repo
    raise BuildError(f"RLX templates not found (looked in {packaged} and {repo}); the installation is incomplete")

"""Where the Jinja templates live: inside the installed package, or the repo's templates/."""

from __future__ import annotations

from pathlib import Path


def templates_dir() -> Path:
    """The directory holding `cpu/`, `cuda/` and `metal/` templates."""
    packaged = Path(__file__).resolve().parent / "templates"
    if (packaged / "cpu").is_dir():
        return packaged
    repo = Path(__file__).resolve().parent.parent / "templates"
    if (repo / "cpu").is_dir():
        return repo
    from rlx.errors import BuildError

    raise BuildError(f"RLX templates not found (looked in {packaged} and {repo}); the installation is incomplete")

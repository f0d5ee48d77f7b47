"""The wheel lists its packages explicitly (templates are mapped in): keep that list complete."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_subpackage_ships_in_the_wheel() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "rlx").rglob("__init__.py")}
    assert on_disk <= listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert config["package-dir"]["rlx.templates"] == "templates"
    for target in ("cpu", "cuda"):
        assert any((REPO / "templates" / target).iterdir()), f"templates/{target} is empty"

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
    for target in ("cpu", "cuda", "metal"):
        assert any((REPO / "templates" / target).iterdir()), f"templates/{target} is empty"
    # every template file is matched by a package-data pattern (the Metal kernels included)
    import fnmatch

    patterns = config["package-data"]["rlx.templates"]
    for path in (REPO / "templates").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(REPO / "templates").as_posix()
            assert any(fnmatch.fnmatch(rel, p) and rel.count("/") == p.count("/") for p in patterns), \
                f"{rel} is not shipped: add its directory to [tool.setuptools.package-data]"

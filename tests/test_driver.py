"""Session.compile_recipe: a graph found by how it is built, without building it, and never a stale object.

Each test uses a private cache root (the recipe index lives in the cache's memo); graphs are one
elementwise op, so each full compile is one small C build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.driver import Session

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="needs a C compiler")


class Builder:
    """Builds `relu(x * scale)` and counts its calls."""

    def __init__(self, scale: float = 2.0) -> None:
        self.scale = scale
        self.calls = 0

    def __call__(self) -> rlx.Graph:
        self.calls += 1
        g = rlx.Graph("recipe_probe")
        x = g.input("x", [4, 8])
        g.set_outputs([g.activation("relu", g.mul(x, g.constant(np.float32(self.scale))))])
        return g


X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One private cache for the module (its first build pays for the kernel units once)."""
    return tmp_path_factory.mktemp("recipe") / "cache"


@pytest.fixture
def private_cache(cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLX_CACHE_DIR", str(cache_root))
    return cache_root


KNOWN_RECIPE = textwrap.dedent("""
    import json, numpy as np, rlx
    from rlx.driver import Session
    calls = []
    def build():
        calls.append(1)
        g = rlx.Graph("recipe_probe")
        x = g.input("x", [4, 8])
        g.set_outputs([g.activation("relu", g.mul(x, g.constant(np.float32(2.0))))])
        return g
    recipe = {"builder": "known", "scale": 2.0}
    cold = Session().compile_recipe(recipe, build)
    after_cold = len(calls)
    warm = Session().compile_recipe(recipe, build)
    after_warm = len(calls)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    same = bool(np.array_equal(warm.run(x=x)[0], np.maximum(x * 2, 0)))
    has_lir = warm.lir is not None
    print(json.dumps([after_cold, after_warm, warm.cache_hit, warm.key == cold.key, same, has_lir, len(calls)]))
""")


def test_a_known_recipe_loads_its_object_without_building_the_graph(private_cache: Path) -> None:
    """In a fresh process: the recipe index is used only while the compiler is pristine, and a test process that
    ran other tests (monkeypatches, modules loaded meanwhile) may no longer be."""
    out = subprocess.run([sys.executable, "-c", KNOWN_RECIPE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RLX_CACHE_DIR": str(private_cache)})
    assert out.returncode == 0, out.stderr[-2000:]
    after_cold, after_warm, hit, same_key, same, has_lir, calls = json.loads(out.stdout.strip().splitlines()[-1])
    assert after_cold == 1
    assert after_warm == 1 and hit and same_key
    assert same
    assert has_lir and calls == 2  # the LIR, asked for, is made from the graph then


def test_another_recipe_is_built(private_cache: Path) -> None:
    Session().compile_recipe({"builder": "other", "scale": 2.0}, Builder(2.0))
    other = Builder(3.0)
    cg = Session().compile_recipe({"builder": "other", "scale": 3.0}, other)
    assert other.calls == 1
    np.testing.assert_array_equal(cg.run(x=X)[0], np.maximum(X * 3, 0))


def test_changed_compiler_files_build_again(private_cache: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe index is keyed by the compiler's source digest: edited templates are a miss."""
    from rlx.templates_path import templates_dir

    recipe = {"builder": "templates", "scale": 2.0}
    Session().compile_recipe(recipe, Builder())
    copy = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    prelude = copy / "cpu" / "prelude.c.j2"
    prelude.write_text("/* rlx recipe test: edited template */\n" + prelude.read_text())
    monkeypatch.setenv("RLX_TEMPLATES_DIR", str(copy))
    build = Builder()
    cg = Session().compile_recipe(recipe, build)
    assert build.calls == 1 and "rlx recipe test: edited template" in cg.source


def test_a_patched_builder_module_is_not_trusted(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rlx.models.bert builds the embedder's graphs from its recipe: patched, nothing is found by recipe."""
    import rlx.models.bert as bert

    recipe = {"builder": "patched", "scale": 2.0}
    Session().compile_recipe(recipe, Builder())
    monkeypatch.setattr(bert, "POOLING_MODES", ("mean",))
    build = Builder()
    Session().compile_recipe(recipe, build)
    assert build.calls == 1


def test_a_graph_with_a_custom_op_is_never_found_by_its_recipe(private_cache: Path, tmp_path: Path) -> None:
    """A custom op's header is read by a build only: edited, the same recipe must build again."""
    from tests.ir.user_ops import EXAMPLE, swish_beta

    header = tmp_path / "swish_beta.h"
    shutil.copy(EXAMPLE.parent / "swish_beta.h", header)
    op = swish_beta("swish_recipe", c_header=header)
    calls = []

    def build() -> rlx.Graph:
        calls.append(1)
        return rlx.trace("swish_recipe", lambda t: op(t.input("x", [4]), t.input("beta", [])))

    recipe = {"builder": "swish_recipe"}
    first = Session().compile_recipe(recipe, build)
    header.write_text(header.read_text() + "\n/* rlx recipe test: edited header */\n")
    second = Session().compile_recipe(recipe, build)
    assert len(calls) == 2 and second.key != first.key and "edited header" in second.source

"""The cache key covers what produced the object: a changed template or codegen tunable is never a stale hit.

Every compile runs in a fresh process (the warm path, the compile index, only matters across
processes) against a private cache root. The graph is one elementwise op, whose C loop carries
`rlx.codegen.cpu.rules.GRAIN` as its OpenMP threshold (`if(n >= 32768)`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = "/* rlx stale-cache test: edited template */"

# argv: JSON options. Prints one JSON line: what was compiled and what this process loaded.
CHILD = r'''
import json, sys
opts = json.loads(sys.argv[1])
import rlx
if opts.get("grain"):
    import rlx.codegen.cpu.rules
    rlx.codegen.cpu.rules.GRAIN = opts["grain"]  # the monkeypatch a tuning script or a test would do
g = rlx.Graph("stale")
g.set_outputs([g.activation("relu", g.input("x", [4, 256]))])
what = rlx.Session().lower(g) if opts.get("lir") else g
cg = rlx.Session().compile(what)
import numpy as np
(y,) = cg.run(x=np.full((4, 256), -1.0, np.float32))
print(json.dumps({
    "key": cg.key, "hit": cg.cache_hit, "source": cg.source, "ok": bool((y == 0).all()),
    "manifest_key": cg.manifest.get("key"),
    "loaded": sorted(m for m in sys.modules if m == "jinja2" or m.startswith(("jinja2.", "rlx.codegen"))),
}))
'''

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="needs a C compiler")


def compile_in_fresh_process(cache: Path, *, templates: Path | None = None, grain: int = 0,
                             lir: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RLX_TEMPLATES_DIR", "RLX_CACHE", "RLX_CACHE_PATH")}
    env.update(RLX_CACHE_DIR=str(cache), RLX_BLAS="none", PYTHONPATH=str(REPO))
    if templates is not None:
        env["RLX_TEMPLATES_DIR"] = str(templates)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps({"grain": grain, "lir": lir})],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["manifest_key"] == out["key"]  # the library embeds the key it is cached under
    return out


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def edited_templates(tmp_path: Path) -> Path:
    """A copy of the templates directory whose CPU prelude starts with MARKER."""
    from rlx.templates_path import templates_dir

    copy = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    prelude = copy / "cpu" / "prelude.c.j2"
    prelude.write_text(MARKER + "\n" + prelude.read_text())
    return copy


def test_a_changed_template_is_a_miss_with_the_change_in_the_new_source(cache: Path, tmp_path: Path) -> None:
    first = compile_in_fresh_process(cache)
    warm = compile_in_fresh_process(cache)
    assert not first["hit"] and warm["hit"] and warm["key"] == first["key"]
    assert MARKER not in first["source"]

    templates = edited_templates(tmp_path)
    edited = compile_in_fresh_process(cache, templates=templates)
    assert not edited["hit"] and edited["key"] != first["key"]
    assert MARKER in edited["source"]
    # The LirModule path (no compile index) keys by the rendered source too.
    edited_lir = compile_in_fresh_process(cache, templates=templates, lir=True)
    assert edited_lir["key"] == edited["key"] and MARKER in edited_lir["source"]
    # And the original templates still find the original object.
    again = compile_in_fresh_process(cache)
    assert again["hit"] and again["key"] == first["key"]


def test_a_monkeypatched_codegen_constant_is_not_served_the_old_object(cache: Path) -> None:
    first = compile_in_fresh_process(cache)
    assert "if(n >= 32768)" in first["source"]
    assert compile_in_fresh_process(cache)["hit"]  # indexed: a fresh process would take the warm path

    patched = compile_in_fresh_process(cache, grain=4096)
    assert not patched["hit"] and patched["key"] != first["key"]
    assert "if(n >= 4096)" in patched["source"] and "if(n >= 32768)" not in patched["source"]
    # The patched process did not index its object under the unpatched fingerprint.
    unpatched = compile_in_fresh_process(cache)
    assert unpatched["hit"] and unpatched["key"] == first["key"] and "if(n >= 32768)" in unpatched["source"]
    # Patched again: the object built for GRAIN=4096 is found by its source, not rebuilt.
    assert compile_in_fresh_process(cache, grain=4096)["key"] == patched["key"]


def test_a_warm_hit_loads_neither_jinja2_nor_codegen(cache: Path) -> None:
    cold = compile_in_fresh_process(cache)
    assert not cold["hit"] and "rlx.codegen.cpu.emit" in cold["loaded"] and "jinja2" in cold["loaded"]
    warm = compile_in_fresh_process(cache)
    assert warm["hit"] and warm["key"] == cold["key"]
    assert warm["loaded"] == [], f"a warm hit imported {warm['loaded']}"


def test_the_compile_index_digest_covers_every_template_and_the_compiler_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx.driver import _compiler_files, compiler_source_digest
    from rlx.templates_path import templates_dir

    labels = {label for label, _ in _compiler_files()}
    templates = {f"template:{p.relative_to(templates_dir()).as_posix()}"
                 for p in templates_dir().rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert templates and templates <= labels
    for module in ("py:codegen/cpu/emit.py", "py:codegen/cuda/__init__.py", "py:opt/pipeline.py", "py:ir/lir.py",
                   "py:toolchain/cpu.py", "py:reference.py"):
        assert module in labels
    before = compiler_source_digest()
    monkeypatch.setenv("RLX_TEMPLATES_DIR", str(edited_templates(tmp_path)))
    assert compiler_source_digest() != before

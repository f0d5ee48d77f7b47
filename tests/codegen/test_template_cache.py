"""Compiled Jinja templates kept between processes: loaded only when they are the current source's, never stale."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jinja2
import pytest

from rlx.codegen.template_cache import OPTIONS, VerifiedBytecodeCache, bytecode_tag, environment


def fresh_env(templates: Path, store: Path) -> tuple[jinja2.Environment, list[str]]:
    """A new environment (as a new process would have) over `templates`, counting what it compiles."""
    compiled: list[str] = []

    class Counting(jinja2.Environment):
        def compile(self, source, name=None, filename=None, raw=False, defer_init=False):
            compiled.append(name)
            return super().compile(source, name, filename, raw, defer_init)

    return Counting(loader=jinja2.FileSystemLoader(str(templates)),
                    bytecode_cache=VerifiedBytecodeCache(store), **OPTIONS), compiled


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    templates, store = tmp_path / "templates", tmp_path / "store"
    templates.mkdir()
    store.mkdir(mode=0o700)
    (templates / "t.j2").write_text("{% for i in items %}{{ i }};{% endfor %}!")
    return templates, store


def test_a_second_process_loads_the_compiled_template_instead_of_compiling(dirs):
    templates, store = dirs
    env, compiled = fresh_env(templates, store)
    assert env.get_template("t.j2").render(items=[1, 2]) == "1;2;!"
    assert compiled == ["t.j2"] and len(list(store.glob("*.bc"))) == 1
    env, compiled = fresh_env(templates, store)
    assert env.get_template("t.j2").render(items=[3]) == "3;!"
    assert compiled == []


def test_a_changed_template_is_compiled_again_never_served_stale(dirs):
    templates, store = dirs
    fresh_env(templates, store)[0].get_template("t.j2").render(items=[1])
    (templates / "t.j2").write_text("{% for i in items %}[{{ i }}]{% endfor %}!")
    env, compiled = fresh_env(templates, store)
    assert env.get_template("t.j2").render(items=[1]) == "[1]!" and compiled == ["t.j2"]
    env, compiled = fresh_env(templates, store)  # and the new compilation replaced the stored one
    assert env.get_template("t.j2").render(items=[2]) == "[2]!" and compiled == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_corrupt_stored_template_is_compiled_again_with_a_warning(dirs, damage, caplog):
    templates, store = dirs
    fresh_env(templates, store)[0].get_template("t.j2").render(items=[1])
    (path,) = store.glob("*.bc")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) - 5] ^= 0xFF
    path.write_bytes(bytes(data[: len(data) // 2]) if damage == "truncate" else b"" if damage == "empty"
                     else bytes(data))
    env, compiled = fresh_env(templates, store)
    with caplog.at_level(logging.WARNING, logger="rlx.codegen"):
        assert env.get_template("t.j2").render(items=[4]) == "4;!"
    assert compiled == ["t.j2"]
    assert "is corrupt (checksum mismatch); compiling it again" in caplog.text
    env, compiled = fresh_env(templates, store)  # rewritten whole
    assert env.get_template("t.j2").render(items=[5]) == "5;!" and compiled == []


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_a_stored_template_others_can_write_is_ignored(dirs):
    templates, store = dirs
    fresh_env(templates, store)[0].get_template("t.j2").render(items=[1])
    (path,) = store.glob("*.bc")
    path.chmod(0o666)
    env, compiled = fresh_env(templates, store)
    assert env.get_template("t.j2").render(items=[1]) == "1;!" and compiled == ["t.j2"]


def test_the_store_directory_names_what_decides_the_compiled_code():
    tag = bytecode_tag()
    assert jinja2.__version__ in tag and tag == bytecode_tag()


def test_one_environment_per_templates_directory_and_store(tmp_path: Path):
    assert environment("cpu") is environment("cpu")
    assert environment("cpu", tmp_path) is environment("cpu", tmp_path) is not environment("cpu")
    assert isinstance(environment("cpu", tmp_path).bytecode_cache, VerifiedBytecodeCache)


def test_a_cold_compile_stores_the_cpu_templates_in_the_cache_root(tmp_path: Path):
    import rlx
    from rlx.config import Config

    g = rlx.Graph("tc")
    g.set_outputs([g.activation("relu", g.input("x", [4, 8]))])
    rlx.Session(config=Config(cache_dir=tmp_path / "cache", blas="none")).compile(g)
    store = tmp_path / "cache" / "templates" / bytecode_tag()
    assert len(list(store.glob("*.bc"))) >= 3  # model.c.j2, its includes and the kernel templates
    assert oct(store.stat().st_mode & 0o777) == "0o700"


def test_kernel_headers_follow_the_templates_directory_inside_one_process(tmp_path, monkeypatch):
    """A fixed kernel header (inserted verbatim into rendered CUDA) is read from the templates directory in force at
    each render: RLX_TEMPLATES_DIR switched inside a process renders the other copy's header, not the first one read
    (which would also file the other copy's library under this one's cache key)."""
    import shutil

    from rlx.codegen.template_cache import header_text
    from rlx.templates_path import templates_dir

    name = "cuda/kernels/gemm_small.cuh"
    original = header_text(name)
    copy = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / name).write_text("/* an edited copy */\n" + original)
    monkeypatch.setenv("RLX_TEMPLATES_DIR", str(copy))
    assert header_text(name).startswith("/* an edited copy */")
    monkeypatch.delenv("RLX_TEMPLATES_DIR")
    assert header_text(name) == original

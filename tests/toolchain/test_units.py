"""Kernel units: compiled once per toolchain, linked into every program that includes their header, never stale."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.config import Config
from rlx.templates_path import templates_dir
from rlx.toolchain.cache import CacheWarning, cache_key, file_sha256
from rlx.toolchain.compiler import detect_toolchain, observe_commands
from rlx.toolchain.units import UnitStore, compile_program, unit_components, units_for

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="needs a C compiler")


def core_unit() -> Path:
    return templates_dir() / "cpu" / "kernels" / "packed_core.c"


def mlp(name: str = "unit_mlp", k: int = 40, n: int = 48) -> rlx.Graph:
    g = rlx.Graph(name)
    x = g.input("x", [rlx.Dim.dynamic("batch", max=16), k])
    h = g.add_(g.matmul(x, g.param("w", [k, n])), g.param("b", [n]))
    g.set_outputs([g.activation("relu", h)])
    return g


def unit_entries(root: Path) -> list[Path]:
    return sorted((root / "units").glob("*/*/unit.o"))


# ── which units a program needs ────────────────────────────────────────────


def test_a_program_needs_the_units_of_the_headers_it_includes_directly_or_through_another():
    assert units_for('#include "kernels/packed_gemm.h"\n') == (core_unit(),)  # packed_gemm.h includes packed_core.h
    assert units_for('#include "kernels/packed_core.h"\n') == (core_unit(),)
    assert units_for('#include "kernels/scalar.h"\n#include <immintrin.h>\n') == ()
    assert units_for("/* #include \"kernels/packed_gemm.h\" is only a comment here */\n") == ()


def test_a_graph_without_a_packed_gemm_links_no_unit_and_its_source_never_parses_immintrin(tmp_path: Path):
    g = rlx.Graph("relu_only")
    g.set_outputs([g.activation("relu", g.input("x", [4, 8]))])
    cg = rlx.Session(config=Config(cache_dir=tmp_path / "cache")).compile(g)
    assert "immintrin" not in cg.source and not unit_entries(tmp_path / "cache")


# ── the key: a changed header, flag, compiler or unit is another object ────


def test_the_unit_key_covers_its_text_its_headers_the_flags_and_the_compiler(tmp_path: Path, monkeypatch):
    tc = detect_toolchain(Config(cache_dir=tmp_path / "cache"))
    base = cache_key(unit_components(core_unit(), tc))
    assert cache_key(unit_components(core_unit(), tc)) == base
    flags = dataclasses.replace(tc, isa_flags=(*tc.isa_flags, "-DRLX_TEST_FLAG=1"))
    compiler = dataclasses.replace(tc, cc_version_text=tc.cc_version_text + " (rebuilt)")
    isa = dataclasses.replace(tc, isa_identity="another-cpu")
    keys = {cache_key(unit_components(core_unit(), t)) for t in (flags, compiler, isa)}
    assert base not in keys and len(keys) == 3

    copy = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("RLX_TEMPLATES_DIR", str(copy))
    unit = copy / "cpu" / "kernels" / "packed_core.c"
    base = cache_key(unit_components(unit, tc))  # (the -I flag names the templates directory)
    # a header the unit does not include never changes its key ...
    scalar = copy / "cpu" / "kernels" / "scalar.h"
    scalar.write_text(scalar.read_text() + "\n/* edited */\n")
    (copy / "cpu" / "kernels" / "brand_new.h").write_text("/* a header another helper added */\n")
    assert cache_key(unit_components(unit, tc)) == base
    # ... the header it includes does
    header = copy / "cpu" / "kernels" / "packed_core.h"
    header.write_text(header.read_text() + "\n/* edited */\n")
    edited_header = cache_key(unit_components(unit, tc))
    unit.write_text(unit.read_text() + "\n/* edited */\n")
    assert len({base, edited_header, cache_key(unit_components(unit, tc))}) == 3


# ── building and linking ───────────────────────────────────────────────────


def test_the_unit_is_compiled_once_and_linked_into_every_program(tmp_path: Path, rng: np.random.Generator):
    root = tmp_path / "cache"
    session = rlx.Session(config=Config(cache_dir=root))
    commands: list[list[str]] = []
    with observe_commands(lambda cmd, started, seconds: seconds is None and commands.append(cmd)):
        first = session.compile(mlp("unit_a"))
        (obj,) = unit_entries(root)
        stamp = obj.stat().st_mtime_ns
        second = session.compile(mlp("unit_b", k=24, n=40))
    assert unit_entries(root) == [obj] and obj.stat().st_mtime_ns == stamp
    unit_builds = [c for c in commands if str(core_unit()) in c]
    assert len(unit_builds) == 1 and "-c" in unit_builds[0]
    # the second program is one compiler command, linking the cached object
    assert str(obj) in commands[-1] and "-shared" in commands[-1]
    assert "immintrin" not in first.source
    for cg, g in ((first, mlp("unit_a")), (second, mlp("unit_b", k=24, n=40))):
        run_against_reference(cg, g, rng)


def run_against_reference(cg, g: rlx.Graph, rng: np.random.Generator) -> None:
    k = g.inputs()[0].shape.dims[1].value
    n = g.node(g.outputs[0]).shape.dims[1].value
    params = {"w": rng.standard_normal((k, n)).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32)}
    for name, arr in params.items():
        cg.set_param(name, arr)
    for rows in (1, 13):  # a partial tile and more than one row group of the micro-kernel
        x = rng.standard_normal((rows, k)).astype(np.float32)
        (y,) = cg.run(x=x)
        (want,) = reference.run(g, {"x": x}, params)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_with_the_cache_disabled_the_unit_is_compiled_into_the_build(tmp_path: Path, rng: np.random.Generator):
    config = Config(cache_dir=tmp_path / "cache", cache_enabled=False)
    g = mlp("unit_nocache")
    cg = rlx.Session(config=config).compile(g)
    run_against_reference(cg, g, rng)
    assert not (tmp_path / "cache").exists()


def test_a_corrupt_unit_object_is_quarantined_with_a_warning_and_compiled_again(tmp_path: Path):
    config = Config(cache_dir=tmp_path / "cache")
    tc = detect_toolchain(config)
    store = UnitStore(config)
    obj = store.get(core_unit(), tc, tmp_path)
    good = file_sha256(obj)
    obj.chmod(0o644)
    obj.write_bytes(obj.read_bytes()[:100])  # a torn write
    assert store.cached(core_unit(), tc) is None
    with pytest.warns(CacheWarning, match=r"kernel unit packed_core\.c .* is corrupt \(unit\.o is 100 bytes"):
        again = store.get(core_unit(), tc, tmp_path)
    assert again == obj and file_sha256(again) == good
    assert next(p.name for p in (tmp_path / "cache" / "quarantine").iterdir()).startswith("unit-")
    # the same for a flipped byte (same size) and for a lost meta.json
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match="sha256 does not match"):
        assert file_sha256(store.get(core_unit(), tc, tmp_path)) == good
    (obj.parent / "meta.json").unlink()
    with pytest.warns(CacheWarning, match="meta.json is missing"):
        assert file_sha256(store.get(core_unit(), tc, tmp_path)) == good


def test_a_failing_unit_build_is_a_build_error_naming_the_unit(tmp_path: Path, monkeypatch):
    copy = tmp_path / "templates"
    shutil.copytree(templates_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    unit = copy / "cpu" / "kernels" / "packed_core.c"
    unit.write_text(unit.read_text() + "\nthis is not C;\n")
    monkeypatch.setenv("RLX_TEMPLATES_DIR", str(copy))
    with pytest.raises(rlx.errors.BuildError, match=r"kernel unit failed.*packed_core\.c"):
        rlx.Session(config=Config(cache_dir=tmp_path / "cache")).compile(mlp("unit_broken"))
    assert not unit_entries(tmp_path / "cache")


CONCURRENT = r'''
import json, sys
from pathlib import Path
from rlx.config import Config
from rlx.toolchain.compiler import detect_toolchain, observe_commands
from rlx.toolchain.units import UnitStore
from rlx.templates_path import templates_dir
config = Config(cache_dir=Path(sys.argv[1]))
tc = detect_toolchain(config)
Path(sys.argv[2]).touch()
while not all(Path(p).exists() for p in sys.argv[3:]):  # start together
    pass
ran = []
with observe_commands(lambda cmd, started, seconds: seconds is None and ran.append(cmd)):
    obj = UnitStore(config).get(templates_dir() / "cpu" / "kernels" / "packed_core.c", tc, Path(sys.argv[1]))
print(json.dumps({"object": str(obj), "compiled": len(ran)}))
'''


def test_concurrent_builders_compile_the_unit_once_and_share_it(tmp_path: Path):
    root = tmp_path / "cache"
    detect_toolchain(Config(cache_dir=root))  # the toolchain probe memoized first: only the unit races
    ready = [str(tmp_path / f"ready{i}") for i in range(3)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(root), ready[i], *ready], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["object"] for r in results}) == 1
    assert sum(r["compiled"] for r in results) == 1
    (obj,) = unit_entries(root)
    meta = json.loads((obj.parent / "meta.json").read_text())
    assert meta["object"]["sha256"] == file_sha256(obj)
    assert not list((root / "tmp").iterdir())


def test_compile_program_links_given_units(tmp_path: Path):
    """The toolchain entry point on a hand-written program calling the unit's kernel."""
    src = tmp_path / "prog.c"
    src.write_text('#include "kernels/packed_core.h"\n'
                   "#ifdef RLX_NR\n"
                   "__attribute__((visibility(\"default\"))) void call(float *c, const float *a, const float *bp)\n"
                   "{ rlx_kernel(1, 0, 1, a, 1, bp, c, RLX_NR, RLX_NR, 0, 0); }\n"
                   "#endif\n")
    config = Config(cache_dir=tmp_path / "cache")
    tc = detect_toolchain(config)
    linked = compile_program(tc, src, tmp_path / "prog.so", config)
    assert linked == tuple(unit_entries(tmp_path / "cache"))
    assert (tmp_path / "prog.so").is_file() and not (tmp_path / "prog.program.o").exists()


def test_cache_clear_removes_the_units_and_compiled_templates_too(tmp_path: Path):
    from rlx.toolchain.cache import AotCache

    config = Config(cache_dir=tmp_path / "cache")
    rlx.Session(config=config).compile(mlp("unit_clear"))
    assert unit_entries(tmp_path / "cache") and (tmp_path / "cache" / "templates").is_dir()
    assert AotCache(config).clear() == 1
    assert not (tmp_path / "cache" / "units").exists() and not (tmp_path / "cache" / "templates").exists()


def test_a_unit_object_others_can_write_is_refused_never_linked(tmp_path: Path):
    from rlx.errors import CacheError

    config = Config(cache_dir=tmp_path / "cache")
    tc = detect_toolchain(config)
    store = UnitStore(config)
    obj = store.get(core_unit(), tc, tmp_path)
    obj.chmod(0o666)
    with pytest.raises(CacheError, match="writable by group or others"):
        store.get(core_unit(), tc, tmp_path)
    obj.chmod(0o644)
    obj.unlink()  # a lost object: quarantined with its meta.json and compiled again
    with pytest.warns(CacheWarning, match="unit.o is missing"):
        again = store.get(core_unit(), tc, tmp_path)
    assert file_sha256(again) == json.loads((again.parent / "meta.json").read_text())["object"]["sha256"]

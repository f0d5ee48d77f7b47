"""rlxc: every subcommand's help, exit codes (0 ok / 1 failure / 2 usage), one-line errors, cache management."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.build.cache import AotCache
from rlx.cli import main, synthetic_inputs
from rlx.config import Config

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "build" / "data"

_spec = importlib.util.spec_from_file_location("rlx_cache_worker_cli", DATA / "cache_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

SUBCOMMANDS = ("compile", "inspect", "run", "bench", "cache", "doctor")


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RLX_CACHE_DIR", str(root))
    monkeypatch.delenv("RLX_CACHE_PATH", raising=False)
    return root


def rlxc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    """rlxc in a fresh process, as a user runs it."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "rlx.cli", *args], capture_output=True, text=True, env=full_env,
                          timeout=300)


def tiny_graph(path: Path) -> Path:
    from rlx.ir import serialize
    from rlx.ir.graph import Graph
    from rlx.ir.shape import Dim

    g = Graph("tiny")
    x = g.input("x", [Dim.dynamic("n", max=8), 4])
    w = g.param("w", [4, 3])
    g.set_outputs([g.activation("relu", g.matmul(x, w))])
    serialize.save(g, path)
    return path


# ── help and usage errors ─────────────────────────────────────────────────


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rlxc {command}")


def test_top_level_help_lists_commands(capsys: pytest.CaptureFixture[str]):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in (*SUBCOMMANDS, "embed"):
        assert command in out


def test_embed_dispatches_to_the_example(capsys: pytest.CaptureFixture[str]):
    assert main(["embed", "--help"]) == 0
    assert "rlxc embed" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["compile"],
    ["compile", "g.json", "--opt-level", "7"],
    ["compile", "g.json", "--target", "tpu"],
    ["cache", "shred"],
    ["run", "somewhere", "--input", "no-equals-sign"],
    ["bench", "somewhere", "--reps", "0"],
    ["inspect", "missing.json"],
    ["cache", "explain"],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], cache_root: Path):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err


def test_failure_is_one_line_on_stderr_and_exit_1(tmp_path: Path, cache_root: Path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "rlx-graph", "version": 1, "nodes": [}')
    proc = rlxc("compile", str(bad))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlxc compile: error:"), proc.stderr
    debug = rlxc("--debug", "compile", str(bad))
    assert debug.returncode == 1 and "Traceback" in debug.stderr


# ── cache management ──────────────────────────────────────────────────────


def _fill(root: Path, values: tuple[int, ...]) -> list:
    cache = AotCache(Config(cache_dir=root))
    return [cache.get_or_build(worker.components(v), worker.make_build(v)) for v in values]


def test_cache_ls_stat_verify_gc_clear(cache_root: Path, capsys: pytest.CaptureFixture[str]):
    entries = _fill(cache_root, (1, 2))
    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert all(e.key[:16] in out for e in entries)
    assert main(["cache", "stat"]) == 0
    stat = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert stat["entries"] == "2" and stat["root"] == str(cache_root)
    assert main(["cache", "verify"]) == 0
    capsys.readouterr()
    lib = entries[0].library
    lib.write_bytes(lib.read_bytes()[:10])
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert main(["cache", "verify"]) == 1
    assert entries[0].key[:16] in capsys.readouterr().out
    assert main(["cache", "gc"]) == 0
    assert main(["cache", "clear"]) == 0
    assert "removed 1" in capsys.readouterr().out.splitlines()[-1]
    assert AotCache(Config(cache_dir=cache_root)).entries() == []


def test_cache_explain_by_key(cache_root: Path, capsys: pytest.CaptureFixture[str]):
    (entry,) = _fill(cache_root, (3,))
    assert main(["cache", "explain", entry.key[:12]]) == 0
    assert "a hit" in capsys.readouterr().out
    assert main(["cache", "explain", "f" * 64]) == 1
    assert "not cached" in capsys.readouterr().out


def test_doctor_reports_toolchain_and_cache(cache_root: Path, capsys: pytest.CaptureFixture[str]):
    _fill(cache_root, (4,))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "compiler" in out and "openmp" in out and "blas" in out and "nvcc" in out and "gpus" in out
    assert f"{cache_root}: 1 entries" in out


def test_doctor_flags_an_unsafe_cache_root(cache_root: Path, capsys: pytest.CaptureFixture[str]):
    _fill(cache_root, (5,))
    os.chmod(cache_root, 0o777)
    assert main(["doctor"]) == 1
    assert "writable by group or others" in capsys.readouterr().out
    os.chmod(cache_root, 0o700)


def test_synthetic_inputs_follow_the_manifest():
    manifest = {"inputs": [{"name": "ids", "dtype": "i64", "shape": ["batch", "seq"]},
                           {"name": "x", "dtype": "f32", "shape": ["2*seq", "4"]}],
                "symbols": [{"name": "batch", "max": 3}, {"name": "seq", "max": 5}]}
    inputs = synthetic_inputs(manifest, {"seq": 2})
    assert inputs["ids"].shape == (3, 2) and inputs["ids"].dtype == np.int64
    assert inputs["x"].shape == (4, 4) and inputs["x"].dtype == np.float32
    assert set(np.unique(inputs["ids"])) <= {0, 1}
    assert json.dumps(manifest)  # unchanged, still plain data

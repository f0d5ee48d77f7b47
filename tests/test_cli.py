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

from rlx.cli import main, synthetic_inputs
from rlx.config import Config
from rlx.toolchain.cache import AotCache

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "toolchain" / "data"

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


# ── end to end through the CPU backend ────────────────────────────────────


@pytest.fixture
def project(tmp_path: Path, cache_root: Path) -> dict[str, Path]:
    from safetensors.numpy import save_file

    graph = tiny_graph(tmp_path / "g.json")
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
    save_file({"w": w}, str(tmp_path / "w.safetensors"))
    x = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
    np.save(tmp_path / "x.npy", x)
    return {"graph": graph, "weights": tmp_path / "w.safetensors", "x": tmp_path / "x.npy", "dir": tmp_path}


def _expected(project: dict[str, Path]) -> np.ndarray:
    from safetensors.numpy import load_file

    from rlx import reference
    from rlx.ir import serialize

    g = serialize.load(project["graph"])
    return reference.run(g, {"x": np.load(project["x"])}, load_file(str(project["weights"])))[0]


def test_compile_to_artifact_then_run_it(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    art = project["dir"] / "art"
    assert main(["compile", str(project["graph"]), "-o", str(art), "--weights", str(project["weights"])]) == 0
    out = capsys.readouterr().out
    assert "built" in out and f"artifact written to {art}" in out
    assert {"model.so", "model.c", "rlx.h", "manifest.json", "weights.safetensors"} <= {p.name for p in art.iterdir()}
    npz = project["dir"] / "o.npz"
    assert main(["run", str(art), "--input", f"x={project['x']}", "--output", str(npz)]) == 0
    # One small f32 matmul: the C kernel and numpy may sum in a different order.
    np.testing.assert_allclose(np.load(npz)["out0"], _expected(project), rtol=1e-6, atol=1e-6)
    assert main(["compile", str(project["graph"])]) == 0
    assert "cache hit" in capsys.readouterr().out


def test_run_a_graph_directly(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    npz = project["dir"] / "o.npz"
    argv = ["run", str(project["graph"]), "--input", f"x={project['x']}", "--weights", str(project["weights"])]
    assert main([*argv, "--output", str(npz)]) == 0
    np.testing.assert_allclose(np.load(npz)["out0"], _expected(project), rtol=1e-6, atol=1e-6)
    assert main(argv) == 0
    assert "out0: float32[5, 3]" in capsys.readouterr().out


def test_run_with_a_wrong_input_is_one_line_exit_1(project: dict[str, Path]):
    proc = rlxc("run", str(project["graph"]), "--input", f"y={project['x']}", "--weights", str(project["weights"]),
                env={"RLX_CACHE_DIR": os.environ["RLX_CACHE_DIR"]})
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "unknown inputs ['y']" in proc.stderr


def test_emit_source_prints_c(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    assert main(["compile", str(project["graph"]), "--emit-source"]) == 0
    captured = capsys.readouterr()
    assert "rlx_run" in captured.out and "rlx_abi_version" in captured.out
    assert "key" in captured.err  # the summary moves to stderr so stdout is pure C


def test_inspect_stages(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    g = str(project["graph"])
    assert main(["inspect", g]) == 0
    assert "fused_matmul_bias_act" in capsys.readouterr().out  # default: the optimized MIR
    assert main(["inspect", g, "--stage", "mir", "--opt-level", "0"]) == 0
    assert "fused_matmul_bias_act" not in capsys.readouterr().out
    assert main(["inspect", g, "--stage", "lir", "--passes"]) == 0
    out = capsys.readouterr().out
    assert "optimize level 2" in out and "fuse_matmul_epilogue" in out and "buffer plan for tiny" in out
    assert main(["inspect", g, "--stage", "source"]) == 0
    assert "rlx_run" in capsys.readouterr().out
    assert main(["inspect", g, "--stage", "hir"]) == 2  # a MIR document has no HIR stage
    art = project["dir"] / "art"
    assert main(["compile", g, "-o", str(art)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(art)]) == 0
    out = capsys.readouterr().out
    assert "artifact tiny" in out and "dynamic dims: n<=8" in out
    assert main(["inspect", str(art), "--stage", "source"]) == 0
    assert "rlx_run" in capsys.readouterr().out


def test_inspect_hir_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from rlx.ir import serialize
    from rlx.models.bert import BertConfig, bert_hir

    cfg = BertConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16,
                     max_position_embeddings=8)
    path = tmp_path / "hir.json"
    serialize.save(bert_hir(cfg, max_batch=2, max_seq=8), path)
    assert main(["inspect", str(path), "--stage", "hir"]) == 0
    assert "attention" in capsys.readouterr().out


def test_bench_reports_median_min_max(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    assert main(["bench", str(project["graph"]), "--reps", "3"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "3 calls" in line and "median" in line and "min" in line and "max" in line


def test_cache_explain_a_graph(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    g = str(project["graph"])
    assert main(["compile", g]) == 0
    assert main(["cache", "explain", g]) == 0
    assert "a hit" in capsys.readouterr().out.splitlines()[-1]
    # At -O0 the matmul is not fused: a different LIR (and so source), everything else equal.
    assert main(["cache", "explain", g, "--opt-level", "0"]) == 1
    out = capsys.readouterr().out
    # The key covers the rendered source, which a different LIR changes too.
    assert "differs in 2 component(s)" in out and "lir: wanted" in out and "source: wanted" in out


class _FakeTty:
    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_progress_only_on_a_terminal():
    import threading

    from rlx.cli import progress

    for tty in (True, False):
        stream = _FakeTty(tty)
        started = threading.Event()
        with progress("compiling bert", stream):
            started.wait(0.8)  # long enough for the spinner's first frames
        if tty:
            assert "compiling bert" in stream.text and stream.text.endswith("\r\033[K")
        else:
            assert stream.text == ""

"""rlxc: every subcommand's help, exit codes (0 ok / 1 failure / 2 usage), one-line errors, cache management."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.cli import main, parse_target, synthetic_inputs
from rlx.config import Config
from rlx.toolchain.cache import AotCache

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "toolchain" / "data"

_spec = importlib.util.spec_from_file_location("rlx_cache_worker_cli", DATA / "cache_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

SUBCOMMANDS = ("compile", "inspect", "run", "bench", "report", "cache", "doctor")


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
    assert out.splitlines()[0].split() == ["KEY", "GRAPH", "TARGET", "SIZE", "LAST", "USE"]
    assert all(e.key[:12] in out for e in entries)
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
    (tile,) = [ln for ln in out.splitlines() if ln.startswith("tile unit")]
    assert "AMX" in tile or "none on this CPU" in tile, tile
    (extra,) = [ln for ln in out.splitlines() if ln.startswith("cuda extra")]
    assert "installed: nvidia-cublas" in extra or "make install CUDA=1" in extra, extra
    assert f"{cache_root}: 1 entries" in out


def test_doctor_reports_threads_wait_policy_and_load(cache_root: Path, capsys: pytest.CaptureFixture[str]):
    from rlx.runtime.loader import openmp_policy
    from rlx.runtime.team import cpus_available

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"{cpus_available()} core(s) available to this process" in out
    assert re.search(r"^threads +\d+ per run", out, re.MULTILINE)
    assert f"omp wait     {openmp_policy().source}" in out  # the policy this process's runs use
    assert re.search(r"^load +(\d+\.\d\d over the last minute, \d+ other runnable|unknown)", out, re.MULTILINE)


def test_doctor_prints_the_sgemm_peak_unless_told_not_to(cache_root: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["doctor", "--peak-seconds", "0.05"]) == 0
    (peak,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("sgemm peak")]
    assert re.search(r"\d+\.\d GFLOP/s on .* best at \d+x\d+x\d+.*a 0.05 s probe$", peak) or "no BLAS" in peak, peak
    assert main(["doctor", "--peak-seconds", "0"]) == 0
    assert "sgemm peak" not in capsys.readouterr().out


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
    # A cold compile may print one progress line first ("compiling tiny... done in 1.0 s"): the error is one line.
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "unknown inputs ['y']" in errors[0], proc.stderr
    assert proc.stderr.splitlines()[-1] == errors[0] and "Traceback" not in proc.stderr


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
    assert main(["inspect", str(path), "--stage", "hir", "-O1"]) == 2  # the HIR comes before the optimizer
    assert "before the optimizer" in capsys.readouterr().err
    assert main(["inspect", str(path), "--stage", "mir", "-v"]) == 0  # an HIR graph lowers, then optimizes
    err = capsys.readouterr().err
    assert all(re.search(rf"rlxc:   {s}\s+\d+\.\d ms", err) for s in ("lower", "optimize", "plan")), err


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



# ── progress, -v, targets, flags that must not be ignored ─────────────────


class _FakeStream:
    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_progress_spinner_on_a_terminal_plain_line_elsewhere():
    import time

    from rlx.cli import progress

    tty, log = _FakeStream(True), _FakeStream(False)
    for stream in (tty, log):
        with progress("compiling bert", stream, delay=0.05):
            time.sleep(0.4)  # long enough for the spinner's first frames
    assert "\rcompiling bert |" in tty.text and tty.text.endswith("\r\033[K")
    assert re.fullmatch(r"compiling bert\.\.\. done in \d+\.\d s\n", log.text), log.text


def test_progress_says_nothing_for_fast_work_and_reports_failure():
    import time

    from rlx.cli import progress

    fast = _FakeStream(False)
    with progress("compiling tiny", fast, delay=5.0):
        pass
    assert fast.text == ""
    failed = _FakeStream(False)
    with pytest.raises(RuntimeError), progress("compiling tiny", failed, delay=0.01):
        time.sleep(0.2)
        raise RuntimeError("cc died")
    assert re.fullmatch(r"compiling tiny\.\.\. failed after \d+\.\d s\n", failed.text), failed.text


def test_version_names_rlx_python_and_compiler(cache_root: Path):
    import platform

    import rlx

    proc = rlxc("--version")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"rlxc (rlx) {rlx.__version__}"
    assert lines[1].startswith(f"python   {platform.python_version()}")
    assert lines[2].startswith("cc       /") and lines[3].startswith("nvcc     ")


def test_parse_target_forms():
    assert parse_target("cpu") == parse_target("CPU")
    assert parse_target("cpu").cpu_target is None and parse_target("cpu:native").cpu_target == "native"
    assert parse_target("cpu:avx2").cpu_target == "x86-64-v3"
    assert parse_target("cpu:avx512").cpu_target == "x86-64-v4"
    assert parse_target("cpu:x86-64-v2").cpu_target == "x86-64-v2"
    assert (parse_target("cuda").device, parse_target("cuda").arch) == ("cuda", None)
    assert parse_target("cuda:sm_90").arch == "sm_90" and parse_target("cuda:90a").arch == "sm_90a"


@pytest.mark.parametrize(("target", "message"), [
    ("metal:m2", "the metal target has no variants"),
    ("tpu", "unknown target 'tpu'"),
    ("cuda:sm_9x", "expected a GPU arch like cuda:sm_90"),
    ("cpu:", "names no variant"),
])
def test_bad_targets_exit_2_with_the_reason(target: str, message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]):
    graph = tiny_graph(tmp_path / "g.json")
    assert main(["compile", str(graph), "--target", target]) == 2
    assert message in capsys.readouterr().err


def test_help_offers_metal(capsys: pytest.CaptureFixture[str]):
    for command in ("compile", "run", "bench", "inspect"):
        assert main([command, "--help"]) == 0
        out = capsys.readouterr().out
        assert "metal" in out.lower() and "cuda:sm_XY" in out and "-O {0-3}" in out


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="cpu:avx2 is an x86-64 level")
def test_cpu_isa_target_reaches_the_compiler(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    assert main(["compile", str(project["graph"]), "--target", "cpu:avx2", "-v"]) == 0
    err = capsys.readouterr().err
    assert "-march=x86-64-v3" in err
    assert main(["cache", "ls"]) == 0
    assert "cpu x86-64-v3" in capsys.readouterr().out


def test_verbose_prints_command_lines_and_stage_timings(project: dict[str, Path],
                                                        capsys: pytest.CaptureFixture[str]):
    g = str(project["graph"])
    assert main(["compile", g, "-v", "-O1"]) == 0
    err = capsys.readouterr().err
    assert "compiling tiny for cpu at -O1" in err
    for stage in ("lower", "optimize", "plan", "toolchain", "render", "build", "load", "total"):
        assert re.search(rf"^rlxc:   {stage}\s+\d+\.\d ms", err, re.MULTILINE), (stage, err)
    # every command run: the program's compile (model.c), its link (model.so), and a kernel unit the cache
    # lacked (kernels/*.c, compiled once per toolchain into the cache)
    commands = [line for line in err.splitlines() if line.startswith("rlxc: $ ")]
    assert any(word.endswith("/model.c") for c in commands for word in c.split()), commands
    assert sum("-shared" in c and "model.so" in c for c in commands) == 1, commands
    assert main(["compile", g, "-v", "-O1"]) == 0  # built: now a cache hit, nothing run
    err = capsys.readouterr().err
    assert "rlxc: $" not in err and "cache hit" in err and re.search(r"load\s+\d+\.\d ms", err)


def test_verbose_and_quiet_exclude_each_other(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    assert main(["compile", str(project["graph"]), "-v", "-q"]) == 2
    assert "not allowed with" in capsys.readouterr().err


def test_opt_level_short_form(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    g = str(project["graph"])
    assert main(["inspect", g, "-O0"]) == 0
    assert "fused_matmul_bias_act" not in capsys.readouterr().out
    assert main(["inspect", g, "-O", "2"]) == 0
    assert "fused_matmul_bias_act" in capsys.readouterr().out
    assert main(["inspect", g, "-O4"]) == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["inspect", "{art}", "--passes"], "--passes needs the graph .json"),
    (["inspect", "{art}", "-O1"], "-O/--opt-level only apply when compiling"),
    (["inspect", "{art}", "--stage", "lir"], "--stage lir needs the graph .json"),
    (["inspect", "{art}", "-v"], "-v needs the graph .json"),
    (["inspect", "{graph}", "--stage", "manifest"], "--stage manifest is for an artifact"),
    (["inspect", "{graph}", "--target", "cpu:avx2"], "--target changes only --stage source"),
    (["inspect", "{graph}", "--stage", "source", "--target", "cuda:sm_90"], "--emit-source"),
    (["run", "{art}", "-O3", "--input", "x={x}"], "only apply when compiling"),
    (["bench", "{art}", "--target", "cpu:avx2"], "--target only apply when compiling"),
    (["compile", "{graph}", "--weights", "{weights}"], "--weights needs -o DIR"),
    (["compile", "{graph}", "--num-threads", "2"], "unrecognized arguments: --num-threads"),
    (["compile", "{graph}", "--max-dim", "n=4"], "--max-dim applies to .onnx models"),
    (["compile", "{art}"], "is a directory"),
    (["cache", "ls", "extra"], "cache ls takes no argument"),
    (["cache", "ls", "--no-repair"], "--no-repair applies to `cache verify`"),
    (["cache", "verify", "--stale-seconds", "5"], "--stale-seconds applies to `cache gc`"),
    (["cache", "stat", "-O2"], "apply to `cache explain GRAPH` only"),
    (["cache", "explain", "abc123", "-O1"], "a key already names one build"),
])
def test_flags_that_would_do_nothing_are_refused(argv: list[str], message: str, project: dict[str, Path],
                                                 capsys: pytest.CaptureFixture[str]):
    art = project["dir"] / "art"
    assert main(["compile", str(project["graph"]), "-o", str(art), "-q"]) == 0
    capsys.readouterr()
    names = {"art": art, "graph": project["graph"], "x": project["x"], "weights": project["weights"]}
    assert main([a.format(**names) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_unset_params_hint_at_weights(project: dict[str, Path], capsys: pytest.CaptureFixture[str]):
    art = project["dir"] / "art"
    assert main(["compile", str(project["graph"]), "-o", str(art)]) == 0
    capsys.readouterr()
    assert main(["run", str(art), "--input", f"x={project['x']}"]) == 1
    err = capsys.readouterr().err.strip()
    assert "never set" in err and "'w'" in err and "--weights W.safetensors" in err and "rlxc compile" in err
    assert main(["run", str(project["graph"]), "--input", f"x={project['x']}"]) == 1
    assert "never set" in (err := capsys.readouterr().err) and "pass --weights W.safetensors" in err


def test_closed_pipe_ends_quietly(tmp_path: Path, cache_root: Path):
    from rlx.ir.graph import Graph

    # A source of several hundred KiB: far more than a pipe buffer, so rlxc writes after `head` has exited.
    g = Graph("chain")
    x = g.input("x", [4])
    y = x
    for i in range(400):
        y = g.activation("relu" if i % 2 else "gelu", g.add_(y, x))
    g.set_outputs([y])
    path = tmp_path / "chain.json"
    g.save(path)
    script = (f"{shlex.quote(sys.executable)} -m rlx.cli inspect {shlex.quote(str(path))} --stage source -O0 "
              "| head -1; echo \"rlxc exit ${PIPESTATUS[0]}\" >&2")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout == "/*\n"
    assert proc.stderr == "rlxc exit 0\n", proc.stderr


# ── cache ls / stat across processes ──────────────────────────────────────


def test_cache_ls_names_graphs_targets_sizes_and_last_use(project: dict[str, Path],
                                                          capsys: pytest.CaptureFixture[str]):
    assert main(["compile", str(project["graph"]), "-q"]) == 0
    capsys.readouterr()
    assert main(["cache", "ls"]) == 0
    captured = capsys.readouterr()
    (row,) = captured.out.splitlines()[1:]
    _key, name, device, isa, size, unit, day, _clock = row.split()
    assert name == "tiny" and device == "cpu" and isa.startswith(("native", "x86-64"))
    assert float(size) > 0 and unit in ("KiB", "MiB") and re.fullmatch(r"\d{4}-\d\d-\d\d", day)
    assert "1 entry" in captured.err


def test_cache_stat_counts_every_process(project: dict[str, Path]):
    env = {"RLX_CACHE_DIR": os.environ["RLX_CACHE_DIR"]}
    g = str(project["graph"])
    first, second = rlxc("compile", g, env=env), rlxc("compile", g, env=env)
    assert first.returncode == 0 and "(built," in first.stdout, first.stderr
    assert second.returncode == 0 and "(cache hit," in second.stdout, second.stderr
    stat = rlxc("cache", "stat", env=env)
    values = dict(line.split(": ", 1) for line in stat.stdout.splitlines())
    assert (values["builds"], values["misses"], values["hits"]) == ("1", "1", "1"), stat.stdout
    assert values["since"] != "never"
    assert len((Path(os.environ["RLX_CACHE_DIR"]) / "stats.json").read_bytes()) < 1024


def test_concurrent_processes_never_lose_a_count(cache_root: Path):
    _fill(cache_root, (7,))
    before = AotCache(Config(cache_dir=cache_root)).stat()["hits"]
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('w', {str(DATA / 'cache_worker.py')!r})\n"
            "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
            "from rlx.config import Config\nfrom rlx.toolchain.cache import AotCache\n"
            f"cache = AotCache(Config(cache_dir={str(cache_root)!r}))\n"
            "for _ in range(40):\n    assert cache.get_or_build(w.components(7), w.make_build(7)).hit\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert AotCache(Config(cache_dir=cache_root)).stat()["hits"] - before == 80


# ── ONNX models ───────────────────────────────────────────────────────────


def test_onnx_model_compiles_with_its_weights_through_from_onnx(project: dict[str, Path],
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]):
    """The CLI side of `rlxc compile MODEL.onnx`, against a stand-in with `rlx.from_onnx`'s signature."""
    import types

    from safetensors.numpy import load_file

    from rlx.ir import serialize

    calls = []

    def from_onnx(path_or_model: object, *, max_dims: dict[str, int] | None = None,
                  name: str | None = None) -> types.SimpleNamespace:
        calls.append((Path(str(path_or_model)), max_dims))
        return types.SimpleNamespace(graph=serialize.load(project["graph"]),
                                     params=load_file(str(project["weights"])))

    fake = types.ModuleType("rlx.frontends.onnx")
    fake.from_onnx = from_onnx  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rlx.frontends", types.ModuleType("rlx.frontends"))
    monkeypatch.setitem(sys.modules, "rlx.frontends.onnx", fake)
    model = project["dir"] / "m.onnx"
    model.write_bytes(b"stand-in")
    art = project["dir"] / "art"
    assert main(["compile", str(model), "-o", str(art), "--max-dim", "n=8", "-q"]) == 0
    assert "with 1 weight tensor(s)" in capsys.readouterr().out
    assert calls == [(model, {"n": 8})]
    assert (art / "weights.safetensors").is_file()
    npz = project["dir"] / "o.npz"
    assert main(["run", str(art), "--input", f"x={project['x']}", "--output", str(npz)]) == 0
    np.testing.assert_allclose(np.load(npz)["out0"], _expected(project), rtol=1e-6, atol=1e-6)
    assert main(["compile", str(model), "--max-dim", "n"]) == 2
    assert "--max-dim takes NAME=N" in capsys.readouterr().err


def test_real_onnx_model_end_to_end(tmp_path: Path, cache_root: Path, capsys: pytest.CaptureFixture[str]):
    onnx = pytest.importorskip("onnx")  # an optional dependency (the `onnx` extra; installed by `dev`)
    from onnx import TensorProto, helper, numpy_helper

    w = (np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "tiny_onnx",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        initializer=[numpy_helper.from_array(w, "w")])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
    np.save(tmp_path / "x.npy", x)
    art = tmp_path / "art"
    assert main(["compile", str(path), "-o", str(art), "--max-dim", "n=8", "-q"]) == 0
    npz = tmp_path / "o.npz"
    assert main(["run", str(art), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(npz)]) == 0
    (y,) = np.load(npz).values()
    np.testing.assert_allclose(y, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("command", ["report", "compile", "inspect"])
def test_unbounded_onnx_dims_are_a_usage_error_naming_each_dim_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   command: str):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    def value(name: str) -> object:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "seq len", 4])

    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"])], "two_inputs", [value("x"), value("y")],
                              [value("z")])
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    extra = ["-o", str(tmp_path / "r.html")] if command == "report" else []
    assert main([command, str(path), *extra, "--max-dim", "batch=2"]) == 2
    err = capsys.readouterr().err
    assert "'seq len' (input 'x' axis 1, input 'y' axis 1)" in err and "--max-dim 'seq len=N'" in err
    assert "'batch'" not in err
    assert main([command, str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("'batch'") == 1 and err.count("'seq len'") == 1, err
    assert "--max-dim batch=N --max-dim 'seq len=N'" in err


# ── examples/ end to end ──────────────────────────────────────────────────


def test_examples_walkthrough(tmp_path: Path, cache_root: Path):
    """README's walkthrough: trace + save JSON, rlxc compile, rlxc run, then the C consumer on the artifact."""
    env = {"RLX_CACHE_DIR": str(cache_root)}
    made = subprocess.run([sys.executable, str(REPO / "examples" / "mlp.py"), str(tmp_path)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert made.returncode == 0, made.stderr
    expected = np.load(tmp_path / "expected.npy")
    art = tmp_path / "mlp_artifact"
    built = rlxc("compile", str(tmp_path / "mlp.json"), "-o", str(art), "--weights", str(tmp_path / "mlp.safetensors"),
                 env=env)
    assert built.returncode == 0 and "with 4 weight tensor(s)" in built.stdout, built.stderr
    ran = rlxc("run", str(art), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "y.npz"), env=env)
    assert ran.returncode == 0, ran.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], expected, rtol=1e-5, atol=1e-6)

    cc = shutil.which(os.environ.get("CC") or "cc")
    assert cc is not None, "a C compiler is a requirement of RLX itself"
    consumer = tmp_path / "consumer"
    build = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(consumer),
                            str(REPO / "examples" / "consumer.c"), "-I", str(art), "-L", str(art), "-l:model.so",
                            f"-Wl,-rpath,{art}"], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(consumer), str(art), str(tmp_path / "x.npy")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [[float(v) for v in line.split("=")[1].split()] for line in out.stdout.splitlines()]
    np.testing.assert_allclose(np.array(rows, np.float32), expected, rtol=1e-5, atol=1e-6)
    # The C ABI's checks reach the consumer: a missing artifact is a message and exit 1, not a crash.
    bad = subprocess.run([str(consumer), str(tmp_path / "nowhere"), str(tmp_path / "x.npy")], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "cannot open" in bad.stderr


def test_inspect_support_prints_the_op_backend_table(capsys: pytest.CaptureFixture[str]):
    assert main(["inspect", "--support"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert out.split()[1:4] == ["cpu", "cuda", "metal"]
    assert rows["matmul"] == ["yes", "yes", "yes"] and rows["attention"] == ["yes", "yes", "yes"]
    # Metal has a rule for every op kind but the recurrent ones (scan and the SSM layers: CPU and CUDA
    # only so far), dynamic int8 (CPU only), the collectives (CPU and CUDA only so far), sample_top_k
    # (its u and settings are f64, which MSL lacks), batched LoRA, the MoE ops and the convolutions (conv, pool;
    # CPU and CUDA only so far); custom_fn is inlined before
    # codegen; cond and while_loop have CPU and CUDA rules and are lowered to a select and a masked scan on Metal
    # (rlx/opt/control.py); batch_norm has no rule anywhere: the decompose stage rewrites it into primitives;
    # iota (a dynamic-length arange) has CPU and CUDA rules only so far; so have the token feedback ops (token_feed,
    # token_store: a serving decoder's, which runs on the CPU and CUDA)
    assert rows["cond"] == rows["while_loop"] == ["yes", "yes", "-"]
    assert {op for op, r in rows.items() if r[2] != "yes"} == {
        "custom_fn", "cond", "while_loop", "scan", "selective_scan", "gated_delta_net", "depthwise_conv1d_causal",
        "all_reduce", "all_gather", "reduce_scatter", "int8_matmul", "sample_top_k", "lora_matmul",
        "moe_topk", "moe_gate", "moe_matmul", "conv", "pool", "batch_norm", "iota", "token_feed", "token_store"}
    assert rows["user_op"] == ["yes", "yes", "yes"]  # each backend's rule; an op without its code is refused
    assert rows["moe_matmul"] == ["yes", "yes", "-"]
    assert rows["batch_norm"] == ["-", "-", "-"] and rows["conv"] == ["yes", "yes", "-"]
    assert "input" not in rows  # leaves need no rule


def test_inspect_without_a_path_or_support_is_a_usage_error():
    assert main(["inspect"]) == 2


def test_inspect_lir_shows_the_legalizing_casts(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    g = rlx.Graph("half")
    g.set_outputs([g.softmax(g.input("x", [2, 8], "bf16"))])
    path = tmp_path / "half.json"
    g.save(path)
    assert main(["inspect", str(path), "--stage", "lir"]) == 0
    out = capsys.readouterr().out
    assert "# legalize bf16->f32 for softmax %1" in out and "# legalize f32->bf16 after softmax %1" in out


# ── observing: bench --profile, inspect --memory, report ──────────────────


def test_bench_profile_prints_top_ops_and_writes_a_trace(tmp_path: Path, cache_root: Path,
                                                         capsys: pytest.CaptureFixture[str]):
    graph = tiny_graph(tmp_path / "g.json")
    trace = tmp_path / "t.json"
    assert main(["bench", str(graph), "--reps", "3", "--profile", "--trace", str(trace), "-q"]) == 0
    out = capsys.readouterr().out
    assert "top ops over the 3 timed calls" in out
    row = next(line for line in out.splitlines() if "fused_matmul_bias_act" in line)
    calls, _ms, share = row.split()[2:5]
    assert calls == "3" and share == "100.0%"  # one kernel: the GEMM with its relu
    assert "GFLOP/s" in out and "GB/s" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X" and e["tid"] == 0) == 3


def test_bench_profile_refuses_an_unprofiled_artifact(tmp_path: Path, cache_root: Path,
                                                      capsys: pytest.CaptureFixture[str]):
    graph = tiny_graph(tmp_path / "g.json")
    assert main(["compile", str(graph), "-o", str(tmp_path / "art"), "-q"]) == 0
    assert main(["bench", str(tmp_path / "art"), "--profile"]) == 2
    assert "not built profiled" in capsys.readouterr().err
    assert main(["bench", str(graph), "--trace", str(tmp_path / "t.json")]) == 2


def test_inspect_memory(tmp_path: Path, cache_root: Path, capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch):
    import rlx
    from rlx.ir import serialize

    graph = tiny_graph(tmp_path / "g.json")
    assert main(["inspect", str(graph), "--memory", "--num-threads", "2"]) == 0
    out = capsys.readouterr().out
    est = rlx.Session().estimate(serialize.load(graph), num_threads=2)
    assert "dynamic dims at their bounds: n<=8" in out
    rows = {line.split()[0]: int(line.split()[1].replace(",", "")) for line in out.splitlines()[1:]}
    assert rows["arena"] == est.arena and rows["params"] == est.params and rows["total"] == est.total
    assert rows["inputs"] == 8 * 4 * 4 and rows["outputs"] == 8 * 3 * 4
    assert not list(cache_root.rglob("model.so")), "--memory compiles nothing"
    assert "profiled" not in out  # a normal build's context record has no span ring
    assert main(["inspect", str(graph), "--memory", "--stage", "lir"]) == 2
    capsys.readouterr()
    monkeypatch.setenv("RLX_PROFILE", "1")
    assert main(["inspect", str(graph), "--memory"]) == 0
    context = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("context"))
    assert context.endswith("the context record, with a profiled build's span ring")


def test_report_writes_a_self_contained_page(tmp_path: Path, cache_root: Path, capsys: pytest.CaptureFixture[str]):
    graph = tiny_graph(tmp_path / "g.json")
    trace = tmp_path / "t.json"
    assert main(["bench", str(graph), "--reps", "2", "--profile", "--trace", str(trace), "-q"]) == 0
    out = tmp_path / "report.html"
    assert main(["report", str(graph), "-o", str(out), "--trace", str(trace)]) == 0
    html = out.read_text()
    data = json.loads(html.split('id="rlx-data">', 1)[1].split("</script>", 1)[0])
    assert [s["name"] for s in data["stages"]] == ["MIR", "LIR"]
    assert data["trace"]["total_us"] > 0
    assert main(["report", str(graph)]) == 2  # -o is required
    assert main(["report", str(graph), "-o", str(out), "--trace", str(tmp_path / "missing.json")]) == 2

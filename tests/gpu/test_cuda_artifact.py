"""CUDA artifacts on a GPU: compile, save with weights, `rlx.load` (a `CudaGraph`), run, and the plain-C
consumer (examples/consumer_cuda.c) on the same artifact. The checks that need no GPU (manifest, arch refusal)
are tests/runtime/test_cuda_artifact.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.driver import Device, Session
from rlx.runtime.artifact_load import read_manifest
from rlx.runtime.cuda_device import CudaGraph
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

REPO = Path(__file__).resolve().parents[2]
CC = shutil.which(os.environ.get("CC") or "cc")


def mlp(t: rlx.Tracer) -> dict[str, rlx.TracedTensor]:
    """examples/mlp.py's model (the one examples/consumer_cuda.c knows): x[batch, 4] -> y[batch, 3]."""
    x = t.input("x", [rlx.Dim.dynamic("batch", max=64), 4])
    w1, b1 = t.param("w1", [4, 16]), t.param("b1", [16])
    w2, b2 = t.param("w2", [16, 3]), t.param("b2", [3])
    return {"y": ((x @ w1 + b1).gelu()) @ w2 + b2}


@pytest.fixture(scope="module")
def model() -> tuple:
    graph = rlx.trace("mlp", mlp)
    rng = np.random.default_rng(7)
    weights = {"w1": rng.standard_normal((4, 16)).astype(np.float32) / 2,
               "b1": rng.standard_normal(16).astype(np.float32),
               "w2": rng.standard_normal((16, 3)).astype(np.float32) / 4,
               "b2": rng.standard_normal(3).astype(np.float32)}
    x = rng.standard_normal((5, 4)).astype(np.float32)
    return graph, weights, x, reference.run(graph, {"x": x}, weights)[0]


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_save_load_run_round_trip(model: tuple, tmp_path: Path, precision: str) -> None:
    graph, weights, x, want = model
    cg = Session(Device.CUDA, precision=precision).compile(graph)
    for k, v in weights.items():
        cg.set_param(k, v)
    before = cg.run(x=x)[0]
    out = cg.save(tmp_path / "art", weights=True)
    m = read_manifest(out)
    assert m["target"] == "cuda" and m["arch"] == visible_gpu_arch() and m["precision"] == precision
    assert {"model.so", "model.cu", "rlx.h", "rlx_cuda.h", "weights.safetensors"} <= set(m["files"])
    moved = tmp_path / "moved"
    shutil.move(out, moved)
    again = rlx.load(moved)
    assert isinstance(again, CudaGraph) and again.precision == precision
    got = again.run(x=x)[0]
    np.testing.assert_array_equal(got, before)  # the same library, the same weights: the same bits
    if precision == "f32":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:  # f16 storage, f32 accumulation: a few units of f16 rounding (4.9e-4) relative to the output
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 4e-3
    dev = again.run_device(x=again.to_device(x))[0].numpy()
    np.testing.assert_array_equal(dev, got)


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_plain_c_consumer_runs_the_cuda_artifact(model: tuple, tmp_path: Path) -> None:
    graph, weights, x, want = model
    cg = Session(Device.CUDA).compile(graph)
    for k, v in weights.items():
        cg.set_param(k, v)
    art = cg.save(tmp_path / "art", weights=True)
    exe = tmp_path / "consumer_cuda"
    build = subprocess.run([CC, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(exe),
                            str(REPO / "examples" / "consumer_cuda.c"), "-I", str(art), "-L", str(art),
                            "-l:model.so", f"-Wl,-rpath,{art}"], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([str(exe), str(art), str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = np.array([[float(v) for v in line.split("=")[1].split()] for line in proc.stdout.splitlines()], np.float32)
    np.testing.assert_array_equal(rows, cg.run(x=x)[0])  # %.9g prints a float32 exactly
    np.testing.assert_allclose(rows, want, rtol=1e-5, atol=1e-5)


def _python(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter with this checkout first on the path, as a user runs rlxc."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "RLX_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_readme_cuda_walkthrough(tmp_path: Path) -> None:
    """README's GPU steps: examples/mlp.py, rlxc compile --target cuda, rlxc run, then examples/consumer_cuda.c."""
    cache = tmp_path / "cache"
    made = _python(str(REPO / "examples" / "mlp.py"), str(tmp_path), cache=cache)
    assert made.returncode == 0, made.stderr
    expected = np.load(tmp_path / "expected.npy")
    art = tmp_path / "art_cuda"
    built = _python("-m", "rlx.cli", "compile", str(tmp_path / "mlp.json"), "-o", str(art), "--target", "cuda",
                    "--weights", str(tmp_path / "mlp.safetensors"), cache=cache)
    assert built.returncode == 0 and "with 4 weight tensor(s)" in built.stdout, built.stderr
    assert read_manifest(art)["arch"] == visible_gpu_arch()
    ran = _python("-m", "rlx.cli", "run", str(art), "--input", f"x={tmp_path / 'x.npy'}", "--output",
                  str(tmp_path / "y.npz"), cache=cache)
    assert ran.returncode == 0, ran.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], expected, rtol=1e-5, atol=1e-6)
    exe = tmp_path / "consumer_cuda"
    build = subprocess.run([CC, "-O2", "-o", str(exe), str(REPO / "examples" / "consumer_cuda.c"), "-I", str(art),
                            "-L", str(art), "-l:model.so", f"-Wl,-rpath,{art}"], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(exe), str(art), str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [[float(v) for v in line.split("=")[1].split()] for line in out.stdout.splitlines()]
    np.testing.assert_allclose(np.array(rows, np.float32), expected, rtol=1e-5, atol=1e-6)

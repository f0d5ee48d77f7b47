"""CUDA artifacts without a GPU: a library cross-compiled for sm_90 saved as an artifact, its manifest, the arch
check `load` makes before touching the library, and the plain-C consumer built against its headers.

The round trip on a GPU (save, `rlx.load`, run, the C consumer's output) is tests/gpu/test_cuda_artifact.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.config import Config
from rlx.errors import ArtifactError, BuildError
from rlx.opt.memplan import plan
from rlx.runtime import artifact
from rlx.runtime.artifact import check_gpu_arch, save_library
from rlx.runtime.artifact_load import load, read_manifest

REPO = Path(__file__).resolve().parents[2]
CC = shutil.which(os.environ.get("CC") or "cc")


def _has_nvcc() -> bool:
    from rlx.toolchain.cuda import find_nvcc

    try:
        find_nvcc("nvcc")
        return True
    except BuildError:
        return False


def mlp(t: rlx.Tracer) -> dict[str, rlx.TracedTensor]:
    """examples/mlp.py's model (the one examples/consumer_cuda.c knows): x[batch, 4] -> y[batch, 3]."""
    x = t.input("x", [rlx.Dim.dynamic("batch", max=64), 4])
    w1, b1 = t.param("w1", [4, 16]), t.param("b1", [16])
    w2, b2 = t.param("w2", [16, 3]), t.param("b2", [3])
    return {"y": ((x @ w1 + b1).gelu()) @ w2 + b2}


@pytest.fixture(scope="module")
def cuda_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/mlp.py's model cross-compiled for sm_90 (built-in GEMM: no cuBLASLt needed) and saved."""
    if not _has_nvcc():
        pytest.skip("nvcc is not installed")
    from rlx.codegen.cuda import CudaTarget
    from rlx.pipeline.cuda import build_cuda

    root = tmp_path_factory.mktemp("cuda-art")
    g = rlx.trace("mlp_cuda", mlp)
    built = build_cuda(plan(g), Config(cache_dir=root / "cache"), CudaTarget(gemm="builtin"), arch="sm_90")
    return save_library(built.library, root / "art", source=built.source)


def test_manifest_records_target_arch_and_files(cuda_artifact: Path) -> None:
    m = read_manifest(cuda_artifact)
    assert (m["target"], m["arch"], m["gemm"], m["precision"]) == ("cuda", "sm_90", "builtin", "f32")
    assert sorted(p.name for p in cuda_artifact.iterdir()) == sorted(
        ["manifest.json", "model.so", "model.cu", "rlx.h", "rlx_cuda.h"])
    assert m["bundled_libraries"] == [] and m["weights"] == []
    assert set(m["files"]) == {"model.so", "model.cu", "rlx.h", "rlx_cuda.h"}
    assert "rlx_run_device" in (cuda_artifact / "rlx_cuda.h").read_text()
    assert 'for graph "mlp_cuda"' in (cuda_artifact / "model.cu").read_text()


@pytest.mark.parametrize(("gpu", "message"), [
    ("sm_80", "built for sm_90 GPUs; this machine's GPU is sm_80, which cannot run it: rebuild it here"),
    ("sm_100", "built for sm_90 GPUs; this machine's GPU is sm_100"),
    (None, "built for sm_90 GPUs; no NVIDIA GPU is visible here"),
])
def test_load_refuses_another_gpu_arch_before_touching_the_library(
        cuda_artifact: Path, monkeypatch: pytest.MonkeyPatch, gpu: str | None, message: str) -> None:
    import rlx.toolchain.cuda as tc

    monkeypatch.setattr(tc, "visible_gpu_arch", lambda: gpu)
    monkeypatch.setattr("rlx.runtime.loader.load_library",
                        lambda *a, **k: pytest.fail("the library was opened despite the arch mismatch"))
    with pytest.raises(ArtifactError, match=message):
        load(cuda_artifact)


def test_a_matching_gpu_passes_the_arch_check(cuda_artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an sm_90 GPU faked, every check passes and the load gets as far as starting the library."""
    import rlx.toolchain.cuda as tc

    monkeypatch.setattr(tc, "visible_gpu_arch", lambda: "sm_90")
    artifact.check_loadable(read_manifest(cuda_artifact), cuda_artifact)


def test_a_tampered_arch_is_refused(cuda_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlx.toolchain.cuda as tc

    monkeypatch.setattr(tc, "visible_gpu_arch", lambda: "sm_90")
    copy = tmp_path / "art"
    shutil.copytree(cuda_artifact, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["arch"] = "hopper"
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="records no valid GPU arch \\('hopper'\\)"):
        load(copy)


@pytest.mark.parametrize(("built", "gpu", "runs"), [
    ("sm_90", "sm_90", True), ("sm_80", "sm_86", True), ("sm_86", "sm_80", False), ("sm_80", "sm_90", False),
    ("sm_90a", "sm_90", True), ("sm_90a", "sm_91", False), ("sm_100a", "sm_103", False), ("sm_120", "sm_121", True),
])
def test_binary_compatibility_rule(built: str, gpu: str, runs: bool) -> None:
    """Machine code (no PTX) runs on its own arch and later minors of its major; an `a` arch on itself only."""
    if runs:
        check_gpu_arch(built, gpu)
    else:
        with pytest.raises(ArtifactError, match="cannot run it"):
            check_gpu_arch(built, gpu)


def test_visible_gpu_arch_respects_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx.toolchain.cuda import visible_gpu_arch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpu_arch() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpu_arch() is None


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_c_consumer_builds_against_the_artifact_and_fails_cleanly_without_a_gpu(
        cuda_artifact: Path, tmp_path: Path) -> None:
    """examples/consumer_cuda.c compiles with the artifact's rlx.h + rlx_cuda.h and links its model.so alone;
    with no usable GPU it exits 1 with the library's reason (on a GPU: tests/gpu/test_cuda_artifact.py)."""
    exe = tmp_path / "consumer_cuda"
    build = subprocess.run([CC, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(exe),
                            str(REPO / "examples" / "consumer_cuda.c"), "-I", str(cuda_artifact), "-L",
                            str(cuda_artifact), "-l:model.so", f"-Wl,-rpath,{cuda_artifact}"],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    from rlx.toolchain.cuda import visible_gpu_arch

    if visible_gpu_arch() is not None:
        pytest.skip("a GPU is visible: the run is covered by tests/gpu/test_cuda_artifact.py")
    (tmp_path / "w").mkdir()
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    shutil.copytree(cuda_artifact, tmp_path / "art")
    save_file({"w1": rng.standard_normal((4, 16), np.float32), "b1": np.zeros(16, np.float32),
               "w2": rng.standard_normal((16, 3), np.float32), "b2": np.zeros(3, np.float32)},
              str(tmp_path / "art" / "weights.safetensors"))
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    proc = subprocess.run([str(exe), str(tmp_path / "art"), str(tmp_path / "x.npy")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "rlx_create failed: " in proc.stderr, proc.stderr
    assert "CUDA" in proc.stderr or "device" in proc.stderr

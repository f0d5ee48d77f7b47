"""Builds a CUDA emulator library of tests/codegen/cuda_emu: one .cpp compiled by g++ (C++20) against the CUDA shim
(cuda_emu/cuda_shim.h) and templates/cuda/kernels, so the CUDA kernels run on the CPU. Shared by the
test_cuda_*_emulated.py files; skips the calling test without g++ or C++20."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from rlx.templates_path import templates_dir

EMU_DIR = Path(__file__).resolve().parent / "cuda_emu"


def build_emu(tmp_path_factory: pytest.TempPathFactory, cpp: str) -> ctypes.CDLL:
    """Compile `cuda_emu/<cpp>` into a shared library and load it (the caller sets its argtypes)."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not installed")
    out = tmp_path_factory.mktemp("cuda_emu") / Path(cpp).with_suffix(".so").name
    cmd = [cxx, "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-I", str(EMU_DIR),
           "-I", str(templates_dir() / "cuda" / "kernels"), str(EMU_DIR / cpp), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 and "c++20" in proc.stderr:
        pytest.skip("g++ lacks C++20")
    assert proc.returncode == 0, proc.stderr
    return ctypes.CDLL(str(out))

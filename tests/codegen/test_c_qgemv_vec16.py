"""The AVX-512 f32 decode GEMV of templates/cpu/kernels/quant.h, checked on any x86-64 machine: its source
is written in GCC's 16-float vector types, so tests/codegen/data/qgemv_vec16.c builds it with
-DRLX_QGEMV_VEC16 where AVX-512 is missing and checks batch invariance (bit for bit) and the f32
dot-product bound against the float64 product of the exactly dequantized weights."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

from rlx.templates_path import templates_dir
from rlx.toolchain.compiler import detect_toolchain

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 kernels")
def test_the_avx512_f32_gemv_is_batch_invariant_and_within_its_bound(tmp_path: Path) -> None:
    cc = detect_toolchain().cc
    exe = tmp_path / "qgemv_vec16"
    flags = ["-O2", "-std=gnu11", "-march=native", "-DRLX_QGEMV_VEC16", "-Wno-psabi", "-Wno-unknown-pragmas",
             f"-I{templates_dir() / 'cpu'}"]
    subprocess.run([cc, *flags, "-o", str(exe), str(DATA / "qgemv_vec16.c"), "-lm"], check=True, timeout=300)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "VEC16-OK" in r.stdout, r.stdout + r.stderr

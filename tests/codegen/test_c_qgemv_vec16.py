"""The f32 decode GEMVs of templates/cpu/kernels/quant_kernels.h, checked on any x86-64 machine: the AVX-512 one is
written in GCC's 16-float vector types, so tests/codegen/data/qgemv_vec16.c builds it with
-DRLX_QGEMV_VEC16 where AVX-512 is missing; the AVX2 one (also 8 rows a tile) builds for x86-64-v3. Each
is checked for batch invariance (bit for bit: a speculative verification's rows equal one-row steps) and
the f32 dot-product bound against the float64 product of the exactly dequantized weights."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

from rlx.templates_path import templates_dir
from rlx.toolchain.compiler import detect_toolchain

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 kernels")
@pytest.mark.parametrize("kernel", ["avx512", "avx2"])
def test_the_f32_gemv_is_batch_invariant_and_within_its_bound(tmp_path: Path, kernel: str) -> None:
    cc = detect_toolchain().cc
    exe = tmp_path / "qgemv_vec16"
    isa = ["-march=native", "-DRLX_QGEMV_VEC16"] if kernel == "avx512" else ["-march=x86-64-v3"]
    flags = ["-O2", "-std=gnu11", *isa, "-Wno-psabi", "-Wno-unknown-pragmas", f"-I{templates_dir() / 'cpu'}"]
    subprocess.run([cc, *flags, "-o", str(exe), str(DATA / "qgemv_vec16.c"), "-lm"], check=True, timeout=300)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "VEC16-OK" in r.stdout, r.stdout + r.stderr

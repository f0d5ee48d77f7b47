"""The CUTLASS GEMM units' toolchain side: finding the headers, the unit keys, and refusing what cannot be built.

No nvcc needed (tests/codegen/test_cuda_cutlass.py compiles one; tests/gpu/test_cuda_cutlass.py runs them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx.codegen.cuda import CudaTarget
from rlx.config import Config
from rlx.errors import BuildError
from rlx.toolchain.cuda import Cublas, NvccToolchain, cutlass_note, resolve_target
from rlx.toolchain.cuda_units import (
    Cutlass,
    CutlassUnitToolchain,
    cutlass_objects,
    cutlass_status,
    find_cutlass,
    unit_function,
    unit_path,
    units_in_source,
)
from rlx.toolchain.units import unit_components


def _nvcc(arch: str = "sm_90") -> NvccToolchain:
    return NvccToolchain("/usr/bin/nvcc-none", "release 13.0", arch, Cublas("/inc", "/lib", "/lib/libcublasLt.so"))


def _fake_cutlass(tmp_path: Path) -> Path:
    inc = tmp_path / "include"
    (inc / "cutlass").mkdir(parents=True)
    (inc / "cutlass" / "cutlass.h").write_text("// stand-in\n")
    (inc / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n")
    return inc


def test_find_cutlass_from_a_directory(tmp_path) -> None:
    inc = _fake_cutlass(tmp_path)
    found = find_cutlass(str(inc))
    assert found.found and found.include_dir == str(inc.resolve()) and "version_h=" in found.identity()
    missing = find_cutlass(str(tmp_path / "nowhere"))
    assert not missing.found and "holds no cutlass/cutlass.h" in missing.reason and missing.identity() == "none"


def test_status_and_target_resolution(tmp_path) -> None:
    ok = find_cutlass(str(_fake_cutlass(tmp_path)))
    assert cutlass_status(_nvcc(), ok) == ""
    assert "sm_80" in cutlass_status(_nvcc("sm_80"), ok)
    assert "not found" in cutlass_status(_nvcc(), Cutlass(reason="CUTLASS headers not found"))
    # another arch: the build turns the option off, and the manifest says why
    target = resolve_target(_nvcc("sm_80"), CudaTarget())
    assert not target.cutlass_gemm and "cutlass_gemm=0" in target.identity()
    assert "sm_90 kernels" in cutlass_note(_nvcc("sm_80"), target)


def test_rlx_cutlass_0_turns_the_units_off(tmp_path, monkeypatch) -> None:
    headers = str(_fake_cutlass(tmp_path))
    monkeypatch.setenv("RLX_CUTLASS_DIR", headers)  # what cutlass_note and the key components read
    assert resolve_target(_nvcc(), CudaTarget(), Config.from_env({"RLX_CUTLASS_DIR": headers})).cutlass_gemm
    off = resolve_target(_nvcc(), CudaTarget(), Config.from_env({"RLX_CUTLASS_DIR": headers, "RLX_CUTLASS": "0"}))
    assert not off.cutlass_gemm and "cutlass_gemm=0" in off.identity()
    assert "RLX_CUTLASS=0" in cutlass_note(_nvcc(), off)


def test_unit_keys_differ_per_configuration(tmp_path) -> None:
    cut = find_cutlass(str(_fake_cutlass(tmp_path)))
    keys = {str(unit_components(unit_path(), CutlassUnitToolchain(_nvcc(), cut, d, a, t)))  # type: ignore[arg-type]
            for d in ("f16", "bf16") for a in ("gelu", "silu") for t in (128, 256)}
    assert len(keys) == 8
    flags = CutlassUnitToolchain(_nvcc(), cut, "bf16", "silu", 256).object_flags
    assert "-DRLX_CUTLASS_DT=2" in flags and "-DRLX_CUTLASS_ACT=3" in flags and "-DRLX_CUTLASS_TILE_M=256" in flags
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags  # wgmma: the arch-specific sm_90a


def test_names_and_refusals(tmp_path) -> None:
    assert unit_function("f16", "gelu", 128) == "rlx_cutlass_gemm_f16_gelu_m128"
    with pytest.raises(BuildError, match="no CUTLASS GEMM"):
        unit_function("f32", "gelu", 128)
    assert units_in_source("RLX_CUTLASS_DECL(bf16_silu_m256);") == ()
    assert cutlass_objects("int x;", _nvcc("sm_80"), tmp_path) == ()  # nothing called: nothing built
    with pytest.raises(BuildError, match=r"cannot be built: .*sm_80"):
        cutlass_objects("rlx_cutlass_gemm_f16_gelu_m128(a)", _nvcc("sm_80"), tmp_path)

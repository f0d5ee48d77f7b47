"""Which GEMMs run on the CUTLASS sm90 unit (CutlassGemm decisions of rlx/opt/lowering_cuda_kernels.py), and nvcc
builds it and links it.

Runs without a GPU; tests/gpu/test_cuda_cutlass.py checks the numbers on one. The compile test needs nvcc,
cublasLt.h and CUTLASS's headers (the optional nvidia-cutlass wheel, which `make install CUDA=1` adds),
and takes about a minute of one core (one CUTLASS instantiation).
"""

from __future__ import annotations

import subprocess

import pytest

from rlx.codegen.cuda import CudaTarget
from rlx.errors import BuildError
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.opt.lowering_cuda_kernels import cutlass_choice
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc
from rlx.toolchain.cuda_units import CutlassUnitToolchain, cutlass_for, unit_path, units_in_source
from tests.gpu.gemm_common import forward, gemm_chain, render


def _graph(n: int = 136, k: int = 40, act: str = "gelu") -> Graph:
    """act(x W1 + b1) then silu(. W2) then relu(. W3 + b3) (cuBLASLt's epilogue fuses relu)."""
    return gemm_chain("cutlass_rule", 512, k, [(n, True, act), (64, False, "silu"), (32, True, "relu")],
                      every_output=False)


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_unfusable_activations_move_to_cutlass(precision: str) -> None:
    src = forward(render(_graph(), precision=DType.parse(precision)))
    for act in ("gelu", "silu"):  # one call each, picking its tile at run time
        assert src.count(f"rlx_cutlass_gemm_{precision}_{act}_m256 : rlx_cutlass_gemm_{precision}_{act}_m128)(") == 1
    assert "rlx_bias_act_vec<" not in src  # no separate activation pass
    assert src.count("rlx_lt_matmul(") == 1  # the relu product: cuBLASLt's epilogue fuses it
    assert "CUTLASS sm90 GEMM, bias and gelu in its epilogue" in src  # the choice, in the generated source
    assert units_in_source(src) == tuple((precision, a, t) for a in ("gelu", "silu") for t in (128, 256))


def test_what_stays_on_cublaslt_and_why() -> None:
    # the switch off, f32, the tanh GELU (cuBLASLt fuses it), N not a multiple of 8, another arch
    for src in (render(_graph(), precision=DType.F16, cutlass_gemm=False), render(_graph()),
                render(_graph(act="gelu_tanh"), precision=DType.F16),
                render(_graph(n=134), precision=DType.F16), render(_graph(), precision=DType.F16, arch="sm_80")):
        assert "rlx_cutlass_gemm_f16_gelu" not in forward(src)
    src = forward(render(_graph(n=134), precision=DType.F16))
    assert "not on CUTLASS: N = 134 is not a multiple of 8" in src and "rlx_bias_act<__half, RLX_ACT_GELU" in src
    assert "cutlass_gemm=0" in CudaTarget(cutlass_gemm=False).identity()
    assert "cutlass_gemm" not in CudaTarget().identity()


def test_choice_refusals() -> None:
    ok = dict(enabled=True, arch="sm_90", dt=DType.F16, act="gelu", folded=True, K=Dim(384), N=Dim(1536),
              offsets=[0, 16, 32, 48])
    assert cutlass_choice(**ok).function == "rlx_cutlass_gemm_f16_gelu"
    assert cutlass_choice(**{**ok, "dt": DType.BF16, "act": "silu"}).function == "rlx_cutlass_gemm_bf16_silu"
    for change, why in [({"act": "relu"}, "fused by cuBLASLt"), ({"enabled": False}, "cutlass_gemm=False"),
                        ({"arch": "sm_80"}, "sm_90"), ({"dt": DType.F32}, "f32"), ({"folded": False}, "batched"),
                        ({"K": Dim(388)}, "K = 388"), ({"N": Dim.dynamic("n", max=64)}, "N is dynamic"),
                        ({"offsets": [0, 8, 32, 48]}, "16-byte aligned"), ({"offsets": [0, None]}, "aligned")]:
        c = cutlass_choice(**{**ok, **change})
        assert c.function == "" and why in c.why, (change, c.why)


def test_compiles_and_links(tmp_path) -> None:
    """The program calling rlx_cutlass_gemm_f16_gelu_m128 and that unit (one CUTLASS instantiation: about a minute)
    link into one .so (the _m256 unit, the same code with another tile, is left undefined, as a shared object
    may be: this test never loads it)."""
    try:
        nvcc, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    cublas, cutlass = find_cublas(nvcc), cutlass_for()
    if not cublas.found:
        pytest.skip("cublasLt.h not found (make install CUDA=1 adds the nvidia-cublas wheel)")
    if not cutlass.found:
        pytest.skip(f"{cutlass.reason}")
    tc = NvccToolchain(nvcc, text, "sm_90", cublas)
    src = render(gemm_chain("cutlass_link", 512, 40, [(136, True, "gelu")]), precision=DType.F16)
    assert units_in_source(src) == (("f16", "gelu", 128), ("f16", "gelu", 256))
    unit = tmp_path / "gemm_cutlass.o"
    CutlassUnitToolchain(tc, cutlass, "f16", "gelu", 128).compile_object(unit_path(), unit)
    (tmp_path / "model.cu").write_text(src)
    tc.compile(tmp_path / "model.cu", tmp_path / "model.so", "cublaslt", objects=(unit,))
    syms = subprocess.run(["nm", str(tmp_path / "model.so")], capture_output=True, text=True, check=True).stdout
    assert " t rlx_cutlass_gemm_f16_gelu_m128" in syms  # defined and hidden (not exported from model.so)

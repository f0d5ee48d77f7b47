"""The profiled CUDA variant: cudaEvent spans rendered into the .cu, compiled with nvcc (no GPU needed)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from rlx.codegen.cuda import CudaTarget
from rlx.errors import RlxError
from rlx.opt.memplan import plan
from rlx.pipeline.cuda import cuda_context, render_cuda
from rlx.toolchain.cuda import NvccToolchain

_CASES = Path(__file__).parent.parent / "gpu" / "cases.py"
_spec = importlib.util.spec_from_file_location("rlx_cuda_cases_profile", _CASES)
cases = importlib.util.module_from_spec(_spec)
sys.modules["rlx_cuda_cases_profile"] = cases
_spec.loader.exec_module(cases)


def _graph():
    return cases.CASES["minilm_like"]().graph


def test_profiled_source_times_every_kernel_with_work():
    lir = plan(_graph())
    target = CudaTarget(gemm="builtin", profile=True)
    src = render_cuda(lir, target, {"name": "p"})
    ctx = cuda_context(lir, target, {"name": "p"})
    n = ctx["prof_count"]
    assert n >= 5
    # one event before the first kernel, one after each timed kernel, all recorded on the stream
    assert src.count("cudaEventRecord(c->prof_ev[") == n + 1
    assert sorted(int(i) for i in re.findall(r"cudaEventRecord\(c->prof_ev\[(\d+)\]", src)) == list(range(n + 1))
    assert src.count("rlx_prof_record(&c->prof,") == n
    assert "c->graphs_off = 1;" in src  # eager runs: each kernel's events bracket that kernel alone
    timed = [k for pos, k in enumerate(ctx["kernels"]) if pos in ctx["prof"]]
    assert [ctx["prof"][pos]["index"] for pos in sorted(ctx["prof"])] == list(range(n))
    assert all(k.macro not in ("block_view", "block_none", "block_memcpy") for k in timed)
    assert "profile=1" in target.identity() and "profile" not in CudaTarget(gemm="builtin").identity()


def test_normal_cuda_source_has_no_profiling_code():
    src = render_cuda(plan(_graph()), CudaTarget(gemm="builtin"), {"name": "p"})
    # (cudaEventRecord itself is there: a launched host step records its end, `rlx_host_step_launch`)
    for token in ("prof_ev", "RlxProfRing", "rlx_profile_", "cudaEventRecord(c->prof", "rlx_now_ns"):
        assert token not in src


@pytest.mark.parametrize("gemm", ["builtin", "cublaslt"])
def test_profiled_source_compiles(toolchain: NvccToolchain, gemm: str, tmp_path: Path):
    if gemm == "cublaslt" and not toolchain.cublas.found:
        pytest.skip("cublasLt.h not found (pip install 'rlx[cuda]')")
    src = render_cuda(plan(_graph()), CudaTarget(gemm=gemm, profile=True), {"name": "p"})
    path = tmp_path / f"profiled_{gemm}.cu"
    path.write_text(src)
    toolchain.compile(path, path.with_suffix(".o"), gemm, compile_only=True)
    assert path.with_suffix(".o").stat().st_size > 0


def test_check_nans_is_refused_on_cuda():
    import rlx

    with pytest.raises(RlxError, match="CPU backend"):
        rlx.Session(rlx.Device.CUDA, check_nans=True).compile(_graph())

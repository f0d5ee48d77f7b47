"""The sgemm peak probe (`rlx.toolchain.peak`): what `rlxc doctor` and benchmarks/minilm.py state as this
machine's ceiling."""

from __future__ import annotations

import pytest

from rlx.config import Config
from rlx.errors import RlxError
from rlx.toolchain.compiler import Blas, detect_toolchain
from rlx.toolchain.peak import QUICK_SHAPES, SgemmPeak, sgemm_peak

SMALL = ((64, 48, 32), (96, 40, 80))


@pytest.fixture(scope="module")
def blas() -> Blas:
    found = detect_toolchain(Config.from_env()).blas
    if not found.enabled or not found.library:
        pytest.skip("no BLAS library to probe (RLX_BLAS=none or a system BLAS found only by the linker)")
    return found


def test_probe_reports_the_best_shape_and_restores_the_blas_threads(blas: Blas):
    import cffi

    peak = sgemm_peak(blas, threads=1, seconds=0.02, shapes=SMALL)
    assert isinstance(peak, SgemmPeak)
    assert peak.gflops > 0 and peak.shape in SMALL and peak.threads in (0, 1)
    assert f"{peak.gflops:.1f} GFLOP/s" in peak.describe()
    if blas.has_thread_api:
        ffi = cffi.FFI()
        ffi.cdef(f"int {blas.prefix}openblas_get_num_threads(void); void {blas.prefix}openblas_set_num_threads(int);")
        lib = ffi.dlopen(blas.library)
        getattr(lib, f"{blas.prefix}openblas_set_num_threads")(3)
        sgemm_peak(blas, threads=2, seconds=0.0, shapes=SMALL[:1])
        assert getattr(lib, f"{blas.prefix}openblas_get_num_threads")() == 3


def test_no_blas_gives_none_and_bad_arguments_are_refused(blas: Blas):
    assert sgemm_peak(Blas(provider="none"), threads=1) is None
    with pytest.raises(RlxError, match="threads must be >= 1"):
        sgemm_peak(blas, threads=0, seconds=0.0, shapes=SMALL)


def test_quick_shapes_are_minilm_ffn_products():
    assert QUICK_SHAPES == ((1024, 1536, 384), (1024, 384, 1536))

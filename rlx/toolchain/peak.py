"""The sgemm peak of this machine: the best GFLOP/s the BLAS that RLX links reaches on a few GEMM shapes.

It is the ceiling `benchmarks/minilm.py` states its "% peak" against, and what `rlxc doctor` prints, so a
user sees how far a compute-bound model (MiniLM at batch 8 x 128 is ~23 GFLOP of GEMMs) could go here.
The shapes are a square one and BERT's FFN products (K = 384 and 1536); each is timed for its share of
`seconds` (at least three runs), and the best rate of all is the peak. The product is checked against
numpy, so a broken BLAS cannot report a rate.

>>> from rlx.toolchain.compiler import Blas
>>> sgemm_peak(Blas(provider="none"), threads=1) is None
True
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rlx.errors import RlxError
from rlx.toolchain.compiler import Blas

#: (M, N, K) of the probe: square, then MiniLM's FFN up and down projections at batch 8 x 128 (rows x 4).
PEAK_SHAPES: tuple[tuple[int, int, int], ...] = ((1024, 1024, 1024), (4096, 1536, 384), (4096, 384, 1536))
#: The quick probe of `rlxc doctor`: MiniLM's FFN products at batch 8 x 128 (~1.2 GFLOP each).
QUICK_SHAPES: tuple[tuple[int, int, int], ...] = ((1024, 1536, 384), (1024, 384, 1536))


@dataclass(frozen=True)
class SgemmPeak:
    """The best sgemm rate measured, on how many threads, with which shape and BLAS."""

    gflops: float
    threads: int  # 0: the BLAS has no thread API and ran on its own default
    shape: tuple[int, int, int]
    blas: str

    def describe(self) -> str:
        m, n, k = self.shape
        on = f"{self.threads} thread(s)" if self.threads else "the BLAS's default threads"
        return (f"{self.gflops:.1f} GFLOP/s on {on} ({self.blas}; best at "
                f"{m}x{n}x{k}, FLOP = 2MNK)")


def sgemm_peak(blas: Blas, threads: int, seconds: float = 1.0,
               shapes: tuple[tuple[int, int, int], ...] = PEAK_SHAPES) -> SgemmPeak | None:
    """Best sgemm GFLOP/s of `blas` on `threads` threads over `shapes`, each timed for `seconds / len(shapes)`
    (at least 3 runs); None when there is no BLAS (or its library file is unknown). The BLAS's own thread
    count is restored afterwards."""
    if not blas.enabled or not blas.library:
        return None
    if threads < 1 or seconds < 0:
        raise RlxError(f"sgemm_peak: threads must be >= 1 and seconds >= 0, got {threads} and {seconds}")
    import cffi
    import numpy as np

    p = blas.prefix
    ffi = cffi.FFI()
    ffi.cdef(f"void {p}cblas_sgemm(int, int, int, int, int, int, float, const float *, int, const float *, int,"
             " float, float *, int);")
    if blas.has_thread_api:
        ffi.cdef(f"void {p}openblas_set_num_threads(int); int {p}openblas_get_num_threads(void);")
    lib = ffi.dlopen(blas.library)
    sgemm = getattr(lib, f"{p}cblas_sgemm")
    before = getattr(lib, f"{p}openblas_get_num_threads")() if blas.has_thread_api else None
    if blas.has_thread_api:
        getattr(lib, f"{p}openblas_set_num_threads")(threads)
    else:
        threads = 0  # no thread API: the library runs on its own default
    best, best_shape = 0.0, shapes[0]
    try:
        for m, n, k in shapes:
            rng = np.random.default_rng(m + n + k)
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            c = np.empty((m, n), np.float32)
            pa, pb, pc = (ffi.cast("float *", x.ctypes.data) for x in (a, b, c))
            sgemm(101, 111, 111, m, n, k, 1.0, pa, k, pb, n, 0.0, pc, n)  # row-major, no transposes
            want = a[:4].astype(np.float64) @ b[:, :4].astype(np.float64)
            if not np.allclose(c[:4, :4], want, rtol=1e-3, atol=1e-3 * np.sqrt(k)):
                raise RlxError(f"sgemm_peak: {blas.library} computed a wrong {m}x{n}x{k} product")
            runs: list[float] = []
            end = time.perf_counter() + seconds / len(shapes)
            while time.perf_counter() < end or len(runs) < 3:
                t0 = time.perf_counter()
                sgemm(101, 111, 111, m, n, k, 1.0, pa, k, pb, n, 0.0, pc, n)
                runs.append(time.perf_counter() - t0)
            rate = 2 * m * n * k / min(runs) / 1e9
            if rate > best:
                best, best_shape = rate, (m, n, k)
    finally:
        if before is not None:
            getattr(lib, f"{p}openblas_set_num_threads")(before)
    return SgemmPeak(best, threads, best_shape, f"{blas.provider} {blas.version}".strip())

"""Loading RLX's BLAS without a thread pool of its own (`blas_loading`).

RLX calls its BLAS from inside OpenMP threads, one single-threaded GEMM per
thread: every run pins the BLAS to one thread first (`rlx_blas_single_thread`,
templates/cpu/kernels/gemm.h). OpenBLAS, though, sizes its pool once, when the
library is first loaded (from OPENBLAS_NUM_THREADS, else GOTO_NUM_THREADS or
OMP_NUM_THREADS, else the core count), and starts its workers right then; each
one spins about 2^28 cycles (~0.1 s) waiting for work before it sleeps. So the
load of a generated library (whose model.so needs the BLAS) started threads no
run would ever use, which took a core for the first ~0.1 s: on a 2-core
machine with another busy process that is half the CPU of a warm start's first
embed (measured: 55 ms of CPU, `benchmarks/cache.py --warm-start-only`).

`blas_loading()` wraps such a load: OPENBLAS_NUM_THREADS=1 while the library
initializes, unless the user set it (then their value holds, and RLX still runs
it single-threaded), and the environment as it was afterwards, so subprocesses
and libraries loaded later see nothing of it. A BLAS already loaded (numpy's,
when it is the same library) is unaffected: it read its setting when it
loaded. A program that raises the count later (`openblas_set_num_threads(n)`)
still gets n threads: OpenBLAS starts the missing workers then.

>>> import os
>>> before = os.environ.get("OPENBLAS_NUM_THREADS")
>>> with blas_loading():
...     inside = os.environ["OPENBLAS_NUM_THREADS"]
>>> inside == (before or "1"), os.environ.get("OPENBLAS_NUM_THREADS") == before
(True, True)
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

#: The variable OpenBLAS reads first for its thread count (the prefixed scipy-openblas builds read it too).
BLAS_THREADS_VARIABLE = "OPENBLAS_NUM_THREADS"

# Loads that set the variable run one at a time, so one never restores what another set.
_lock = threading.RLock()


@contextlib.contextmanager
def blas_loading() -> Iterator[None]:
    """Around a dlopen that may load OpenBLAS for the first time: it starts with one thread (no pool)."""
    with _lock:
        if BLAS_THREADS_VARIABLE in os.environ:  # the user's setting (or an enclosing load's)
            yield
            return
        os.environ[BLAS_THREADS_VARIABLE] = "1"  # putenv: what the library's constructor reads with getenv
        try:
            yield
        finally:
            os.environ.pop(BLAS_THREADS_VARIABLE, None)


__all__ = ["BLAS_THREADS_VARIABLE", "blas_loading"]

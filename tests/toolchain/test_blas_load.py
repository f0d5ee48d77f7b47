"""RLX's BLAS is loaded without a thread pool (`blas_loading`): OPENBLAS_NUM_THREADS=1 while a generated
library (and the BLAS it needs) loads, never over a user's own setting, and the environment as it was after.

Checked in fresh processes, since OpenBLAS reads the variable once, when it is first loaded: the BLAS's
own `openblas_get_num_threads` after `load_library` says how many threads its pool was started with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rlx
from rlx.toolchain.blas_load import BLAS_THREADS_VARIABLE, blas_loading
from rlx.toolchain.compiler import detect_toolchain

REPO = Path(__file__).resolve().parents[2]

# argv: the library, the BLAS library, its symbol prefix. Prints the BLAS's thread count after the load,
# the variable as the process sees it then, and a run's output.
CHILD = textwrap.dedent("""
    import ctypes, json, os, sys
    import numpy as np
    from rlx.runtime.compiled import CompiledGraph
    from rlx.runtime.loader import load_library
    loaded_before = any(sys.argv[2] in line for line in open("/proc/self/maps"))
    library = load_library(sys.argv[1])
    threads = getattr(ctypes.CDLL(sys.argv[2]), sys.argv[3] + "openblas_get_num_threads")()
    cg = CompiledGraph(library)
    cg.set_param("w", np.eye(64, dtype=np.float32))
    out = cg.run(x=np.ones((64, 64), np.float32))[0]
    print(json.dumps({"loaded_before": loaded_before, "threads": threads,
                      "env": os.environ.get(sys.argv[4]), "sum": float(out.sum())}))
""")


@pytest.fixture(scope="module")
def library() -> tuple[str, str, str]:
    """A generated library that calls the BLAS (a matmul), and the BLAS's path and symbol prefix."""
    blas = detect_toolchain().blas
    if not (blas.enabled and blas.has_thread_api and blas.library):
        pytest.skip("needs an OpenBLAS with its thread API (RLX_BLAS=openblas32, the default)")
    g = rlx.Graph("blas_pool")
    x = g.input("x", [64, 64])
    g.set_outputs([g.matmul(x, g.param("w", [64, 64]))])
    return str(rlx.Session().compile(g).library_path), blas.library, blas.prefix


def _child(library: tuple[str, str, str], **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k != BLAS_THREADS_VARIABLE}
    full.update({"PYTHONPATH": str(REPO), **env})
    proc = subprocess.run([sys.executable, "-P", "-c", CHILD, *library, BLAS_THREADS_VARIABLE], env=full,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_library_load_starts_its_blas_single_threaded(library: tuple[str, str, str]) -> None:
    got = _child(library)
    assert not got["loaded_before"]  # this load is what brought the BLAS in
    assert got["threads"] == 1, "the BLAS started a thread pool its runs never use"
    assert got["env"] is None  # the variable was set for the load only
    assert got["sum"] == 64 * 64  # x @ I: the library runs


def test_a_users_blas_thread_count_is_kept(library: tuple[str, str, str]) -> None:
    got = _child(library, **{BLAS_THREADS_VARIABLE: "2"})
    assert got["threads"] == 2 and got["env"] == "2"


def test_blas_loading_restores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BLAS_THREADS_VARIABLE, raising=False)
    with blas_loading():
        assert os.environ[BLAS_THREADS_VARIABLE] == "1"
        with blas_loading():  # nested (a probe inside a load): the outer setting holds
            assert os.environ[BLAS_THREADS_VARIABLE] == "1"
        assert os.environ[BLAS_THREADS_VARIABLE] == "1"
    assert BLAS_THREADS_VARIABLE not in os.environ
    with pytest.raises(OSError), blas_loading():  # a failed load restores it too
        raise OSError("cannot open shared object file")
    assert BLAS_THREADS_VARIABLE not in os.environ
    monkeypatch.setenv(BLAS_THREADS_VARIABLE, "3")
    with blas_loading():
        assert os.environ[BLAS_THREADS_VARIABLE] == "3"
    assert os.environ[BLAS_THREADS_VARIABLE] == "3"

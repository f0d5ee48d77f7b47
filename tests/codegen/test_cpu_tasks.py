"""`rlx_tasks` (templates/cpu/kernels/threads.h): how a parallel region's threads take their tasks.

With a task pool a spinning team's threads start on their own ranges and, once done, take tasks from the back of
the fullest other range (work stealing): every task runs exactly once whatever the timing, a thread that is late
leaves its range's end to the others, and with no thread late each runs exactly its own range. A team that does
not spin claims tasks one at a time, as before. Built by gcc with -fopenmp from
tests/codegen/cpu_kernels/task_steal.c; a machine without gcc skips.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rlx.templates_path import templates_dir
from rlx.toolchain.compiler import BASE_FLAGS

HARNESS = Path(__file__).resolve().parent / "cpu_kernels" / "task_steal.c"


@pytest.fixture(scope="module")
def so(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("tasks") / "task_steal.so"
    cmd = [cc, *BASE_FLAGS, "-fopenmp", f"-I{templates_dir() / 'cpu'}", str(HARNESS), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lib = ctypes.CDLL(str(out))
    lib.chk_tasks.restype = ctypes.c_int
    lib.chk_tasks.argtypes = [ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def _run(so: ctypes.CDLL, n: int, nt: int, *, spins: int = 1, take: int = 0, slow: int = -1,
         delay_us: int = 0) -> tuple[int, np.ndarray, np.ndarray]:
    owner = np.full(n, -1, np.int32)
    count = np.zeros(n, np.int32)
    got = so.chk_tasks(n, nt, spins, take, slow, delay_us, owner.ctypes.data, count.ctypes.data)
    return got, owner, count


def _ranges(n: int, nt: int) -> np.ndarray:
    """The thread each task's starting range belongs to."""
    return np.array([next(t for t in range(nt) if n * t // nt <= i < n * (t + 1) // nt) for i in range(n)])


@pytest.mark.parametrize("take", [0, 1])
@pytest.mark.parametrize("nt", [2, 3, 4])
def test_a_late_thread_leaves_its_range_end_to_the_others(so, take, nt) -> None:
    n = 24
    got, owner, count = _run(so, n, nt, take=take, slow=0, delay_us=20_000)
    if got < 2:
        pytest.skip(f"the OpenMP runtime gave a team of {got}")
    assert np.all(count == 1), f"tasks ran {count.tolist()} times"
    home = _ranges(n, got)
    # thread 0 starts 20 ms late and takes 20 ms a task: the others finish their ranges long before and take all
    # of its range but the tasks it claimed itself (from the front: the first of its range, in order)
    mine = np.flatnonzero(owner == 0)
    assert np.all(home[mine] == 0), "the late thread ran another's task"
    assert mine.size < np.count_nonzero(home == 0), "nobody took a task of the late thread's range"
    assert np.array_equal(mine, np.arange(mine.size)), f"the late thread ran {mine.tolist()}, not its range's front"


@pytest.mark.parametrize("nt", [2, 4])
def test_every_task_once_with_no_thread_late(so, nt) -> None:
    for _ in range(20):
        got, owner, count = _run(so, 1000, nt)
        assert np.all(count == 1), f"tasks ran {np.unique(count).tolist()} times"
        assert np.all(owner >= 0) and np.all(owner < got)


def test_a_team_that_does_not_spin_claims_tasks(so) -> None:
    got, owner, count = _run(so, 24, 2, spins=0, slow=0, delay_us=20_000)
    if got < 2:
        pytest.skip(f"the OpenMP runtime gave a team of {got}")
    assert np.all(count == 1)
    # claimed one at a time from a shared counter: the late thread gets at most the task it claimed first
    assert np.count_nonzero(owner == 0) <= 1


def test_a_team_of_one_runs_its_range(so) -> None:
    got, owner, count = _run(so, 10, 1)
    assert got == 1 and np.all(count == 1) and np.all(owner == 0)

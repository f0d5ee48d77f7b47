"""`rlx.distributed.launch`: ranks as processes and threads, compiled collectives, failures named."""

from __future__ import annotations

import time

import pytest
import rank_fns

import rlx
from rlx.distributed import RankError, launch
from rlx.errors import ExecutionError


@pytest.fixture(scope="module", autouse=True)
def warm_cache():
    # Ranks compile the same graph: build it once here so each rank process is a cache hit.
    rlx.Session().compile(rank_fns.sum_graph(2), num_threads=1)


def test_processes_run_compiled_collectives():
    assert launch(rank_fns.compiled_sum, nprocs=2) == [[6.0] * 4, [6.0] * 4]  # (1 + 2) * 2 ranks


def test_threads_run_compiled_collectives():
    assert launch(rank_fns.compiled_sum, nprocs=2, threads=True) == [[6.0] * 4, [6.0] * 4]


def test_a_raising_rank_is_named_and_nobody_hangs():
    t0 = time.perf_counter()
    with pytest.raises(RankError, match="rank 1 of 2 failed: ValueError: rank one refuses") as info:
        launch(rank_fns.fail_on_rank_one, nprocs=2, collective_timeout_s=60)
    assert info.value.rank == 1 and "rank one refuses" in str(info.value)
    assert time.perf_counter() - t0 < 30  # the abort flag released rank 0, not the 60 s timeout


def test_a_crashing_rank_is_found_by_its_exit_code():
    with pytest.raises(RankError, match="rank 1 of 2 exited with code 3 without a result"):
        launch(rank_fns.crash_on_rank_one, nprocs=2, collective_timeout_s=60, grace_s=2)


def test_threads_failure_and_bad_arguments():
    with pytest.raises(RankError, match="rank 1 of 2 failed: ValueError"):
        launch(rank_fns.fail_on_rank_one, nprocs=2, threads=True)
    with pytest.raises(ExecutionError, match="nprocs must be a positive int"):
        launch(rank_fns.compiled_sum, nprocs=0)
    with pytest.raises(ExecutionError, match="unknown device 'tpu'"):
        launch(rank_fns.compiled_sum, nprocs=2, device="tpu")

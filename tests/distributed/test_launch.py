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
    with pytest.raises(ExecutionError, match=r"do not pickle .* use a module-level function, or threads=True"):
        launch(lambda rank: rank.rank, nprocs=2)
    with pytest.raises(ExecutionError, match="threads=True is for CPU ranks"):
        launch(rank_fns.compiled_sum, nprocs=2, device="cuda", threads=True)
    with pytest.raises(ExecutionError, match="unknown device 'tpu'"):
        launch(rank_fns.compiled_sum, nprocs=2, device="tpu")


def test_cuda_launch_needs_one_gpu_per_rank():
    from rlx.runtime.nccl import gpu_count

    if gpu_count() >= 2:
        pytest.skip("this machine has 2 GPUs: the CUDA path runs in benchmarks/tp.py")
    with pytest.raises(ExecutionError, match=r"needs 2 GPUs; this machine has \d"):
        launch(rank_fns.compiled_sum, nprocs=2, device="cuda")


def test_nccl_unique_id():
    from rlx.runtime.nccl import unique_id
    from rlx.toolchain.nccl import find_nccl_library

    if not find_nccl_library():
        pytest.skip("NCCL is not installed (nvidia-nccl-cu12, the rlx[cuda] extra)")
    a, b = unique_id(), unique_id()
    assert len(a) == len(b) == 128 and a != b


def test_a_stuck_rank_ends_at_the_launch_timeout():
    t0 = time.perf_counter()
    with pytest.raises(RankError, match=r"did not finish within 3 s"):
        launch(rank_fns.stuck_on_rank_one, nprocs=2, timeout_s=3, grace_s=1)
    assert time.perf_counter() - t0 < 20  # terminated, not waited for

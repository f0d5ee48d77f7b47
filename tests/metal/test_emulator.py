"""The emulator itself: barriers and threadgroup memory cooperate, simd_sum reduces a simdgroup, and
divergent synchronization is an error rather than a hang or a silent wrong answer."""

from __future__ import annotations

import numpy as np
import pytest
from emulator import HERE, EmulatorRunner, build_source, have_compiler

import rlx
from rlx.runtime.metal_host import Launch

pytestmark = pytest.mark.skipif(not have_compiler(), reason="no C++ compiler for the Metal emulator")


@pytest.fixture(scope="module")
def runner() -> EmulatorRunner:
    lib = build_source((HERE / "data" / "emulator_check.metal").read_text(), ["tg_sum", "divergent"])
    return EmulatorRunner(lib, 4 * 4096)


def test_barriers_threadgroup_memory_and_simd_sum(runner):
    data = runner.memory.view(np.float32)
    values = np.random.default_rng(0).standard_normal(16 * 64).astype(np.float32)
    data[:1024] = values
    runner.run([Launch(0, "tg_sum", (16, 1, 1), (64, 1, 1), True)], np.zeros(1, np.int64))
    want = values.reshape(16, 64).astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(data[1024:1040], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(data[2048:2064], want, rtol=1e-5, atol=1e-5)


def test_divergent_synchronization_is_reported(runner):
    with pytest.raises(rlx.ExecutionError, match="deadlock"):
        runner.run([Launch(1, "divergent", (1, 1, 1), (64, 1, 1), True)], np.zeros(1, np.int64))


def test_a_barrier_in_a_kernel_launched_without_sync_is_reported(runner):
    from emulator import reset_error

    reset_error(runner)
    with pytest.raises(rlx.ExecutionError, match="not synchronizing"):
        runner.run([Launch(0, "tg_sum", (1, 1, 1), (64, 1, 1), False)], np.zeros(1, np.int64))

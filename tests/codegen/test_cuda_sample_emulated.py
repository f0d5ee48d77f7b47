"""The CUDA sampling kernel (templates/cuda/kernels/sample.cuh) runs on the CPU through the CUDA shim
(tests/codegen/cuda_emu/cuda_shim.h, plus the warp votes, matches and atomics in sample_emu.cpp) and equals
the reference token for token: the radix select, the ordered gather of tied candidates across warps, the
rank sort and the sampling arithmetic, with blocks of 1, 2 and 4 warps. Needs g++ with C++20."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_emu_build import build_emu

from rlx.ir.ops_sample import SAMPLE_TOP_K_MAX, sample_rows

BELOW_1 = float(np.nextafter(1.0, 0.0))


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "sample_emu.cpp")
    lib.emu_sample_top_k.restype = ctypes.c_int
    lib.emu_sample_top_k.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return lib


def run(lib: ctypes.CDLL, x: np.ndarray, u: np.ndarray, s: tuple, threads: int) -> tuple[np.ndarray, int]:
    x = np.ascontiguousarray(x, np.float32)
    u = np.ascontiguousarray(u, np.float64)
    sv = np.array(s, np.float64)
    y = np.full(x.shape[0], -1, np.int32)
    flag = lib.emu_sample_top_k(x.ctypes.data, u.ctypes.data, sv.ctypes.data, y.ctypes.data, x.shape[0],
                                x.shape[1], threads)
    return y, flag


CASES = [  # (vocab, settings, grid values?, threads)
    (700, (0.8, 40, 1.0), False, 64),
    (700, (1.0, SAMPLE_TOP_K_MAX, 0.9), True, 128),
    (333, (2.0, 7, 0.3), True, 32),
    (97, (0.5, 200, 1.0), False, 64),     # top_k above the vocabulary
    (500, (0.0, 20, 1.0), True, 64),      # temperature 0: the argmax pass
    (500, (1.5, 1, 1.0), False, 128),     # top_k 1
    (1, (1.0, 5, 1.0), False, 32),
    (640, (1e-3, 100, 1e-6), True, 64),
]


@pytest.mark.parametrize(("vocab", "s", "grid", "threads"), CASES)
def test_kernel_equals_the_reference(emu, vocab: int, s: tuple, grid: bool, threads: int) -> None:
    r = np.random.default_rng(vocab + threads)
    rows = 3
    if grid:  # long runs of ties spread over every warp's segment
        x = (r.integers(-6, 6, (rows, vocab)) / 2).astype(np.float32)
    else:
        x = (r.standard_normal((rows, vocab)) * 3).astype(np.float32)
    if vocab > 10:
        x[1, [3, vocab - 2]] = np.nan
    u = np.array([0.0, r.random(), BELOW_1])
    y, flag = run(emu, x, u, s, threads)
    assert flag == 0
    np.testing.assert_array_equal(y, sample_rows(x, u, s[0], int(s[1]), s[2]))


def test_signed_zero_and_infinities(emu) -> None:
    x = np.zeros((3, 200), np.float32)
    x[0, 100:] = -0.0          # -0 ties +0: index order
    x[1, :] = -np.inf          # nothing finite: the first token
    x[2, 150] = np.inf
    u = np.full(3, BELOW_1)
    y, flag = run(emu, x, u, (1e6, SAMPLE_TOP_K_MAX, 1.0), 64)
    assert flag == 0
    np.testing.assert_array_equal(y, [199, 0, 150])
    np.testing.assert_array_equal(y, sample_rows(x, u, 1e6, SAMPLE_TOP_K_MAX, 1.0))


@pytest.mark.parametrize(("s", "u", "bit"), [((-1.0, 5, 1.0), 0.5, 8), ((1.0, 0, 1.0), 0.5, 16),
                                             ((1.0, SAMPLE_TOP_K_MAX + 1, 1.0), 0.5, 16), ((1.0, 5, 2.0), 0.5, 32),
                                             ((1.0, 5, 1.0), 1.0, 64)])
def test_bad_settings_raise_their_flag_bit(emu, s: tuple, u: float, bit: int) -> None:
    _, flag = run(emu, np.zeros((2, 50), np.float32), np.array([0.25, u]), s, 32)
    assert flag == bit


def test_temperature_zero_copies_the_given_argmax(emu) -> None:
    """SampleFromArgmax: at temperature 0 or top_k 1 the kernel copies the argmax ids it is given (ids no scan
    would pick, so the copy shows), still checking the settings and each u first; other settings scan the logits."""
    f = emu.emu_sample_top_k_best
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_uint, ctypes.c_void_p]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 300)).astype(np.float32)
    u = rng.uniform(0, 1, 5)
    best = (np.argmax(x, axis=1).astype(np.int32) + 7) % 300  # not the argmax: only a copy yields these

    def sample(s: tuple, uu: np.ndarray = u) -> tuple[np.ndarray, int]:
        y = np.full(5, -1, np.int32)
        sv = np.array(s, np.float64)
        flag = f(x.ctypes.data, uu.ctypes.data, sv.ctypes.data, y.ctypes.data, 5, 300, 64, best.ctypes.data)
        return y, flag

    for s in ((0.0, 1, 1.0), (0.0, 50, 0.5), (1.3, 1, 1.0)):
        y, flag = sample(s)
        assert flag == 0 and y.tolist() == best.tolist(), s
    y, flag = sample((0.8, 40, 1.0))
    assert flag == 0 and y.tolist() == [int(t) for t in sample_rows(x, u, 0.8, 40, None)]
    assert sample((-1.0, 1, 1.0))[1] == 8  # settings checked before the copy
    bad_u = u.copy()
    bad_u[2] = 1.0
    assert sample((0.0, 1, 1.0), bad_u)[1] == 64

"""The CUDA iota kernels (templates/cuda/kernels/iota.cuh) run on the CPU through the CUDA shim
(tests/codegen/cuda_emu/cuda_shim.h, iota_emu.cpp) and equal the reference `iota`: floats computed in double and
rounded once, integers exact, with grids smaller than the values (the grid-stride loop wraps). Needs g++ with
C++20."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_emu_build import build_emu

from rlx import reference
from rlx.ir.ops_range import Iota
from rlx.ir.shape import Dim, Shape

DTYPES = {"f32": (0, np.float32), "f64": (1, np.float64), "i32": (2, np.int32), "i64": (3, np.int64)}


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "iota_emu.cpp")
    lib.emu_iota.restype = ctypes.c_int
    lib.emu_iota.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double, ctypes.c_double,
                             ctypes.c_uint, ctypes.c_uint]
    return lib


@pytest.mark.parametrize(("dtype", "n", "start", "delta", "grid"), [
    ("i64", 1000, 0, 1, 2),         # 2 blocks of 64 threads for 1000 values: the loop wraps
    ("i32", 77, -5, 3, 1),
    ("f32", 500, 0.5, -0.25, 3),    # start + i * delta rounded once to f32
    ("f64", 129, 1e-3, 1 / 3, 2),
    ("i64", 0, 0, 1, 1),            # empty
])
def test_iota_kernel_matches_the_reference(emu, dtype: str, n: int, start: float, delta: float, grid: int) -> None:
    code, np_type = DTYPES[dtype]
    y = np.full(n, 7, np_type)
    assert emu.emu_iota(y.ctypes.data, n, code, float(start), float(delta), grid, 64) == 0
    op = Iota(Dim(n), start, delta, dtype)
    want = reference.to_boundary(reference.evaluate(op, [], Shape.of([n], dtype)), op.dtype)
    np.testing.assert_array_equal(y, want)

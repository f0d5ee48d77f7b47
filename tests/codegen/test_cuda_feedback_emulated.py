"""The CUDA token feedback kernels (templates/cuda/kernels/feedback.cuh) run on the CPU through the CUDA shim
(tests/codegen/cuda_emu/cuda_shim.h, feedback_emu.cpp) and equal the reference `token_feed` / `token_store`
(`rlx.ir.ops_feedback`): sources and destinations of -1 or past the slots leave the rows and the state alone,
a prefill chunk's source replaces its last token only, and grids smaller than the rows wrap. Needs g++ with C++20."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_emu_build import build_emu

from rlx.ir.ops_feedback import feed_tokens, store_tokens

P32 = ctypes.c_void_p


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "feedback_emu.cpp")
    lib.emu_token_feed.argtypes = [P32, P32, P32, P32, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint,
                                   ctypes.c_uint]
    lib.emu_token_store.argtypes = [P32, P32, P32, P32, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint, ctypes.c_uint]
    return lib


@pytest.mark.parametrize(("rows", "seq", "grid"), [(37, 1, 1), (70, 1, 2), (9, 4, 1), (1, 1, 1)])
def test_feed_and_store_match_the_reference(emu, rows: int, seq: int, grid: int) -> None:
    rng = np.random.default_rng(rows)
    slots = 12
    tokens = rng.integers(0, 1000, (rows, seq)).astype(np.int32)
    src = rng.integers(-1, slots + 2, rows).astype(np.int32)  # -1 and past the slots: the row's own token
    last = rng.integers(0, 1000, slots).astype(np.int32)
    y = np.full_like(tokens, -7)
    assert emu.emu_token_feed(tokens.ctypes.data, src.ctypes.data, last.ctypes.data, y.ctypes.data, rows, seq, slots,
                              grid, 32) == 0
    want = feed_tokens(tokens, src, last)
    np.testing.assert_array_equal(y, want)
    if seq > 1:  # only the last column takes a source
        np.testing.assert_array_equal(y[:, :-1], tokens[:, :-1])
    values = rng.integers(0, 1000, rows).astype(np.int32)
    dst = rng.permutation(np.arange(-3, rows + slots))[:rows].astype(np.int32)  # distinct, some outside the slots
    got_last, want_last = last.copy(), last.copy()
    out = np.full_like(values, -7)
    assert emu.emu_token_store(values.ctypes.data, dst.ctypes.data, got_last.ctypes.data, out.ctypes.data, rows, slots,
                               grid, 32) == 0
    np.testing.assert_array_equal(out, store_tokens(values, dst, want_last))
    np.testing.assert_array_equal(got_last, want_last)

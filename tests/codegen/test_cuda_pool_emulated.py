"""The CUDA pooling-tail kernel (templates/cuda/kernels/pool.cuh) runs on the CPU through the CUDA shim
(tests/codegen/cuda_emu/cuda_shim.h, pool_emu.cpp) and equals the reference of the graph it replaces: masked mean
over the sequence, with and without the L2 normalization, 16-byte and scalar loads, hidden sizes narrower and wider
than the block, sentences with padding and with no token at all. Needs g++ with C++20."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_emu_build import build_emu

from rlx import reference
from tests.gpu.pool_common import pool_feed, pool_graph


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "pool_emu.cpp")
    lib.emu_pool_tail.restype = ctypes.c_int
    lib.emu_pool_tail.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int64] + [ctypes.c_int] * 4 \
        + [ctypes.c_float] * 2
    lib.emu_pool_tail_norm.restype = ctypes.c_int
    lib.emu_pool_tail_norm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_float] + [ctypes.c_void_p] * 2 \
        + [ctypes.c_int64, ctypes.c_int64] + [ctypes.c_int] * 5 + [ctypes.c_float] * 2
    return lib


@pytest.mark.parametrize(("batch", "seq", "hidden", "vec", "threads", "normalize"), [
    (3, 10, 48, 4, 64, True),    # 12 chunks: 5 groups of tokens per block
    (2, 7, 36, 1, 32, False),    # scalar loads, no normalization
    (1, 5, 160, 4, 32, True),    # 40 chunks > 32 threads: each thread takes two, one group
    (3, 1, 8, 4, 64, True),      # one token per sentence
    (1, 16, 48, 4, 256, True),   # the launch's 256 threads: 21 groups of tokens, more than the tokens
])
def test_pool_tail_kernel_matches_the_reference(emu, batch, seq, hidden, vec, threads, normalize) -> None:
    feed, _ = pool_feed(batch, seq, hidden, seed=batch + seq)
    expect = reference.run(pool_graph(hidden, dense=False, normalize=normalize, max_batch=4, max_seq=16), feed)[0]
    out = np.full((batch, hidden), np.nan, np.float32)
    x, m = np.ascontiguousarray(feed["x"]), np.ascontiguousarray(feed["m"])
    rc = emu.emu_pool_tail(x.ctypes.data, m.ctypes.data, out.ctypes.data, batch, seq, hidden, vec, int(normalize),
                           threads, 1e-9, 1e-12)
    assert rc == 0
    np.testing.assert_allclose(out, expect, rtol=2e-6, atol=1e-7)
    if batch > 2:
        np.testing.assert_array_equal(out[0], 0.0)  # no token: the count clamps, the mean (and its norm) is 0


@pytest.mark.parametrize(("batch", "seq", "hidden", "vec", "norm", "threads"), [
    (3, 10, 48, 4, "layer", 256),      # more warps than tokens, a padded and an empty sentence
    (2, 16, 48, 4, "layer_res", 128),  # the residual sum first; 4 warps take 4 tokens each
    (1, 5, 160, 4, "rms", 64),         # 40 chunks: two per lane, the second only for 8 lanes
    (3, 7, 36, 1, "rms_res", 256),     # scalar loads (36 chunks of 1 float)
])
def test_pool_tail_norm_kernel_matches_the_reference(emu, batch, seq, hidden, vec, norm, threads) -> None:
    graph = pool_graph(hidden, dense=False, norm=norm, max_batch=4, max_seq=16)
    feed, params = pool_feed(batch, seq, hidden, seed=batch + seq, norm=True)
    rms = norm.startswith("rms")
    params = {k: v for k, v in params.items() if k in ("gamma",) or (k == "beta" and not rms)}
    expect = reference.run(graph, feed, params)[0]
    out = np.full((batch, hidden), np.nan, np.float32)
    x, m = np.ascontiguousarray(feed["x"]), np.ascontiguousarray(feed["m"])
    gamma, beta = params["gamma"], params.get("beta", params["gamma"])
    res = norm.endswith("_res")
    eps = 1e-6 if rms else 1e-5
    rc = emu.emu_pool_tail_norm(x.ctypes.data, x.ctypes.data if res else None, gamma.ctypes.data, beta.ctypes.data,
                                eps, m.ctypes.data, out.ctypes.data, batch, seq, hidden, vec, 2 if rms else 1,
                                int(res), threads, 1e-9, 1e-12)
    assert rc == 0
    np.testing.assert_allclose(out, expect, rtol=2e-5, atol=2e-6)
    if batch > 2:
        np.testing.assert_array_equal(out[0], 0.0)

"""The CUDA MoE kernels (templates/cuda/kernels/moe.cuh) run on the CPU through the CUDA shim
(tests/codegen/cuda_emu/cuda_shim.h), against rlx.reference: the router (top-k order, ties, both
normalizations) and the expert matmul on f32 experts and on q8_0 / q4_1 / q4_k blocks, with one activation
per token and one per chosen expert, and NaN rows for ids outside [0, E), on both paths: one warp per pair and
expert row, and pairs sorted by expert into 32-pair tiles of one tiled GEMM per group. Needs g++ with C++20."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_emu_build import build_emu

from rlx.ir import quant as Q
from rlx.reference import moe_expert_matmul, moe_gate_weights, moe_topk_ids

F32P, I32P = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32)
FORMATS = {None: -1, "q8_0": 0, "q4_1": 2, "q4_k": 5}  # kernels/quant.cuh's format ids


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "moe_emu.cpp")
    i64, i32 = ctypes.c_int64, ctypes.c_int
    lib.emu_moe_topk.argtypes = [F32P, I32P, i64, i64, i32]
    lib.emu_moe_gate.argtypes = [F32P, I32P, F32P, i64, i64, i32, i32]
    lib.emu_moe_matmul.argtypes = [i32, F32P, i32, I32P, i32, ctypes.c_void_p, F32P, i64, i64, i64, i64, i64, I32P]
    return lib


def test_router(emu: ctypes.CDLL) -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 12)).astype(np.float32)
    logits[0, [2, 7, 9]] = 4.0  # a tie: lower ids first
    ids = np.zeros((5, 3), np.int32)
    emu.emu_moe_topk(logits.ctypes.data_as(F32P), ids.ctypes.data_as(I32P), 5, 12, 3)
    np.testing.assert_array_equal(ids, moe_topk_ids(logits, 3))
    assert ids[0].tolist() == [2, 7, 9]
    for normalize in (0, 1):
        g = np.zeros((5, 3), np.float32)
        emu.emu_moe_gate(logits.ctypes.data_as(F32P), ids.ctypes.data_as(I32P), g.ctypes.data_as(F32P), 5, 12, 3,
                         normalize)
        np.testing.assert_allclose(g, moe_gate_weights(logits, ids, bool(normalize)), rtol=1e-6)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("per_pair, grouped", [(False, False), (True, False), (False, True), (True, True)])
def test_expert_matmul(emu: ctypes.CDLL, fmt: str | None, per_pair: bool, grouped: bool) -> None:
    rng = np.random.default_rng(len(str(fmt)) + per_pair)
    # grouped: 80 pairs over 2 experts, so each group spans several 32-pair tiles; 40 rows: a partial row tile
    tokens, top_k, experts, n, k = (40, 2, 2, 40, 64) if grouped else (3, 2, 5, 6, 256)
    if fmt == "q4_k":
        k = 256
    if fmt is None:
        w = (rng.standard_normal((experts, n, k)) * 0.1).astype(np.float32)
        dense, rb = w.astype(np.float64), k
    else:
        w = Q.random_blocks(rng, experts * n, k, fmt).reshape(experts, n, -1)
        dense, rb = Q.dequantize(w.reshape(experts * n, -1), fmt, k).reshape(experts, n, k), w.shape[2]
    ids = rng.integers(0, experts, (tokens, top_k)).astype(np.int32)
    ids[1, 1] = experts  # out of range: a NaN row
    x = rng.standard_normal((tokens, top_k, k) if per_pair else (tokens, k)).astype(np.float32)
    y = np.zeros((tokens, top_k, n), np.float32)
    scratch = np.zeros(2 * (experts + 1) + tokens * top_k, np.int32) if grouped else None
    emu.emu_moe_matmul(FORMATS[fmt], x.ctypes.data_as(F32P), int(per_pair), ids.ctypes.data_as(I32P), top_k,
                       w.ctypes.data, y.ctypes.data_as(F32P), tokens, experts, n, k, rb,
                       None if scratch is None else scratch.ctypes.data_as(I32P))
    if grouped:
        assert np.bincount(ids[ids < experts], minlength=experts).min() > 32
    want = moe_expert_matmul(x.astype(np.float64), ids, dense)
    bad = ids >= experts
    assert np.isnan(y[bad]).all() and not np.isnan(y[~bad]).any()
    mag = np.abs(moe_expert_matmul(np.abs(x.astype(np.float64)), np.where(bad, 0, ids), np.abs(dense)))
    assert np.all(np.abs(y[~bad] - want[~bad]) <= (k + 4) * 2.0 ** -24 * mag[~bad]), fmt

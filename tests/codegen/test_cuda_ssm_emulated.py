"""The CUDA SSM kernels (templates/cuda/kernels/ssm.cuh) run on the CPU through a small CUDA shim
(tests/codegen/cuda_emu/cuda_shim.h: a block's threads as std::threads, __syncthreads and warp shuffles as
barriers), against rlx.reference: the chunked selective scan and the chunked (WY) gated delta rule with the
index arithmetic and synchronization they have on a GPU, plus the sequential and column kernels. The path
choice of templates/cuda/ssm.cu.j2 is written out in cuda_emu/ssm_emu.cpp. Needs g++ with C++20."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_emu_build import build_emu

from rlx import reference
from rlx.opt.lowering_cuda import GDN_CHUNK_MIN_SEQ, SSM_MIN_CHUNK, SSM_WARPS_PER_SM, gdn_segments, ssm_segments

F32P = ctypes.POINTER(ctypes.c_float)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = build_emu(tmp_path_factory, "ssm_emu.cpp")
    i64 = ctypes.c_int64
    lib.emu_selective_scan.restype = i64
    lib.emu_selective_scan.argtypes = [F32P] * 6 + [i64, i64, i64, ctypes.c_int, i64, i64, i64, i64, F32P]
    lib.emu_gated_delta_net.restype = ctypes.c_int
    lib.emu_gated_delta_net.argtypes = [F32P] * 8 + [i64, i64, i64, ctypes.c_int, ctypes.c_float, i64, i64, F32P]
    return lib


def _p(a: np.ndarray | None) -> ctypes._Pointer | None:
    return None if a is None else a.ctypes.data_as(F32P)


def _close(out: np.ndarray, ref: np.ndarray, what: str) -> None:
    # f32 arithmetic against the f64 reference: rtol 1e-5 with a floor of 1e-5 x the RMS (as tests/gpu)
    scale = float(np.sqrt(np.mean(ref * ref)))
    assert np.all(np.abs(out - ref) <= 1e-5 * (np.abs(ref) + scale)), f"{what}: max error {np.abs(out - ref).max()}"


@pytest.mark.parametrize("seq, chunked", [(150, True), (50, False)])
def test_selective_scan(emu: ctypes.CDLL, seq: int, chunked: bool) -> None:
    r = np.random.default_rng(seq)
    b, h, n = 2, 3, 40
    x, dt = r.standard_normal((b, seq, h)), np.abs(r.standard_normal((b, seq, h))) * 0.1
    a, bm, cm = -np.abs(r.standard_normal((h, n))) - 0.1, r.standard_normal((b, seq, n)), r.standard_normal((b, seq, n))
    x, dt, a, bm, cm = (z.astype(np.float32) for z in (x, dt, a, bm, cm))
    y = np.zeros((b, seq, h), np.float32)
    segs = ssm_segments(b, h, seq)
    scratch = np.zeros(max(segs * (n + 1), 1), np.float32)
    nch = emu.emu_selective_scan(_p(x), _p(dt), _p(a), _p(bm), _p(cm), _p(y), b, seq, h, n, 132, SSM_MIN_CHUNK,
                                 SSM_WARPS_PER_SM, segs, _p(scratch))
    assert (nch > 1) == chunked
    _close(y, reference.selective_scan(x, dt, a, bm, cm), f"selective_scan seq={seq} chunks={nch}")


@pytest.mark.parametrize("seq, n, carry, chunked", [(130, 48, True, True), (131, 16, False, True),
                                                    (4, 48, True, False), (2, 128, True, False)])
def test_gated_delta_net(emu: ctypes.CDLL, seq: int, n: int, carry: bool, chunked: bool) -> None:
    r = np.random.default_rng(seq + n)
    b, h = (2, 1) if chunked else (1, 1)  # (the column kernel's shuffles are slow to emulate: keep it short)
    unit = lambda z: z / np.linalg.norm(z, axis=-1, keepdims=True)  # noqa: E731
    q, k = unit(r.standard_normal((b, seq, h, n))), unit(r.standard_normal((b, seq, h, n)))
    v = r.standard_normal((b, seq, h, n))
    g, beta = -np.abs(r.standard_normal((b, seq, h))) * 0.1, np.abs(r.standard_normal((b, seq, h))) * 0.5
    q, k, v, g, beta = (z.astype(np.float32) for z in (q, k, v, g, beta))
    s0 = (r.standard_normal((b, h, n, n)) * 0.1).astype(np.float32) if carry else None
    state = s0.copy() if carry else None  # updated in place, as a state input is
    o = np.zeros((b, seq, h, n), np.float32)
    segs = gdn_segments(b, h, seq, n)
    scratch = np.zeros(max(segs * 32 * (2 * n + 33), 1), np.float32)
    ran = emu.emu_gated_delta_net(_p(q), _p(k), _p(v), _p(g), _p(beta), _p(state), _p(state), _p(o), b, seq, h, n,
                                  n ** -0.5, segs, GDN_CHUNK_MIN_SEQ, _p(scratch))
    assert ran == int(chunked)
    ref_o, ref_s = reference.gated_delta_net(q, k, v, g, beta, s0, n ** -0.5)
    _close(o, ref_o, f"gated_delta_net seq={seq} n={n} output")
    if carry:
        _close(state, ref_s, f"gated_delta_net seq={seq} n={n} final state")

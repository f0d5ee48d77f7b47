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
    lib.emu_selective_scan.argtypes = [F32P] * 8 + [i64, i64, i64, ctypes.c_int, i64, i64, i64, i64, F32P]
    lib.emu_dwconv_carry.restype = ctypes.c_int32
    lib.emu_dwconv_carry.argtypes = [F32P] * 3 + [ctypes.POINTER(ctypes.c_int32), F32P, i64, i64, i64, ctypes.c_int]
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
    nch = emu.emu_selective_scan(_p(x), _p(dt), _p(a), _p(bm), _p(cm), None, None, _p(y), b, seq, h, n, 132,
                                 SSM_MIN_CHUNK, SSM_WARPS_PER_SM, segs, _p(scratch))
    assert (nch > 1) == chunked
    _close(y, reference.selective_scan(x, dt, a, bm, cm), f"selective_scan seq={seq} chunks={nch}")


@pytest.mark.parametrize("seq, chunked", [(150, True), (5, False), (1, False)])
def test_selective_scan_carried_state(emu: ctypes.CDLL, seq: int, chunked: bool) -> None:
    """The carried form (a Mamba-2 cache): the scan starts from the state input and leaves the final state in
    it, in place, in the chunked prefill path and the sequential (decode) path; a step of dt 0 (a padded token)
    leaves the state as it was."""
    r = np.random.default_rng(seq + 7)
    b, h, n = 2, 3, 40
    x, dt = r.standard_normal((b, seq, h)), np.abs(r.standard_normal((b, seq, h))) * 0.1
    dt[1, seq // 2:] = 0.0  # row 1's second half is padding
    a, bm, cm = -np.abs(r.standard_normal((h, n))) - 0.1, r.standard_normal((b, seq, n)), r.standard_normal((b, seq, n))
    s0 = r.standard_normal((b, h, n))
    x, dt, a, bm, cm, s0 = (z.astype(np.float32) for z in (x, dt, a, bm, cm, s0))
    state = s0.copy()
    y = np.zeros((b, seq, h), np.float32)
    segs = ssm_segments(b, h, seq)
    scratch = np.zeros(max(segs * (n + 1), 1), np.float32)
    nch = emu.emu_selective_scan(_p(x), _p(dt), _p(a), _p(bm), _p(cm), _p(state), _p(state), _p(y), b, seq, h, n,
                                 132, SSM_MIN_CHUNK, SSM_WARPS_PER_SM, segs, _p(scratch))
    assert (nch > 1) == chunked
    ref_y, ref_s = reference.selective_scan_carry(x, dt, a, bm, cm, s0)
    _close(y, ref_y, f"carried selective_scan seq={seq} chunks={nch} output")
    _close(state, ref_s, f"carried selective_scan seq={seq} chunks={nch} final state")
    if seq > 1:  # the padded half of row 1 left its state where its real tokens put it
        _, half = reference.selective_scan_carry(x[1:, :seq // 2], dt[1:, :seq // 2], a, bm[1:, :seq // 2],
                                                 cm[1:, :seq // 2], s0[1:])
        _close(state[1:], half, f"carried selective_scan seq={seq}: padding kept row 1's state")


@pytest.mark.parametrize("seq, lengths", [(6, (6, 2)), (1, (1, 0)), (2, (0, 2))])
def test_conv_state_update(emu: ctypes.CDLL, seq: int, lengths: tuple[int, int]) -> None:
    """The carried depthwise conv: outputs after the state (read before it changes), then each row's state is the
    last k-1 of (state, x[:length]): whole rows replaced, partly shifted, or kept (length 0)."""
    r = np.random.default_rng(seq)
    b, c, k = 2, 5, 4
    x, w, s0 = (r.standard_normal(shape).astype(np.float32) for shape in ((b, seq, c), (c, k), (b, k - 1, c)))
    state, y = s0.copy(), np.zeros((b, seq, c), np.float32)
    lens = np.array(lengths, np.int32)
    flag = emu.emu_dwconv_carry(_p(x), _p(w), _p(state), lens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), _p(y),
                                b, seq, c, k)
    assert flag == 0
    _close(y, reference.depthwise_conv1d_causal(x, w, s0), f"carried conv seq={seq} output")
    np.testing.assert_array_equal(state, reference.conv_state_after(x, s0, lens).astype(np.float32))


def test_conv_state_update_flags_a_bad_length(emu: ctypes.CDLL) -> None:
    """A length outside 0..seq raises flag bit 256 (the run's error: "a row's length ... is outside 0..seq") and
    leaves that row's state as it was."""
    b, seq, c, k = 2, 3, 4, 3
    r = np.random.default_rng(1)
    x, w, s0 = (r.standard_normal(shape).astype(np.float32) for shape in ((b, seq, c), (c, k), (b, k - 1, c)))
    state, y = s0.copy(), np.zeros((b, seq, c), np.float32)
    lens = np.array([1, seq + 1], np.int32)
    flag = emu.emu_dwconv_carry(_p(x), _p(w), _p(state), lens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), _p(y),
                                b, seq, c, k)
    assert flag == 256
    np.testing.assert_array_equal(state[1], s0[1])
    np.testing.assert_array_equal(state[0], reference.conv_state_after(x[:1], s0[:1], lens[:1])[0].astype(np.float32))


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

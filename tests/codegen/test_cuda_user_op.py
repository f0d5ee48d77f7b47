"""The CUDA rule of user-defined ops (rlx/codegen/cuda/user_op.py): the user's header once in the .cu, the call
on the run's stream with device pointers and dtypes, loop bodies included. nvcc compiles the example's graph in
tests/codegen/test_cuda_compile.py (case user_op) and tests/gpu runs it against the reference."""

from __future__ import annotations

import re

import pytest

import rlx
from rlx.errors import BuildError
from rlx.toolchain.cuda import find_nvcc
from tests.ir.user_ops import swish_beta


def _nvcc() -> bool:
    try:
        find_nvcc("nvcc")
        return True
    except BuildError:
        return False


pytestmark = pytest.mark.skipif(not _nvcc(), reason="nvcc is not installed (the CUDA session resolves its toolchain)")


def _scan_graph() -> rlx.Graph:
    op = swish_beta()

    def f(t):
        xs, c0, beta = t.input("xs", [5, 4]), t.input("c0", [4]), t.input("beta", [])
        return op(t.scan(lambda c, b, x: op(c + x, b), c0, xs=[xs], bcasts=[beta]), beta)

    return rlx.trace("scan_user", f)


def test_header_once_and_calls_on_the_stream() -> None:
    text = rlx.Session(rlx.Device.CUDA, target="cuda:sm_90").render(_scan_graph()).text
    assert text.count("/* ── custom op swish_beta (cuda): swish_beta.cuh, sha256 ") == 1
    assert text.count("swish_beta_cuda(rlx_user_in, 2, &rlx_user_out, st)") == 2  # in the loop body and after
    assert text.index("typedef struct rlx_user_tensor") < text.index("static int swish_beta_cuda(")
    assert "custom op %s returned status %d" in text


def test_device_dtypes_follow_the_sessions_precision() -> None:
    op = swish_beta()
    g = rlx.trace("half", lambda t: op(t.input("x", [4]), t.input("beta", [])))
    f32 = rlx.Session(rlx.Device.CUDA, target="cuda:sm_90").render(g).text
    f16 = rlx.Session(rlx.Device.CUDA, target="cuda:sm_90", precision="f16").render(g).text
    # x as (data, dtype code, rank, numel, dims): RLX_USER_F32 = 1, RLX_USER_F16 = 3 (the example's body refuses it)
    assert re.search(r"\{ \(void \*\)RLX_P\(float, \d+\), 1, 1, \(int64_t\)4, \{ \(int64_t\)4 \} \}", f32)
    assert re.search(r"\{ \(void \*\)RLX_P\(__half, \d+\), 3, 1, \(int64_t\)4, \{ \(int64_t\)4 \} \}", f16)

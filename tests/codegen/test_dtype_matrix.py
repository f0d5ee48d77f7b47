"""Every op × every dtype on both backends is either right or refused before any C runs.

For each (op, dtype) the IR accepts: if a CPU session builds it (its rule table takes it, after
legalization runs f16/bf16 ops the CPU lacks in f32 between casts), the CPU build must match the
reference (one compiled graph per dtype holding every supported op; also run under
AddressSanitizer in a child process), and if the CUDA rule table takes it the CUDA renderer must
render it; if not, compiling must raise BuildError from the rule check — never build, never run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cpu_helpers import sanitizer_env

import rlx
from rlx.codegen.backends import first_unsupported_op
from rlx.codegen.cuda import CudaTarget
from rlx.ir.dtype import DType
from rlx.opt.memplan import plan
from rlx.pipeline.cuda import render_cuda

from .dtype_matrix import DTYPES, RTOL, build_one, cases, check_supported, feeds

#: What the CPU computes on every float type: the whole op set (f16/bf16 legalized where needed).
FULL_FLOAT_SET = {"matmul", "attention:self", "attention:causal", "rope", "fused_swiglu", "activation:softplus",
                  "softmax", "layer_norm", "rms_norm", "fused_matmul_bias_act", "fused_residual_layer_norm",
                  "fused_residual_rms_norm", "reduce:sum", "gather", "elementwise_region"}

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
def test_supported_ops_match_the_reference_on_cpu(dtype):
    checked = check_supported(dtype)
    if dtype in (DType.F32, DType.F16, DType.BF16):  # every op, on f32 and on the half types
        assert set(checked) >= FULL_FLOAT_SET, sorted(FULL_FLOAT_SET - set(checked))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
def test_unsupported_ops_are_decomposed_or_refused_before_any_build(dtype, monkeypatch):
    from rlx.toolchain import compiler

    real = compiler.run_compiler
    refused: list[str] = []

    def guarded(*args, **kwargs):
        if refusing:
            raise AssertionError("the C compiler ran for a graph the rule table refuses")
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "run_compiler", guarded)
    session = rlx.Session()
    rng = np.random.default_rng(3)
    for label, build in cases(dtype):
        g = build_one(dtype, build)
        if g is None or first_unsupported_op(g, "cpu") is None:
            continue
        after = session.first_unsupported_op(g, opt_level=0)  # after decomposition into primitives
        refusing = after is not None
        if refusing:
            refused.append(label)
            node, _reason = after
            with pytest.raises(rlx.BuildError, match=f"does not support {node.kind}|has no rule for {node.kind}"):
                session.compile(g, opt_level=0)
            continue
        # Decomposed into ops the backend has: it must then be right, like any supported op.
        inputs, params = feeds(g, rng)
        cg = session.compile(g, opt_level=0)
        for name, value in params.items():
            cg.set_param(name, value)
        got = cg.run(inputs)[0]
        want = rlx.reference.run(g, inputs, params)[0]
        # Several rounded primitives stand for one op: a few more ulps than the op itself.
        np.testing.assert_allclose(got, want, rtol=8 * RTOL.get(dtype, 2e-5), atol=1e-5, err_msg=label)
    if dtype in (DType.F16, DType.BF16):
        assert refused == []  # legalization leaves no half-precision op refused


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_self_attention_is_legalized_not_miscompiled(dtype):
    # q, k and v one node: the case whose dtype check once skipped every input and corrupted the heap.
    g = rlx.Graph("att16")
    x = g.input("x", [1, 4, 8], dtype)
    g.set_outputs([g.attention(x, x, x, num_heads=2, head_dim=4)])
    session = rlx.Session()
    lir = session.lower(g, opt_level=0)
    casts = [n for n in lir.graph.nodes if n.kind == "cast"]
    assert [n.name for n in casts] == [f"legalize {dtype}->f32 for attention %1",
                                       f"legalize f32->{dtype} after attention %1"]
    assert f"# legalize {dtype}->f32 for attention %1" in lir.inspect()  # what `rlxc inspect --stage lir` prints
    xv = feeds(g, np.random.default_rng(1))[0]
    got = session.compile(g, opt_level=0).run(xv)[0]
    want = rlx.reference.run(g, xv)[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=RTOL[DType.parse(dtype)],
                               atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
def test_cuda_renders_what_its_rules_accept(dtype):
    for label, build in cases(dtype):
        g = build_one(dtype, build)
        if g is None:
            continue
        lir = plan(g)
        if first_unsupported_op(g, "cuda") is None:
            assert "rlx_run" in render_cuda(lir, CudaTarget(gemm="builtin"), {"name": g.name}), label
        else:
            with pytest.raises(rlx.BuildError):
                render_cuda(lir, CudaTarget(gemm="builtin"), {"name": g.name})


def test_dtype_matrix_is_asan_clean():
    env = sanitizer_env("address", {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1"}, HERE)
    proc = subprocess.run([sys.executable, str(HERE / "dtype_matrix.py")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "MATRIX-OK" in proc.stdout, proc.stderr[-6000:]

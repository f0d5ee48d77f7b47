"""The CPU rule of user-defined ops (rlx/codegen/cpu/user_op.py): the user's C function compiled into the graph's
one source file and run, the header's digest in the cache key (an edited header rebuilds), run-time statuses
reported, and backends without the op's code refusing it before any build."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.errors import BuildError, ExecutionError, RlxError
from tests.ir.user_ops import EXAMPLE, swish_beta

HEADER = EXAMPLE.parent / "swish_beta.h"
ROWS = rlx.Dim.dynamic("rows", max=64)


def _model(op: rlx.CustomOp):
    def model(t):
        x, beta = t.input("x", [ROWS, 16]), t.input("beta", [])
        h = op((x @ t.param("w", [16, 16])).tanh(), beta)
        return op(h, beta) + 1.0  # two calls: one copy of the header, two calls in the source
    return model


@pytest.fixture(scope="module")
def compiled():
    graph = rlx.trace("swish_twice", _model(swish_beta()))
    return graph, rlx.Session().compile(graph)


def test_runs_like_the_reference_at_every_size(compiled) -> None:
    graph, cg = compiled
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 16)).astype(np.float32) * 0.3
    cg.set_param("w", w)
    for rows in (64, 5, 1):
        feed = {"x": rng.standard_normal((rows, 16)).astype(np.float32), "beta": np.array(1.25, np.float32)}
        (got,) = cg.run(**feed)
        (want,) = reference.run(graph, feed, {"w": w})
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_the_header_is_in_the_one_source_file_once(compiled) -> None:
    graph, _ = compiled
    text = rlx.Session().render(graph).text
    assert text.count("/* ── custom op swish_beta (cpu): swish_beta.h, sha256 ") == 1
    assert text.count("static int swish_beta(const rlx_user_tensor *in") == 1  # the user's function, inlined
    assert text.count("user_op[swish_beta, digest=") == 2  # each call headed by its op
    assert "/* custom op swish_beta: swish_beta() from swish_beta.h */" in text  # (the two share one body)
    assert text.index('#include "kernels/user_op.h"') < text.index("static int swish_beta(")


def test_a_nonzero_status_is_an_error_naming_the_op() -> None:
    op = rlx.custom_op("swish_any_beta", infer=lambda x, beta: x, reference=lambda x, beta: x,
                       cpu=(HEADER, "swish_beta"))
    g = rlx.trace("bad_beta", lambda t: op(t.input("x", [4]), t.input("beta", [2])))  # the body takes a scalar
    cg = rlx.Session().compile(g)
    with pytest.raises(ExecutionError, match="user_op swish_any_beta: custom op swish_any_beta returned status 1"):
        cg.run(x=np.ones(4, np.float32), beta=np.ones(2, np.float32))


def test_editing_the_header_rebuilds_with_the_new_code(tmp_path: Path) -> None:
    header = tmp_path / "swish_beta.h"
    shutil.copy(HEADER, header)
    op = swish_beta("swish_stale", c_header=header)

    def model(t):
        return op(t.input("x", [8]), t.input("beta", []))

    x, beta = np.linspace(-2, 2, 8, dtype=np.float32), np.array(1.0, np.float32)
    first = rlx.trace("stale", model)
    cg1 = rlx.Session().compile(first)
    np.testing.assert_allclose(cg1.run(x=x, beta=beta)[0], x / (1 + np.exp(-x)), rtol=1e-6)

    original = header.read_text()
    header.write_text(original.replace("y[i] = x[i] / (1.0f + expf(-beta * x[i]));",
                                       "y[i] = 2.0f * x[i] / (1.0f + expf(-beta * x[i]));"))
    with pytest.raises(BuildError, match="changed since the graph was traced"):
        rlx.Session().compile(first)  # the graph traced before the edit would run the old program
    cg2 = rlx.Session().compile(rlx.trace("stale", model))
    assert cg2.source_digest != cg1.source_digest
    np.testing.assert_allclose(cg2.run(x=x, beta=beta)[0], 2 * x / (1 + np.exp(-x)), rtol=1e-6)

    header.write_text(original)  # back as it was: the first program again, from the cache
    cg3 = rlx.Session().compile(rlx.trace("stale", model))
    assert cg3.source_digest == cg1.source_digest
    np.testing.assert_allclose(cg3.run(x=x, beta=beta)[0], x / (1 + np.exp(-x)), rtol=1e-6)


def test_a_backend_without_the_ops_code_refuses_before_any_build(monkeypatch: pytest.MonkeyPatch) -> None:
    op = rlx.custom_op("cpu_only_swish", infer=lambda x, beta: x, reference=lambda x, beta: x,
                       cpu=(HEADER, "swish_beta"))
    g = rlx.trace("t", lambda t: op(t.input("x", [4]), t.input("beta", [])))
    from rlx.toolchain import cuda as cuda_toolchain

    def no_build(*args, **kwargs):
        raise AssertionError("the CUDA toolchain was asked to build")

    monkeypatch.setattr(cuda_toolchain.NvccToolchain, "compile", no_build)
    session = rlx.Session(rlx.Device.CUDA, target="cuda:sm_90")
    assert session.first_unsupported_op(g)[1] == ("the CUDA backend does not support user_op 'cpu_only_swish': "
                                                  "it was registered without cuda= code")
    with pytest.raises(RlxError, match="'cpu_only_swish': it was registered without cuda= code"):
        session.compile(g)
    with pytest.raises(RlxError, match="'cpu_only_swish': it was registered without metal= code"):
        rlx.Session(rlx.Device.METAL).render(g)


def test_inside_a_scan_body() -> None:
    """The op in a loop body: the loop computes the reference (tests/codegen/test_cuda_user_op.py renders it
    for CUDA)."""
    op = swish_beta()

    def f(t):
        xs, c0, beta = t.input("xs", [5, 4]), t.input("c0", [4]), t.input("beta", [])
        return t.scan(lambda c, b, x: op(c + x, b), c0, xs=[xs], bcasts=[beta])

    g = rlx.trace("scan_user", f)
    rng = np.random.default_rng(3)
    feed = {"xs": rng.standard_normal((5, 4)).astype(np.float32), "c0": rng.standard_normal(4).astype(np.float32),
            "beta": np.array(1.3, np.float32)}
    (got,) = rlx.Session().compile(g).run(**feed)
    np.testing.assert_allclose(got, reference.run(g, feed)[0], rtol=2e-5, atol=2e-6)
    assert "user_op[swish_beta" in rlx.Session().render(g).text


def test_the_example_runs_as_a_script() -> None:
    """examples/custom_op/swish_beta.py: compiled on the CPU against the reference, and a gradient through it."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "swish_beta on the CPU matches the reference: (4, 8)" in proc.stdout and "d loss / d beta =" in proc.stdout

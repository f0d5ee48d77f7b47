"""The Metal rule of user-defined ops (rlx/codegen/metal/user_op.py), through the emulator against the reference:
the user's MSL function (examples/custom_op/swish_beta.metal) placed once in the .metal and called per output
element, a nonzero status failing the run (naming the op), the header's digest in the cache key (an edited
header renders and runs the new code; a graph traced before the edit is refused), and an op without metal=
code refused before any build."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from emulator import emulate, have_compiler

import rlx
from rlx import reference
from rlx.codegen.backends import first_unsupported_op
from rlx.codegen.metal.emit import USER_OP_FLAG
from rlx.errors import BuildError, ExecutionError
from tests.ir.user_ops import EXAMPLE, swish_beta

HEADER = EXAMPLE.parent / "swish_beta.metal"
ROWS = rlx.Dim.dynamic("rows", max=64)
needs_compiler = pytest.mark.skipif(not have_compiler(), reason="no C++ compiler for the Metal emulator")


def _model(op: rlx.CustomOp):
    def model(t):
        x, beta = t.input("x", [ROWS, 16]), t.input("beta", [])
        h = op((x @ t.param("w", [16, 16])).tanh(), beta)
        return op(h, beta) + 1.0  # two calls: one copy of the header, two kernels calling it
    return model


@pytest.fixture(scope="module")
def graph() -> rlx.Graph:
    return rlx.trace("swish_twice", _model(swish_beta()))


@needs_compiler
def test_runs_like_the_reference_at_every_size(graph) -> None:
    m = emulate(graph, opt_level=2)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 16)).astype(np.float32) * 0.3
    m.set_param("w", w)
    for rows in (64, 5, 1):
        feed = {"x": rng.standard_normal((rows, 16)).astype(np.float32), "beta": np.array(1.25, np.float32)}
        (got,) = m.run(feed)
        (want,) = reference.run(graph, feed, {"w": w})
        assert got.shape == (rows, 16)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_the_header_is_in_the_one_metal_file_once(graph) -> None:
    text = rlx.Session(rlx.Device.METAL).render(graph).text
    assert text.count("/* ── custom op swish_beta (metal): swish_beta.metal, sha256 ") == 1
    assert text.count("inline int swish_beta_metal(thread const rlx_user_tensor *in") == 1
    assert text.count("swish_beta_metal(rlx_user_in, 2, &rlx_user_out, i)") == 2  # one kernel per call
    assert text.index("struct rlx_user_tensor {") < text.index("inline int swish_beta_metal(")
    # x's rows are the dynamic dim: the tensor's numel and dims are expressions of sym[0]
    assert "(16 * sym[0]), { sym[0], 16 } }" in text


@needs_compiler
def test_a_nonzero_status_fails_the_run() -> None:
    op = rlx.custom_op("swish_any_beta_metal", infer=lambda x, beta: x, reference=lambda x, beta: x,
                       metal=(HEADER, "swish_beta_metal"))
    g = rlx.trace("bad_beta", lambda t: op(t.input("x", [4]), t.input("beta", [2])))  # the body takes a scalar
    m = emulate(g)
    with pytest.raises(ExecutionError, match="user_op swish_any_beta_metal: custom op swish_any_beta_metal "
                                             "returned a nonzero status"):
        m.run({"x": np.ones(4, np.float32), "beta": np.ones(2, np.float32)})
    assert list(m.manifest["flag_errors"]) == [str(USER_OP_FLAG + g.outputs[0])]  # the flag names the node


@needs_compiler
def test_editing_the_header_renders_and_runs_the_new_code(tmp_path: Path) -> None:
    header = tmp_path / "swish_beta.metal"
    shutil.copy(HEADER, header)
    op = swish_beta("swish_stale_metal", metal_header=header)

    def model(t):
        return op(t.input("x", [8]), t.input("beta", []))

    session = rlx.Session(rlx.Device.METAL)
    first = rlx.trace("stale", model)
    before = session.render(first)
    original = header.read_text()
    header.write_text(original.replace("= x / (1.0f + exp(-beta * x));", "= 2.0f * x / (1.0f + exp(-beta * x));"))
    with pytest.raises(BuildError, match="changed since the graph was traced"):
        session.render(first)  # the graph traced before the edit would render the old program
    second = rlx.trace("stale", model)
    after = session.render(second)
    # the cache key's components: the LIR (the node's digest attribute) and the source (the header's text)
    assert after.components["lir"] != before.components["lir"]
    assert after.components["source"] != before.components["source"]
    x, beta = np.linspace(-2, 2, 8, dtype=np.float32), np.array(1.0, np.float32)
    (got,) = emulate(second).run({"x": x, "beta": beta})
    np.testing.assert_allclose(got, 2 * x / (1 + np.exp(-x)), rtol=1e-6)
    header.write_text(original)  # back as it was: the first program's key again
    assert session.render(rlx.trace("stale", model)).components == before.components


def test_an_op_without_metal_code_is_refused_before_any_build() -> None:
    op = rlx.custom_op("cpu_only_swish_metal", infer=lambda x, beta: x, reference=lambda x, beta: x,
                       cpu=(EXAMPLE.parent / "swish_beta.h", "swish_beta"))
    g = rlx.trace("t", lambda t: op(t.input("x", [4]), t.input("beta", [])))
    assert first_unsupported_op(g, "metal")[1] == ("the METAL backend does not support user_op "
                                                   "'cpu_only_swish_metal': it was registered without metal= code")
    with pytest.raises(BuildError, match="'cpu_only_swish_metal': it was registered without metal= code"):
        emulate(g)

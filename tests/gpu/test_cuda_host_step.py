"""`CudaGraph.bind_host_step` on a real GPU: per-run inputs from host memory in one transfer, state inputs
resident, only the outputs asked for come back; results equal rlx.reference step after step."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.driver import Device, Session
from rlx.errors import ExecutionError
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]


def _graph() -> rlx.Graph:
    """Two per-run inputs of different dtypes sharing a dynamic dim, a state read by a gather, two outputs."""
    g = rlx.Graph("host_step")
    m = rlx.Dim.dynamic("m", 6)
    x = g.input("x", [m, 4])
    ids = g.input("ids", [m], "i32")
    s = g.state("s", [10, 4])
    y = g.add_(x, g.gather(s, ids))
    g.set_outputs([y, g.argmax(y, axis=-1)])
    return g


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_host_step_matches_reference_step_after_step(precision: str) -> None:
    g = _graph()
    cg = Session(Device.CUDA, precision=precision).compile(g)
    rng = np.random.default_rng(0)
    state = rng.standard_normal((10, 4)).astype(np.float32)
    s_dev = cg.to_device(state)
    x0 = rng.standard_normal((3, 4)).astype(np.float32)
    step = cg.bind_host_step({"x": x0, "ids": np.array([1, 9, 0], np.int32), "s": s_dev}, outputs=["out1"])
    assert list(step.outputs) == ["out1"] and step.outputs["out1"].shape == (3,)
    assert step.inputs["ids"].dtype == np.int32 and step.inputs["x"].shape == (3, 4)
    tol = 0 if precision == "f32" else 2e-3
    for i in range(4):
        if i:
            step.inputs["x"][...] = rng.standard_normal((3, 4)).astype(np.float32)
            step.inputs["ids"][...] = rng.integers(0, 10, 3)
        feed = {"x": step.inputs["x"].copy(), "ids": step.inputs["ids"].copy(), "s": state}
        y, want = reference.run(g, feed, {})
        got = step()["out1"]
        if tol:  # f16 storage: the argmax may differ only between near-equal values
            rows = np.arange(3)
            assert np.all(y[rows, got] >= y[rows, want] - tol * np.abs(y).max())
        else:
            np.testing.assert_array_equal(got, want)
    # both outputs: the values too
    both = cg.bind_host_step({"x": x0, "ids": np.array([2, 2, 5], np.int32), "s": s_dev})
    out = both()
    y, want = reference.run(g, {"x": x0, "ids": np.array([2, 2, 5], np.int32), "s": state}, {})
    np.testing.assert_allclose(out["out0"], y, rtol=0, atol=0 if precision == "f32" else 2e-2)
    cg.release_states()
    # read, never written: the buffer comes back as the context held it (in f16, the state rounded to f16)
    held = state if precision == "f32" else state.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(s_dev.numpy(), held)


def test_host_step_refuses_bad_bindings() -> None:
    cg = Session(Device.CUDA).compile(_graph())
    s_dev = cg.to_device(np.zeros((10, 4), np.float32))
    x, ids = np.zeros((2, 4), np.float32), np.zeros(2, np.int32)
    with pytest.raises(ExecutionError, match="missing inputs"):
        cg.bind_host_step({"x": x, "s": s_dev})
    with pytest.raises(ExecutionError, match="unknown inputs"):
        cg.bind_host_step({"x": x, "ids": ids, "s": s_dev, "z": x})
    with pytest.raises(ExecutionError, match="outputs to return"):
        cg.bind_host_step({"x": x, "ids": ids, "s": s_dev}, outputs=["nope"])
    with pytest.raises(ExecutionError, match="host data"):
        cg.bind_host_step({"x": cg.to_device(x), "ids": ids, "s": s_dev})
    with pytest.raises(ExecutionError, match="__cuda_array_interface__"):
        cg.bind_host_step({"x": x, "ids": ids, "s": np.zeros((10, 4), np.float32)})
    with pytest.raises(ExecutionError, match="float64"):
        cg.bind_host_step({"x": x.astype(np.float64), "ids": ids, "s": s_dev})
    with pytest.raises(ExecutionError, match="m is"):
        cg.bind_host_step({"x": x, "ids": np.zeros(3, np.int32), "s": s_dev})
    step = cg.bind_host_step({"x": x, "ids": ids, "s": s_dev})
    with pytest.raises(TypeError):
        step.inputs["x"] = x  # the library holds the bound arrays' addresses: they cannot be swapped

"""Whole-run graphs (CudaTarget.io_graph): a run on device pointers whose dims and pointers are those of an earlier
call replays one CUDA graph holding its input copies, the step, the error flag's read-back and its output copies.
Replays read the inputs' current contents, write the outputs given, follow new pointers and dims, and still report
a kernel's error (and run again after it); the build without it gives the same numbers."""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.config import Config
from rlx.driver import Device, Session
from rlx.errors import ExecutionError
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.pipeline.cuda import compile_cuda
from tests.gpu.gemm_common import GPU_ONLY

pytestmark = GPU_ONLY


def _graph() -> Graph:
    g = Graph("io_graph")
    ids = g.input("ids", [Dim.dynamic("n", 8)], "i64")
    x = g.input("x", [Dim.dynamic("n", 8), 4])
    g.set_outputs({"e": g.activation("tanh", g.add_(g.gather(g.param("t", [10, 4]), ids), x))})
    return g


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_replays_follow_contents_pointers_dims_and_errors(precision: str) -> None:
    graph = _graph()
    table = np.linspace(-2, 2, 40, dtype=np.float32).reshape(10, 4)
    builds = [compile_cuda(Session(Device.CUDA).lower(graph), Config.from_env(), precision=precision, **o)
              for o in ({}, {"io_graph": False})]
    assert "rlx_io_find" in builds[0].source and "rlx_io_find" not in builds[1].source
    tol = 1e-6 if precision == "f32" else 2e-3
    rng = np.random.default_rng(1)
    for cg in builds:
        cg.set_param("t", table)
        ids, x = cg.to_device(np.zeros(3, np.int64)), cg.to_device(np.zeros((3, 4), np.float32))
        outs = [cg.to_device(np.zeros((3, 4), np.float32)) for _ in range(2)]
        steps = [cg.bind_device({"ids": ids, "x": x}, outputs={"e": o}) for o in outs]
        for trial in range(4):  # new contents in the same buffers, alternating output buffers
            feed = {"ids": rng.integers(0, 10, 3).astype(np.int64), "x": rng.standard_normal((3, 4)).astype(np.float32)}
            ids.copy_from_host(feed["ids"])
            x.copy_from_host(feed["x"])
            before = outs[1 - trial % 2].numpy()
            steps[trial % 2]()
            want = reference.run(graph, feed, {"t": table})[0]
            np.testing.assert_allclose(outs[trial % 2].numpy(), want, rtol=0, atol=tol)
            np.testing.assert_array_equal(outs[1 - trial % 2].numpy(), before)  # the other output untouched
        ids.copy_from_host(np.array([1, 12, 2], np.int64))  # out of range, found by a replay
        with pytest.raises(ExecutionError, match="gather index out of range"):
            steps[0]()
        ids.copy_from_host(np.array([9, 0, 3], np.int64))
        steps[0]()
        want = reference.run(graph, {"ids": np.array([9, 0, 3], np.int64), "x": x.numpy()}, {"t": table})[0]
        np.testing.assert_allclose(outs[0].numpy(), want, rtol=0, atol=tol)
        # other dims: their own run (and graph)
        ids5, x5 = cg.to_device(np.array([0, 1, 2, 3, 4], np.int64)), cg.to_device(np.ones((5, 4), np.float32))
        out5 = cg.to_device(np.zeros((5, 4), np.float32))
        for _ in range(2):
            cg.run_device({"ids": ids5, "x": x5}, outputs={"e": out5})
            want = reference.run(graph, {"ids": ids5.numpy(), "x": x5.numpy()}, {"t": table})[0]
            np.testing.assert_allclose(out5.numpy(), want, rtol=0, atol=tol)

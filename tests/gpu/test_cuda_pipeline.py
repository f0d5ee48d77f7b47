"""`CompiledGraph.pipeline` on a real GPU: its slots' input and output arrays are pinned host memory
(`CudaGraph.host_empty`), and the outputs equal `run`'s and the reference's, in input order, over two shapes."""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.driver import Device, Session
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]


def _owner(arr: np.ndarray) -> object:
    """The object at the end of `arr`'s base chain (the memory's owner)."""
    while isinstance(arr, np.ndarray) and arr.base is not None:
        arr = arr.base
    return arr


def test_pipeline_slots_are_pinned_and_give_runs_outputs() -> None:
    g = Graph("pinned_pipeline")
    rows = Dim.dynamic("rows", 64)
    x, w = g.input("x", [rows, 32]), g.input("w", [32, 16])
    g.set_outputs({"y": g.activation("tanh", g.matmul(x, w))})
    cg = Session(Device.CUDA).compile(g)
    r = np.random.default_rng(3)
    w_val = (r.standard_normal((32, 16)) * 0.2).astype(np.float32)
    feeds = [{"x": r.standard_normal((n, 32)).astype(np.float32), "w": w_val} for n in (64, 5, 64, 5, 17)]
    pinned = cg.host_empty((4, 8), np.float32)
    assert type(_owner(pinned)).__module__ == "_cffi_backend"  # cffi's buffer over rlx_cuda_host_alloc memory
    for feed, (out,) in zip(feeds, cg.pipeline(iter(feeds), depth=2)):
        assert type(_owner(out)).__module__ == "_cffi_backend", "a slot's output array is not pinned memory"
        np.testing.assert_allclose(out, cg.run(feed)[0], rtol=0, atol=0)
        np.testing.assert_allclose(out, reference.run(g, feed, {})[0], rtol=1e-5, atol=1e-5)

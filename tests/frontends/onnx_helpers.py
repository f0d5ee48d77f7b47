"""Helpers shared by the ONNX frontend tests: building models with onnx.helper, and checking an import
compiled for the CPU against the reference and onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import rlx
from rlx import reference
from rlx.frontends.onnx import from_onnx

try:
    import onnxruntime as ort
except ImportError:  # the comparison with onnxruntime is skipped, nothing else
    ort = None

REPO = Path(__file__).resolve().parents[2]
F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RTOL, ATOL = 1e-5, 1e-6


def _vi(name: str, elem: int, shape: Sequence[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def _const(name: str, value: object, dtype: type = np.float32) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype), name))


def _model(nodes: list, inputs: list, outputs: list, inits: Sequence = (), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)  # what the installed onnxruntime reads
    return model


def _ort(model: onnx.ModelProto | str, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray] | None:
    if ort is None:
        return None
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, dict(feeds))


def _compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray], names: Sequence[str], who: str) -> None:
    assert len(got) == len(want)
    for name, g, w in zip(names, got, want):
        assert g.shape == w.shape, f"{name} vs {who}: shape {g.shape} != {w.shape}"
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{name} vs {who}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{name} vs {who}")


def _check(model: onnx.ModelProto, feeds_list: Sequence[Mapping[str, np.ndarray]], **kw: object) -> rlx.Graph:
    """Import, compile once, and compare compiled vs reference vs onnxruntime for every feed."""
    graph, params = from_onnx(model, **kw)
    compiled = rlx.Session(rlx.Device.CPU).compile(graph)
    for name, value in params.items():
        compiled.set_param(name, value)
    names = [o.name for o in model.graph.output]
    for feeds in feeds_list:
        ref = reference.run(graph, feeds, params)
        _compare(compiled.run(feeds), ref, names, "reference")
        want = _ort(model, feeds)
        if want is not None:
            _compare(ref, want, names, "onnxruntime")
    return graph

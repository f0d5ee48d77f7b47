"""`rlx.frontends.onnx_conv`: convolution-family ONNX models against onnxruntime.

Exported by `torch.onnx.export` (the TorchScript exporter; its eval-mode export already folds batch
norms): ResNet-18 and MobileNetV3-small (tests/frontends/conv_models.py, torchvision's architectures in
plain torch, random weights) at 64x64, and a Whisper-like conv1d audio front end, each compiled once
with a dynamic batch and run at two batch sizes. Hand-built models cover what those exports do not:
BatchNormalization folded into a conv at import, a standalone one, `auto_pad` modes, pooling variants,
Pad, Resize, ConvTranspose and both Winograd tile sizes.
Every output must equal onnxruntime's (f32) within 1e-4 x max |out|.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.errors import IRError
from rlx.frontends.onnx import from_onnx, supported_ops

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
F = TensorProto.FLOAT


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= 1e-4 * float(np.abs(want).max()), f"{what}: max abs error {err} vs max |out| {np.abs(want).max()}"


def _compiled(data: bytes, max_batch: int) -> rlx.CompiledGraph:
    graph, params = from_onnx(data, max_dims={"batch": max_batch})
    cg = rlx.Session(rlx.Device.CPU).compile(graph)
    for name, value in params.items():
        cg.set_param(name, value)
    return cg


# ── exported models ────────────────────────────────────────────────────

MODELS = {"resnet18": (3, 64, 64), "mobilenet_v3_small": (3, 64, 64), "audio": (16, 40)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request: pytest.FixtureRequest) -> tuple[str, bytes, rlx.CompiledGraph]:
    torch = pytest.importorskip("torch")
    import conv_models

    name = request.param
    data = conv_models.export(conv_models.build(name), torch.randn(1, *MODELS[name]))
    return name, data, _compiled(data, max_batch=4)


def test_torch_exports_equal_onnxruntime(exported: tuple[str, bytes, rlx.CompiledGraph]) -> None:
    name, data, cg = exported
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    convs = [n for n in cg.lir.graph.nodes if n.kind == "conv"]
    assert convs and (name == "audio" or any(n.op.activation for n in convs))  # relu / hardswish fused
    from rlx.ir.decisions_conv import ConvPlan

    # the stems on RGB (3 -> 64 7 x 7, 3 -> 16 3 x 3, stride 2) run with the output channels in the lanes; with 16-float
    # vectors so do ResNet's stride-2 3 x 3 convs and its F(2x2)-wide stage (wide_lanes_fit)
    lanes = [d for d in cg.lir.decided(ConvPlan) if d.layout == "nchw_lanes"]
    wide = [d for d in lanes if cg.lir.graph.node(d.weight).shape.static_dims[1] > 4]
    assert len(lanes) - len(wide) == (0 if name == "audio" else 1), name
    assert all(d.vector == 16 for d in wide), name
    if name == "resnet18" and lanes[0].vector == 16:
        assert wide, name
    # every residual add is computed in the store of the conv it reads (ConvResidual): ResNet's 8 with their relu,
    # MobileNetV3-small's 6 projection convs plus shortcut
    from rlx.ir.decisions_conv import ConvResidual

    residuals = [(d.activation or "-") for d in cg.lir.decided(ConvResidual)]
    assert residuals == {"resnet18": ["relu"] * 8, "mobilenet_v3_small": ["-"] * 6, "audio": []}[name], name
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, *MODELS[name])).astype(np.float32)
        _close(cg.run(x=x)[0], sess.run(None, {"x": x})[0], f"{name} batch {batch}")


# ── hand-built models: what the exports leave out ───────────────────────


def _vi(name: str, shape: Sequence[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F, None if shape is None else list(shape))


def _model(nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray], opset: int = 17) -> bytes:
    graph = helper.make_graph(nodes, "t", inputs, outputs, [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)  # what the installed onnxruntime reads
    return model.SerializeToString()


def _window_model() -> tuple[bytes, list[str]]:
    rng = np.random.default_rng(7)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    def stats(c: int, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}_s": w(c) + 1, f"{prefix}_b": w(c), f"{prefix}_m": w(c),
                f"{prefix}_v": np.abs(w(c)) + np.float32(0.5)}

    inits = {"w1": w(6, 3, 3, 3), "b1": w(6), "w2": w(6, 3, 3, 3), "w3": w(4, 3, 2, 2), "wd": w(3, 1, 3, 3),
             **stats(6, "bn1"), **stats(3, "bn2"), **stats(6, "bn3"),
             "pads_hw": np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64),
             "pads_crop": np.array([0, 0, -1, 2, 0, 0, 1, -2], np.int64),
             "pad_value": np.array(0.5, np.float32), "scales": np.array([1, 1, 2, 3], np.float32),
             "wt": w(3, 4, 3, 2), "bt": w(4), "wtg": w(3, 2, 2, 3)}
    bn = ["_s", "_b", "_m", "_v"]
    nodes = [
        # conv (bias) -> BN -> relu: folded at import, then the relu fused into the conv
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c1", *(f"bn1{s}" for s in bn)], ["n1"], epsilon=1e-3),
        helper.make_node("Relu", ["n1"], ["folded"]),
        # conv without bias -> BN, the conv's output also read elsewhere: both values stay right
        helper.make_node("Conv", ["x", "w2"], ["c2"], auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c2", *(f"bn3{s}" for s in bn)], ["shared_bn"]),
        helper.make_node("Sigmoid", ["c2"], ["shared_raw"]),
        # BN on an input: the standalone batch_norm op
        helper.make_node("BatchNormalization", ["x", *(f"bn2{s}" for s in bn)], ["standalone"], epsilon=1e-5),
        helper.make_node("Conv", ["x", "w3"], ["same_lower"], auto_pad="SAME_LOWER", strides=[2, 1]),
        helper.make_node("Conv", ["x", "w3"], ["valid"], auto_pad="VALID", strides=[1, 2]),
        helper.make_node("Conv", ["x", "wd"], ["depthwise"], group=3, pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["x"], ["maxpool"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
        helper.make_node("MaxPool", ["x"], ["maxpool_dil"], kernel_shape=[2, 2], dilations=[2, 2], ceil_mode=1,
                         strides=[2, 2]),
        helper.make_node("AveragePool", ["x"], ["avgpool"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], count_include_pad=1, ceil_mode=1),
        helper.make_node("AveragePool", ["x"], ["avgpool_ex"], kernel_shape=[2, 3], pads=[1, 1, 0, 1]),
        helper.make_node("GlobalAveragePool", ["x"], ["gap"]),
        helper.make_node("HardSigmoid", ["x"], ["hsig"], alpha=0.3, beta=0.4),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Pad", ["x", "pads_hw", "pad_value"], ["pad_constant"]),
        helper.make_node("Pad", ["x", "pads_hw"], ["pad_reflect"], mode="reflect"),
        helper.make_node("Pad", ["x", "pads_crop"], ["pad_edge"], mode="edge"),
        helper.make_node("Resize", ["x", "", "scales"], ["up_asym"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Resize", ["x", "", "scales"], ["up_half"], mode="nearest"),
        helper.make_node("ConvTranspose", ["x", "wt", "bt"], ["deconv"], strides=[2, 3], pads=[1, 0, 0, 1],
                         output_padding=[1, 0]),
        helper.make_node("ConvTranspose", ["x", "wtg"], ["deconv_grouped"], group=3, dilations=[2, 1]),
    ]
    outs = ["folded", "shared_bn", "shared_raw", "standalone", "same_lower", "valid", "depthwise", "maxpool",
            "maxpool_dil", "avgpool", "avgpool_ex", "gap", "hsig", "flat", "pad_constant", "pad_reflect", "pad_edge",
            "up_asym", "up_half", "deconv", "deconv_grouped"]
    return _model(nodes, [_vi("x", ["batch", 3, 9, 8])], [_vi(o, None) for o in outs], inits), outs


def test_windows_batch_norms_and_auto_pads_equal_onnxruntime() -> None:
    data, outs = _window_model()
    graph, _ = from_onnx(data, max_dims={"batch": 2})
    kinds = [n.kind for n in graph.nodes]
    assert kinds.count("batch_norm") == 1  # only x's: each conv's BN is folded into a copy of the conv
    assert kinds.count("conv") == 9  # 5 convs + 2 folded copies (the first one's original is dead code) + 2 deconvs
    cg = _compiled(data, max_batch=2)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in (2, 1):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 9, 8)).astype(np.float32)
        for name, got, want in zip(outs, cg.run(x=x), sess.run(outs, {"x": x})):
            _close(got, want, f"{name} batch {batch}")


def test_winograd_convs_equal_onnxruntime() -> None:
    """3x3 stride-1 convs with 32+ channels: Winograd F(4x4, 3x3) on rows of 30 (partial tiles in both axes,
    uneven pads, relu fused) and F(2x2, 3x3) on rows of 16, batches split over the team and shared by it."""
    from rlx.ir.decisions_conv import ConvPlan

    rng = np.random.default_rng(11)
    inits = {name: (rng.standard_normal(shape) * 0.2).astype(np.float32)
             for name, shape in (("w4", (34, 33, 3, 3)), ("b4", (34,)), ("w2", (34, 34, 3, 3)))}
    nodes = [helper.make_node("Conv", ["x", "w4", "b4"], ["c4"], pads=[2, 1, 0, 1]),
             helper.make_node("Relu", ["c4"], ["wino4"]),
             helper.make_node("Slice", ["wino4", "starts", "ends", "axes"], ["left"]),
             helper.make_node("Conv", ["left", "w2"], ["wino2"], pads=[1, 1, 1, 1])]
    inits |= {"starts": np.array([0], np.int64), "ends": np.array([16], np.int64), "axes": np.array([3], np.int64)}
    data = _model(nodes, [_vi("x", ["batch", 33, 9, 30])], [_vi("wino4", None), _vi("wino2", None)], inits)
    cg = _compiled(data, max_batch=2)
    assert {d.layout for d in cg.lir.decided(ConvPlan) if d.algorithm == "winograd"} == {"nchw_wino4_tiles",
                                                                                         "nchw_wino_tiles"}
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in (2, 1):
        x = np.random.default_rng(batch).standard_normal((batch, 33, 9, 30)).astype(np.float32)
        for name, got, want in zip(("wino4", "wino2"), cg.run(x=x), sess.run(["wino4", "wino2"], {"x": x})):
            _close(got, want, f"{name} batch {batch}")


@pytest.mark.parametrize(("node", "x_shape", "w_shape", "pattern"), [
    (dict(op_type="Conv"), [1, 2, 4, 4, 4], [2, 2, 1, 1, 1], "over 3 spatial axes"),
    (dict(op_type="Conv", auto_pad="SAME_UPPER", pads=[1, 1, 1, 1]), [1, 2, 4, 4], [2, 2, 1, 1], "together"),
    (dict(op_type="Conv", kernel_shape=[3, 3]), [1, 2, 4, 4], [2, 2, 1, 1], "disagrees with the weight"),
    (dict(op_type="BatchNormalization", training_mode=1), [1, 2, 4, 4], None, "training_mode=1"),
    (dict(op_type="MaxPool", kernel_shape=[2, 2], storage_order=1), [1, 2, 4, 4], None, "storage_order"),
    # linear and cubic, and nearest by any factor, resize static axes (test_onnx_resize.py); these are refused:
    (dict(op_type="Resize", mode="linear", antialias=1), [1, 2, 4, 4], [1, 1, 0.5, 0.5], "antialias"),
    (dict(op_type="Resize", coordinate_transformation_mode="tf_crop_and_resize"), [1, 2, 4, 4], None,
     "tf_crop_and_resize"),
    (dict(op_type="Pad", mode="circular"), [1, 2, 4, 4], None, "mode 'circular'"),
])
def test_unsupported_forms_are_refused_by_name(node: dict, x_shape: list[int], w_shape: list | None,
                                               pattern: str) -> None:
    op = node.pop("op_type")
    inits = {}
    if op == "Conv":
        inits["w"] = np.ones(w_shape, np.float32)
        inputs = ["x", "w"]
    elif op == "BatchNormalization":
        inits.update({n: np.ones([2], np.float32) for n in "sbmv"})
        inputs = ["x", *"sbmv"]
    elif op == "Resize":
        inits["scales"] = np.array(w_shape or [1, 1, 2, 2], np.float32)
        inputs = ["x", "", "scales"]
    elif op == "Pad":
        inits["pads"] = np.zeros(8, np.int64)
        inputs = ["x", "pads"]
    else:
        inputs = ["x"]
    data = _model([helper.make_node(op, inputs, ["y"], **node)], [_vi("x", x_shape)], [_vi("y", None)], inits)
    with pytest.raises(IRError, match=pattern):
        from_onnx(data)


def test_conv_family_is_listed_as_supported() -> None:
    assert {"Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Pad",
            "Resize", "ConvTranspose"} <= set(supported_ops())


def test_conv_transpose_with_a_run_time_weight_equals_onnxruntime() -> None:
    """A ConvTranspose weight that is a graph input: flipped and turned by gathers and a transpose in the graph."""
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 1], pads=[1, 0, 0, 1], group=2,
                              output_padding=[1, 0]),
             helper.make_node("ConvTranspose", ["x1", "w1", "b1"], ["y1"], dilations=[2])]
    data = _model(nodes, [_vi("x", [1, 4, 5, 4]), _vi("w", [4, 3, 3, 2]), _vi("x1", [2, 2, 7]), _vi("w1", [2, 3, 3]),
                          _vi("b1", [3])], [_vi("y", None), _vi("y1", None)], {})
    graph, params = from_onnx(data)
    cg = rlx.Session(rlx.Device.CPU).compile(graph)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((1, 4, 5, 4)), "w": rng.standard_normal((4, 3, 3, 2)),
             "x1": rng.standard_normal((2, 2, 7)), "w1": rng.standard_normal((2, 3, 3)), "b1": rng.standard_normal(3)}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    for name, got, ref, want in zip(("y", "y1"), cg.run(feeds), rlx.reference.run(graph, feeds, params),
                                    sess.run(None, feeds)):
        _close(got, want, f"{name} compiled")
        _close(ref, want, f"{name} reference")


def test_3d_pools_dilated_average_and_global_max_equal_onnxruntime() -> None:
    """3-D MaxPool / AveragePool (decomposed into two 2-D pools for the CPU), AveragePool-19's dilations,
    GlobalMaxPool over 3 axes, Pad-19's wrap mode (wider than the axis: around again), MaxPool of uint8 (in
    f32, exact); a dynamic batch at two sizes."""
    nodes = [
        helper.make_node("MaxPool", ["v"], ["max3"], kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1],
                         dilations=[1, 2, 1], ceil_mode=1),
        helper.make_node("AveragePool", ["v"], ["avg3_pad"], kernel_shape=[3, 2, 2], strides=[2, 2, 1],
                         pads=[1, 0, 1, 1, 1, 0], count_include_pad=1, ceil_mode=1),
        helper.make_node("AveragePool", ["v"], ["avg3_dil"], kernel_shape=[2, 2, 3], pads=[1, 1, 1, 0, 1, 1],
                         dilations=[2, 1, 2]),
        helper.make_node("AveragePool", ["x"], ["avg2_dil"], kernel_shape=[3, 2], strides=[1, 2], dilations=[2, 3],
                         pads=[2, 1, 1, 0]),
        helper.make_node("GlobalMaxPool", ["v"], ["gmp"]),
        helper.make_node("Pad", ["x", "pads_wrap"], ["pad_wrap"], mode="wrap"),
        helper.make_node("MaxPool", ["u"], ["max_u8"], kernel_shape=[2, 3], pads=[1, 1, 0, 1]),
    ]
    outs = ["max3", "avg3_pad", "avg3_dil", "avg2_dil", "gmp", "pad_wrap", "max_u8"]
    u8_in = helper.make_tensor_value_info("u", TensorProto.UINT8, ["batch", 2, 5, 6])
    u8_out = helper.make_tensor_value_info("max_u8", TensorProto.UINT8, None)
    data = _model(nodes, [_vi("v", ["batch", 3, 6, 7, 5]), _vi("x", ["batch", 2, 9, 8]), u8_in],
                  [*(_vi(o, None) for o in outs[:-1]), u8_out],
                  {"pads_wrap": np.array([0, 0, 2, 11, 0, 0, 10, 1], np.int64)}, opset=19)
    graph, params = from_onnx(data, max_dims={"batch": 2})
    cg = _compiled(data, max_batch=2)
    assert all(len(n.op.kernel) <= 2 for n in cg.lir.graph.nodes if n.kind == "pool")
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in (2, 1):
        rng = np.random.default_rng(batch)
        feeds = {"v": rng.standard_normal((batch, 3, 6, 7, 5)).astype(np.float32),
                 "x": rng.standard_normal((batch, 2, 9, 8)).astype(np.float32),
                 "u": rng.integers(0, 256, (batch, 2, 5, 6)).astype(np.uint8)}
        want = sess.run(outs, feeds)
        for name, got, ref, w in zip(outs, cg.run(feeds), rlx.reference.run(graph, feeds, params), want):
            _close(got, w, f"{name} batch {batch}")
            _close(ref, w, f"{name} reference batch {batch}")

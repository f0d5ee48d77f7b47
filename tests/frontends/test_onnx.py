"""`rlx.from_onnx`: hand-built ONNX graphs per op, compiled and checked against the reference and onnxruntime.

Ops are grouped into a few multi-output models so each group compiles once.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.errors import IRError
from rlx.frontends.onnx import from_onnx, supported_ops

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_helpers import (  # noqa: E402
    BOOL,
    I64,
    REPO,
    F,
    _check,
    _compare,
    _const,
    _model,
    _ort,
    _vi,
)

# ── op groups ───────────────────────────────────────────────────────────


def test_elementwise_compare_reduce_and_erf_gelu(rng: np.random.Generator) -> None:
    sqrt2 = math.sqrt(2.0)
    nodes = [
        _const("two", 2.0), _const("three", 3, np.int64), _const("one", 1.0), _const("half", 0.5),
        _const("sqrt2", sqrt2), _const("inv_sqrt2", 1 / sqrt2), _const("ax1", [1], np.int64),
        helper.make_node("Add", ["x", "w"], ["add"]),
        helper.make_node("Sub", ["x", "y"], ["sub"]),
        helper.make_node("Mul", ["x", "y"], ["mul"]),
        helper.make_node("Div", ["x", "y"], ["div"]),
        helper.make_node("Pow", ["y", "two"], ["pow"]),
        helper.make_node("Pow", ["x", "three"], ["pow_int_exp"]),
        *[helper.make_node(op, [src], [op.lower()]) for op, src in
          (("Sqrt", "y"), ("Tanh", "x"), ("Relu", "x"), ("Sigmoid", "x"), ("Exp", "x"), ("Log", "y"),
           ("Neg", "x"), ("Abs", "x"))],
        helper.make_node("Softmax", ["x"], ["softmax0"], axis=0),
        helper.make_node("ReduceMean", ["x"], ["rmean"], axes=[1], keepdims=1),  # axes attribute (opset < 18)
        helper.make_node("ReduceSum", ["x", "ax1"], ["rsum"], keepdims=0),  # axes input
        helper.make_node("ReduceSum", ["x"], ["rsum_all"]),
        helper.make_node("Equal", ["xi", "yi"], ["eq"]),
        helper.make_node("Not", ["eq"], ["not"]),
        helper.make_node("Less", ["x", "y"], ["lt"]),
        helper.make_node("Where", ["lt", "x", "y"], ["where"]),
        helper.make_node("Cast", ["x"], ["cast_i32"], to=TensorProto.INT32),
        helper.make_node("Cast", ["xi"], ["cast_f32"], to=F),
        # erf-GELU in its three usual association orders, and with x * (1/sqrt 2)
        helper.make_node("Div", ["x", "sqrt2"], ["g1_d"]), helper.make_node("Erf", ["g1_d"], ["g1_e"]),
        helper.make_node("Add", ["g1_e", "one"], ["g1_a"]), helper.make_node("Mul", ["x", "g1_a"], ["g1_m"]),
        helper.make_node("Mul", ["g1_m", "half"], ["gelu_a"]),
        helper.make_node("Mul", ["y", "inv_sqrt2"], ["g2_d"]), helper.make_node("Erf", ["g2_d"], ["g2_e"]),
        helper.make_node("Add", ["one", "g2_e"], ["g2_a"]), helper.make_node("Mul", ["half", "y"], ["g2_h"]),
        helper.make_node("Mul", ["g2_h", "g2_a"], ["gelu_b"]),
        helper.make_node("Div", ["x", "sqrt2"], ["g3_d"]), helper.make_node("Erf", ["g3_d"], ["g3_e"]),
        helper.make_node("Add", ["g3_e", "one"], ["g3_a"]), helper.make_node("Mul", ["g3_a", "half"], ["g3_m"]),
        helper.make_node("Mul", ["x", "g3_m"], ["gelu_c"]),
    ]
    outs = [("add", F, [2, 3]), ("sub", F, [2, 3]), ("mul", F, [2, 3]), ("div", F, [2, 3]), ("pow", F, [2, 3]),
            ("pow_int_exp", F, [2, 3]), *[(n, F, [2, 3]) for n in
                                           ("sqrt", "tanh", "relu", "sigmoid", "exp", "log", "neg", "abs")],
            ("softmax0", F, [2, 3]), ("rmean", F, [2, 1]), ("rsum", F, [2]), ("rsum_all", F, [1, 1]),
            ("eq", BOOL, [2, 3]), ("not", BOOL, [2, 3]), ("lt", BOOL, [2, 3]), ("where", F, [2, 3]),
            ("cast_i32", TensorProto.INT32, [2, 3]), ("cast_f32", F, [2, 3]),
            ("gelu_a", F, [2, 3]), ("gelu_b", F, [2, 3]), ("gelu_c", F, [2, 3])]
    model = _model(nodes, [_vi("x", F, [2, 3]), _vi("y", F, [2, 3]), _vi("xi", I64, [2, 3]), _vi("yi", I64, [2, 3])],
                   [_vi(*o) for o in outs], inits=[("w", np.array([0.5, -1.0, 2.0], np.float32))])
    graph = from_onnx(model).graph
    kinds = [n.op.describe() for n in graph.nodes]
    assert kinds.count("activation[fn=gelu]") == 3 and not any("erf" in k for k in kinds)
    feeds = {"x": rng.uniform(-3, 3, (2, 3)).astype(np.float32), "y": rng.uniform(0.5, 2, (2, 3)).astype(np.float32),
             "xi": np.array([[1, 2, 3], [4, 5, 6]]), "yi": np.array([[1, 0, 3], [0, 5, 0]])}
    _check(model, [feeds])


def test_matmul_gemm_norm_gelu_gather(rng: np.random.Generator) -> None:
    nodes = [
        _const("idx", [[2, -1], [0, 1]], np.int64), _const("ax", [-1], np.int64),
        helper.make_node("MatMul", ["x", "w"], ["mm3d"]),
        helper.make_node("MatMul", ["v", "w"], ["mm_vec_left"]),
        helper.make_node("MatMul", ["x", "v2"], ["mm_vec_right"]),
        helper.make_node("Gemm", ["a", "b", "c"], ["gemm_t"], transA=1, transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Gemm", ["a2", "w"], ["gemm_plain"]),
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], epsilon=1e-3),
        helper.make_node("LayerNormalization", ["x", "gamma"], ["ln_nobias"], axis=2),
        helper.make_node("Gelu", ["x"], ["gelu"]),
        helper.make_node("Gelu", ["x"], ["gelu_tanh"], approximate="tanh"),
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("Gather", ["x", "idx"], ["gather_const"], axis=2),
        helper.make_node("ReduceMean", ["x", "ax"], ["rmean"], keepdims=0),  # opset 18+: axes input
    ]
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    inits = [("w", normal(4, 5)), ("v2", normal(4)), ("b", normal(5, 3)), ("c", normal(5)),
             ("gamma", rng.uniform(0.5, 1.5, 4).astype(np.float32)), ("beta", normal(4)), ("table", normal(7, 3))]
    outs = [("mm3d", [2, 3, 5]), ("mm_vec_left", [5]), ("mm_vec_right", [2, 3]), ("gemm_t", [2, 5]),
            ("gemm_plain", [2, 5]), ("ln", [2, 3, 4]), ("ln_nobias", [2, 3, 4]), ("gelu", [2, 3, 4]),
            ("gelu_tanh", [2, 3, 4]), ("emb", [2, 2, 3]), ("gather_const", [2, 3, 2, 2]), ("rmean", [2, 3])]
    model = _model(nodes, [_vi("x", F, [2, 3, 4]), _vi("v", F, [4]), _vi("a", F, [3, 2]), _vi("a2", F, [2, 4]),
                           _vi("ids", I64, [2, 2])],
                   [_vi(n, F, s) for n, s in outs], inits=inits, opset=20)
    feeds = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32), "v": rng.standard_normal(4).astype(np.float32),
             "a": rng.standard_normal((3, 2)).astype(np.float32), "a2": rng.standard_normal((2, 4)).astype(np.float32),
             "ids": np.array([[6, 0], [3, 3]], np.int64)}
    graph = _check(model, [feeds])
    assert {"activation[fn=gelu]", "activation[fn=gelu_tanh]"} <= {n.op.describe() for n in graph.nodes}


def test_shape_ops_and_folding(rng: np.random.Generator) -> None:
    big = np.iinfo(np.int64).max
    c = lambda name, v: _const(name, v, np.int64)  # noqa: E731
    nodes = [
        c("shape_a", [0, -1]), c("perm_axes", [0]), c("starts", [-3, 1]), c("ends", [big, 3]), c("axes", [2, 1]),
        c("split", [1, 3]), c("exp_shape", [2, 1, 4]), c("r_start", 1), c("r_limit", 4), c("r_delta", 1),
        helper.make_node("Reshape", ["x", "shape_a"], ["reshape"]),
        helper.make_node("Transpose", ["x"], ["transpose"]),
        helper.make_node("Unsqueeze", ["x", "perm_axes"], ["unsq"]),
        helper.make_node("Squeeze", ["unsq", "perm_axes"], ["sq_axes"]),
        helper.make_node("Squeeze", ["ones_col"], ["sq_all"]),
        helper.make_node("Concat", ["x", "x"], ["concat"], axis=1),
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["slice"]),
        helper.make_node("Split", ["x", "split"], ["split0", "split1"], axis=2),
        helper.make_node("Split", ["x"], ["half0", "half1"], axis=1, num_outputs=2),  # opset 18+, uneven
        helper.make_node("Expand", ["row", "exp_shape"], ["expand"]),
        helper.make_node("Identity", ["x"], ["ident"]),
        # folded: Shape(x)[1:] → ConstantOfShape → Add; Range → Gather
        helper.make_node("Shape", ["x"], ["shp"], start=1),
        helper.make_node("ConstantOfShape", ["shp"], ["filled"], value=numpy_helper.from_array(
            np.array([1.5], np.float32))),
        helper.make_node("Add", ["x", "filled"], ["plus_filled"]),
        helper.make_node("Range", ["r_start", "r_limit", "r_delta"], ["rng"]),
        helper.make_node("Gather", ["x", "rng"], ["gather_range"], axis=2),
    ]
    outs = [("reshape", [2, 12]), ("transpose", [4, 3, 2]), ("unsq", [1, 2, 3, 4]), ("sq_axes", [2, 3, 4]),
            ("sq_all", [3]), ("concat", [2, 6, 4]), ("slice", [2, 2, 3]), ("split0", [2, 3, 1]),
            ("split1", [2, 3, 3]), ("half0", [2, 2, 4]), ("half1", [2, 1, 4]), ("expand", [2, 1, 4]),
            ("ident", [2, 3, 4]), ("plus_filled", [2, 3, 4]), ("gather_range", [2, 3, 3])]
    model = _model(nodes, [_vi("x", F, [2, 3, 4]), _vi("ones_col", F, [3, 1]), _vi("row", F, [4])],
                   [_vi(n, F, s) for n, s in outs], opset=21)
    graph = from_onnx(model).graph
    # Shape/ConstantOfShape/Range fold away: no graph node computes a shape.
    assert sum(n.kind == "constant" for n in graph.nodes) >= 2
    feeds = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
             "ones_col": rng.standard_normal((3, 1)).astype(np.float32),
             "row": rng.standard_normal(4).astype(np.float32)}
    _check(model, [feeds])


def test_dynamic_shape_subgraphs_fold_to_symbolic_dims(rng: np.random.Generator) -> None:
    c = lambda name, v: _const(name, v, np.int64)  # noqa: E731
    nodes = [
        c("i0", 0), c("i1", 1), c("ax0", [0]), c("tail", [2, 3]), c("neg1", [-1]), c("zero", [0]),
        c("big", [np.iinfo(np.int64).max]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"]), helper.make_node("Gather", ["s", "i1"], ["t"]),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]), helper.make_node("Unsqueeze", ["t", "ax0"], ["t1"]),
        helper.make_node("Mul", ["b1", "t1"], ["bt"]),
        helper.make_node("Concat", ["bt", "tail"], ["shape_flat"], axis=0),
        helper.make_node("Reshape", ["x", "shape_flat"], ["flat"]),  # [batch*seq, 2, 3]
        helper.make_node("Concat", ["b1", "t1", "neg1"], ["shape_back"], axis=0),
        helper.make_node("Reshape", ["flat", "shape_back"], ["back"]),
        # torch's Expand idiom: Where(Equal(shape, -1), ones, shape)
        helper.make_node("Equal", ["s", "neg1"], ["is_neg"]),
        helper.make_node("ConstantOfShape", ["s"], ["twos"],
                         value=numpy_helper.from_array(np.array([2.0], np.float32))),
        helper.make_node("Shape", ["s"], ["rank"]),
        helper.make_node("ConstantOfShape", ["rank"], ["ones_i"], value=numpy_helper.from_array(np.array([1]))),
        helper.make_node("Where", ["is_neg", "ones_i", "s"], ["exp_shape"]),
        helper.make_node("Expand", ["w", "exp_shape"], ["w_big"]),
        helper.make_node("Mul", ["w_big", "twos"], ["w2"]),
        helper.make_node("Add", ["back", "w2"], ["out"]),
        helper.make_node("Slice", ["out", "zero", "big", "ax0"], ["whole"]),  # the whole dynamic axis
    ]
    model = _model(nodes, [_vi("x", F, ["batch", "seq", 6])],
                   [_vi("flat", F, ["bs", 2, 3]), _vi("whole", F, ["batch", "seq", 6])],
                   inits=[("w", rng.standard_normal(6).astype(np.float32))])
    graph = _check(model, [{"x": rng.standard_normal((b, s, 6)).astype(np.float32)} for b, s in ((1, 1), (3, 5))],
                   max_dims={"batch": 4, "seq": 8})
    batch, seq = rlx.Dim.dynamic("batch", 4), rlx.Dim.dynamic("seq", 8)
    assert graph.shape(graph.outputs[0]).dims == (batch * seq, rlx.Dim(2), rlx.Dim(3))
    assert graph.symbols() == {"batch": 4, "seq": 8}


def test_range_over_a_dynamic_axis_is_an_iota(rng: np.random.Generator) -> None:
    """torch's ``arange(x.shape[1])`` position ids (and a strided one over twice the axis), and BERT's
    ``position_table[:seq]`` (a Slice of a static axis to a dynamic length), no fixed_dims."""
    c = lambda name, v: _const(name, v, np.int64)  # noqa: E731
    nodes = [
        c("i1", 1), c("z", 0), c("one", 1), c("two", 2), c("ax0", [0]),
        helper.make_node("Shape", ["ids"], ["s"]), helper.make_node("Gather", ["s", "i1"], ["n"]),
        helper.make_node("Range", ["z", "n", "one"], ["pos"]),                  # [seq]
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["pos1"]),                # [1, seq]
        helper.make_node("Gather", ["table", "pos1"], ["pe"]),                  # [1, seq, 4]
        helper.make_node("Gather", ["table", "ids"], ["te"]),                   # [batch, seq, 4]
        helper.make_node("Add", ["te", "pe"], ["emb"]),
        helper.make_node("Mul", ["n", "two"], ["n2"]),
        helper.make_node("Range", ["z", "n2", "two"], ["even"]),                # [seq]: 0, 2, 4, ...
        c("six", 6), helper.make_node("Less", ["even", "six"], ["first_half"]),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Slice", ["table", "ax0", "n1", "ax0"], ["rows"]),  # table[0:seq]: [seq, 4]
        helper.make_node("Add", ["emb", "rows"], ["emb_rows"]),
    ]
    model = _model(nodes, [_vi("ids", I64, ["batch", "seq"])],
                   [_vi("emb", F, ["batch", "seq", 4]), _vi("even", I64, ["seq"]), _vi("first_half", BOOL, ["seq"]),
                    _vi("emb_rows", F, ["batch", "seq", 4])],
                   inits=[("table", rng.standard_normal((16, 4)).astype(np.float32))])
    graph = _check(model, [{"ids": rng.integers(0, 16, (b, s))} for b, s in ((1, 1), (2, 5), (3, 16))],
                   max_dims={"batch": 3, "seq": 16})
    assert "iota" in {n.kind for n in graph.nodes}
    assert graph.shape(graph.outputs[1]).dims == (rlx.Dim.dynamic("seq", 16),)
    with pytest.raises(IRError, match="past the axis"):  # seq up to 17 would cut past the table's 16 rows
        from_onnx(model, max_dims={"batch": 3, "seq": 17})


def test_slice_steps_on_static_axes(rng: np.random.Generator) -> None:
    """Reversed and strided Slices of static axes (a gather of the indices taken), next to a dynamic batch."""
    c = lambda name, v: _const(name, v, np.int64)  # noqa: E731
    nodes = [
        c("rs", [-1, 5]), c("re", [-100, 0]), c("ra", [1, 2]), c("rst", [-1, -2]),
        helper.make_node("Slice", ["x", "rs", "re", "ra", "rst"], ["rev"]),
        c("ss", [1]), c("se", [100]), c("sa", [2]), c("sst", [3]),
        helper.make_node("Slice", ["x", "ss", "se", "sa", "sst"], ["strided"]),
    ]
    model = _model(nodes, [_vi("x", F, ["batch", 4, 7])], [_vi("rev", F, None), _vi("strided", F, None)])
    graph = _check(model, [{"x": rng.standard_normal((b, 4, 7)).astype(np.float32)} for b in (1, 3)],
                   max_dims={"batch": 3})
    assert [graph.shape(o).dims[1:] for o in graph.outputs] == [(rlx.Dim(4), rlx.Dim(3)), (rlx.Dim(4), rlx.Dim(2))]


def _example() -> object:
    spec = importlib.util.spec_from_file_location("make_onnx", REPO / "examples" / "make_onnx.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _encoder_feeds(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = rng.integers(0, 50, (batch, seq))
    mask = np.ones_like(ids)
    mask[0, max(1, seq - 2):] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": np.arange(seq, dtype=np.int64)}


def test_example_encoder_with_dynamic_axes(rng: np.random.Generator, tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    assert _example().main([str(path), "--layers", "1"]) == 0
    model = onnx.load(str(path))
    graph = _check(model, [_encoder_feeds(rng, 1, 3), _encoder_feeds(rng, 3, 7)],
                   max_dims={"batch": 4, "sequence": 16})
    assert [str(n.op.shape) for n in graph.inputs()] == ["i64[batch,sequence]"] * 2 + ["i64[sequence]"]
    assert any(n.kind == "reshape" and str(n.shape) == "f32[batch,sequence,4,8]" for n in graph.nodes)
    assert graph.symbols() == {"batch": 4, "sequence": 16}


def test_external_data(rng: np.random.Generator, tmp_path: Path) -> None:
    model = _example().build_model(layers=1)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}  # saving moves them out
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (path.parent / "weights.bin").stat().st_size > 1000
    graph, params = from_onnx(path, max_dims={"batch": 2, "sequence": 8})
    assert params.keys() == weights.keys()
    for name, value in weights.items():
        np.testing.assert_array_equal(params[name], value)
    feeds = _encoder_feeds(rng, 2, 5)
    want = _ort(str(path), feeds)
    if want is not None:
        _compare(reference.run(graph, feeds, params), want, ["last_hidden_state", "pooled"], "onnxruntime")
    unloaded = onnx.load(str(path), load_external_data=False)
    with pytest.raises(IRError, match="external file"):
        from_onnx(unloaded, max_dims={"batch": 2, "sequence": 8})


# ── errors ──────────────────────────────────────────────────────────────


def _tiny(nodes: list, opset: int = 17, x_shape: Sequence[int | str] = (2, 3)) -> onnx.ModelProto:
    return _model(nodes, [_vi("x", F, list(x_shape))], [_vi("out", F, None)], opset=opset)


def test_unsupported_ops_are_listed_with_their_nodes() -> None:
    nodes = [helper.make_node("RoiAlign", ["x", "x"], ["c1"], name="roi_a"),  # (Conv was the example until
             helper.make_node("RoiAlign", ["c1", "x"], ["c2"], name="roi_b"),  # rlx.frontends.onnx_conv)
             helper.make_node("Erf", ["c2"], ["e"], name="lonely_erf"),
             helper.make_node("FusedMatMul", ["e", "x"], ["f"], name="ms_op", domain="com.microsoft"),
             helper.make_node("LSTM", ["f"], ["out"])]
    with pytest.raises(IRError) as err:
        from_onnx(_tiny(nodes))
    msg = str(err.value)
    for fragment in ("4 unsupported", "RoiAlign (nodes roi_a, roi_b)", "Erf", "lonely_erf",
                     "com.microsoft::FusedMatMul (nodes ms_op)", "LSTM (nodes #4)"):
        assert fragment in msg
    assert "Erf" in supported_ops() and "MatMul" in supported_ops()


def test_dynamic_axis_bounds() -> None:
    model = _tiny([helper.make_node("Relu", ["x"], ["out"])], x_shape=["batch", "seq len"])
    with pytest.raises(IRError, match=r"'batch' \(input 'x' axis 0\), 'seq len' \(input 'x' axis 1\).*max_dims"):
        from_onnx(model)
    with pytest.raises(IRError, match=r"'seq len'.*max_dims"):
        from_onnx(model, max_dims={"batch": 2})
    with pytest.raises(IRError, match=r"\['btach'\].*'batch'"):
        from_onnx(model, max_dims={"batch": 2, "seq len": 3, "btach": 2})
    graph, _ = from_onnx(model, max_dims={"batch": 2, "seq len": 3})
    assert str(graph.inputs()[0].op.shape) == "f32[batch,seq_len]"


def test_fixed_dims_make_an_axis_static() -> None:
    model = _tiny([helper.make_node("Relu", ["x"], ["out"])], x_shape=["batch", "seq len"])
    graph, _ = from_onnx(model, max_dims={"batch": 2}, fixed_dims={"seq len": 5})
    assert str(graph.inputs()[0].op.shape) == "f32[batch,5]"
    with pytest.raises(IRError, match=r"\['batch'\] are given both a bound"):
        from_onnx(model, max_dims={"batch": 2, "seq len": 3}, fixed_dims={"batch": 2})
    with pytest.raises(IRError, match=r"\['sequence'\], which are not dynamic axes"):
        from_onnx(model, fixed_dims={"batch": 2, "seq len": 3, "sequence": 2})


def test_each_node_is_checked_against_the_version_its_opset_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx.frontends import onnx_opset

    relu = [helper.make_node("Relu", ["x"], ["out"])]
    assert from_onnx(_tiny(relu, onnx.defs.onnx_opset_version())).graph  # Relu-14 at the newest opset
    monkeypatch.setitem(onnx_opset.REVIEWED, "Relu", (13,))  # as if Relu-14 were new and unreviewed
    with pytest.raises(IRError, match=r"Relu-14 \(selected by opset 17\) is a version RLX has not implemented"):
        from_onnx(_tiny(relu, 17))
    assert from_onnx(_tiny(relu, 13)).graph
    # an opset before 13 imports when its ops' versions are the reviewed ones (Where-9, Not-1, Equal-11 is not)
    cond = [helper.make_node("Greater", ["x", "x"], ["g"]), helper.make_node("Not", ["g"], ["n"]),
            helper.make_node("Where", ["n", "x", "x"], ["out"])]
    assert from_onnx(_tiny(cond, 13)).graph
    with pytest.raises(IRError, match=r"Greater-9 \(selected by opset 11\)"):
        from_onnx(_tiny(cond, 11))


def test_an_unbounded_axis_shared_by_inputs_is_named_once() -> None:
    from rlx.errors import UnboundedDimsError

    model = _model([helper.make_node("Add", ["x", "y"], ["out"])],
                   [_vi("x", F, ["batch", 3]), _vi("y", F, ["batch", 3])], [_vi("out", F, None)])
    with pytest.raises(UnboundedDimsError) as err:
        from_onnx(model)
    assert err.value.dims == {"batch": ["input 'x' axis 0", "input 'y' axis 0"]}
    assert str(err.value).count("'batch'") == 1


@pytest.mark.parametrize(("nodes", "opset", "pattern"), [
    ([_const("s", [0], np.int64), _const("e", [2], np.int64), _const("a", [1], np.int64),
      _const("st", [2], np.int64), helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["out"])], 17, "steps"),
    ([helper.make_node("Shape", ["x"], ["s"]), _const("i", 1, np.int64), _const("z", 0, np.int64),
      helper.make_node("Gather", ["s", "i"], ["n"]), _const("one", 1, np.int64),
      helper.make_node("Range", ["one", "n", "one"], ["out"])], 17, "dynamic limit needs start 0"),
    ([helper.make_node("Shape", ["x"], ["s"]), _const("i", 1, np.int64), _const("three", 3, np.int64),
      helper.make_node("Gather", ["s", "i"], ["n"]), _const("z", 0, np.int64),
      helper.make_node("Range", ["z", "n", "three"], ["out"])], 17, "does not divide the dynamic limit"),
    ([helper.make_node("Relu", ["x"], ["out"])], 12, "Relu-6 .selected by opset 12. is a version RLX has not"),
    ([helper.make_node("Relu", ["x"], ["out"])], onnx.defs.onnx_opset_version() + 1,
     f"opsets up to {onnx.defs.onnx_opset_version()}"),
    ([helper.make_node("Gelu", ["x"], ["out"])], 17, "Gelu is not defined in opset 17"),
    ([_const("s", [5, 5], np.int64), helper.make_node("Reshape", ["x", "s"], ["out"], name="bad_reshape")], 17,
     "bad_reshape.*cannot reshape"),
])
def test_clear_errors(nodes: list, opset: int, pattern: str) -> None:
    with pytest.raises(IRError, match=pattern):
        from_onnx(_tiny(nodes, opset, x_shape=(2, "n")), max_dims={"n": 4})


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(IRError, match="does not exist"):
        from_onnx(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a model")
    with pytest.raises(IRError, match="cannot read"):
        from_onnx(tmp_path / "junk.onnx")
    with pytest.raises(TypeError, match=r"path, bytes or an onnx\.ModelProto"):
        from_onnx(42)  # type: ignore[arg-type]
    model = _tiny([helper.make_node("Relu", ["x"], ["out"])])
    graph, params = from_onnx(model.SerializeToString(), name="from_bytes")
    assert graph.name == "from_bytes" and params == {}


def test_import_rlx_does_not_import_onnx() -> None:
    code = ("import sys, rlx; assert 'onnx' not in sys.modules; "
            "from rlx.frontends.onnx import from_onnx; assert rlx.from_onnx is from_onnx; "
            "assert 'onnx' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# ── torch export (only where torch is installed) ───────────────────────


def test_torch_exported_minilm_shaped_bert(rng: np.random.Generator, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from rlx.models import bert as B
    from rlx.models.torch_bert import TorchBert

    cfg = B.BertConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                       max_position_embeddings=40)
    module = TorchBert(cfg, B.random_weights(cfg, seed=3)).module(pooled=False)
    ids = torch.from_numpy(rng.integers(4, 60, (2, 6)))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    path = tmp_path / "bert.onnx"
    legacy = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    torch.onnx.export(module, (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["tokens"], opset_version=17, **legacy)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    graph, params = from_onnx(path)
    compiled = rlx.Session(rlx.Device.CPU).compile(graph)
    for name, value in params.items():
        compiled.set_param(name, value)
    got = compiled.run(feeds)
    _compare(got, reference.run(graph, feeds, params), ["tokens"], "reference")
    want = _ort(str(path), feeds)
    if want is not None:
        _compare(got, want, ["tokens"], "onnxruntime")

"""`rlx.frontends.onnx_ops`: the ops torch exports add, in two multi-output models, each compiled once
for the CPU and checked against the reference and onnxruntime (run-time inputs, so nothing folds)."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.frontends.onnx import from_onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx_helpers import _check, _const, _model, _vi  # noqa: E402

F, I64, BOOL, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL, TensorProto.INT32


def test_logic_arithmetic_and_layer_norm_outputs(rng: np.random.Generator) -> None:
    nodes = [
        _const("lo", -0.5), _const("hi", 0.75), _const("two", 2, np.int64),
        helper.make_node("And", ["p", "q"], ["and"]),
        helper.make_node("Or", ["p", "q"], ["or"]),
        helper.make_node("Xor", ["p", "q"], ["xor"]),
        helper.make_node("Not", ["p"], ["not"]),
        helper.make_node("IsNaN", ["x"], ["isnan"]),
        helper.make_node("IsInf", ["x"], ["isinf"]),
        helper.make_node("IsInf", ["x"], ["isneginf"], detect_positive=0),
        helper.make_node("Sign", ["x"], ["sign"]),
        helper.make_node("Max", ["x", "y", "row"], ["max"]),
        helper.make_node("Min", ["x", "y"], ["min"]),
        helper.make_node("Sum", ["x", "y", "row"], ["sum"]),
        helper.make_node("Mean", ["x", "y"], ["mean"]),
        helper.make_node("Clip", ["y", "lo", "hi"], ["clip"]),
        helper.make_node("Clip", ["y", "", "hi"], ["clip_hi"]),
        helper.make_node("Mod", ["xi", "yi"], ["mod"]),
        helper.make_node("Mod", ["xi", "yi"], ["fmod"], fmod=1),
        helper.make_node("Reciprocal", ["y"], ["recip"]),
        helper.make_node("LeakyRelu", ["y"], ["leaky"], alpha=0.2),
        helper.make_node("Softplus", ["y"], ["softplus"]),
        helper.make_node("LayerNormalization", ["y", "gamma", "beta"], ["ln", "ln_mean", "ln_inv"], epsilon=1e-3),
        helper.make_node("LayerNormalization", ["y", "gamma2"], ["ln_all"], axis=0),
        helper.make_node("CastLike", ["xi", "y"], ["castlike"]),
        helper.make_node("ReduceMax", ["p"], ["any"], keepdims=0),
    ]
    outs = [("and", BOOL), ("or", BOOL), ("xor", BOOL), ("not", BOOL), ("isnan", BOOL), ("isinf", BOOL),
            ("isneginf", BOOL), ("sign", F), ("max", F), ("min", F), ("sum", F), ("mean", F), ("clip", F),
            ("clip_hi", F), ("mod", I64), ("fmod", I64), ("recip", F), ("leaky", F), ("softplus", F), ("ln", F),
            ("ln_mean", F), ("ln_inv", F), ("ln_all", F), ("castlike", F), ("any", BOOL)]
    model = _model(nodes, [_vi("p", BOOL, [3, 4]), _vi("q", BOOL, [3, 4]), _vi("x", F, [3, 4]), _vi("y", F, [3, 4]),
                           _vi("row", F, [4]), _vi("xi", I64, [3, 4]), _vi("yi", I64, [3, 4])],
                   [_vi(n, t, None) for n, t in outs],
                   inits=[("gamma", rng.uniform(0.5, 1.5, 4).astype(np.float32)),
                          ("beta", rng.standard_normal(4).astype(np.float32)),
                          ("gamma2", rng.uniform(0.5, 1.5, (3, 4)).astype(np.float32))], opset=20)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    x[1, 0] = 0.0
    feeds = {"p": rng.random((3, 4)) < 0.5, "q": rng.random((3, 4)) < 0.5, "x": x,
             "y": rng.standard_normal((3, 4)).astype(np.float32) + 0.1,
             "row": rng.standard_normal(4).astype(np.float32),
             "xi": rng.integers(-9, 10, (3, 4)), "yi": rng.choice([-4, -3, 2, 5], (3, 4))}
    _check(model, [feeds])


def test_index_and_shape_ops(rng: np.random.Generator) -> None:
    c = lambda name, v: _const(name, v, np.int64)  # noqa: E731
    nodes = [
        c("ax1", 1), c("reps", [2, 1, 3]), c("k1", [1]), c("k2", [2]), c("k3", [3]), c("kneg", -1),
        c("gidx", [[[0, 2], [1, 0], [2, 2]], [[1, 1], [0, 0], [2, 1]]]),
        c("ndidx", [[1, 2], [0, -1]]), c("scidx", [[1], [0]]),
        helper.make_node("Flatten", ["x"], ["flat"], axis=2),
        helper.make_node("Flatten", ["x"], ["flat_neg"], axis=-1),
        helper.make_node("Tile", ["x", "reps"], ["tile"]),
        helper.make_node("Trilu", ["x"], ["triu"]),
        helper.make_node("Trilu", ["x", "kneg"], ["tril"], upper=0),
        helper.make_node("CumSum", ["x", "ax1"], ["cumsum"]),
        helper.make_node("CumSum", ["x", "ax1"], ["cumsum_rev_ex"], reverse=1, exclusive=1),
        helper.make_node("CumSum", ["xi", "ax1"], ["cumsum_int"]),
        helper.make_node("GatherElements", ["x", "gidx"], ["gather_el"], axis=2),
        helper.make_node("GatherElements", ["x", "ridx"], ["gather_el_rt"], axis=1),
        helper.make_node("GatherND", ["x", "ndidx"], ["gather_nd"]),
        helper.make_node("GatherND", ["x", "rndidx"], ["gather_nd_rt"]),
        helper.make_node("ScatterND", ["x", "scidx", "upd"], ["scatter_nd"]),
        helper.make_node("ArgMax", ["x"], ["argmax"], axis=1),
        helper.make_node("ArgMin", ["x"], ["argmin_last"], axis=2, keepdims=0, select_last_index=1),
        helper.make_node("ArgMax", ["xi"], ["argmax_int"], axis=2, keepdims=0),
        helper.make_node("TopK", ["x", "k1"], ["top_v", "top_i"], axis=-1),
        helper.make_node("TopK", ["x", "k3"], ["top3_v", "top3_i"], axis=-1),  # unrolled argmax steps
        helper.make_node("TopK", ["x", "k2"], ["low2_v", "low2_i"], axis=1, largest=0),
        helper.make_node("TopK", ["xi", "k2"], ["top2i_v", "top2i_i"]),
        helper.make_node("Gather", ["x", "negids"], ["gather_neg"], axis=1),
        helper.make_node("Dropout", ["x"], ["dropout"]),
    ]
    outs = [("flat", F), ("flat_neg", F), ("tile", F), ("triu", F), ("tril", F), ("cumsum", F),
            ("cumsum_rev_ex", F), ("cumsum_int", I64), ("gather_el", F), ("gather_el_rt", F), ("gather_nd", F),
            ("gather_nd_rt", F), ("scatter_nd", F), ("argmax", I64), ("argmin_last", I64), ("argmax_int", I64),
            ("top_v", F), ("top_i", I64), ("top3_v", F), ("top3_i", I64), ("low2_v", F), ("low2_i", I64),
            ("top2i_v", I64), ("top2i_i", I64), ("gather_neg", F), ("dropout", F)]
    model = _model(nodes, [_vi("x", F, [2, 3, 4]), _vi("xi", I64, [2, 3, 4]), _vi("ridx", I64, [2, 2, 4]),
                           _vi("rndidx", I64, [2, 2]), _vi("upd", F, [2, 3, 4]), _vi("negids", I64, [2])],
                   [_vi(n, t, None) for n, t in outs], opset=18)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x[1, 1, :2] = x[1, 1, 3]  # ties for ArgMin's select_last_index and TopK (the lower index first)
    x[0, 2, :] = [-np.inf, 1.0, -np.inf, -np.inf]  # TopK K=3 past the finite values: the lower -inf index first
    feeds = {"x": x, "xi": rng.integers(-5, 6, (2, 3, 4)), "ridx": rng.integers(-3, 3, (2, 2, 4)),
             "rndidx": np.array([[1, -1], [0, 2]]), "upd": rng.standard_normal((2, 3, 4)).astype(np.float32),
             "negids": np.array([-1, 1])}
    graph = _check(model, [feeds])
    kinds = {n.kind for n in graph.nodes}
    assert "gather" in kinds and "reduce" in kinds  # GatherElements / GatherND / CumSum ran as graph ops


def test_float_mod_equals_onnxruntime(rng: np.random.Generator) -> None:
    """Mod of floats at run time: fmod=1 is C's fmod (the dividend's sign), checked against onnxruntime; fmod=0
    (Mod-28's floor mod for floats, the divisor's sign; onnxruntime refuses it) against numpy's mod."""
    a = (rng.standard_normal((3, 8)) * 7).astype(np.float32)
    a[0, :4] = [0.0, -6.0, 6.0, -2.5]  # exact multiples and zeros: no sign fix-up
    b = np.array([2.5, -3.0, 3.0, -1.25, 0.7, -0.7, 4.0, -4.0], np.float32)
    c_mod = _model([helper.make_node("Mod", ["a", "b"], ["out"], fmod=1)], [_vi("a", F, [3, 8]), _vi("b", F, [8])],
                   [_vi("out", F, None)], opset=18)
    _check(c_mod, [{"a": a, "b": b}])
    floor_mod = _model([helper.make_node("Mod", ["a", "b"], ["out"])], [_vi("a", F, [3, 8]), _vi("b", F, [8])],
                       [_vi("out", F, None)], opset=onnx.defs.onnx_opset_version())
    graph, _ = from_onnx(floor_mod)
    got = rlx.Session(rlx.Device.CPU).compile(graph).run({"a": a, "b": b})[0]
    np.testing.assert_allclose(got, np.mod(a, b), rtol=1e-6, atol=1e-6)


def test_refusals_name_their_reason() -> None:
    x = _vi("x", F, [2, 80])
    cases = [
        ([_const("k", [65], np.int64), helper.make_node("TopK", ["x", "k"], ["out", "idx"])], "K=65 > 64.*no sort"),
        ([helper.make_node("Dropout", ["x", "", "t"], ["out"]), ], "training mode"),
    ]
    for nodes, pattern in cases:
        extra = [_const("t", True, np.bool_)] if "training" in pattern else []
        model = _model(extra + nodes, [x], [_vi("out", F, None)], opset=18)
        with pytest.raises(onnx_error(), match=pattern):
            from_onnx(model)


def onnx_error() -> type[Exception]:
    from rlx.errors import IRError

    return IRError


def test_integer_and_bool_dtypes_at_the_boundary(rng: np.random.Generator) -> None:
    """int8 / uint8 / int16 / int32 / int64 / bool graph inputs and outputs, computed on and cast to."""
    types = {"i8": (TensorProto.INT8, np.int8), "u8": (TensorProto.UINT8, np.uint8),
             "i16": (TensorProto.INT16, np.int16), "i32": (I32, np.int32), "i64": (I64, np.int64)}
    nodes = [helper.make_node("Abs", ["f"], ["f_abs"])]  # uint8's source: float -> uint8 of a negative is UB
    inputs, outs, feeds = [_vi("p", BOOL, [2, 3]), _vi("f", F, [2, 3])], [], {}
    feeds["p"] = rng.random((2, 3)) < 0.5
    feeds["f"] = rng.uniform(-60, 60, (2, 3)).astype(np.float32)
    for name, (onnx_type, np_type) in types.items():
        lo = 0 if name == "u8" else -50
        inputs += [_vi(f"a_{name}", onnx_type, [2, 3]), _vi(f"b_{name}", onnx_type, [2, 3])]
        feeds[f"a_{name}"] = rng.integers(lo, 50, (2, 3)).astype(np_type)
        feeds[f"b_{name}"] = rng.integers(lo, 50, (2, 3)).astype(np_type)
        nodes += [helper.make_node("Add", [f"a_{name}", f"b_{name}"], [f"add_{name}"]),
                  helper.make_node("Cast", [f"a_{name}"], [f"to_f32_{name}"], to=F),
                  helper.make_node("Cast", ["f" if name != "u8" else "f_abs"], [f"from_f32_{name}"], to=onnx_type),
                  helper.make_node("Greater", [f"a_{name}", f"b_{name}"], [f"gt_{name}"])]
        outs += [(f"add_{name}", onnx_type), (f"to_f32_{name}", F), (f"from_f32_{name}", onnx_type),
                 (f"gt_{name}", BOOL)]
    nodes += [helper.make_node("Not", ["p"], ["not_p"]), helper.make_node("Where", ["p", "a_i8", "b_i8"], ["where_i8"])]
    outs += [("not_p", BOOL), ("where_i8", TensorProto.INT8)]
    model = _model(nodes, inputs, [_vi(n, t, None) for n, t in outs], opset=17)
    _check(model, [feeds])


def test_unsigned_dtypes_compute_unsigned(rng: np.random.Generator) -> None:
    """uint16 / uint32 / uint64: arithmetic wraps, division and comparison are unsigned (values above the
    signed range), casts to and from float, sums; compiled for the CPU against the reference and numpy."""
    types = {"u16": (TensorProto.UINT16, np.uint16), "u32": (TensorProto.UINT32, np.uint32),
             "u64": (TensorProto.UINT64, np.uint64)}
    nodes = [helper.make_node("Abs", ["f"], ["f_abs"])]  # a float -> unsigned cast of a negative value is UB
    inputs, outs, feeds = [_vi("f", F, [2, 3])], [], {"f": rng.uniform(-60, 60, (2, 3)).astype(np.float32)}
    for name, (onnx_type, np_type) in types.items():
        top = np.iinfo(np_type).max
        a = rng.integers(0, 50, (2, 3)).astype(np_type)
        a[0] = [top, top - 7, top // 2 + 3]  # above the signed range of the same width
        b = rng.integers(1, 50, (2, 3)).astype(np_type)
        b[1, 0] = top  # a / top is 0 or 1, never -a
        feeds[f"a_{name}"], feeds[f"b_{name}"] = a, b
        inputs += [_vi(f"a_{name}", onnx_type, [2, 3]), _vi(f"b_{name}", onnx_type, [2, 3])]
        for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Greater", "Equal"):
            nodes.append(helper.make_node(op, [f"a_{name}", f"b_{name}"], [f"{op.lower()}_{name}"]))
            outs.append((f"{op.lower()}_{name}", BOOL if op in ("Greater", "Equal") else onnx_type))
        nodes += [helper.make_node("Cast", [f"a_{name}"], [f"to_f64_{name}"], to=TensorProto.DOUBLE),
                  helper.make_node("Cast", ["f_abs"], [f"from_f32_{name}"], to=onnx_type),
                  helper.make_node("ReduceSum", [f"a_{name}"], [f"sum_{name}"], keepdims=0),
                  helper.make_node("ReduceMax", [f"a_{name}"], [f"rmax_{name}"], keepdims=0)]
        outs += [(f"to_f64_{name}", TensorProto.DOUBLE), (f"from_f32_{name}", onnx_type), (f"sum_{name}", onnx_type),
                 (f"rmax_{name}", onnx_type)]
    model = _model(nodes, inputs, [_vi(n, t, None) for n, t in outs], opset=18)
    graph, params = from_onnx(model)
    compiled = rlx.Session(rlx.Device.CPU).compile(graph)
    got, ref = compiled.run(feeds), reference.run(graph, feeds, params)
    with np.errstate(over="ignore"):
        want = {}
        for name, (_, np_type) in types.items():
            a, b = feeds[f"a_{name}"], feeds[f"b_{name}"]
            want |= {f"add_{name}": a + b, f"sub_{name}": a - b, f"mul_{name}": a * b, f"div_{name}": a // b,
                     f"max_{name}": np.maximum(a, b), f"min_{name}": np.minimum(a, b), f"greater_{name}": a > b,
                     f"equal_{name}": a == b, f"to_f64_{name}": a.astype(np.float64),
                     f"from_f32_{name}": np.abs(feeds["f"]).astype(np_type),
                     f"sum_{name}": np.sum(a, axis=None, dtype=np_type), f"rmax_{name}": a.max()}
    for (out, _), g, r in zip(outs, got, ref):
        assert g.dtype == want[out].dtype and r.dtype == want[out].dtype, out
        np.testing.assert_array_equal(g, want[out], err_msg=out)
        np.testing.assert_array_equal(r, want[out], err_msg=out)


def test_float8_and_int4_casts_saturating_or_not(rng: np.random.Generator) -> None:
    """ONNX Cast/CastLike to float8 (saturate=1 and 0), float4 and int4 and back, compiled for the CPU: equal to
    the reference bit for bit (the reference's casts are checked against ONNX's own expected outputs in the
    node suite; onnxruntime's Python API returns no float8 arrays)."""
    import ml_dtypes

    f8 = {TensorProto.FLOAT8E4M3FN: "e4m3fn", TensorProto.FLOAT8E4M3FNUZ: "e4m3fnuz",
          TensorProto.FLOAT8E5M2: "e5m2", TensorProto.FLOAT8E5M2FNUZ: "e5m2fnuz"}
    nodes, outs = [], []
    for onnx_type, name in f8.items():
        for sat in (1, 0):
            nodes.append(helper.make_node("Cast", ["x"], [f"{name}_{sat}"], to=onnx_type, saturate=sat))
            outs.append((f"{name}_{sat}", onnx_type))
        nodes.append(helper.make_node("Cast", [f"{name}_0"], [f"{name}_back"], to=F))
        outs.append((f"{name}_back", F))
    nodes += [helper.make_node("Cast", ["x"], ["f4"], to=TensorProto.FLOAT4E2M1),
              helper.make_node("Cast", ["i"], ["i4"], to=TensorProto.INT4),
              helper.make_node("CastLike", ["i4", "x"], ["i4_back"])]
    outs += [("f4", TensorProto.FLOAT4E2M1), ("i4", TensorProto.INT4), ("i4_back", F)]
    model = _model(nodes, [_vi("x", F, [64]), _vi("i", I32, [64])], [_vi(n, t, None) for n, t in outs], opset=23)
    x = np.concatenate([[np.nan, np.inf, -np.inf, 464, 465, -1000, 248, 247, 61440, 61439, -70000, 0.0, -0.0],
                        rng.standard_normal(51) * 10.0 ** rng.integers(-4, 5, 51)]).astype(np.float32)
    feeds = {"x": x, "i": rng.integers(-20, 20, 64).astype(np.int32)}
    graph, params = from_onnx(model)
    got = rlx.Session(rlx.Device.CPU).compile(graph).run(feeds)
    ref = reference.run(graph, feeds, params)
    for k, (out, _) in enumerate(outs):
        g, r = got[k], ref[k]
        assert g.dtype == r.dtype, out
        np.testing.assert_array_equal(g.view(np.uint8) if g.itemsize == 1 else g, r.view(np.uint8) if
                                      r.itemsize == 1 else r, err_msg=out)
    assert ref[0].dtype == ml_dtypes.float8_e4m3fn and np.isnan(ref[1].astype(np.float32)[4])  # 465 > 464: NaN
    for k, (out, _) in enumerate(outs):  # saturate=0 is ml_dtypes' plain conversion (ONNX's reference's)
        if out.endswith("_0"):
            plain = x.astype(ref[k].dtype).astype(np.float64)
            np.testing.assert_array_equal(ref[k].astype(np.float64), plain, err_msg=out)


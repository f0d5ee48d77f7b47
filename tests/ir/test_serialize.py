"""JSON round trips of graphs, and hostile documents that must raise IRError."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir import serialize
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim, Shape
from tests.ir.user_ops import swish_beta

SEQ = Dim.dynamic("seq", max=32)
BATCH = Dim.dynamic("batch", max=4)


def assert_same(a: Graph, b: Graph) -> None:
    assert type(a) is type(b)
    assert a.name == b.name
    assert a.nodes == b.nodes  # ids, ops (attributes, constant bytes), inputs, shapes, names
    assert a.outputs == b.outputs and a.output_names == b.output_names
    assert str(a) == str(b)


def round_trip(g: Graph) -> Graph:
    text = g.to_json()
    back = Graph.from_json(text)
    assert_same(g, back)
    assert back.to_json() == text  # the encoding is canonical: writing again gives the same text
    return back


def every_op_graph() -> Graph:
    """One graph that uses every MIR op kind, with dynamic dims, several dtypes and odd names."""
    g = Graph("every-op \"quoted\" ünïcode")
    x = g.input("x", [BATCH, SEQ, 16])
    ids = g.input("ids", [BATCH, SEQ], "i32")
    pad = g.input("pad", [BATCH, SEQ], "bool")
    w = g.param("w", [16, 16])
    wt = g.add(O.Param("wt", Shape.of([16, 16]), layout=(1, 0)), name="wt")
    gamma = g.param("gamma", [16])
    beta = g.param("beta", [16])
    table = g.param("table", [50, 16])
    cos = g.input("cos", [SEQ, 2])
    sin = g.input("sin", [SEQ, 2])
    half = g.constant(np.float32(0.5))
    bf = g.constant(np.array([1.0, -2.5, 3.25], np.float32), "bf16")
    g.constant(np.arange(6, dtype=np.int64).reshape(2, 3))
    emb = g.gather(table, ids)
    h = g.add_(x, emb)
    h = g.activation("gelu", g.mul(h, half))
    m = g.matmul(h, w)
    sc = g.where(g.compare("gt", m, half), m, h)
    ln = g.layer_norm(sc, gamma, beta, eps=1e-12)
    rn = g.rms_norm(ln, gamma, eps=3e-7)
    att = g.attention(rn, rn, rn, num_heads=4, head_dim=4, mask="padding", mask_input=pad, scale=0.3)
    gq = g.attention(att, g.narrow(att, 2, 0, 8), g.narrow(att, 2, 8, 8), num_heads=4, head_dim=4,
                     mask="causal", num_kv_heads=2)
    ro = g.rope(gq, cos, sin, head_dim=4, variant="interleaved")
    flat = g.reshape(ro, [BATCH * SEQ, -1])
    tr = g.transpose(g.reshape(flat, [BATCH, SEQ, 4, 4]), [0, 2, 1, 3])
    red = g.reduce("mean", tr, [-1], keep_dim=True)
    sm = g.softmax(red, axis=1)
    g.argmax(sm, axis=0)
    g.sample_top_k(g.reshape(sm, [BATCH, -1]), g.input("u", [BATCH], "f64"), g.input("knobs", [3], "f64"))
    ex = g.expand(g.reduce("max", sm, [1, 3]), [3, BATCH, SEQ])
    cat = g.concat([bf, g.cast(g.reduce("sum", ex, [1, 2]), "bf16")], axis=0)
    f1 = g.add(O.FusedMatMulBiasAct("silu"), [x, wt, gamma], name="fused \u2603")
    f2 = g.add(O.FusedResidualLayerNorm(2e-5), [f1, x, gamma, gamma, beta])
    f3 = g.add(O.FusedResidualRmsNorm(), [f2, x, gamma])
    f4 = g.add(O.FusedSwiGLU(), [f3, w, wt])
    region = O.ElementwiseRegion((
        O.RegionStep(O.Binary("sub"), (0, 1)),
        O.RegionStep(O.Compare("lt"), (2, 1)),
        O.RegionStep(O.Where(), (3, 2, 0)),
        O.RegionStep(O.Activation("tanh"), (4,)),
        O.RegionStep(O.Cast(O.DType.F16), (5,)),
    ))
    reg = g.add(region, [f4, x], name="region")
    q4 = g.param("q4", [3, 20], "u8")  # three q4_1 rows of 32 values
    g.dequant_matmul(g.input("qx", [SEQ, 32]), q4, quant="q4_1")
    g.int8_matmul(x, g.param("w8", [16, 5]), g.param("b8", [5]), activation="gelu")
    g.dequantize(g.gather(g.param("q8", [7, 34], "u8"), ids), quant="q8_0")
    moe_x = g.input("moe_x", [SEQ, 32])
    moe_ids, _ = g.moe_router(g.input("router_logits", [SEQ, 6]), top_k=2, normalize=True)
    g.moe_matmul(moe_x, moe_ids, g.param("experts_q", [6, 3, 34], "u8"), quant="q8_0")
    kc, vc = g.state("k_cache", [4, 40, 8]), g.state("v_cache", [4, 40, 8])
    g.cached_attention(ro, g.narrow(ro, 2, 0, 8), g.narrow(ro, 2, 8, 8), kc, vc,
                       g.input("positions", [BATCH], "i32"), num_heads=4, head_dim=4, num_kv_heads=2, scale=0.5)
    pk, pv = g.state("k_pages", [6, 8, 8]), g.state("v_pages", [6, 8, 8])
    g.cached_attention(ro, g.narrow(ro, 2, 0, 8), g.narrow(ro, 2, 8, 8), pk, pv,
                       g.input("paged_positions", [BATCH], "i32"), num_heads=4, head_dim=4, num_kv_heads=2,
                       block_table=g.input("block_table", [BATCH, 5], "i32"), page_size=8)
    h4 = g.reshape(x, [BATCH, SEQ, 4, 4])
    s4 = g.reduce("mean", h4, [-1])
    gdn = g.gated_delta_net(h4, h4, h4, s4, s4, scale=0.25)
    conv = g.depthwise_conv1d_causal(x, g.param("cw", [16, 4]))
    ssm = g.selective_scan(conv, conv, g.param("A", [16, 8]), g.narrow(x, 2, 0, 8), g.narrow(x, 2, 8, 8))
    # the carried forms (a recurrent cache): conv state and scan state inputs updated in place
    conv_c = g.depthwise_conv1d_causal(x, g.param("cw_c", [16, 4]), g.input("conv_pad", [BATCH, 3, 16]),
                                       lengths=g.input("conv_lengths", [BATCH], "i32"))
    g.selective_scan(conv_c, conv_c, g.param("A_c", [16, 8]), g.narrow(x, 2, 0, 8), g.narrow(x, 2, 8, 8),
                     state=g.input("ssm_state", [BATCH, 16, 8]))
    body = Graph("step")
    bc, bx = body.input("c", [16]), body.input("x", [16])
    body.set_outputs([body.activation("tanh", body.add_(bc, bx))])
    row = g.reduce("mean", g.reshape(x, [BATCH * SEQ, 16]), [0])
    scan = g.scan(body, row, xs=[g.reshape(x, [BATCH * SEQ, 16])], save_trajectory=True, reverse=True)
    sq = Graph("sq")
    sx = sq.input("x", [16])
    sq.set_outputs([sq.mul(sx, sx)])
    vj = Graph("sq_vjp")
    vx, _, vd = vj.input("x", [16]), vj.input("primal_output", [16]), vj.input("d_output", [16])
    vj.set_outputs([vj.mul(vj.mul(vx, vd), vj.constant(np.float32(2)))])
    jv = Graph("sq_jvp")
    jx, jt = jv.input("x", [16]), jv.input("tangent_0", [16])
    jv.set_outputs([jv.mul(jv.mul(jx, jt), jv.constant(np.float32(2)))])
    cfn = g.custom_fn([row], sq, vjp=vj, jvp=jv)
    pred = Graph("positive")
    pred.set_outputs([pred.compare("gt", pred.reduce("sum", pred.input("x", [16])), pred.constant(np.float32(0)))])
    neg = Graph("neg")
    neg.set_outputs([neg.activation("neg", neg.input("x", [16]))])
    cfn = g.cond(g.reshape(g.compare("lt", g.reduce("max", row), g.constant(np.float32(1))), [1]), sq, neg, [cfn])
    cfn = g.while_loop(pred, sq, cfn, max_trips=3)
    user = g.user_op(swish_beta().name, [row, g.constant(np.float32(1.5))])
    g.lora_matmul(x, g.param("lora_a", [2, 3, 16]), g.param("lora_b", [2, 5, 3]), g.param("lora_s", [2]),
                  g.input("lora_index", [BATCH], "i32"))
    img = g.input("img", [BATCH, 2, 5, 5])
    conv = g.conv(img, g.param("kw", [4, 1, 3, 3]), g.param("kb", [4]), strides=(2, 1), pads=(1, 1, 1, 1), groups=2,
                  activation="relu")
    pooled = g.pool("avg", g.batch_norm(conv, *(g.param(f"bn{n}", [4]) for n in "sbmv"), eps=1e-3), (2, 2),
                    ceil_mode=True, count_include_pad=True)
    g.iota(SEQ * 2, 0.5, -0.25, "f32")
    last = g.state("last_tokens", [4], "i32")
    fed = g.token_feed(g.input("fed", [BATCH, 1], "i32"), g.input("token_src", [BATCH], "i32"), last)
    g.token_store(g.reshape(fed, [BATCH]), g.input("token_dst", [BATCH], "i32"), last)
    ar = g.add(O.AllReduce(world=2, reduce="max"), [cat])
    g.add(O.ReduceScatter(world=2, axis=-1), [g.add(O.AllGather(world=3, axis=-1), [g.reshape(ar, [1, 6])])])
    g.set_outputs({"cat": cat, "region": reg, "m": m, "m again": m, "gdn": gdn, "ssm": ssm, "scan": scan,
                   "cfn": cfn, "user": user, "pooled": pooled})
    return g


def test_every_op_round_trips() -> None:
    g = every_op_graph()
    assert {n.kind for n in g.nodes} == set(O.OPS)  # the fixture really covers the op set
    round_trip(g)


def test_document_layout() -> None:
    g = Graph("doc")
    x = g.input("x", [SEQ, 2])
    g.set_outputs([g.activation("relu", x)])
    text = g.to_json()
    doc = json.loads(text)
    assert doc["format"] == "rlx-graph" and doc["version"] == 1 and doc["stage"] == "mir"
    assert doc["name"] == "doc" and doc["outputs"] == [1] and doc["output_names"] == ["out0"]
    assert doc["nodes"][1] == {"id": 1, "op": {"op": "activation", "fn": "relu"}, "inputs": [0], "name": "",
                               "shape": {"dtype": "f32", "dims": [{"coeff": 1, "symbols": [["seq", 32]]}, 2]}}
    assert text.count("\n") == len(g.nodes) + 2  # one node per line
    assert "NaN" not in text


def test_non_finite_and_odd_floats_round_trip() -> None:
    g = Graph("floats")
    x = g.input("x", [1, 2, 8])
    gm = g.param("g", [8])
    y = g.rms_norm(x, gm, eps=5e-324)  # the smallest subnormal survives the trip exactly
    z = g.attention(y, y, y, num_heads=2, head_dim=4, scale=-0.1 + 0.30000000000000004)
    c = g.constant(np.array([np.nan, np.inf, -np.inf, -0.0], np.float32))
    g.set_outputs([z, c])
    back = round_trip(g)
    assert back.node(y).op.eps == 5e-324
    data = back.node(c).op.array()
    assert np.isnan(data[0]) and data[1] == np.inf and data[2] == -np.inf and np.signbit(data[3])


def test_hostile_names_are_plain_data() -> None:
    g = Graph("*/ #include <x> \"; \\ \n\t\x00")
    x = g.input("x\"); system(\"rm -rf /\"); //", [2])
    y = g.add(O.Activation("relu"), [x], name="\ud800 lone surrogate, \U0001f600 and \u2028")
    g.set_outputs({"out \"1\"": y})
    text = g.to_json()
    assert text.isascii()  # everything outside ASCII is escaped
    round_trip(g)


def test_save_and_load(tmp_path) -> None:
    g = every_op_graph()
    path = tmp_path / "g.rlx.json"
    g.save(path)
    assert_same(g, Graph.load(path))
    assert_same(g, Graph.load(str(path)))
    assert [p.name for p in tmp_path.iterdir()] == ["g.rlx.json"]  # no temp file left behind
    g2 = Graph("other")
    g2.set_outputs([g2.input("y", [1])])
    g2.save(path)  # overwrites atomically
    assert_same(g2, Graph.load(path))


def test_load_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        Graph.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(IRError, match=r"bad\.json: graph document is not valid UTF-8"):
        Graph.load(bad)
    big = tmp_path / "big.json"
    big.write_text(" " * 100 + "{}")
    with pytest.raises(IRError, match="102 bytes, over the limit of 64"):
        serialize.load(big, max_bytes=64)  # refused from its size, before reading


def test_save_refuses_unloadable_graphs(tmp_path) -> None:
    g = Graph("no outputs")
    g.input("x", [2])
    with pytest.raises(IRError, match="no outputs"):
        g.to_json()
    long = Graph("n" * (serialize.MAX_NAME_CHARS + 1))
    long.set_outputs([long.input("x", [2])])
    with pytest.raises(IRError, match="graph name is 1025 characters long"):
        long.to_json()
    with pytest.raises(IRError):
        long.save(tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []


# ── HIR ─────────────────────────────────────────────────────────────────

_LOCAL_BLOCKS: dict[str, type[O.Op]] = {}


@dataclass(frozen=True)
class _Double(O.Op):
    """A stand-in HIR block (registered in its own registry, like real blocks)."""

    registry: ClassVar[dict[str, type[O.Op]]] = _LOCAL_BLOCKS
    kind: ClassVar[str] = "test.double"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    factor: int = 2

    def infer(self, inputs: list[Shape]) -> Shape:
        return inputs[0]


class _LocalHir(Graph):
    stage = "hir"
    op_registry: ClassVar[dict[str, type[O.Op]]] = {**O.OPS, **_LOCAL_BLOCKS}


def test_local_hir_subclass_round_trips() -> None:
    h = _LocalHir("hir")
    x = h.input("x", [2])
    h.set_outputs([h.add(_Double(3), [h.activation("relu", x)])])
    text = h.to_json()
    assert json.loads(text)["stage"] == "hir"
    back = _LocalHir.from_json(text)
    assert_same(h, back)
    # A MIR graph refuses the block, and the HIR class refuses a MIR document.
    with pytest.raises(IRError, match=r"unknown op 'test\.double'"):
        Graph.from_json(text.replace('"stage": "hir"', '"stage": "mir"'))
    mir = Graph("m")
    mir.set_outputs([mir.input("x", [1])])
    with pytest.raises(IRError, match="holds a mir graph but _LocalHir"):
        _LocalHir.from_json(mir.to_json())


def test_hir_module_round_trips() -> None:
    hir = pytest.importorskip("rlx.ir.hir")
    h = hir.HirModule("block")
    x = h.input("x", [BATCH, SEQ, 8])
    w = h.param("w", [16, 8])
    y = h.linear(x, w, activation="gelu", transpose_weight=True, name="proj")
    h.set_outputs([h.activation("relu", y)])
    text = h.to_json()
    for loaded in (Graph.from_json(text), hir.HirModule.from_json(text)):  # the stage picks the class
        assert_same(h, loaded)
        assert isinstance(loaded, hir.HirModule)
    mir = h.lower_to_mir()
    assert type(Graph.from_json(mir.to_json())) is Graph
    with pytest.raises(IRError, match="holds a mir graph"):
        hir.HirModule.from_json(mir.to_json())


# ── property: random valid graphs round-trip exactly ────────────────────

FLOAT_DTYPES = ("f32", "f16", "bf16", "f64")
_names = st.text(max_size=12)
_dims = st.sampled_from([Dim(1), Dim(2), Dim(3), Dim(4), SEQ, BATCH])


def _pick(draw: Any, g: Graph, pred: Callable[[Shape], bool] = lambda s: True) -> int:
    candidates = [n.id for n in g.nodes if pred(n.shape)]
    if not candidates:
        raise IRError("no candidate")
    return draw(st.sampled_from(candidates))


def _is_float(s: Shape) -> bool:
    return s.dtype.is_float


def _param_like(g: Graph, dims: tuple, dtype: str) -> int:
    return g.param(f"p{len(g.nodes)}", list(dims), dtype)


def _mk_unary(draw: Any, g: Graph) -> None:
    x = _pick(draw, g, _is_float)
    g.add(O.Activation(draw(st.sampled_from(O.ACTIVATIONS))), [x], name=draw(_names))


def _mk_binary(draw: Any, g: Graph) -> None:
    a = _pick(draw, g, lambda s: s.dtype.value != "bool")
    dtype = g.shape(a).dtype
    b = _pick(draw, g, lambda s: s.dtype == dtype)
    kind = draw(st.sampled_from(["binary", "compare"]))
    op = O.Binary(draw(st.sampled_from(O.BINARY_OPS))) if kind == "binary" else \
        O.Compare(draw(st.sampled_from(O.COMPARE_OPS)))
    g.add(op, [a, b])


def _mk_where(draw: Any, g: Graph) -> None:
    a = _pick(draw, g, _is_float)
    cond = g.compare("lt", a, a)
    g.where(cond, a, a)


def _mk_cast(draw: Any, g: Graph) -> None:
    g.cast(_pick(draw, g), draw(st.sampled_from(list(O.DType))))


def _mk_matmul(draw: Any, g: Graph) -> None:
    a = _pick(draw, g, lambda s: s.dtype.is_float and s.rank >= 2)
    sa = g.shape(a)
    w = _param_like(g, (sa.dims[-1], draw(st.integers(1, 5))), sa.dtype.value)
    kind = draw(st.sampled_from(["matmul", "fused", "fused_bias", "swiglu"]))
    if kind == "matmul":
        g.matmul(a, w)
    elif kind == "fused":
        g.add(O.FusedMatMulBiasAct(draw(st.none() | st.sampled_from(O.ACTIVATIONS))), [a, w])
    elif kind == "fused_bias":
        bias = _param_like(g, (g.shape(w).dims[1],), sa.dtype.value)
        g.add(O.FusedMatMulBiasAct(draw(st.none() | st.sampled_from(O.ACTIVATIONS))), [a, w, bias])
    else:
        w2 = _param_like(g, g.shape(w).dims, sa.dtype.value)
        g.add(O.FusedSwiGLU(), [a, w, w2])


def _mk_reduce(draw: Any, g: Graph) -> None:
    x = _pick(draw, g, lambda s: s.dtype.value != "bool")
    rank = g.shape(x).rank
    axes = draw(st.lists(st.integers(-rank, rank - 1), max_size=rank, unique_by=lambda a: a % rank)) if rank else []
    g.reduce(draw(st.sampled_from(O.REDUCE_OPS)), x, axes, draw(st.booleans()))


def _mk_softmax(draw: Any, g: Graph) -> None:
    x = _pick(draw, g, lambda s: s.dtype.is_float and s.rank >= 1)
    axis = draw(st.integers(-g.shape(x).rank, g.shape(x).rank - 1))
    if draw(st.booleans()) and g.shape(x).dims[axis].max > 0:
        g.argmax(x, axis)
    else:
        g.softmax(x, axis)


def _mk_sample(draw: Any, g: Graph) -> None:
    x = _pick(draw, g, lambda s: s.dtype.is_float and s.rank == 2 and s.dims[1].max > 0)
    rows = g.shape(x).dims[0]
    g.sample_top_k(x, g.input(f"u{len(g.nodes)}", [rows], "f64"), g.input(f"s{len(g.nodes)}", [3], "f64"))


def _mk_feedback(draw: Any, g: Graph) -> None:
    """token_feed of an i32 [rows, seq] value, then token_store of its first column, through one token state."""
    x = _pick(draw, g, lambda s: s.dtype.value == "i32" and s.rank == 2)
    rows = g.shape(x).dims[0]
    last = g.state(f"last{len(g.nodes)}", [draw(st.integers(1, 5))], "i32")
    fed = g.token_feed(x, g.input(f"src{len(g.nodes)}", [rows], "i32"), last)
    if draw(st.booleans()):
        first = g.reshape(g.narrow(fed, 1, 0, 1), [rows])
        g.token_store(first, g.input(f"dst{len(g.nodes)}", [rows], "i32"), last)


def _mk_norm(draw: Any, g: Graph) -> None:
    x = _pick(draw, g, lambda s: s.dtype.is_float and s.rank >= 1)
    s = g.shape(x)
    gm = _param_like(g, (s.dims[-1],), s.dtype.value)
    eps = draw(st.floats(0, 1, allow_nan=False, allow_infinity=False))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        g.layer_norm(x, gm, gm, eps)
    elif kind == 1:
        g.rms_norm(x, gm, eps)
    elif kind == 2:
        g.add(O.FusedResidualLayerNorm(eps), [x, x, gm, gm] + ([gm] if draw(st.booleans()) else []))
    else:
        g.add(O.FusedResidualRmsNorm(eps), [x, x, gm] + ([gm] if draw(st.booleans()) else []))


def _mk_shape_op(draw: Any, g: Graph) -> None:
    x = _pick(draw, g, lambda s: s.rank >= 1)
    s = g.shape(x)
    kind = draw(st.integers(0, 5))
    if kind == 0:
        g.reshape(x, [-1])
    elif kind == 1:
        g.reshape(x, [1, *s.dims, 1])
    elif kind == 2:
        g.transpose(x, draw(st.permutations(range(s.rank))))
    elif kind == 3:
        axes = [i for i, d in enumerate(s.dims) if d.is_static and d.value >= 1]
        if not axes:
            raise IRError("no static axis")
        axis = draw(st.sampled_from(axes))
        start = draw(st.integers(0, s.dims[axis].value - 1))
        g.narrow(x, axis, start, draw(st.integers(0, s.dims[axis].value - start)))
    elif kind == 4:
        axes = [i for i, d in enumerate(s.dims) if d.is_static]
        if not axes:
            raise IRError("no static axis")
        g.concat([x] * draw(st.integers(1, 3)), draw(st.sampled_from(axes)))
    else:
        g.expand(x, [draw(_dims), *(d if d != 1 else draw(_dims) for d in s.dims)])


def _mk_gather(draw: Any, g: Graph) -> None:
    table = _param_like(g, (draw(st.integers(1, 9)), draw(st.integers(1, 4))), draw(st.sampled_from(FLOAT_DTYPES)))
    idx = _pick(draw, g, lambda s: s.dtype.value in ("i32", "i64"))
    g.gather(table, idx, draw(st.sampled_from([0, 1, -1])))


def _mk_constant(draw: Any, g: Graph) -> None:
    if draw(st.booleans()):  # an iota: a leaf-like value with a dim (maybe dynamic) for its length
        g.iota(draw(_dims), draw(st.integers(-3, 3)), draw(st.sampled_from([1, 2, -1])),
               draw(st.sampled_from(["i64", "i32"])))
        return
    dtype = draw(st.sampled_from(list(O.DType)))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    n = int(np.prod(shape)) if shape else 1
    raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    g.add(O.Constant(raw, Shape.of(shape, dtype)), name=draw(_names))


def _mk_attention(draw: Any, g: Graph) -> None:
    heads, kv = draw(st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2)]))
    d = draw(st.sampled_from([1, 2, 4]))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    sq, skv = draw(_dims), draw(_dims)
    q = g.input(f"q{len(g.nodes)}", [2, sq, heads * d], dtype)
    k = g.input(f"k{len(g.nodes)}", [2, skv, kv * d], dtype)
    mask = draw(st.sampled_from(O.MASK_KINDS))
    ins = [q, k, k]
    if mask == "padding":
        ins.append(g.input(f"m{len(g.nodes)}", [2, skv], draw(st.sampled_from(["bool", "i32", dtype]))))
    elif mask == "bias":
        ins.append(g.input(f"b{len(g.nodes)}", [sq, skv], dtype))
    scale = draw(st.none() | st.floats(-4, 4, allow_nan=False))
    g.add(O.Attention(heads, d, mask, scale, kv if kv != heads or draw(st.booleans()) else None), ins)


def _mk_rope(draw: Any, g: Graph) -> None:
    hd = draw(st.sampled_from([2, 4, 8]))
    n_rot = draw(st.none() | st.sampled_from([r for r in (2, 4, 8) if r <= hd]))
    rot = n_rot or hd
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    s = draw(_dims)
    x = g.input(f"r{len(g.nodes)}", [1, s, hd * draw(st.integers(1, 3))], dtype)
    c = g.input(f"c{len(g.nodes)}", [s, rot // 2], dtype)
    g.rope(x, c, c, head_dim=hd, n_rot=n_rot, variant=draw(st.sampled_from(O.ROPE_VARIANTS)))


def _mk_cached_attention(draw: Any, g: Graph) -> None:
    d, kv = draw(st.sampled_from([2, 4])), draw(st.sampled_from([1, 2]))
    heads = kv * draw(st.sampled_from([1, 2]))
    b, s = draw(_dims), draw(_dims)
    n = len(g.nodes)
    q = g.input(f"aq{n}", [b, s, heads * d])
    k, v = g.input(f"ak{n}", [b, s, kv * d]), g.input(f"av{n}", [b, s, kv * d])
    caches = [g.state(f"{which}{n}", [b.max, s.max + draw(st.integers(0, 8)), kv * d]) for which in ("kc", "vc")]
    g.cached_attention(q, k, v, caches[0], caches[0] if draw(st.booleans()) else caches[1],
                       g.input(f"ap{n}", [b], "i32"), num_heads=heads, head_dim=d, num_kv_heads=kv,
                       scale=draw(st.none() | st.floats(0.1, 2)))


def _mk_quant(draw: Any, g: Graph) -> None:
    from rlx.ir.quant import QUANT_FORMATS, row_bytes

    fmt = draw(st.sampled_from(sorted(QUANT_FORMATS)))
    k = QUANT_FORMATS[fmt].block_size * draw(st.integers(1, 2))
    w = g.param(f"q{len(g.nodes)}", [draw(st.integers(1, 5)), row_bytes(fmt, k)], "u8")
    if draw(st.booleans()):
        act = draw(st.sampled_from(["f32", "q8"])) if fmt in ("q8_0", "q4_0", "q4_1") else "f32"
        g.dequant_matmul(g.input(f"qx{len(g.nodes)}", [draw(_dims), k]), w, quant=fmt, act=act)
    else:
        g.dequantize(w, quant=fmt)


def _mk_moe(draw: Any, g: Graph) -> None:
    tag, experts, t = len(g.nodes), draw(st.integers(1, 6)), draw(_dims)
    ids, _ = g.moe_router(g.input(f"ml{tag}", [t, experts]), top_k=draw(st.integers(1, experts)),
                          normalize=draw(st.booleans()))
    quant = draw(st.none() | st.sampled_from(["q8_0", "q4_k"]))
    k = 256 if quant else draw(st.integers(1, 9))
    x = g.input(f"mx{tag}", [t, k] if draw(st.booleans()) else [t, g.shape(ids).dims[1], k])
    rows = k if quant is None else k // 256 * {"q8_0": 272, "q4_k": 144}[quant]
    w = g.param(f"mw{tag}", [experts, draw(st.integers(1, 5)), rows],
                "u8" if quant else draw(st.sampled_from(["f32", "f16", "bf16"])))
    g.moe_matmul(x, ids, w, quant=quant)


def _mk_int8(draw: Any, g: Graph) -> None:
    k, n = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    bias = [g.param(f"b{len(g.nodes)}", [n])] if draw(st.booleans()) else []
    g.int8_matmul(g.input(f"ix{len(g.nodes)}", [draw(_dims), k]), g.param(f"w{len(g.nodes)}", [k, n]), *bias,
                  activation=draw(st.sampled_from([None, "gelu", "relu"])))


def _mk_region(draw: Any, g: Graph) -> None:
    a = _pick(draw, g, _is_float)
    dtype = g.shape(a).dtype
    b = _pick(draw, g, lambda s: s.dtype == dtype)
    steps = [O.RegionStep(O.Binary(draw(st.sampled_from(O.BINARY_OPS))), (0, 1))]
    for _ in range(draw(st.integers(0, 3))):
        last = len(steps) + 1
        steps.append(O.RegionStep(O.Activation(draw(st.sampled_from(O.ACTIVATIONS))), (last,)))
    g.add(O.ElementwiseRegion(tuple(steps)), [a, b])


def _mk_ssm(draw: Any, g: Graph) -> None:
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    s, n, h = draw(_dims), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    tag = len(g.nodes)
    kind = draw(st.integers(0, 2))
    if kind == 0:
        x, bc = g.input(f"sx{tag}", [2, s, h], dtype), g.input(f"sb{tag}", [2, s, n], dtype)
        g.selective_scan(x, x, g.input(f"sa{tag}", [h, n], dtype), bc, bc)
    elif kind == 1:
        q, gb = g.input(f"gq{tag}", [1, s, h, n], dtype), g.input(f"gg{tag}", [1, s, h], dtype)
        state = g.input(f"gs{tag}", [1, h, n, n], dtype) if draw(st.booleans()) else None
        g.gated_delta_net(q, q, q, gb, gb, state=state, scale=draw(st.none() | st.floats(0.1, 2)))
    else:
        x = g.input(f"cx{tag}", [2, s, h], dtype)
        pad = g.input(f"cp{tag}", [2, n - 1, h], dtype) if draw(st.booleans()) else None
        g.depthwise_conv1d_causal(x, g.input(f"cw{tag}", [h, n], dtype), pad)


def _mk_scan(draw: Any, g: Graph) -> None:
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    width = draw(st.integers(1, 4))
    body = Graph(draw(_names))
    c = body.input("c", [width], dtype)
    x = body.input("x", [width], dtype)
    body.set_outputs([body.activation(draw(st.sampled_from(["tanh", "neg", "exp"])), body.add_(c, x))])
    tag = len(g.nodes)
    init = g.input(f"si{tag}", [width], dtype)
    form = draw(st.sampled_from(["scan", "custom_fn", "cond", "while_loop"]))
    if form == "scan":
        g.scan(body, init, xs=[g.input(f"sxs{tag}", [draw(_dims), width], dtype)],
               save_trajectory=draw(st.booleans()), reverse=draw(st.booleans()))
    elif form == "custom_fn":
        g.custom_fn([init, init], body, vjp=None)
    elif form == "cond":
        g.cond(g.input(f"sp{tag}", [], "bool"), body, body, [init, init])
    else:
        pred = Graph("pred")
        pc, _ = pred.input("c", [width], dtype), pred.input("x", [width], dtype)
        pred.set_outputs([pred.compare("lt", pred.reduce("max", pc), pred.reduce("min", pc))])
        g.while_loop(pred, body, init, bcasts=[init], max_trips=draw(st.sampled_from([None, 0, 3])))


def _mk_conv(draw: Any, g: Graph) -> None:
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    tag, rank = len(g.nodes), draw(st.integers(1, 2))
    c, k = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    x = g.input(f"vx{tag}", [draw(_dims), c, *([draw(st.integers(2, 5))] * rank)], dtype)
    kind = draw(st.integers(0, 2))
    if kind == 0:
        groups = draw(st.sampled_from([1, c]))
        g.conv(x, g.param(f"vw{tag}", [2 * groups, c // groups, *([k] * rank)], dtype),
               strides=(draw(st.integers(1, 2)),) * rank, pads=(draw(st.integers(0, 1)),) * (2 * rank), groups=groups,
               activation=draw(st.sampled_from([None, "relu"])))
    elif kind == 1:
        g.pool(draw(st.sampled_from(["max", "avg"])), x, (k,) * rank, ceil_mode=draw(st.booleans()))
    else:
        g.batch_norm(x, *(g.param(f"v{n}{tag}", [c], dtype) for n in "sbmv"), eps=draw(st.floats(0, 0.1)))


def _mk_collective(draw: Any, g: Graph) -> None:
    x = _pick(draw, g, lambda s: s.dtype.value in FLOAT_DTYPES and s.rank >= 1)
    world, axis = draw(st.integers(1, 4)), draw(st.sampled_from([0, -1]))
    op = draw(st.sampled_from([O.AllReduce(world, draw(st.sampled_from(["sum", "max"]))),
                               O.AllGather(world, axis), O.ReduceScatter(world, "sum", axis)]))
    g.add(op, [x])


def _mk_user_op(draw: Any, g: Graph) -> None:
    x = _pick(draw, g, lambda s: s.dtype is O.DType.F32)
    g.user_op(swish_beta().name, [x, g.input(f"beta{len(g.nodes)}", [])])


def _mk_lora(draw: Any, g: Graph) -> None:
    x = _pick(draw, g, lambda s: s.dtype.value == "f32" and s.rank >= 2 and s.dims[-1].is_static)
    s = g.shape(x)
    slots, rank, n = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    a = _param_like(g, (slots, rank, s.dims[-1].value), "f32")
    b = _param_like(g, (slots, n, rank), "f32")
    g.lora_matmul(x, a, b, _param_like(g, (slots,), "f32"), g.input(f"lora{len(g.nodes)}", [s.dims[0]], "i32"))


MAKERS = [_mk_collective, _mk_unary, _mk_binary, _mk_where, _mk_cast, _mk_matmul, _mk_int8, _mk_reduce, _mk_softmax,
          _mk_sample, _mk_norm, _mk_shape_op, _mk_gather, _mk_constant, _mk_attention, _mk_rope, _mk_quant,
          _mk_region, _mk_cached_attention, _mk_ssm, _mk_scan, _mk_user_op, _mk_lora, _mk_moe, _mk_conv,
          _mk_feedback]


@st.composite
def graphs(draw: Any) -> Graph:
    g = Graph(draw(_names))
    for k in range(draw(st.integers(1, 3))):
        dims = draw(st.lists(_dims, min_size=1, max_size=3))
        g.input(f"x{k}", dims, draw(st.sampled_from([*FLOAT_DTYPES, "i32", "i64"])))
    if draw(st.booleans()):
        g.add(O.Param("lp", Shape.of([2, 3, 4]), layout=tuple(draw(st.permutations(range(3))))), name="lp")
    for _ in range(draw(st.integers(0, 10))):
        # A choice that does not fit the graph drawn so far raises; a failed add leaves the graph as it
        # was (helper params already added stay, and are still valid nodes).
        with contextlib.suppress(IRError):
            draw(st.sampled_from(MAKERS))(draw, g)
    outs = draw(st.lists(st.sampled_from(range(len(g.nodes))), min_size=1, max_size=3))
    g.set_outputs(outs, [f"o{i}" for i in range(len(outs))])
    return g


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_round_trip(g: Graph) -> None:
    g.verify()
    round_trip(g)


def test_generator_reaches_every_op() -> None:
    """Guard for the property test: its generator can produce every op kind."""
    seen: set[str] = set()

    # 500 examples: with int8_matmul's maker, 300 left some op kind unreached depending on what else
    # the session had imported; with 17 activations (mish, hardswish), 400 left rms_norm unreached;
    # with 22 dtypes (unsigned and storage formats: the cast and constant makers draw them), 500 left
    # while_loop unreached; with the carried scan/conv forms and CUDA control flow merged, 600 left expand
    @settings(max_examples=800, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(graphs())
    def collect(g: Graph) -> None:
        seen.update(n.kind for n in g.nodes)

    collect()
    assert set(O.OPS) - seen == set()


# ── hostile documents ───────────────────────────────────────────────────


def base_doc() -> dict[str, Any]:
    g = Graph("base")
    x = g.input("x", [SEQ, 4])
    gm = g.param("g", [4])
    c = g.constant(np.ones(4, np.float32))
    y = g.rms_norm(g.add_(x, c), gm)
    r = g.reduce("sum", y, [1])
    g.set_outputs([y, r], ["y", "r"])
    return json.loads(g.to_json())


def mutate(fn: Callable[[dict[str, Any]], None]) -> str:
    doc = copy.deepcopy(base_doc())
    fn(doc)
    return json.dumps(doc)


def _set(path: tuple, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return apply


def _delete(path: tuple) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return apply


def _const_with(shape: dict[str, Any], data: bytes) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        doc["nodes"][2]["op"] = {"op": "constant", "data": base64.b64encode(data).decode(), "shape": shape}
        doc["nodes"][2]["shape"] = shape
    return apply


def _region_in_region(doc: dict[str, Any]) -> None:
    inner: dict[str, Any] = {"op": "activation", "fn": "relu"}
    for _ in range(300):
        inner = {"op": "elementwise_region", "steps": [{"op": inner, "args": [0]}]}
    doc["nodes"][3]["op"] = inner


def _many_symbols(doc: dict[str, Any]) -> None:
    doc["nodes"][0]["op"]["shape"]["dims"][0] = {"coeff": 1, "symbols": [["s", 1]] * 100_000}


def _extra_node(node: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc["nodes"].append(node)


F32_4 = {"dtype": "f32", "dims": [4]}
HOSTILE: list[tuple[str, str | bytes | Callable[[], str], str]] = [
    # not JSON, or not an object
    ("empty", "", "not valid JSON"),
    ("truncated", '{"format": "rlx-graph", "version": 1', "not valid JSON"),
    ("trailing data", lambda: json.dumps(base_doc()) + " []", "not valid JSON"),
    ("invalid utf-8", b'{"name": "\xff"}', "not valid UTF-8"),
    ("array", "[]", "must be a JSON object"),
    ("number", "3", "must be a JSON object"),
    ("NaN literal", lambda: json.dumps(base_doc()).replace('"eps": 1e-06', '"eps": NaN'), "contains NaN"),
    ("Infinity literal", '{"format": Infinity}', "contains Infinity"),
    ("duplicate key", '{"format": "rlx-graph", "format": "rlx-graph"}', "repeats the key 'format'"),
    ("deep nesting", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("deep nesting inside an op",
     lambda: json.dumps(base_doc()).replace('"fn": "sum"', '"fn": ' + "[" * 50_000 + "]" * 50_000),
     "nested too deeply"),
    ("huge integer literal", '{"version": ' + "9" * 5000 + "}", "not valid JSON"),
    ("too many values", "[" + "0," * serialize.MAX_JSON_VALUES + "0]", "JSON values, over the limit"),
    ("ten million nodes", '{"nodes": [' + "{}," * 10_000_000 + "{}]}", "over the limit"),
    ("too many nodes", lambda: mutate(_set(("nodes",), [0] * (serialize.MAX_NODES + 1))), "200001 nodes"),
    # header
    ("wrong format", lambda: mutate(_set(("format",), "rlx-lir")), "not an rlx graph document"),
    ("missing format", lambda: mutate(_delete(("format",))), "not an rlx graph document"),
    ("newer version", lambda: mutate(_set(("version",), 2)), "version 2; this rlx reads version 1"),
    ("string version", lambda: mutate(_set(("version",), "1")), "version must be an integer"),
    ("bool version", lambda: mutate(_set(("version",), True)), "version must be an integer"),
    ("float version", lambda: mutate(_set(("version",), 1.0)), "version must be an integer"),
    ("unknown stage", lambda: mutate(_set(("stage",), "lir")), "stage must be one of"),
    ("stage not a string", lambda: mutate(_set(("stage",), ["mir"])), "stage must be one of"),
    ("unknown top-level key", lambda: mutate(_set(("extra",), 1)), "unknown keys 'extra'"),
    ("missing nodes", lambda: mutate(_delete(("nodes",))), r"missing \['nodes'\]"),
    ("nodes not a list", lambda: mutate(_set(("nodes",), {})), "'nodes' must be a list"),
    ("graph name not a string", lambda: mutate(_set(("name",), 5)), "graph name must be a string"),
    ("graph name null", lambda: mutate(_set(("name",), None)), "graph name must be a string"),
    ("graph name too long", lambda: mutate(_set(("name",), "x" * 5000)), "5000 characters long"),
    # nodes
    ("node not an object", lambda: mutate(_set(("nodes", 1), [1])), r"node %1: expected a JSON object"),
    ("node missing shape", lambda: mutate(_delete(("nodes", 1, "shape"))), r"node %1: missing \['shape'\]"),
    ("node extra key", lambda: mutate(_set(("nodes", 1, "device"), "gpu")), r"node %1: unknown keys"),
    ("node id string", lambda: mutate(_set(("nodes", 1, "id"), "1")), "id must be an integer"),
    ("node id bool", lambda: mutate(_set(("nodes", 1, "id"), True)), "id must be an integer"),
    ("duplicate node id", lambda: mutate(_set(("nodes", 1, "id"), 0)), "duplicate node id 0"),
    ("out-of-order node id", lambda: mutate(_set(("nodes", 1, "id"), 7)), "out-of-order node id 7"),
    ("node name not a string", lambda: mutate(_set(("nodes", 3, "name"), 3)), r"node %3 name must be a string"),
    ("node name too long", lambda: mutate(_set(("nodes", 3, "name"), "n" * 2000)), "over the limit of 1024"),
    ("input name not a string", lambda: mutate(_set(("nodes", 0, "op", "name"), 7)), "expected a string"),
    ("input name too long", lambda: mutate(_set(("nodes", 0, "op", "name"), "i" * 2000)), "input name is 2000"),
    ("forward reference", lambda: mutate(_set(("nodes", 3, "inputs"), [0, 4])), "input %4 is not an earlier node"),
    ("self reference (cycle)", lambda: mutate(_set(("nodes", 3, "inputs"), [3, 2])), "input %3 is not an earlier"),
    ("negative reference", lambda: mutate(_set(("nodes", 3, "inputs"), [-1, 2])), "input %-1 is not an earlier"),
    ("bool reference", lambda: mutate(_set(("nodes", 3, "inputs"), [True, 2])), "input True is not a node id"),
    ("inputs not a list", lambda: mutate(_set(("nodes", 3, "inputs"), "0,2")), "inputs must be a list"),
    ("leaf with inputs", lambda: mutate(_set(("nodes", 1, "inputs"), [0])), "param takes no inputs"),
    ("wrong arity", lambda: mutate(_set(("nodes", 3, "inputs"), [0])), "binary takes 2 inputs, got 1"),
    # ops and attributes
    ("unknown op", lambda: mutate(_set(("nodes", 3, "op"), {"op": "conv2d"})), r"node %3: unknown op 'conv2d'"),
    ("op not an object", lambda: mutate(_set(("nodes", 3, "op"), "binary")), "expected an object"),
    ("op kind not a string", lambda: mutate(_set(("nodes", 3, "op", "op"), 4)), "expected an object with an 'op'"),
    ("unknown attribute", lambda: mutate(_set(("nodes", 3, "op", "alpha"), 1)), r"unknown attributes \['alpha'\]"),
    ("missing attribute", lambda: mutate(_delete(("nodes", 3, "op", "fn"))), "missing attribute 'fn'"),
    ("attribute wrong type", lambda: mutate(_set(("nodes", 3, "op", "fn"), 1)), "expected a string"),
    ("unknown binary fn", lambda: mutate(_set(("nodes", 3, "op", "fn"), "xor")), "unknown binary op 'xor'"),
    ("axes not a list", lambda: mutate(_set(("nodes", 5, "op", "axes"), 1)), "expected a list"),
    ("axes of strings", lambda: mutate(_set(("nodes", 5, "op", "axes"), ["1"])), "expected an integer"),
    ("axis float", lambda: mutate(_set(("nodes", 5, "op", "axes"), [1.0])), "expected an integer"),
    ("keep_dim int", lambda: mutate(_set(("nodes", 5, "op", "keep_dim"), 1)), "expected true/false"),
    ("axis out of range", lambda: mutate(_set(("nodes", 5, "op", "axes"), [5])), "out of range"),
    ("eps as string", lambda: mutate(_set(("nodes", 4, "op", "eps"), "1e-6")), "expected a number"),
    ("eps NaN object", lambda: mutate(_set(("nodes", 4, "op", "eps"), {"float": "nan"})), "eps must be a finite"),
    ("eps bad float object", lambda: mutate(_set(("nodes", 4, "op", "eps"), {"float": "1"})), "expected a number"),
    ("eps overflows to inf", lambda: json.dumps(base_doc()).replace('"eps": 1e-06', '"eps": 1e400'),
     "eps must be a finite"),
    ("eps giant int", lambda: mutate(_set(("nodes", 4, "op", "eps"), 10**400)), "out of float range"),
    ("nested region", lambda: mutate(_region_in_region), "is not elementwise"),
    ("region steps not a list", lambda: mutate(_set(("nodes", 3, "op"), {"op": "elementwise_region", "steps": 3})),
     "expected a list"),
    ("region step reads the future",
     lambda: mutate(_set(("nodes", 3, "op"), {"op": "elementwise_region", "steps": [
         {"op": {"op": "binary", "fn": "add"}, "args": [0, 7]}]})), "reads value 7"),
    ("region step with extra key",
     lambda: mutate(_set(("nodes", 3, "op"), {"op": "elementwise_region", "steps": [
         {"op": {"op": "binary", "fn": "add"}, "args": [0, 1], "x": 1}]})), "bad region step"),
    ("param layout invalid", lambda: mutate(_set(("nodes", 1, "op", "layout"), [0, 0])), "not a permutation"),
    ("attention heads as strings",
     lambda: mutate(_set(("nodes", 3, "op"), {"op": "attention", "num_heads": "1", "head_dim": 4})),
     "expected an integer"),
    ("concat of too many inputs", lambda: mutate(_extra_node(
        {"id": 6, "op": {"op": "concat", "axis": 0}, "inputs": [2] * 2000, "name": "", "shape": F32_4})),
     r"concat takes 1\.\.1024 inputs, got 2000"),
    # shapes, dims and sizes
    ("stored shape differs", lambda: mutate(_set(("nodes", 5, "shape", "dims"), [3])), "stored shape f32\\[3\\]"),
    ("stored dtype differs", lambda: mutate(_set(("nodes", 5, "shape", "dtype"), "f16")), "stored shape f16"),
    ("dtype alias", lambda: mutate(_set(("nodes", 0, "op", "shape", "dtype"), "float32")), "bad dtype 'float32'"),
    ("dtype unknown", lambda: mutate(_set(("nodes", 0, "op", "shape", "dtype"), "f8")), "bad dtype 'f8'"),
    ("dtype not a string", lambda: mutate(_set(("nodes", 0, "op", "shape", "dtype"), 4)), "bad dtype 4"),
    ("shape not an object", lambda: mutate(_set(("nodes", 0, "op", "shape"), [4])), "bad shape"),
    ("shape extra key", lambda: mutate(_set(("nodes", 0, "op", "shape", "layout"), "nchw")), "bad shape"),
    ("float dim", lambda: mutate(_set(("nodes", 1, "op", "shape", "dims"), [1e15])),
     r"bad dimension 1000000000000000\.0"),
    ("huge dim", lambda: mutate(_set(("nodes", 1, "op", "shape", "dims"), [10**15])), "absurdly large"),
    ("huge product", lambda: mutate(_set(("nodes", 1, "op", "shape", "dims"), [1 << 30, 1 << 30])),
     "more than 1099511627776 elements"),
    ("negative dim", lambda: mutate(_set(("nodes", 1, "op", "shape", "dims"), [-4])), ">= 0"),
    ("bool dim", lambda: mutate(_set(("nodes", 1, "op", "shape", "dims"), [True])), "bad dimension True"),
    ("rank 17", lambda: mutate(_set(("nodes", 1, "op", "shape", "dims"), [1] * 17)), "rank 17 exceeds 16"),
    ("rank 10000", lambda: mutate(_set(("nodes", 1, "op", "shape", "dims"), [1] * 10_000)), "exceeds 16"),
    ("bad symbol name", lambda: mutate(_set(("nodes", 0, "op", "shape", "dims", 0, "symbols"), [["a-b", 4]])),
     "must be an identifier"),
    ("zero symbol bound", lambda: mutate(_set(("nodes", 0, "op", "shape", "dims", 0, "symbols"), [["s", 0]])),
     "upper bound >= 1"),
    ("huge symbol bound", lambda: mutate(_set(("nodes", 0, "op", "shape", "dims", 0, "symbols"), [["s", 1 << 50]])),
     "upper bound"),
    ("symbol not a pair", lambda: mutate(_set(("nodes", 0, "op", "shape", "dims", 0, "symbols"), [["s"]])),
     "bad dynamic dimension symbol"),
    ("no symbols", lambda: mutate(_set(("nodes", 0, "op", "shape", "dims", 0, "symbols"), [])), "needs 1..64 symbols"),
    ("100k symbols", lambda: mutate(_many_symbols), "needs 1..64 symbols"),
    ("one symbol, two bounds", lambda: mutate(_extra_node(
        {"id": 6, "op": {"op": "input", "name": "z", "shape": {"dtype": "f32", "dims": [
            {"coeff": 1, "symbols": [["seq", 7]]}]}}, "inputs": [], "name": "",
         "shape": {"dtype": "f32", "dims": [{"coeff": 1, "symbols": [["seq", 7]]}]}})), "two bounds"),
    ("duplicate input name", lambda: mutate(_extra_node(
        {"id": 6, "op": {"op": "input", "name": "x", "shape": F32_4}, "inputs": [], "name": "", "shape": F32_4})),
     "duplicate input name 'x'"),
    ("constant bytes short", lambda: mutate(_const_with(F32_4, b"\x00" * 15)),
     r"holds 15 bytes but f32\[4\] needs 16"),
    ("constant claims a terabyte", lambda: mutate(_const_with({"dtype": "f32", "dims": [1 << 20, 1 << 20]}, b"")),
     "holds 0 bytes"),
    ("constant bad base64", lambda: mutate(_set(("nodes", 2, "op", "data"), "!!not base64!!")), "bad base64"),
    ("constant data not text", lambda: mutate(_set(("nodes", 2, "op", "data"), [0, 0])), "expected base64 text"),
    ("dynamic constant", lambda: mutate(_const_with(
        {"dtype": "f32", "dims": [{"coeff": 1, "symbols": [["seq", 32]]}]}, b"")), "static shape"),
    # outputs
    ("fewer outputs than names", lambda: mutate(_set(("outputs",), [4])), "1 outputs but 2 output names"),
    ("no outputs at all", lambda: mutate(lambda d: d.update(outputs=[], output_names=[])), "at least one output"),
    ("dangling output", lambda: mutate(_set(("outputs",), [4, 99])), "output 99 does not name a node"),
    ("negative output", lambda: mutate(_set(("outputs",), [4, -1])), "output -1 does not name a node"),
    ("bool output", lambda: mutate(_set(("outputs",), [4, True])), "output True does not name a node"),
    ("output as string", lambda: mutate(_set(("outputs",), [4, "5"])), "output '5' does not name a node"),
    ("outputs not a list", lambda: mutate(_set(("outputs",), 4)), "must be lists"),
    ("output names mismatch", lambda: mutate(_set(("output_names",), ["y"])), "2 outputs but 1 output names"),
    ("output name not a string", lambda: mutate(_set(("output_names",), ["y", 1])), "output name must be a string"),
    ("empty output name", lambda: mutate(_set(("output_names",), ["y", ""])), "non-empty strings"),
    ("duplicate output names", lambda: mutate(_set(("output_names",), ["y", "y"])), "duplicate output names"),
]


@pytest.mark.parametrize(("doc", "pattern"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_documents_raise_irerror(doc: str | bytes | Callable[[], str], pattern: str) -> None:
    text = doc() if callable(doc) else doc
    with pytest.raises(IRError, match=pattern):
        Graph.from_json(text)


def test_base_document_is_valid() -> None:
    """The hostile table mutates this document: unmutated, it must load."""
    doc = base_doc()
    assert [n["op"]["op"] for n in doc["nodes"]] == ["input", "param", "constant", "binary", "rms_norm", "reduce"]
    Graph.from_json(json.dumps(doc))


def test_size_limit() -> None:
    text = json.dumps(base_doc())
    with pytest.raises(IRError, match=f"{len(text)} characters, over the limit of 100"):
        serialize.from_json(text, max_bytes=100)
    with pytest.raises(IRError, match="bytes, over the limit of 100"):
        serialize.from_json(text.encode(), max_bytes=100)
    assert len(serialize.from_json(text.encode()).nodes) == 6  # bytes are accepted too


def test_wrong_argument_type() -> None:
    with pytest.raises(IRError, match="must be str or bytes, got int"):
        Graph.from_json(123)  # type: ignore[arg-type]


def test_large_claims_load_without_allocating() -> None:
    """A terabyte-sized *input* is only a declaration: it loads, and nothing is allocated for it."""
    g = Graph("big")
    x = g.input("x", [1 << 20, 1 << 20])
    g.set_outputs([g.reshape(x, [-1])])
    back = round_trip(g)
    assert back.shape(1).max_numel == 1 << 40


def test_a_document_loads_in_a_process_that_has_not_loaded_its_graph_class() -> None:
    """`import rlx` loads no graph class (they load lazily): loading a MIR or HIR document imports its
    stage's class (`serialize._DEFINED_IN`) instead of failing as an unregistered stage."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from rlx.ir.hir import HirModule

    mir = Graph("m")
    mir.set_outputs([mir.add_(mir.input("x", [2]), mir.input("y", [2]))])
    hir = HirModule("h")
    hir.set_outputs([hir.linear(hir.input("x", [2, 4]), hir.param("w", [4, 3]))])
    code = ("import json, sys, rlx\nfrom rlx.ir import serialize\nloaded = 'rlx.ir.graph' in sys.modules\n"
            "graphs = [serialize.from_json(text) for text in json.loads(sys.stdin.read())]\n"
            "print(json.dumps([loaded] + [[type(g).__name__, [n.kind for n in g.nodes]] for g in graphs]))")
    proc = subprocess.run([sys.executable, "-P", "-c", code], input=json.dumps([mir.to_json(), hir.to_json()]),
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [False, ["Graph", [n.kind for n in mir.nodes]],
                                       ["HirModule", [n.kind for n in hir.nodes]]]

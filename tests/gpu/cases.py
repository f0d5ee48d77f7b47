"""Graphs exercising every MIR and fused op the CUDA backend implements, with random feeds.

Shared by tests/gpu (parity on a GPU) and tests/codegen/test_cuda_compile.py (nvcc, no GPU).
Each case is built by a function returning `Case`; feeds are lists so that graphs with dynamic dims
run at several sizes (one library, several captured CUDA Graphs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlx.ir import ops as O
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim


@dataclass
class Case:
    name: str
    graph: Graph
    feeds: list[dict[str, np.ndarray]]
    params: dict[str, np.ndarray] = field(default_factory=dict)
    #: False for cases whose values do not survive f16/bf16 storage meaningfully (integer-exact logic).
    lowp: bool = True


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


CASES: dict[str, Callable[[], Case]] = {}


def case(fn: Callable[[], Case]) -> Callable[[], Case]:
    CASES[fn.__name__] = fn
    return fn


@case
def activations() -> Case:
    g = Graph("activations")
    x = g.input("x", [3, 257])
    pos = g.input("pos", [3, 257])
    outs = [g.activation(fn, x) for fn in ("gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "neg", "abs",
                                          "sin", "cos", "exp", "softplus", "mish", "hardswish")]
    outs += [g.activation(fn, pos) for fn in ("log", "sqrt", "rsqrt")]
    g.set_outputs(outs)
    r = _rng(1)
    return Case("activations", g, [{"x": _f32(r, 3, 257, scale=2.0),
                                    "pos": np.abs(_f32(r, 3, 257)) + np.float32(0.1)}])


@case
def binary_broadcast() -> Case:
    g = Graph("binary_broadcast")
    seq = Dim.dynamic("seq", max=40)
    a = g.input("a", [2, seq, 6])
    b = g.input("b", [6])
    c = g.input("c", [2, 1, 6])
    d = g.input("d", [2, seq, 1])
    outs = [g.binary(fn, a, b) for fn in ("add", "sub", "mul", "div", "max", "min")]
    outs.append(g.binary("add", g.mul(a, c), d))
    outs.append(g.binary("pow", g.activation("abs", a), c))
    g.set_outputs(outs)
    r = _rng(2)
    feeds = []
    for s in (7, 40, 1):
        feeds.append({"a": _f32(r, 2, s, 6), "b": _f32(r, 6) + np.float32(3.0), "c": _f32(r, 2, 1, 6),
                      "d": _f32(r, 2, s, 1)})
    return Case("binary_broadcast", g, feeds)


@case
def compare_where_cast() -> Case:
    g = Graph("compare_where_cast")
    a = g.input("a", [4, 33])
    b = g.input("b", [33])
    outs = [g.compare(fn, a, b) for fn in ("eq", "ne", "lt", "le", "gt", "ge")]
    outs.append(g.where(g.compare("gt", a, b), a, b))
    outs.append(g.cast(g.mul(a, g.constant(np.float32(10.0))), "i32"))
    outs.append(g.cast(a, "bool"))
    outs.append(g.cast(g.cast(a, "f16"), "f32"))
    g.set_outputs(outs)
    r = _rng(3)
    a_v = _f32(r, 4, 33)
    a_v[0, :5] = 0.0
    b_v = a_v[1].copy()  # exact ties for eq / le / ge
    return Case("compare_where_cast", g, [{"a": a_v, "b": b_v}], lowp=False)


@case
def integer_ops() -> Case:
    g = Graph("integer_ops")
    a = g.input("a", [5, 9], "i32")
    b = g.input("b", [9], "i32")
    c = g.input("c", [5, 9], "i64")
    outs = [g.binary(fn, a, b) for fn in ("add", "sub", "mul", "div", "max", "min")]
    outs.append(g.activation("neg", c))
    outs.append(g.activation("abs", c))
    outs.append(g.reduce("sum", c, [1]))
    outs.append(g.reduce("max", a, [0]))
    outs.append(g.cast(a, "f32"))
    g.set_outputs(outs)
    r = _rng(4)
    b_v = r.integers(-9, 10, size=9).astype(np.int32)
    b_v[b_v == 0] = 3
    return Case("integer_ops", g, [{"a": r.integers(-100, 100, size=(5, 9)).astype(np.int32), "b": b_v,
                                    "c": r.integers(-1000, 1000, size=(5, 9)).astype(np.int64)}], lowp=False)


@case
def region() -> Case:
    g = Graph("region")
    x = g.input("x", [4, Dim.dynamic("n", max=300)])
    y = g.input("y", [4, 1])
    steps = (O.RegionStep(O.Binary("mul"), (0, 1)), O.RegionStep(O.Activation("gelu"), (2,)),
             O.RegionStep(O.Binary("add"), (3, 0)), O.RegionStep(O.Activation("tanh"), (4,)))
    g.set_outputs([g.add(O.ElementwiseRegion(steps=steps), [x, y])])
    r = _rng(5)
    return Case("region", g, [{"x": _f32(r, 4, n), "y": _f32(r, 4, 1)} for n in (300, 17)])


@case
def matmuls() -> Case:
    g = Graph("matmuls")
    seq = Dim.dynamic("seq", max=70)
    x = g.input("x", [3, seq, 48])
    w = g.param("w", [48, 40])
    bx = g.input("bx", [3, 40, 24])
    a4 = g.input("a4", [2, 1, 5, 7])
    b4 = g.input("b4", [1, 3, 7, 6])
    h = g.matmul(x, w)
    outs = [h, g.matmul(h, bx), g.matmul(a4, b4)]
    bias = g.param("bias", [40])
    for act in (None, "relu", "gelu", "gelu_tanh", "silu"):
        outs.append(g.add(O.FusedMatMulBiasAct(act), [x, w, bias]))
    outs.append(g.add(O.FusedMatMulBiasAct("gelu_tanh"), [x, w]))
    g.set_outputs(outs)
    r = _rng(6)
    params = {"w": _f32(r, 48, 40, scale=0.2), "bias": _f32(r, 40)}
    feeds = [{"x": _f32(r, 3, s, 48), "bx": _f32(r, 3, 40, 24, scale=0.2), "a4": _f32(r, 2, 1, 5, 7),
              "b4": _f32(r, 1, 3, 7, 6)} for s in (70, 5)]
    return Case("matmuls", g, feeds, params)


@case
def swiglu() -> Case:
    g = Graph("swiglu")
    x = g.input("x", [2, Dim.dynamic("seq", max=33), 64])
    wg = g.param("wg", [64, 96])
    wu = g.param("wu", [64, 96])
    g.set_outputs([g.add(O.FusedSwiGLU(), [x, wg, wu])])
    r = _rng(7)
    return Case("swiglu", g, [{"x": _f32(r, 2, s, 64)} for s in (33, 3)],
                {"wg": _f32(r, 64, 96, scale=0.2), "wu": _f32(r, 64, 96, scale=0.2)})


@case
def reductions() -> Case:
    g = Graph("reductions")
    x = g.input("x", [3, Dim.dynamic("s", max=50), 20])
    outs = []
    for fn in ("sum", "mean", "max", "min"):
        outs.append(g.reduce(fn, x, [2]))
        outs.append(g.reduce(fn, x, [1], keep_dim=True))
        outs.append(g.reduce(fn, x, [0, 2]))
    outs.append(g.reduce("sum", x, []))
    small = g.input("small", [4, 6])
    outs.append(g.reduce("prod", small, [1]))
    g.set_outputs(outs)
    r = _rng(8)
    return Case("reductions", g, [{"x": _f32(r, 3, s, 20), "small": np.float32(1.0) + _f32(r, 4, 6, scale=0.1)}
                                  for s in (50, 9)])


@case
def conv_family() -> Case:
    """conv (implicit GEMM: strided, dilated, grouped, 1-D; depthwise; fused bias + activation), max / average
    pooling (dilated average, a 3-D max decomposed into two 2-D pools); a dynamic batch (and an iota over it:
    integer and float, added to a value)."""
    g = Graph("conv_family")
    b = Dim.dynamic("b", max=3)
    x = g.input("x", [b, 4, 9, 8])
    y = g.conv(x, g.param("w1", [8, 4, 3, 3]), g.param("b1", [8]), strides=(2, 1), pads=(1, 1, 1, 1),
               activation="relu")
    dw = g.conv(y, g.param("wd", [8, 1, 3, 3]), pads=(2, 2, 2, 2), dilations=(2, 2), groups=8,
                activation="hardswish")
    grouped = g.conv(dw, g.param("wg", [6, 4, 1, 1]), groups=2)
    pooled = g.pool("max", grouped, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    avg = g.pool("avg", grouped, (2, 3), strides=(2, 2), pads=(0, 1, 0, 1), ceil_mode=True)
    seq = g.input("seq", [b, 5, 17])
    audio = g.conv(seq, g.param("wa", [7, 5, 3]), g.param("ba", [7]), strides=(2,), pads=(1, 1), activation="gelu")
    steps = g.reshape(g.iota(b, 0.5, -0.25, "f32"), [b, 1, 1])
    vol = g.input("vol", [b, 2, 5, 6, 4])
    cube = g.pool("max", vol, (2, 3, 2), strides=(2, 1, 2), pads=(1, 1, 0, 0, 1, 1), dilations=(1, 2, 1),
                  ceil_mode=True)
    dilated = g.pool("avg", grouped, (2, 2), pads=(1, 1, 0, 0), dilations=(2, 1), count_include_pad=True)
    g.set_outputs([pooled, avg, g.add_(audio, steps), g.iota(b * 2, 3, 2, "i32"), cube, dilated])
    r = _rng(31)
    params = {"w1": _f32(r, 8, 4, 3, 3, scale=0.3), "b1": _f32(r, 8), "wd": _f32(r, 8, 1, 3, 3, scale=0.3),
              "wg": _f32(r, 6, 4, 1, 1, scale=0.5), "wa": _f32(r, 7, 5, 3, scale=0.3), "ba": _f32(r, 7)}
    return Case("conv_family", g, [{"x": _f32(r, n, 4, 9, 8), "seq": _f32(r, n, 5, 17), "vol": _f32(r, n, 2, 5, 6, 4)}
                                   for n in (3, 1)], params)


@case
def softmaxes() -> Case:
    g = Graph("softmaxes")
    x = g.input("x", [2, 3, Dim.dynamic("n", max=3000)])
    y = g.input("y", [4, 37, 5])
    g.set_outputs([g.softmax(x, -1), g.softmax(y, 1), g.softmax(y, -1)])
    r = _rng(9)
    return Case("softmaxes", g, [{"x": _f32(r, 2, 3, n, scale=3.0), "y": _f32(r, 4, 37, 5, scale=3.0)}
                                 for n in (3000, 100, 700)])


@case
def norms() -> Case:
    g = Graph("norms")
    outs = []
    feed: dict[str, np.ndarray] = {}
    params: dict[str, np.ndarray] = {}
    r = _rng(10)
    for n in (99, 384, 1000, 9000):
        x = g.input(f"x{n}", [3, n])
        res = g.input(f"r{n}", [3, n])
        gamma = g.param(f"g{n}", [n])
        beta = g.param(f"b{n}", [n])
        bias = g.param(f"c{n}", [n])
        outs.append(g.layer_norm(x, gamma, beta, eps=1e-5))
        outs.append(g.rms_norm(x, gamma, eps=1e-6))
        outs.append(g.add(O.FusedResidualLayerNorm(1e-12), [x, res, gamma, beta]))
        outs.append(g.add(O.FusedResidualLayerNorm(1e-5), [x, res, bias, gamma, beta]))
        outs.append(g.add(O.FusedResidualRmsNorm(1e-6), [x, res, gamma]))
        outs.append(g.add(O.FusedResidualRmsNorm(1e-6), [x, res, bias, gamma]))
        feed[f"x{n}"] = _f32(r, 3, n) + np.float32(0.5)
        feed[f"r{n}"] = _f32(r, 3, n)
        params.update({f"g{n}": np.float32(1.0) + _f32(r, n, scale=0.1), f"b{n}": _f32(r, n, scale=0.1),
                       f"c{n}": _f32(r, n, scale=0.1)})
    g.set_outputs(outs)
    return Case("norms", g, [feed], params)


@case
def argmax() -> Case:
    """Rows of distinct small integers (exact in f16 and bf16), a tie (the first index wins), NaNs (the
    first NaN wins) and a row of negative values only, along the last, the first and a middle axis; a
    dynamic row count."""
    g = Graph("argmax")
    rows = Dim.dynamic("rows", max=6)
    x = g.input("x", [rows, 200])
    y = g.input("y", [5, 33])
    z = g.input("z", [3, 7, 5])
    g.set_outputs([g.argmax(x), g.argmax(y, axis=0), g.argmax(z, axis=1)])
    r = _rng(21)
    xs = np.stack([r.permutation(200) - 100 for _ in range(5)]).astype(np.float32)
    xs[1, 3] = xs[1, 150] = 120.0
    xs[2, 77] = xs[2, 120] = np.nan
    xs[4] -= 120.0  # all negative (-220..-21, exact in bf16): threads that saw no value must not win
    return Case("argmax", g, [{"x": xs, "y": r.permutation(165).reshape(5, 33).astype(np.float32) - 80,
                               "z": r.permutation(105).reshape(3, 7, 5).astype(np.float32) - 50}])


@case
def sample_top_k() -> Case:
    """Sampling a token per row (ops_sample): logits on a grid of 1/8 (exact in f16 and bf16, many ties), a
    NaN row, a dynamic row count, and settings from argmax (temperature 0) through top_k at the cap with
    top_p; u at 0 and just below 1. Token ids must equal the reference's exactly."""
    g = Graph("sample_top_k")
    rows = Dim.dynamic("rows", max=8)
    x = g.input("x", [rows, 3000])
    u = g.input("u", [rows], "f64")
    s = g.input("s", [3], "f64")
    g.set_outputs([g.sample_top_k(x, u, s)])
    r = _rng(23)
    feeds = []
    for n, settings in ((5, (0.0, 1, 1.0)), (8, (0.8, 40, 1.0)), (3, (1.0, 256, 0.9)), (6, (2.5, 7, 0.3)),
                        (4, (0.5, 1, 1.0)), (7, (1e-3, 200, 1e-6))):
        xs = (r.integers(-128, 128, (n, 3000)) / 8).astype(np.float32)
        us = r.random(n)
        us[0], us[-1] = 0.0, np.nextafter(1.0, 0.0)
        if n > 2:
            xs[1, 17] = xs[1, 2900] = np.nan
        feeds.append({"x": xs, "u": us, "s": np.array(settings, np.float64)})
    return Case("sample_top_k", g, feeds)


@case
def lora_matmul() -> Case:
    """Batched LoRA (ops_lora): row groups of a dynamic count, each with its adapter slot or none (-1), a
    rank that is not a multiple of the warp count, K and N not multiples of the block."""
    g = Graph("lora_matmul")
    groups = Dim.dynamic("groups", max=6)
    x = g.input("x", [groups, 3, 200])
    index = g.input("index", [groups], "i32")
    a, b, s = g.param("a", [3, 7, 200]), g.param("b", [3, 130, 7]), g.param("s", [3])
    g.set_outputs([g.lora_matmul(x, a, b, s, index)])
    r = _rng(29)
    params = {"a": _f32(r, 3, 7, 200, scale=0.1), "b": _f32(r, 3, 130, 7, scale=0.1),
              "s": np.array([0.5, 2.0, 1.25], np.float32)}
    feeds = [{"x": _f32(r, 4, 3, 200), "index": np.array([2, -1, 0, 1], np.int32)},
             {"x": _f32(r, 1, 3, 200), "index": np.array([1], np.int32)}]
    return Case("lora_matmul", g, feeds, params)


@case
def movement() -> Case:
    g = Graph("movement")
    seq = Dim.dynamic("seq", max=20)
    x = g.input("x", [2, seq, 3, 8])
    y = g.input("y", [2, seq, 5])
    z = g.input("z", [1, 5])
    outs = [g.transpose(x, [0, 2, 1, 3]), g.transpose(x, [3, 1, 0, 2]), g.narrow(x, 3, 2, 4),
            g.narrow(y, 2, 1, 3), g.concat([y, g.narrow(y, 2, 0, 2), y], axis=2),
            g.expand(z, [2, seq, 5]), g.reshape(g.transpose(y, [0, 2, 1]), [2, -1])]
    g.set_outputs(outs)
    r = _rng(11)
    return Case("movement", g, [{"x": _f32(r, 2, s, 3, 8), "y": _f32(r, 2, s, 5), "z": _f32(r, 1, 5)}
                                for s in (20, 3)])


@case
def gathers() -> Case:
    g = Graph("gathers")
    seq = Dim.dynamic("seq", max=16)
    table = g.param("table", [50, 12])
    ids = g.input("ids", [2, seq], "i64")
    ids32 = g.input("ids32", [3], "i32")
    t2 = g.input("t2", [4, 7, 3])
    g.set_outputs([g.gather(table, ids), g.gather(t2, ids32, axis=1)])
    r = _rng(12)
    return Case("gathers", g, [{"ids": r.integers(0, 50, size=(2, s)).astype(np.int64),
                                "ids32": np.array([6, 0, 3], np.int32), "t2": _f32(r, 4, 7, 3)} for s in (16, 5)],
                {"table": _f32(r, 50, 12)})


def _attention_case(name: str, *, heads: int, kv_heads: int, head_dim: int, mask: str, sq: list[int],
                    skv: list[int] | None = None, batch: int = 2, seed: int = 0) -> Case:
    g = Graph(name)
    s_q = Dim.dynamic("sq", max=max(sq))
    s_kv = Dim.dynamic("skv", max=max(skv)) if skv is not None else s_q
    q = g.input("q", [batch, s_q, heads * head_dim])
    k = g.input("k", [batch, s_kv, kv_heads * head_dim])
    v = g.input("v", [batch, s_kv, kv_heads * head_dim])
    m = None
    if mask == "padding":
        m = g.input("m", [batch, s_kv], "i64")
    elif mask == "bias":
        m = g.input("m", [batch, 1, 1, s_kv])
    out = g.attention(q, k, v, num_heads=heads, head_dim=head_dim, mask=mask, mask_input=m,
                      num_kv_heads=kv_heads if kv_heads != heads else None)
    g.set_outputs([out])
    r = _rng(seed)
    feeds = []
    for i, lq in enumerate(sq):
        lk = skv[i] if skv is not None else lq
        f = {"q": _f32(r, batch, lq, heads * head_dim), "k": _f32(r, batch, lk, kv_heads * head_dim),
             "v": _f32(r, batch, lk, kv_heads * head_dim)}
        if mask == "padding":
            mv = np.ones((batch, lk), np.int64)
            mv[0, max(1, lk // 2):] = 0
            if batch > 1 and lk > 1:
                mv[1, :] = 0  # a fully masked row yields zeros
            f["m"] = mv
        elif mask == "bias":
            f["m"] = _f32(r, batch, 1, 1, lk)
        feeds.append(f)
    return Case(name, g, feeds)


@case
def attention_plain() -> Case:
    return _attention_case("attention_plain", heads=4, kv_heads=4, head_dim=32, mask="none", sq=[130, 7], seed=13)


@case
def attention_causal_gqa() -> Case:
    return _attention_case("attention_causal_gqa", heads=8, kv_heads=2, head_dim=64, mask="causal", sq=[77, 64],
                           seed=14)


@case
def attention_padding() -> Case:
    return _attention_case("attention_padding", heads=12, kv_heads=12, head_dim=32, mask="padding", sq=[128, 19],
                           seed=15)


@case
def attention_bias_d80() -> Case:
    return _attention_case("attention_bias_d80", heads=2, kv_heads=2, head_dim=80, mask="bias", sq=[45, 3], seed=16)


@case
def attention_decode() -> Case:
    return _attention_case("attention_decode", heads=8, kv_heads=4, head_dim=128, mask="causal", sq=[1, 1, 5],
                           skv=[1000, 3, 1000], batch=2, seed=17)


@case
def rope() -> Case:
    g = Graph("rope")
    seq = Dim.dynamic("seq", max=24)
    x = g.input("x", [2, seq, 4 * 16])
    cos = g.input("cos", [seq, 6])
    sin = g.input("sin", [seq, 6])
    g.set_outputs([g.rope(x, cos, sin, head_dim=16, n_rot=12, variant="neox"),
                   g.rope(x, cos, sin, head_dim=16, n_rot=12, variant="interleaved")])
    r = _rng(18)
    feeds = []
    for s in (24, 5):
        ang = np.arange(s)[:, None] * (1.0 / 100 ** (np.arange(6) / 6))[None, :]
        feeds.append({"x": _f32(r, 2, s, 64), "cos": np.cos(ang).astype(np.float32),
                      "sin": np.sin(ang).astype(np.float32)})
    return Case("rope", g, feeds)


@case
def rope_per_row() -> Case:
    g = Graph("rope_per_row")
    batch, seq = Dim.dynamic("batch", max=3), Dim.dynamic("seq", max=8)
    x = g.input("x", [batch, seq, 3 * 8])
    cos = g.input("cos", [batch, seq, 4])
    sin = g.input("sin", [batch, seq, 4])
    g.set_outputs([g.rope(x, cos, sin, head_dim=8, variant="interleaved")])
    r = _rng(31)
    feeds = []
    for b, s in ((3, 8), (2, 1)):
        ang = (np.arange(b)[:, None, None] * 7 + np.arange(s)[None, :, None]) * (0.5 ** np.arange(4))
        feeds.append({"x": _f32(r, b, s, 24), "cos": np.cos(ang).astype(np.float32),
                      "sin": np.sin(ang).astype(np.float32)})
    return Case("rope_per_row", g, feeds)


#: the cached_attention cases' query heads, KV heads and head dim
_KV = (4, 2, 64)


def _kv_attention_graph(name: str, cap: int, max_seq: int, window: int | None = None,
                        cache_dtype: str = "f32") -> Graph:
    """cached_attention (`_KV` heads) on up to 2 rows of up to `max_seq` new tokens,
    a cache of `cap` positions for 2 rows."""
    g = Graph(name)
    batch, seq = Dim.dynamic("batch", max=2), Dim.dynamic("seq", max=max_seq)
    heads, kv_heads, hd = _KV
    q = g.input("q", [batch, seq, heads * hd])
    k = g.input("k", [batch, seq, kv_heads * hd])
    v = g.input("v", [batch, seq, kv_heads * hd])
    kc = g.state("k_cache", [2, cap, kv_heads * hd], cache_dtype)
    vc = g.state("v_cache", [2, cap, kv_heads * hd], cache_dtype)
    pos = g.input("pos", [batch], "i32")
    g.set_outputs([g.cached_attention(q, k, v, kc, vc, pos, num_heads=heads, head_dim=hd, num_kv_heads=kv_heads,
                                      window=window)])
    return g


@case
def kv_attention() -> Case:
    """cached_attention: rows at different positions, prefill then decode steps through one cache."""
    (heads, kv_heads, hd), cap = _KV, 48
    g = _kv_attention_graph("kv_attention", cap, 16)
    r = _rng(32)
    feeds = []
    caches = (np.zeros((2, cap, kv_heads * hd), np.float32), np.zeros((2, cap, kv_heads * hd), np.float32))
    at = np.array([0, 5], np.int32)
    for s in (16, 1, 3):  # the same cache arrays every feed: each step appends after the last
        feeds.append({"q": _f32(r, 2, s, heads * hd), "k": _f32(r, 2, s, kv_heads * hd),
                      "v": _f32(r, 2, s, kv_heads * hd), "pos": at.copy(), "k_cache": caches[0],
                      "v_cache": caches[1]})
        at = at + s
    return Case("kv_attention", g, feeds)


@case
def token_feedback() -> Case:
    """token_feed / token_store through one i32 token state (rlx/ir/ops_feedback.py): rows fed from the slots the
    step before stored their last tokens in (-1 and a slot past the state: the row's own), steps of 3 and 2 rows."""
    g = Graph("token_feedback")
    b = Dim.dynamic("batch", max=4)
    last = g.state("last", [6], "i32")
    fed = g.token_feed(g.input("tokens", [b, 2], "i32"), g.input("src", [b], "i32"), last)
    stored = g.token_store(g.reshape(g.narrow(fed, 1, 1, 1), [b]), g.input("dst", [b], "i32"), last)
    g.set_outputs([fed, stored])
    state = np.arange(6, dtype=np.int32) + 100
    feeds = []
    # no step stores into a slot it reads: the reference writes the state in place before the GPU runs the same feed
    # (twice), so a step must read the same slots either way
    for tokens, src, dst in (([[1, 2], [3, 4], [5, 6]], [-1, 0, 9], [5, -1, 3]),
                             ([[7, 8], [9, 10]], [5, 0], [1, 2]),
                             ([[11, 12], [13, 14], [15, 16]], [1, 2, -1], [3, 4, 5])):
        feeds.append({"tokens": np.array(tokens, np.int32), "src": np.array(src, np.int32),
                      "dst": np.array(dst, np.int32), "last": state})
    return Case("token_feedback", g, feeds, lowp=False)


@case
def kv_attention_split() -> Case:
    """cached_attention over a long past: decode queries split their keys over several blocks (DecodeSplitKv)."""
    (heads, kv_heads, hd), cap = _KV, 1100
    g = _kv_attention_graph("kv_attention_split", cap, 4)
    r = _rng(33)
    caches = (_f32(r, 2, cap, kv_heads * hd), _f32(r, 2, cap, kv_heads * hd))  # a long past already there
    feeds = []
    # decode steps (split), one across a split boundary, one of 6 rows (not split), the last cache row
    for at, s in (([700, 1090], 1), ([257, 511], 2), ([300, 40], 3), ([1099, 256], 1)):
        feeds.append({"q": _f32(r, 2, s, heads * hd), "k": _f32(r, 2, s, kv_heads * hd),
                      "v": _f32(r, 2, s, kv_heads * hd), "pos": np.array(at, np.int32), "k_cache": caches[0],
                      "v_cache": caches[1]})
    return Case("kv_attention_split", g, feeds)


@case
def kv_attention_window() -> Case:
    """cached_attention with a sliding window of 100 over an f16 cache (f32 queries): prefill steps (rlx_kv_attend)
    and decode steps (rlx_kv_decode, split over the window's keys), rows inside and past the window."""
    (heads, kv_heads, hd), cap = _KV, 600
    g = _kv_attention_graph("kv_attention_window", cap, 4, window=100, cache_dtype="f16")
    r = _rng(34)
    caches = tuple(_f32(r, 2, cap, kv_heads * hd).astype(np.float16) for _ in range(2))  # a long past already there
    feeds = []
    for at, s in (([0, 300], 4), ([450, 590], 1), ([100, 20], 2), ([99, 5], 1)):
        feeds.append({"q": _f32(r, 2, s, heads * hd), "k": _f32(r, 2, s, kv_heads * hd),
                      "v": _f32(r, 2, s, kv_heads * hd), "pos": np.array(at, np.int32), "k_cache": caches[0],
                      "v_cache": caches[1]})
    return Case("kv_attention_window", g, feeds)


@case
def quant() -> Case:
    """dequant_matmul on q4_1 blocks (GEMV and tiled prefill sizes) and dequantize of gathered q8_0 rows."""
    from rlx.ir.quant import random_blocks, row_bytes

    g = Graph("quant")
    tokens = Dim.dynamic("tokens", max=40)
    x = g.input("x", [tokens, 64])
    w = g.param("w", [5, row_bytes("q4_1", 64)], "u8")
    table = g.param("table", [7, row_bytes("q8_0", 64)], "u8")
    ids = g.input("ids", [3], "i32")
    g.set_outputs([g.dequant_matmul(x, w, quant="q4_1"), g.dequantize(g.gather(table, ids), quant="q8_0")])
    r = _rng(40)
    feeds = [{"x": _f32(r, n, 64), "ids": np.array(i, np.int32)} for n, i in ((1, [0, 6, 3]), (40, [2, 2, 5]))]
    params = {"w": random_blocks(r, 5, 64, "q4_1"), "table": random_blocks(r, 7, 64, "q8_0")}
    # f32 only here: tests/gpu/test_cuda_quant.py bounds the half-precision error per format
    return Case("quant", g, feeds, params, lowp=False)


@case
def moe_ops() -> Case:
    """The MoE router (both normalizations) and moe_matmul on f32, f16, q8_0 and q4_k experts, one activation per
    token and one per chosen expert; 1 token and 40 (the CUDA plan: one warp per pair and expert row)."""
    from rlx.ir.quant import random_blocks, row_bytes

    g = Graph("moe_ops")
    tokens = Dim.dynamic("tokens", max=40)
    experts, n, k, top_k = 6, 24, 256, 2
    logits = g.input("logits", [tokens, experts])
    x, xk = g.input("x", [tokens, k]), g.input("xk", [tokens, top_k, k])
    ids, gate = g.moe_router(logits, top_k=top_k, normalize=True)
    _, raw_gate = g.moe_router(logits, top_k=top_k, normalize=False)
    w32, w16 = g.param("w32", [experts, n, k]), g.param("w16", [experts, n, k], "f16")
    wq8 = g.param("wq8", [experts, n, row_bytes("q8_0", k)], "u8")
    wq4k = g.param("wq4k", [experts, n, row_bytes("q4_k", k)], "u8")
    g.set_outputs({"ids": ids, "gate": gate, "raw_gate": raw_gate, "y32": g.moe_matmul(x, ids, w32),
                   "y32k": g.moe_matmul(xk, ids, w32), "y16": g.moe_matmul(x, ids, w16),
                   "yq8": g.moe_matmul(xk, ids, wq8, quant="q8_0"), "yq4k": g.moe_matmul(x, ids, wq4k, quant="q4_k")})
    r = _rng(41)
    feeds = [{"logits": _f32(r, t, experts), "x": _f32(r, t, k), "xk": _f32(r, t, top_k, k)} for t in (1, 40)]
    w = _f32(r, experts, n, k, scale=0.1)
    params = {"w32": w, "w16": w.astype(np.float16),
              "wq8": random_blocks(r, experts * n, k, "q8_0").reshape(experts, n, -1),
              "wq4k": random_blocks(r, experts * n, k, "q4_k").reshape(experts, n, -1)}
    # f32 only: expert ids chosen from half-precision logits may differ from the reference's
    return Case("moe_ops", g, feeds, params, lowp=False)


@case
def outputs_of_leaves() -> Case:
    g = Graph("outputs_of_leaves")
    x = g.input("x", [3, 4])
    w = g.param("w", [4])
    c = g.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    g.set_outputs([x, w, c, g.reshape(x, [12]), g.narrow(x, 0, 1, 1)])
    r = _rng(19)
    return Case("outputs_of_leaves", g, [{"x": _f32(r, 3, 4)}], {"w": _f32(r, 4)})


@case
def half_graph() -> Case:
    """A graph declared in f16 / bf16 (not the session precision): rounding at op boundaries like the reference."""
    g = Graph("half_graph")
    x = g.input("x", [8, 64], "f16")
    w = g.param("w", [64, 32], "f16")
    y = g.input("y", [8, 32], "bf16")
    h = g.activation("gelu", g.matmul(x, w))
    g.set_outputs([h, g.softmax(y, -1), g.cast(h, "bf16")])
    r = _rng(20)
    return Case("half_graph", g, [{"x": _f32(r, 8, 64).astype(np.float16), "y": _f32(r, 8, 32)}],
                {"w": _f32(r, 64, 32, scale=0.2).astype(np.float16)}, lowp=False)


def minilm_like(batch: int = 2, seq: int = 16, layers: int = 1) -> Case:
    """A BERT layer stack at MiniLM's width, built from MIR ops (no model package needed)."""
    g = Graph("minilm_like")
    b = Dim.dynamic("batch", max=max(batch, 4))
    s = Dim.dynamic("seq", max=max(seq, 32))
    h, heads, inter = 384, 12, 1536
    x = g.input("x", [b, s, h])
    mask = g.input("mask", [b, s], "i64")
    r = _rng(21)
    params: dict[str, np.ndarray] = {}

    def p(name: str, shape: list[int], scale: float = 0.05, one: bool = False) -> int:
        params[name] = (np.float32(1.0) if one else np.float32(0.0)) + _f32(r, *shape, scale=scale)
        return g.param(name, shape)

    for i in range(layers):
        q = g.add(O.FusedMatMulBiasAct(None), [x, p(f"q{i}", [h, h]), p(f"qb{i}", [h])])
        k = g.add(O.FusedMatMulBiasAct(None), [x, p(f"k{i}", [h, h]), p(f"kb{i}", [h])])
        v = g.add(O.FusedMatMulBiasAct(None), [x, p(f"v{i}", [h, h]), p(f"vb{i}", [h])])
        a = g.attention(q, k, v, num_heads=heads, head_dim=h // heads, mask="padding", mask_input=mask)
        o = g.add(O.FusedMatMulBiasAct(None), [a, p(f"o{i}", [h, h]), p(f"ob{i}", [h])])
        x = g.add(O.FusedResidualLayerNorm(1e-12), [o, x, p(f"g1{i}", [h], 0.1, True), p(f"b1{i}", [h], 0.1)])
        f = g.add(O.FusedMatMulBiasAct("gelu"), [x, p(f"f1{i}", [h, inter]), p(f"fb1{i}", [inter])])
        f = g.add(O.FusedMatMulBiasAct(None), [f, p(f"f2{i}", [inter, h], 0.03), p(f"fb2{i}", [h])])
        x = g.add(O.FusedResidualLayerNorm(1e-12), [f, x, p(f"g2{i}", [h], 0.1, True), p(f"b2{i}", [h], 0.1)])
    g.set_outputs([x])
    mv = np.ones((batch, seq), np.int64)
    mv[-1, seq // 2:] = 0
    feeds = [{"x": _f32(r, batch, seq, h), "mask": mv},
             {"x": _f32(r, 1, 1, h), "mask": np.ones((1, 1), np.int64)},  # q_len 1: the decode kernel
             {"x": _f32(r, 3, 29, h), "mask": np.ones((3, 29), np.int64)}]  # > 16 rows: 4-warp blocks
    return Case("minilm_like", g, feeds, params)


CASES["minilm_like"] = minilm_like


@case
def ssm_ops() -> Case:
    """selective_scan, gated_delta_net (from zero and from a given state) and the causal depthwise conv."""
    g = Graph("ssm_ops")
    seq = Dim.dynamic("seq", max=40)
    x, dt = g.input("x", [2, seq, 24]), g.input("dt", [2, seq, 24])
    bm, cm = g.input("bm", [2, seq, 16]), g.input("cm", [2, seq, 16])
    a = g.input("a", [24, 16])
    q, k, v = (g.input(n, [2, seq, 3, 32]) for n in ("q", "k", "v"))
    gate, beta = g.input("g", [2, seq, 3]), g.input("beta", [2, seq, 3])
    s0 = g.input("s0", [2, 3, 32, 32])
    w, pad = g.input("w", [24, 4]), g.input("pad", [2, 3, 24])
    g.set_outputs({"ssm": g.selective_scan(x, dt, a, bm, cm), "gdn": g.gated_delta_net(q, k, v, gate, beta),
                   "gdn_carry": g.gated_delta_net_carry(q, k, v, gate, beta, s0),
                   "conv": g.depthwise_conv1d_causal(x, w), "conv_pad": g.depthwise_conv1d_causal(x, w, pad),
                   "conv_rev": g.depthwise_conv1d_causal(x, w, reverse=True)})
    r = _rng(31)
    feeds = []
    for s in (40, 1):
        unit = lambda *shape: (lambda z: z / np.linalg.norm(z, axis=-1, keepdims=True))(_f32(r, *shape))  # noqa: E731
        feeds.append({"x": _f32(r, 2, s, 24), "dt": np.abs(_f32(r, 2, s, 24, scale=0.2)),
                      "bm": _f32(r, 2, s, 16), "cm": _f32(r, 2, s, 16), "a": -np.abs(_f32(r, 24, 16)) - 0.5,
                      "q": unit(2, s, 3, 32), "k": unit(2, s, 3, 32), "v": _f32(r, 2, s, 3, 32),
                      "g": -np.abs(_f32(r, 2, s, 3, scale=0.3)), "beta": np.abs(_f32(r, 2, s, 3, scale=0.5)),
                      "s0": _f32(r, 2, 3, 32, 32, scale=0.1), "w": _f32(r, 24, 4), "pad": _f32(r, 2, 3, 24)})
    return Case("ssm_ops", g, [{k: v.astype(np.float32) for k, v in f.items()} for f in feeds])




@case
def ssm_long() -> Case:
    """Prefill lengths that take the chunked selective scan (few rows x channels, a sequence of hundreds) and the
    chunked gated delta rule (state sizes 48 with a carried state, and 16), the column kernel at state size 128,
    state sizes that are not multiples of 32, and a decode step (the sequential / column kernels)."""
    g = Graph("ssm_long")
    seq = Dim.dynamic("seq", max=700)
    x, dt = g.input("x", [1, seq, 6]), g.input("dt", [1, seq, 6])
    bm, cm = g.input("bm", [1, seq, 40]), g.input("cm", [1, seq, 40])
    a = g.input("a", [6, 40])
    q, k, v = (g.input(n, [1, seq, 2, 128]) for n in ("q", "k", "v"))
    q2, k2, v2 = (g.input(n, [1, seq, 3, 48]) for n in ("q2", "k2", "v2"))
    gate, beta = g.input("g", [1, seq, 2]), g.input("beta", [1, seq, 2])
    gate2, beta2 = g.input("g2", [1, seq, 3]), g.input("beta2", [1, seq, 3])
    s0 = g.input("s0", [1, 3, 48, 48])
    q3, k3, v3 = (g.input(n, [2, seq, 2, 16]) for n in ("q3", "k3", "v3"))
    gate3, beta3 = g.input("g3", [2, seq, 2]), g.input("beta3", [2, seq, 2])
    g.set_outputs({"ssm": g.selective_scan(x, dt, a, bm, cm), "gdn128": g.gated_delta_net(q, k, v, gate, beta),
                   "gdn48": g.gated_delta_net_carry(q2, k2, v2, gate2, beta2, s0),
                   "gdn16": g.gated_delta_net(q3, k3, v3, gate3, beta3)})
    r = _rng(37)

    def unit(*shape: int) -> np.ndarray:
        z = _f32(r, *shape)
        return z / np.linalg.norm(z, axis=-1, keepdims=True)

    feeds = []
    for n in (700, 257, 1):
        feeds.append({"x": _f32(r, 1, n, 6), "dt": np.abs(_f32(r, 1, n, 6, scale=0.05)), "bm": _f32(r, 1, n, 40),
                      "cm": _f32(r, 1, n, 40), "a": -np.abs(_f32(r, 6, 40)) - 0.1,
                      "q": unit(1, n, 2, 128), "k": unit(1, n, 2, 128), "v": _f32(r, 1, n, 2, 128),
                      "g": -np.abs(_f32(r, 1, n, 2, scale=0.05)), "beta": np.abs(_f32(r, 1, n, 2, scale=0.5)),
                      "q2": unit(1, n, 3, 48), "k2": unit(1, n, 3, 48), "v2": _f32(r, 1, n, 3, 48),
                      "g2": -np.abs(_f32(r, 1, n, 3, scale=0.05)), "beta2": np.abs(_f32(r, 1, n, 3, scale=0.5)),
                      "s0": _f32(r, 1, 3, 48, 48, scale=0.1),
                      "q3": unit(2, n, 2, 16), "k3": unit(2, n, 2, 16), "v3": _f32(r, 2, n, 2, 16),
                      "g3": -np.abs(_f32(r, 2, n, 2, scale=0.05)), "beta3": np.abs(_f32(r, 2, n, 2, scale=0.5))})
    return Case("ssm_long", g, feeds)

def _scan_body(rows: int, width: int) -> Graph:
    """One RNN-like step: c' = tanh(c @ w + x) + 0.5 * relu(x) (a GEMM, a fused region, a constant)."""
    b = Graph("step")
    c, w, x = b.input("c", [rows, width]), b.input("w", [width, width]), b.input("x", [rows, width])
    h = b.activation("tanh", b.add_(b.matmul(c, w), x))
    b.set_outputs([b.add_(h, b.mul(b.activation("relu", x), b.constant(np.float32(0.5))))])
    return b


@case
def scan_loop() -> Case:
    """scan over a dynamic length (24, 1 and 7 steps): the final carry, the trajectory, a reversed trajectory."""
    g = Graph("scan_loop")
    length = Dim.dynamic("L", max=24)
    xs = g.input("xs", [length, 3, 16])
    c0, w = g.input("c0", [3, 16]), g.input("w", [16, 16])
    body = _scan_body(3, 16)
    g.set_outputs({"final": g.scan(body, c0, xs=[xs], bcasts=[w]),
                   "traj": g.scan(body, c0, xs=[xs], bcasts=[w], save_trajectory=True),
                   "rev": g.scan(body, c0, xs=[xs], bcasts=[w], save_trajectory=True, reverse=True)})
    r = _rng(41)
    feeds = [{"xs": _f32(r, n, 3, 16), "c0": _f32(r, 3, 16), "w": _f32(r, 16, 16, scale=0.25)} for n in (24, 1, 7)]
    return Case("scan_loop", g, feeds)


@case
def scan_ssm_body() -> Case:
    """A scan whose body holds an SSM op: a causal depthwise conv over a chunk of 4 rows per step, padded by
    the carry (2 rows), the next carry built from the chunk's last 2 rows (views feeding a region)."""
    g = Graph("scan_ssm_body")
    steps = Dim.dynamic("T", max=6)
    b = Graph("chunk")
    c, x = b.input("c", [1, 2, 8]), b.input("x", [1, 4, 8])
    y = b.depthwise_conv1d_causal(x, b.constant(np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3)), c)
    b.set_outputs([b.add_(b.narrow(y, 1, 2, 2), b.activation("sigmoid", b.narrow(x, 1, 2, 2)))])
    xs = g.input("xs", [steps, 1, 4, 8])
    c0 = g.input("c0", [1, 2, 8])
    g.set_outputs({"y": g.scan(b, c0, xs=[xs], save_trajectory=True)})
    r = _rng(43)
    feeds = [{"xs": _f32(r, n, 1, 4, 8), "c0": _f32(r, 1, 2, 8)} for n in (6, 2)]
    return Case("scan_ssm_body", g, feeds)

@case
def control_flow() -> Case:
    """cond (a GEMM branch or an elementwise one, both taken over the feeds) feeding a while_loop with
    max_trips: both run on the device predicate (rlx/codegen/cuda/control.py)."""
    g = Graph("control_flow")
    x, w = g.input("x", [4, 16]), g.input("w", [16, 16])
    t = Graph("gemm_branch")
    tx, tw = t.input("x", [4, 16]), t.input("w", [16, 16])
    t.set_outputs([t.activation("tanh", t.matmul(tx, tw))])
    f = Graph("relu_branch")
    fx, _ = f.input("x", [4, 16]), f.input("w", [16, 16])
    f.set_outputs([f.mul(f.activation("relu", fx), f.constant(np.float32(0.5)))])
    y = g.cond(g.compare("gt", g.reduce("sum", x), g.constant(np.float32(0))), t, f, [x, w])
    pred = Graph("small")
    pc = pred.input("c", [4, 16])
    pred.set_outputs([pred.compare("lt", pred.reduce("max", pred.activation("abs", pc)),
                                   pred.constant(np.float32(6.1)))])
    body = Graph("grow")
    bc = body.input("c", [4, 16])
    body.set_outputs([body.add_(body.mul(bc, body.constant(np.float32(1.5))), body.constant(np.float32(0.25)))])
    g.set_outputs({"y": y, "z": g.while_loop(pred, body, y, max_trips=12)})
    r = _rng(47)
    feeds = [{"x": np.abs(_f32(r, 4, 16)) + np.float32(0.1), "w": _f32(r, 16, 16, scale=0.25)},
             {"x": -np.abs(_f32(r, 4, 16)) - np.float32(0.1), "w": _f32(r, 16, 16, scale=0.25)}]
    return Case("control_flow", g, feeds, lowp=False)


@case
def user_op() -> Case:
    """A user-defined op (examples/custom_op's swish_beta, its CUDA body) between a GEMM and an activation, over a
    dynamic number of rows (f32 only: the example's body takes f32)."""
    from tests.ir.user_ops import swish_beta

    op = swish_beta()
    g = Graph("user_op")
    rows = Dim.dynamic("rows", max=64)
    x, w, beta = g.input("x", [rows, 32]), g.input("w", [32, 32]), g.input("beta", [])
    g.set_outputs({"y": g.activation("tanh", g.user_op(op.name, [g.matmul(x, w), beta]))})
    r = _rng(47)
    feeds = [{"x": _f32(r, n, 32), "w": _f32(r, 32, 32, scale=0.2), "beta": np.array(1.7, np.float32)}
             for n in (64, 3)]
    return Case("user_op", g, feeds, lowp=False)


def scale_of(arr: np.ndarray) -> float:
    a = np.asarray(arr, dtype=np.float64)
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


def rel_l2(out: np.ndarray, ref: np.ndarray) -> float:
    o = np.asarray(out, dtype=np.float64)
    f = np.asarray(ref, dtype=np.float64)
    den = math.sqrt(float(np.sum(f * f)))
    num = math.sqrt(float(np.sum((o - f) ** 2)))
    return num / den if den > 0 else num

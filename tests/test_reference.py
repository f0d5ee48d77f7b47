"""The numpy reference: every op against hand-computed values, and against PyTorch where it is installed.

Tolerances: graphs in f64 are compared tightly (1e-12: the same math in the
same precision, only the order of operations differs); f32 graphs at about
1e-6 relative (a few f32 roundings); narrow float types by exact bit equality
where both sides round one exactly computed value, else by a few units of
their last place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from rlx import reference
from rlx.errors import ExecutionError
from rlx.ir import ops as O
from rlx.ir.dtype import BFLOAT16, DType, bf16_to_f32, f32_to_bf16
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim, Shape


def _dtype_of(a: np.ndarray, dtype: DType | str | None) -> DType:
    return DType.parse(dtype) if dtype is not None else DType.parse(a.dtype)


def run_op(op: O.Op, *args: np.ndarray | float, dtypes: Sequence[DType | str | None] | None = None) -> np.ndarray:
    """Run one op on input arrays through a graph (so shape inference runs too)."""
    arrays = [np.asarray(a) for a in args]
    g = Graph("t")
    ids = [g.input(f"i{k}", a.shape, _dtype_of(a, dtypes[k] if dtypes else None)) for k, a in enumerate(arrays)]
    g.set_outputs([g.add(op, ids)])
    return reference.run(g, {f"i{k}": a for k, a in enumerate(arrays)})[0]


def bf16(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Round to bf16, returned as float32 (the boundary form of bf16)."""
    return bf16_to_f32(f32_to_bf16(np.asarray(values, np.float32)))


def f64(a: Sequence | np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float64)


# ── elementwise, hand-computed ──────────────────────────────────────────

PHI_1 = 0.8413447460685429  # standard normal CDF at 1


@pytest.mark.parametrize(("fn", "x", "want"), [
    ("relu", [-1.0, 0.0, 2.5], [0.0, 0.0, 2.5]),
    ("gelu", [1.0, 0.0, -1.0], [PHI_1, 0.0, -(1 - PHI_1)]),
    ("gelu_tanh", [1.0], [0.5 * (1 + math.tanh(math.sqrt(2 / math.pi) * 1.044715))]),
    ("silu", [1.0, 0.0], [1 / (1 + math.exp(-1)), 0.0]),
    ("sigmoid", [0.0, -800.0, 800.0], [0.5, 0.0, 1.0]),  # no overflow warning or NaN at the extremes
    ("tanh", [0.5], [math.tanh(0.5)]),
    ("exp", [1.0, 0.0], [math.e, 1.0]),
    ("log", [math.e, 1.0, 0.0], [1.0, 0.0, -math.inf]),
    ("sqrt", [4.0, 2.0], [2.0, math.sqrt(2)]),
    ("rsqrt", [4.0, 0.0], [0.5, math.inf]),
    ("neg", [1.5, -0.0], [-1.5, 0.0]),
    ("abs", [-3.0, 2.0], [3.0, 2.0]),
    ("sin", [math.pi / 2], [1.0]),
    ("cos", [0.0], [1.0]),
])
def test_activation_values(fn: str, x: list[float], want: list[float]) -> None:
    out = run_op(O.Activation(fn), f64(x))
    np.testing.assert_allclose(out, want, rtol=1e-14, atol=1e-300)


def test_activation_nan_and_integers() -> None:
    out = run_op(O.Activation("relu"), f64([np.nan, -1.0]))
    assert np.isnan(out[0]) and out[1] == 0.0  # relu propagates NaN rather than clamping it to 0
    assert np.isnan(run_op(O.Activation("sqrt"), f64([-1.0]))[0])
    for fn, want in (("relu", [0, 0, 5]), ("neg", [3, 0, -5]), ("abs", [3, 0, 5])):
        out = run_op(O.Activation(fn), np.array([-3, 0, 5], np.int32))
        assert out.dtype == np.int32 and out.tolist() == want


def test_binary_broadcasting_and_values() -> None:
    a = f64([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = f64([10.0, 20.0, 30.0])
    assert run_op(O.Binary("add"), a, b).tolist() == [[11, 22, 33], [14, 25, 36]]
    assert run_op(O.Binary("sub"), b, a).tolist() == [[9, 18, 27], [6, 15, 24]]
    assert run_op(O.Binary("mul"), a, f64([[2.0], [3.0]])).tolist() == [[2, 4, 6], [12, 15, 18]]
    assert run_op(O.Binary("div"), a, f64(2.0)).tolist() == [[0.5, 1, 1.5], [2, 2.5, 3]]
    assert run_op(O.Binary("pow"), f64([2.0, 9.0]), f64([3.0, 0.5])).tolist() == [8, 3]
    assert run_op(O.Binary("max"), f64([1.0, 5.0]), f64([3.0, 2.0])).tolist() == [3, 5]
    assert run_op(O.Binary("min"), f64([1.0, 5.0]), f64([3.0, 2.0])).tolist() == [1, 2]


def test_binary_nan_propagates_through_max_min() -> None:
    for fn in ("max", "min"):
        out = run_op(O.Binary(fn), f64([np.nan, 1.0]), f64([1.0, np.nan]))
        assert np.isnan(out).all()


def test_integer_division_truncates_toward_zero() -> None:
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    out = run_op(O.Binary("div"), a, b)
    assert out.dtype == np.int32 and out.tolist() == [3, -3, -3, 3, 0]  # C semantics, not floor
    with pytest.raises(ExecutionError, match="division by zero"):
        run_op(O.Binary("div"), a, np.zeros(5, np.int32))
    assert run_op(O.Binary("pow"), a, np.array([2, 3, 0, 1, 5], np.int32)).tolist() == [49, -343, 1, -7, 0]
    with pytest.raises(ExecutionError, match="negative exponent"):
        run_op(O.Binary("pow"), a, np.array([1, 1, -1, 1, 1], np.int32))


def test_compare_and_where() -> None:
    a, b = f64([1.0, 2.0, 3.0]), f64([2.0, 2.0, 2.0])
    want = {"eq": [0, 1, 0], "ne": [1, 0, 1], "lt": [1, 0, 0], "le": [1, 1, 0], "gt": [0, 0, 1], "ge": [0, 1, 1]}
    for fn, expected in want.items():
        out = run_op(O.Compare(fn), a, b)
        assert out.dtype == np.bool_ and out.tolist() == [bool(v) for v in expected]
    nan = run_op(O.Compare("ne"), f64([np.nan]), f64([np.nan]))
    assert nan.tolist() == [True]
    cond = np.array([[True], [False]])
    out = run_op(O.Where(), cond, f64([1.0, 2.0]), f64(-1.0))
    assert out.tolist() == [[1, 2], [-1, -1]]


def test_cast() -> None:
    x = np.array([-1.7, -0.5, 0.0, 0.5, 2.9], np.float32)
    assert run_op(O.Cast(DType.I32), x).tolist() == [-1, 0, 0, 0, 2]  # truncation toward zero
    assert run_op(O.Cast(DType.BOOL), x).tolist() == [True, True, False, True, True]
    assert run_op(O.Cast(DType.F32), np.array([True, False])).tolist() == [1.0, 0.0]
    out = run_op(O.Cast(DType.BF16), np.array([1.0 + 2**-9, 3.0], np.float32))
    assert out.dtype == BFLOAT16 and out.tolist() == [1.0, 3.0]  # bf16 boundary arrays are bfloat16 (ml_dtypes)
    out = run_op(O.Cast(DType.F16), np.array([1.0 + 2**-9, 70000.0], np.float32))
    assert out.dtype == np.float16 and out.tolist() == [1.0 + 2**-9, math.inf]
    assert run_op(O.Cast(DType.I8), np.array([300], np.int32)).tolist() == [44]  # wraps like C


# ── compute, hand-computed ──────────────────────────────────────────────


def test_matmul() -> None:
    a = f64([[1.0, 2.0], [3.0, 4.0]])
    b = f64([[5.0, 6.0], [7.0, 8.0]])
    assert run_op(O.MatMul(), a, b).tolist() == [[19, 22], [43, 50]]
    batched = run_op(O.MatMul(), np.stack([a, 2 * a]), b)  # b broadcasts over the batch
    assert batched.tolist() == [[[19, 22], [43, 50]], [[38, 44], [86, 100]]]


def test_reduce() -> None:
    x = f64([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert run_op(O.Reduce("sum", (1,)), x).tolist() == [6, 15]
    assert run_op(O.Reduce("mean", (0,), True), x).tolist() == [[2.5, 3.5, 4.5]]
    assert run_op(O.Reduce("max", ()), x).tolist() == 6
    assert run_op(O.Reduce("min", (-1,)), x).tolist() == [1, 4]
    assert run_op(O.Reduce("prod", (0, 1)), x).tolist() == 720
    assert run_op(O.Reduce("sum", ()), np.array([[1, 2], [3, 4]], np.int32)).tolist() == 10
    assert run_op(O.Reduce("sum", (0,)), np.zeros((0, 2))).tolist() == [0, 0]
    with pytest.raises(ExecutionError, match="empty"):
        run_op(O.Reduce("max", (0,)), np.zeros((0, 2)))
    # reducing a non-empty axis of an empty tensor is fine: the result is empty too
    assert run_op(O.Reduce("max", (1,)), np.zeros((0, 2))).shape == (0,)


def test_softmax() -> None:
    out = run_op(O.Softmax(), f64([[0.0, math.log(2)], [1000.0, 1000.0]]))
    np.testing.assert_allclose(out, [[1 / 3, 2 / 3], [0.5, 0.5]], rtol=1e-15)  # stable for large inputs
    out = run_op(O.Softmax(0), f64([[0.0], [math.log(3)]]))
    np.testing.assert_allclose(out, [[0.25], [0.75]], rtol=1e-15)


def test_layer_norm_and_rms_norm() -> None:
    x = f64([[1.0, 2.0, 3.0, 4.0]])
    g, b = f64([1.0, 2.0, 1.0, 1.0]), f64([0.0, 0.0, 0.0, 1.0])
    eps = 1e-5
    # mean 2.5, biased variance 1.25
    norm = (x - 2.5) / math.sqrt(1.25 + eps)
    np.testing.assert_allclose(run_op(O.LayerNorm(eps), x, g, b), norm * g + b, rtol=1e-15)
    xr = f64([[3.0, 4.0]])
    want = xr / math.sqrt(12.5 + 1e-6) * f64([1.0, 0.5])
    np.testing.assert_allclose(run_op(O.RmsNorm(1e-6), xr, f64([1.0, 0.5])), want, rtol=1e-15)


# ── shape ops, hand-computed ────────────────────────────────────────────


def test_shape_ops() -> None:
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    assert run_op(O.Reshape((3, -1)), x).tolist() == [[0, 1], [2, 3], [4, 5]]
    assert run_op(O.Transpose((1, 0)), x).tolist() == [[0, 3], [1, 4], [2, 5]]
    assert run_op(O.Narrow(1, 1, 2), x).tolist() == [[1, 2], [4, 5]]
    assert run_op(O.Narrow(-1, 3, 0), x).shape == (2, 0)
    assert run_op(O.Concat(0), x, x[:1]).tolist() == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]
    assert run_op(O.Expand((2, 2, 3)), x[:1]).tolist() == [[[0, 1, 2]] * 2] * 2


def test_gather() -> None:
    table = np.arange(12, dtype=np.float64).reshape(4, 3)
    idx = np.array([[3, 0], [1, 1]], np.int32)
    assert run_op(O.Gather(0), table, idx).tolist() == [[[9, 10, 11], [0, 1, 2]], [[3, 4, 5], [3, 4, 5]]]
    assert run_op(O.Gather(1), table, np.array([2], np.int64)).tolist() == [[2], [5], [8], [11]]
    with pytest.raises(ExecutionError, match=r"gather index 4 is out of range \[0, 4\)"):
        run_op(O.Gather(0), table, np.array([0, 4], np.int32))
    with pytest.raises(ExecutionError, match="index -1 is out of range"):
        run_op(O.Gather(0), table, np.array([-1], np.int32))  # no Python-style wrap-around


def test_dynamic_dims() -> None:
    seq = Dim.dynamic("seq", max=16)
    g = Graph("dyn")
    x = g.input("x", [2, seq, 3])
    flat = g.reshape(x, [-1, 3])
    ex = g.expand(g.reduce("sum", flat, [1], keep_dim=True), [2 * seq, 4])
    g.set_outputs([flat, ex])
    for n in (1, 5, 16):
        xv = np.arange(2 * n * 3, dtype=np.float32).reshape(2, n, 3)
        flat_v, ex_v = reference.run(g, {"x": xv})
        assert flat_v.shape == (2 * n, 3) and ex_v.shape == (2 * n, 4)
        np.testing.assert_array_equal(ex_v[:, 0], xv.reshape(-1, 3).sum(1))
    with pytest.raises(ExecutionError, match="seq=17 exceeds its bound 16"):
        reference.run(g, {"x": np.zeros((2, 17, 3), np.float32)})


# ── attention ───────────────────────────────────────────────────────────


def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, h: int, hkv: int, d: int,
                    allowed: np.ndarray | None = None, bias: np.ndarray | None = None,
                    scale: float | None = None) -> np.ndarray:
    """Loop-by-loop attention, written independently of the reference's vectorized form.

    `allowed[b, i, j]` says whether query i of batch b may see key j.
    """
    bsz, sq, _ = q.shape
    skv = k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((bsz, sq, h * d))
    for b in range(bsz):
        for head in range(h):
            kvh = head // (h // hkv)
            for i in range(sq):
                qv = q[b, i, head * d:(head + 1) * d]
                scores = []
                for j in range(skv):
                    s = float(qv @ k[b, j, kvh * d:(kvh + 1) * d]) * scale
                    if bias is not None:
                        s += float(np.broadcast_to(bias, (bsz, h, sq, skv))[b, head, i, j])
                    ok = allowed is None or allowed[b, i, j]
                    scores.append(s if ok else -math.inf)
                m = max(scores)
                if m == -math.inf:
                    continue  # a query that sees nothing yields zeros
                w = [math.exp(s - m) for s in scores]
                total = sum(w)
                for j in range(skv):
                    out[b, i, head * d:(head + 1) * d] += w[j] / total * v[b, j, kvh * d:(kvh + 1) * d]
    return out


def _attention(op: O.Attention, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               mask: np.ndarray | None = None) -> np.ndarray:
    args = [q, k, v] + ([mask] if mask is not None else [])
    return run_op(op, *args)


def _qkv(rng: np.random.Generator, b: int, sq: int, skv: int, h: int, hkv: int, d: int) -> tuple:
    return (rng.standard_normal((b, sq, h * d)), rng.standard_normal((b, skv, hkv * d)),
            rng.standard_normal((b, skv, hkv * d)))


def test_attention_hand_computed() -> None:
    # one head, d=1: scores are q*k/1; with q=ln2 and keys [0, 1] the weights are [1/3, 2/3]
    q = f64([[[math.log(2)]]])
    k = f64([[[0.0], [1.0]]])
    v = f64([[[3.0], [6.0]]])
    out = _attention(O.Attention(1, 1), q, k, v)
    np.testing.assert_allclose(out, [[[5.0]]], rtol=1e-15)
    # causal decode (Sq=1) sees the whole cache; causal prefill row 0 sees only key 0
    out = _attention(O.Attention(1, 1, "causal"), q, k, v)
    np.testing.assert_allclose(out, [[[5.0]]], rtol=1e-15)
    q2 = f64([[[1.0], [1.0]]])
    out = _attention(O.Attention(1, 1, "causal"), q2, k, v)
    np.testing.assert_allclose(out[0, 0], [3.0], rtol=1e-15)


@pytest.mark.parametrize(("mask", "sq", "skv", "h", "hkv"), [
    ("none", 3, 5, 2, 2),
    ("causal", 4, 4, 2, 2),
    ("causal", 2, 6, 4, 2),   # q_len < kv_len: bottom-right aligned (decode with a cache)
    ("causal", 5, 3, 2, 1),   # q_len > kv_len: the first rows see nothing and yield zeros
    ("padding", 3, 5, 4, 1),
    ("bias", 3, 4, 2, 2),
    ("none", 1, 7, 6, 3),     # grouped-query: 2 query heads per kv head
])
def test_attention_against_loops(rng: np.random.Generator, mask: str, sq: int, skv: int, h: int, hkv: int) -> None:
    d, b = 4, 2
    q, k, v = _qkv(rng, b, sq, skv, h, hkv, d)
    op = O.Attention(h, d, mask, num_kv_heads=hkv if hkv != h else None)
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    allowed = None
    extra = None
    bias = None
    if mask == "causal":
        allowed = np.broadcast_to(j <= i + (skv - sq), (b, sq, skv))
    elif mask == "padding":
        keep = np.array([[1] * skv, [1] * (skv - 2) + [0, 0]], np.int32)
        allowed = np.broadcast_to(keep[:, None, :] != 0, (b, sq, skv))
        extra = keep
    elif mask == "bias":
        bias = rng.standard_normal((sq, skv))
        bias[0, 1] = -np.inf
        extra = bias
    out = _attention(op, q, k, v, extra)
    want = naive_attention(q, k, v, h, hkv, d, allowed, bias)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    if mask == "causal" and sq > skv:
        assert not out[:, : sq - skv].any()


def test_attention_scale_and_fully_padded_batch(rng: np.random.Generator) -> None:
    q, k, v = _qkv(rng, 2, 2, 3, 2, 2, 4)
    out = _attention(O.Attention(2, 4, scale=0.1), q, k, v)
    np.testing.assert_allclose(out, naive_attention(q, k, v, 2, 2, 4, scale=0.1), rtol=1e-12)
    keep = np.array([[1, 1, 0], [0, 0, 0]], np.int32)
    out = _attention(O.Attention(2, 4, "padding"), q, k, v, keep)
    assert np.isfinite(out).all() and not out[1].any()  # zeros, not NaN


# ── rope ────────────────────────────────────────────────────────────────


def rope_tables(positions: np.ndarray, n_rot: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    angles = positions[:, None] * inv_freq[None, :]
    return np.cos(angles), np.sin(angles)


def test_rope_hand_computed() -> None:
    # head_dim 4, one head; rotate by 90 degrees (cos 0, sin 1) in pair 0 and by 0 in pair 1
    x = f64([[[1.0, 2.0, 3.0, 4.0]]])
    cos, sin = f64([[0.0, 1.0]]), f64([[1.0, 0.0]])
    # neox pairs (0,2) and (1,3): (x0, x2) -> (x0*c - x2*s, x2*c + x0*s) = (-3, 1); pair 1 unchanged
    neox = run_op(O.Rope(4), x, cos, sin)
    np.testing.assert_allclose(neox, [[[-3.0, 2.0, 1.0, 4.0]]], atol=1e-15)
    # interleaved pairs (0,1) and (2,3): (1, 2) -> (-2, 1); (3, 4) unchanged
    inter = run_op(O.Rope(4, variant="interleaved"), x, cos, sin)
    np.testing.assert_allclose(inter, [[[-2.0, 1.0, 3.0, 4.0]]], atol=1e-15)
    # partial rotation: only the first n_rot=2 dims of each head turn, in both heads
    x2 = f64([[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]]])
    part = run_op(O.Rope(4, 2), x2, f64([[0.0]]), f64([[1.0]]))
    np.testing.assert_allclose(part, [[[-2.0, 1.0, 3.0, 4.0, -6.0, 5.0, 7.0, 8.0]]], atol=1e-15)


@pytest.mark.parametrize("variant", ["neox", "interleaved"])
@pytest.mark.parametrize("n_rot", [None, 4])
def test_rope_preserves_pair_norms_and_relative_position(rng: np.random.Generator, variant: str,
                                                         n_rot: int | None) -> None:
    hd, s = 8, 6
    rot = n_rot or hd
    cos, sin = rope_tables(np.arange(s, dtype=np.float64), rot)
    x = rng.standard_normal((1, s, 2 * hd))
    out = run_op(O.Rope(hd, n_rot, variant), x, cos, sin)
    xh, oh = x.reshape(1, s, 2, hd), out.reshape(1, s, 2, hd)
    np.testing.assert_array_equal(oh[..., rot:], xh[..., rot:])  # the unrotated tail passes through
    pairs = (lambda t: np.stack([t[..., : rot // 2], t[..., rot // 2: rot]], -1)) if variant == "neox" else \
        (lambda t: np.stack([t[..., 0:rot:2], t[..., 1:rot:2]], -1))
    np.testing.assert_allclose(np.linalg.norm(pairs(oh), axis=-1), np.linalg.norm(pairs(xh), axis=-1), rtol=1e-12)
    # the same vector at positions p and p+1 vs 0 and 1: dot products depend only on the offset
    same = np.broadcast_to(x[:, :1], x.shape).copy()
    r = run_op(O.Rope(hd, n_rot, variant), same, cos, sin).reshape(s, 2, hd)
    np.testing.assert_allclose(r[1, 0] @ r[0, 0], r[4, 0] @ r[3, 0], rtol=1e-12)


# ── fused ops equal their unfused composition ───────────────────────────


def _both(build_fused, build_unfused, inputs: dict[str, tuple], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    g = Graph("fuse")
    ids = {name: g.input(name, arr.shape, dtype) for name, (arr, _) in inputs.items()}
    g.set_outputs([build_fused(g, ids), build_unfused(g, ids)])
    return tuple(reference.run(g, {n: a for n, (a, _) in inputs.items()}))


def _cast_for(dtype: str, a: np.ndarray) -> np.ndarray:
    if dtype == "bf16":
        return bf16(a)
    return a.astype(DType.parse(dtype).np)


FUSED_CASES = {
    "matmul_bias_act": (
        lambda g, i: g.add(O.FusedMatMulBiasAct("gelu"), [i["x"], i["w"], i["b"]]),
        lambda g, i: g.activation("gelu", g.add_(g.matmul(i["x"], i["w"]), i["b"])),
        {"x": (2, 3, 8), "w": (8, 5), "b": (5,)}),
    "matmul_no_bias": (
        lambda g, i: g.add(O.FusedMatMulBiasAct(None), [i["x"], i["w"]]),
        lambda g, i: g.matmul(i["x"], i["w"]),
        {"x": (3, 8), "w": (8, 5)}),
    "residual_layer_norm": (
        lambda g, i: g.add(O.FusedResidualLayerNorm(1e-5), [i["x"], i["r"], i["b"], i["gm"], i["bt"]]),
        lambda g, i: g.layer_norm(g.add_(g.add_(i["x"], i["r"]), i["b"]), i["gm"], i["bt"], 1e-5),
        {"x": (3, 8), "r": (3, 8), "b": (8,), "gm": (8,), "bt": (8,)}),
    "residual_layer_norm_no_bias": (
        lambda g, i: g.add(O.FusedResidualLayerNorm(1e-5), [i["x"], i["r"], i["gm"], i["bt"]]),
        lambda g, i: g.layer_norm(g.add_(i["x"], i["r"]), i["gm"], i["bt"], 1e-5),
        {"x": (3, 8), "r": (3, 8), "gm": (8,), "bt": (8,)}),
    "residual_rms_norm": (
        lambda g, i: g.add(O.FusedResidualRmsNorm(1e-6), [i["x"], i["r"], i["b"], i["gm"]]),
        lambda g, i: g.rms_norm(g.add_(g.add_(i["x"], i["r"]), i["b"]), i["gm"], 1e-6),
        {"x": (2, 2, 8), "r": (2, 2, 8), "b": (8,), "gm": (8,)}),
    "residual_rms_norm_no_bias": (
        lambda g, i: g.add(O.FusedResidualRmsNorm(1e-6), [i["x"], i["r"], i["gm"]]),
        lambda g, i: g.rms_norm(g.add_(i["x"], i["r"]), i["gm"], 1e-6),
        {"x": (2, 8), "r": (2, 8), "gm": (8,)}),
    "swiglu": (
        lambda g, i: g.add(O.FusedSwiGLU(), [i["x"], i["wg"], i["wu"]]),
        lambda g, i: g.mul(g.activation("silu", g.matmul(i["x"], i["wg"])), g.matmul(i["x"], i["wu"])),
        {"x": (3, 8), "wg": (8, 6), "wu": (8, 6)}),
}


@pytest.mark.parametrize("case", list(FUSED_CASES))
@pytest.mark.parametrize("dtype", ["f64", "f32", "bf16"])
def test_fused_equals_unfused(rng: np.random.Generator, case: str, dtype: str) -> None:
    fused, unfused, shapes = FUSED_CASES[case]
    inputs = {n: (_cast_for(dtype, rng.standard_normal(s)), s) for n, s in shapes.items()}
    a, b = _both(fused, unfused, inputs, dtype)
    if dtype == "f64":
        np.testing.assert_array_equal(a, b)  # same operations, same order, no rounding in between
    elif dtype == "f32":
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)  # the unfused form rounds 2-3 more times
    else:
        # fused rounds once, unfused after each op: they may differ by a few bf16 ulps (2**-8 relative)
        np.testing.assert_allclose(a, b, rtol=3 * 2**-8, atol=3 * 2**-8)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_elementwise_region_is_exactly_its_steps(rng: np.random.Generator, dtype: str) -> None:
    steps = (
        O.RegionStep(O.Binary("mul"), (0, 1)),
        O.RegionStep(O.Binary("add"), (2, 0)),
        O.RegionStep(O.Activation("silu"), (3,)),
        O.RegionStep(O.Compare("gt"), (4, 1)),
        O.RegionStep(O.Where(), (5, 4, 0)),
    )
    g = Graph("region")
    x = g.input("x", [4, 8], dtype)
    y = g.input("y", [8], dtype)
    fused = g.add(O.ElementwiseRegion(steps), [x, y])
    m = g.mul(x, y)
    s = g.activation("silu", g.add_(m, x))
    unfused = g.where(g.compare("gt", s, y), s, x)
    g.set_outputs([fused, unfused])
    xv = _cast_for(dtype, rng.standard_normal((4, 8)))
    yv = _cast_for(dtype, rng.standard_normal(8))
    a, b = reference.run(g, {"x": xv, "y": yv})
    np.testing.assert_array_equal(a, b)  # a region rounds every step to its dtype, like the unfused ops


# ── narrow float types ──────────────────────────────────────────────────


def test_bf16_and_f16_round_at_every_op() -> None:
    one_plus = np.array([1.0], np.float32)
    tiny = np.array([2.0**-9], np.float32)  # below half a bf16 ulp at 1.0, above half an f16 ulp
    bf = run_op(O.Binary("add"), one_plus, tiny, dtypes=["bf16", "bf16"])
    assert bf.dtype == BFLOAT16 and bf.tolist() == [1.0]
    hf = run_op(O.Binary("add"), one_plus.astype(np.float16), tiny.astype(np.float16))
    assert hf.dtype == np.float16 and hf.tolist() == [1.0 + 2**-9]
    # rounding between ops: (1 + t) + t in bf16 stays 1; in f32 it is 1 + 2t
    g = Graph("chain")
    a = g.input("a", [1], "bf16")
    b = g.input("b", [1], "bf16")
    g.set_outputs([g.add_(g.add_(a, b), b)])
    assert reference.run(g, {"a": one_plus, "b": tiny})[0].tolist() == [1.0]


def test_bf16_inputs_are_rounded_on_entry() -> None:
    # a bf16 input given values that are not bf16-representable is rounded (to nearest even)
    out = run_op(O.Activation("abs"), np.array([1.0 + 2**-8 + 2**-12, -3.0 - 2**-10], np.float32), dtypes=["bf16"])
    assert out.tolist() == [1.0 + 2**-7, 3.0]


def test_bf16_constants_and_matmul() -> None:
    g = Graph("bf")
    x = g.input("x", [2, 2], "bf16")
    c = g.constant(np.array([[1.0, 0.5], [0.25, 3.0]], np.float32), "bf16")
    g.set_outputs([g.matmul(x, c)])
    xv = bf16([[1.0, 2.0], [1.0 + 2**-7, -1.0]])
    out = reference.run(g, {"x": xv})[0]
    want = bf16(xv.astype(np.float64) @ np.array([[1.0, 0.5], [0.25, 3.0]]))
    np.testing.assert_array_equal(out, want)  # accumulate exactly, round once


def test_param_layout_is_applied_to_user_arrays() -> None:
    g = Graph("layout")
    x = g.input("x", [1, 3])
    w = g.add(O.Param("w", Shape.of([3, 2]), layout=(1, 0)), name="w")  # stored [3,2], user gives [2,3]
    g.set_outputs([g.matmul(x, w)])
    user_w = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    out = reference.run(g, {"x": np.array([[1.0, 1.0, 1.0]], np.float32)}, {"w": user_w})[0]
    assert out.tolist() == [[6.0, 15.0]]
    with pytest.raises(ExecutionError, match=r"param 'w' must have shape \(2, 3\)"):
        reference.run(g, {"x": np.ones((1, 3), np.float32)}, {"w": user_w.T})


def test_run_errors() -> None:
    g = Graph("errs")
    x = g.input("x", [Dim.dynamic("n", max=4), 2])
    p = g.param("p", [2])
    g.set_outputs([g.add_(x, p)])
    ok = {"x": np.zeros((3, 2), np.float32)}
    with pytest.raises(ExecutionError, match=r"missing inputs: \['x'\]"):
        reference.run(g, {}, {"p": np.zeros(2)})
    with pytest.raises(ExecutionError, match="unknown inputs"):
        reference.run(g, {**ok, "y": np.zeros(1)}, {"p": np.zeros(2)})
    with pytest.raises(ExecutionError, match="param 'p' was not given"):
        reference.run(g, ok)
    with pytest.raises(ExecutionError, match="must have rank 2"):
        reference.run(g, {"x": np.zeros(3, np.float32)}, {"p": np.zeros(2)})
    with pytest.raises(ExecutionError, match="axis 1 must be 2"):
        reference.run(g, {"x": np.zeros((3, 3), np.float32)}, {"p": np.zeros(2)})


# ── against PyTorch ─────────────────────────────────────────────────────


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is an optional peer for these comparisons")


def _t(torch, a: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize("fn", O.ACTIVATIONS)
def test_activations_vs_torch(torch, rng: np.random.Generator, fn: str) -> None:
    F = torch.nn.functional
    x = rng.standard_normal(64) * 3
    if fn in ("log", "sqrt", "rsqrt"):
        x = np.abs(x) + 0.01
    t = _t(torch, x)
    ref = {"gelu": lambda: F.gelu(t), "gelu_tanh": lambda: F.gelu(t, approximate="tanh"), "silu": lambda: F.silu(t),
           "relu": lambda: F.relu(t), "sigmoid": lambda: torch.sigmoid(t), "tanh": lambda: torch.tanh(t),
           "exp": lambda: torch.exp(t), "log": lambda: torch.log(t), "sqrt": lambda: torch.sqrt(t),
           "rsqrt": lambda: torch.rsqrt(t), "neg": lambda: -t, "abs": lambda: torch.abs(t),
           "sin": lambda: torch.sin(t), "cos": lambda: torch.cos(t), "softplus": lambda: F.softplus(t),
           "mish": lambda: F.mish(t), "hardswish": lambda: F.hardswish(t)}[fn]().numpy()
    np.testing.assert_allclose(run_op(O.Activation(fn), x), ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("fn", ["silu", "gelu", "exp"])
def test_narrow_activations_round_like_torch(torch, rng: np.random.Generator, dtype: str, fn: str) -> None:
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    x = _cast_for(dtype, rng.standard_normal(256))
    out = run_op(O.Activation(fn), x, dtypes=[dtype])
    # torch in f64 on the same (already rounded) inputs, then one conversion to the dtype: the value a
    # correctly rounding backend produces. (torch's own f32 gelu is not that accurate near zero.)
    t = _t(torch, x.astype(np.float64))
    want = getattr(torch.nn.functional, fn, getattr(torch, fn, None))(t).to(tdt).float().numpy()
    if dtype == "f32":
        np.testing.assert_array_equal(out, want)
    else:
        # the reference rounds f64 -> f32 -> dtype; that double rounding may land one ulp off near a tie
        ulp = 2**-7 if dtype == "bf16" else 2**-10
        np.testing.assert_allclose(out.astype(np.float32), want, rtol=ulp, atol=0)


@pytest.mark.parametrize("fn", O.BINARY_OPS)
def test_binary_vs_torch(torch, rng: np.random.Generator, fn: str) -> None:
    a = rng.standard_normal((3, 1, 4))
    b = rng.standard_normal((5, 1))
    if fn == "pow":
        a = np.abs(a) + 0.1
    ta, tb = _t(torch, a), _t(torch, b)
    want = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
            "min": torch.minimum, "pow": torch.pow, "fmod": torch.fmod}[fn](ta, tb).numpy()
    np.testing.assert_allclose(run_op(O.Binary(fn), a, b), want, rtol=1e-14)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("fn", ["add", "mul", "sub"])
def test_narrow_binary_bit_exact_vs_torch(torch, rng: np.random.Generator, dtype: str, fn: str) -> None:
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    a = _cast_for(dtype, rng.standard_normal(512) * 4)
    b = _cast_for(dtype, rng.standard_normal(512))
    out = run_op(O.Binary(fn), a, b, dtypes=[dtype, dtype])
    want = getattr(torch, fn)(_t(torch, a.astype(np.float32)).to(tdt), _t(torch, b.astype(np.float32)).to(tdt))
    np.testing.assert_array_equal(out.astype(np.float32), want.float().numpy())  # one rounding of an exact value


def test_integer_division_vs_torch(torch) -> None:
    a = np.array([7, -7, 7, -7, 9, -1], np.int64)
    b = np.array([2, 2, -2, -2, 3, 5], np.int64)
    want = torch.div(_t(torch, a), _t(torch, b), rounding_mode="trunc").numpy()
    np.testing.assert_array_equal(run_op(O.Binary("div"), a, b), want)


@pytest.mark.parametrize("fn", O.COMPARE_OPS)
def test_compare_and_where_vs_torch(torch, rng: np.random.Generator, fn: str) -> None:
    a = rng.integers(-2, 3, (4, 3)).astype(np.float64)
    b = rng.integers(-2, 3, (3,)).astype(np.float64)
    want = getattr(torch, fn)(_t(torch, a), _t(torch, b)).numpy()
    cond = run_op(O.Compare(fn), a, b)
    np.testing.assert_array_equal(cond, want)
    np.testing.assert_array_equal(run_op(O.Where(), cond, a, b),
                                  torch.where(_t(torch, want), _t(torch, a), _t(torch, b)).numpy())


@pytest.mark.parametrize(("src", "dst"), [("f32", "i32"), ("f32", "bf16"), ("f32", "f16"), ("f32", "bool"),
                                          ("i32", "f32"), ("f64", "i64"), ("bool", "f32"), ("i32", "i8")])
def test_cast_vs_torch(torch, rng: np.random.Generator, src: str, dst: str) -> None:
    tdt = {"i32": torch.int32, "bf16": torch.bfloat16, "f16": torch.float16, "bool": torch.bool,
           "f32": torch.float32, "i64": torch.int64, "i8": torch.int8}[dst]
    x = (rng.standard_normal(200) * 100).astype(DType.parse(src).np) if src != "bool" else rng.random(200) > 0.5
    if (src, dst) == ("i32", "i8"):
        x = rng.integers(-100, 100, 200).astype(np.int32)  # in range: out-of-range narrowing differs across libs
    out = run_op(O.Cast(DType.parse(dst)), x)
    want = _t(torch, x).to(tdt)
    want = want.float().numpy() if dst == "bf16" else want.numpy()
    np.testing.assert_array_equal(out, want)


def test_matmul_vs_torch(torch, rng: np.random.Generator) -> None:
    a = rng.standard_normal((2, 1, 3, 8))
    b = rng.standard_normal((4, 8, 5))
    np.testing.assert_allclose(run_op(O.MatMul(), a, b), torch.matmul(_t(torch, a), _t(torch, b)).numpy(),
                               rtol=1e-12)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    # f32: torch accumulates in f32, the reference in f64 then rounds: ~sqrt(K) ulps apart at most
    np.testing.assert_allclose(run_op(O.MatMul(), a32, b32), torch.matmul(_t(torch, a32), _t(torch, b32)).numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("fn", "axes", "keep"), [("sum", (1,), False), ("mean", (0, 2), True), ("max", (), False),
                                                  ("min", (-1,), True), ("prod", (1, 2), False)])
def test_reduce_vs_torch(torch, rng: np.random.Generator, fn: str, axes: tuple, keep: bool) -> None:
    x = rng.standard_normal((3, 4, 5))
    t = _t(torch, x)
    dims = axes or tuple(range(3))
    if fn == "prod":
        want = t
        for d in sorted(dims, reverse=True):
            want = torch.prod(want, dim=d, keepdim=keep)
    else:
        want = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[fn](t, dim=dims,
                                                                                             keepdim=keep)
    np.testing.assert_allclose(run_op(O.Reduce(fn, axes, keep), x), want.numpy(), rtol=1e-12)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_vs_torch(torch, rng: np.random.Generator, axis: int) -> None:
    x = rng.standard_normal((3, 4, 5)) * 10
    want = torch.softmax(_t(torch, x), dim=axis).numpy()
    np.testing.assert_allclose(run_op(O.Softmax(axis), x), want, rtol=1e-12, atol=1e-15)


def test_norms_vs_torch(torch, rng: np.random.Generator) -> None:
    F = torch.nn.functional
    x = rng.standard_normal((2, 3, 16)) * 3 + 1
    g, b = rng.standard_normal(16), rng.standard_normal(16)
    want = F.layer_norm(_t(torch, x), (16,), _t(torch, g), _t(torch, b), eps=1e-5).numpy()
    np.testing.assert_allclose(run_op(O.LayerNorm(1e-5), x, g, b), want, rtol=1e-12, atol=1e-12)
    want = F.rms_norm(_t(torch, x), (16,), _t(torch, g), eps=1e-6).numpy()
    np.testing.assert_allclose(run_op(O.RmsNorm(1e-6), x, g), want, rtol=1e-12, atol=1e-12)


def test_shape_ops_vs_torch(torch, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 4))
    t = _t(torch, x)
    np.testing.assert_array_equal(run_op(O.Reshape((4, -1)), x), t.reshape(4, -1).numpy())
    np.testing.assert_array_equal(run_op(O.Transpose((2, 0, 1)), x), t.permute(2, 0, 1).numpy())
    np.testing.assert_array_equal(run_op(O.Narrow(1, 1, 2), x), t.narrow(1, 1, 2).numpy())
    np.testing.assert_array_equal(run_op(O.Concat(-1), x, x[..., :1]), torch.cat([t, t[..., :1]], -1).numpy())
    np.testing.assert_array_equal(run_op(O.Expand((5, 2, 3, 4)), x), t.expand(5, 2, 3, 4).numpy())
    for axis in (0, 1, 2):
        idx = rng.integers(0, x.shape[axis], (2, 3)).astype(np.int64)
        want = torch.index_select(t, axis, _t(torch, idx.reshape(-1)))
        want = want.reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1:]).numpy()
        np.testing.assert_array_equal(run_op(O.Gather(axis), x, idx), want)


def torch_attention(torch, q, k, v, h: int, hkv: int, d: int, mask: str, extra=None, scale=None) -> np.ndarray:
    F = torch.nn.functional
    b, sq, _ = q.shape
    skv = k.shape[1]
    qh = _t(torch, q).view(b, sq, h, d).transpose(1, 2)
    kh = _t(torch, k).view(b, skv, hkv, d).transpose(1, 2)
    vh = _t(torch, v).view(b, skv, hkv, d).transpose(1, 2)
    attn_mask = None
    if mask == "causal":  # bottom-right aligned: query i sees keys j <= i + skv - sq
        attn_mask = torch.ones(sq, skv, dtype=torch.bool).tril(diagonal=skv - sq)
    elif mask == "padding":
        attn_mask = _t(torch, extra != 0)[:, None, None, :]
    elif mask == "bias":
        attn_mask = _t(torch, extra)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attn_mask, scale=scale, enable_gqa=hkv != h)
    return out.transpose(1, 2).reshape(b, sq, h * d).numpy()


@pytest.mark.parametrize(("mask", "sq", "skv", "h", "hkv", "scale"), [
    ("none", 4, 4, 4, 4, None),
    ("none", 3, 7, 4, 1, 0.2),     # multi-query
    ("causal", 6, 6, 2, 2, None),
    ("causal", 1, 9, 8, 2, None),  # decode step with a cache, grouped-query
    ("causal", 3, 8, 4, 2, None),  # chunked prefill against a longer cache
    ("padding", 5, 5, 4, 2, None),
    ("bias", 4, 6, 2, 2, None),
    ("bias", 2, 3, 4, 4, 1.5),
])
def test_attention_vs_torch(torch, rng: np.random.Generator, mask: str, sq: int, skv: int, h: int, hkv: int,
                            scale: float | None) -> None:
    d, b = 8, 2
    q, k, v = _qkv(rng, b, sq, skv, h, hkv, d)
    extra = None
    if mask == "padding":
        extra = np.ones((b, skv), np.int32)
        extra[1, -2:] = 0
    elif mask == "bias":
        extra = rng.standard_normal((b, h, sq, skv)) if scale else rng.standard_normal((1, 1, sq, skv))
    op = O.Attention(h, d, mask, scale, hkv)
    out = _attention(op, q, k, v, extra)
    want = torch_attention(torch, q, k, v, h, hkv, d, mask, extra, scale)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_attention_narrow_vs_torch(torch, rng: np.random.Generator, dtype: str) -> None:
    h, hkv, d, sq, skv = 4, 2, 16, 5, 7
    q, k, v = (_cast_for(dtype, a) for a in _qkv(rng, 1, sq, skv, h, hkv, d))
    g = Graph("att")
    ids = [g.input(n, a.shape, dtype) for n, a in zip("qkv", (q, k, v))]
    g.set_outputs([g.attention(*ids, num_heads=h, head_dim=d, mask="causal", num_kv_heads=hkv)])
    out = reference.run(g, dict(zip("qkv", (q, k, v))))[0]
    # exact math on the rounded inputs (float64 torch), rounded once: within one ulp of the output dtype
    want = torch_attention(torch, q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), h, hkv, d,
                           "causal")
    ulp = 2**-23 if dtype == "f32" else 2**-8
    np.testing.assert_allclose(out, want, rtol=ulp, atol=ulp)


def torch_rope(torch, x, cos, sin, hd: int, rot: int, variant: str) -> np.ndarray:
    b, s, total = x.shape
    xt = _t(torch, x).view(b, s, total // hd, hd)
    xr, tail = xt[..., :rot], xt[..., rot:]
    c = _t(torch, cos)[None, :, None, :]
    sn = _t(torch, sin)[None, :, None, :]
    if variant == "neox":  # rotate_half, as in GPT-NeoX / LLaMA
        c2, s2 = torch.cat([c, c], -1), torch.cat([sn, sn], -1)
        half = rot // 2
        rotated = torch.cat([-xr[..., half:], xr[..., :half]], -1)
    else:  # rotate_every_two, as in GPT-J
        c2, s2 = c.repeat_interleave(2, -1), sn.repeat_interleave(2, -1)
        rotated = torch.stack([-xr[..., 1::2], xr[..., 0::2]], -1).flatten(-2)
    out = torch.cat([xr * c2 + rotated * s2, tail], -1)
    return out.reshape(b, s, total).numpy()


@pytest.mark.parametrize("variant", ["neox", "interleaved"])
@pytest.mark.parametrize(("hd", "n_rot"), [(8, None), (16, 8), (64, 16)])
def test_rope_vs_torch(torch, rng: np.random.Generator, variant: str, hd: int, n_rot: int | None) -> None:
    s = 7
    rot = n_rot or hd
    cos, sin = rope_tables(np.arange(3, 3 + s, dtype=np.float64), rot)
    x = rng.standard_normal((2, s, 3 * hd))
    out = run_op(O.Rope(hd, n_rot, variant), x, cos, sin)
    np.testing.assert_allclose(out, torch_rope(torch, x, cos, sin, hd, rot, variant), rtol=1e-13, atol=1e-14)


def test_fused_ops_vs_torch(torch, rng: np.random.Generator) -> None:
    F = torch.nn.functional
    x, w, bias = rng.standard_normal((2, 3, 8)), rng.standard_normal((8, 6)), rng.standard_normal(6)
    tx, tw, tb = _t(torch, x), _t(torch, w), _t(torch, bias)
    np.testing.assert_allclose(run_op(O.FusedMatMulBiasAct("gelu_tanh"), x, w, bias),
                               F.gelu(tx @ tw + tb, approximate="tanh").numpy(), rtol=1e-12, atol=1e-14)
    wu = rng.standard_normal((8, 6))
    np.testing.assert_allclose(run_op(O.FusedSwiGLU(), x, w, wu), (F.silu(tx @ tw) * (tx @ _t(torch, wu))).numpy(),
                               rtol=1e-12, atol=1e-14)
    r, b8, g8, be8 = (rng.standard_normal(s) for s in ((2, 3, 8), 8, 8, 8))
    want = F.layer_norm(tx + _t(torch, r) + _t(torch, b8), (8,), _t(torch, g8), _t(torch, be8), 1e-5).numpy()
    np.testing.assert_allclose(run_op(O.FusedResidualLayerNorm(1e-5), x, r, b8, g8, be8), want, rtol=1e-12,
                               atol=1e-12)
    want = F.rms_norm(tx + _t(torch, r), (8,), _t(torch, g8), 1e-6).numpy()
    np.testing.assert_allclose(run_op(O.FusedResidualRmsNorm(1e-6), x, r, g8), want, rtol=1e-12, atol=1e-12)
    region = O.ElementwiseRegion((O.RegionStep(O.Binary("sub"), (0, 1)), O.RegionStep(O.Activation("tanh"), (2,))))
    np.testing.assert_allclose(run_op(region, x, r), torch.tanh(tx - _t(torch, r)).numpy(), rtol=1e-14)


@pytest.mark.parametrize("paged", [False, True])
def test_f8_cache_stores_rounded_and_saturated(paged: bool) -> None:
    """An f8e4m3fn KV cache holds each new key and value rounded to 8 bits, saturating at +-448 (CUDA's satfinite
    conversion; ml_dtypes' own cast would make NaN), and attention reads the cache as stored."""
    import ml_dtypes

    f8 = ml_dtypes.float8_e4m3fn
    r = np.random.default_rng(3)
    q = r.standard_normal((1, 1, 32))
    k = np.array([[[1000.0, -1000.0, 0.3, 447.9] * 4]])
    v = np.array([[[-500.0, 465.0, 1e-4, 2.0] * 4]])
    op = O.CachedAttention(num_heads=2, head_dim=16, num_kv_heads=1, page_size=4 if paged else None)
    kc, vc = (np.zeros((2, 4, 16) if paged else (1, 8, 16), f8) for _ in range(2))
    table = (np.array([[1, 0]], np.int32),) if paged else ()
    out = reference.cached_attention(q, k, v, kc, vc, np.array([5 if paged else 3], np.int32), op, *table)
    row = kc[0, 1] if paged else kc[0, 3]
    np.testing.assert_array_equal(row.astype(np.float32)[:4], [448.0, -448.0, 0.3125, 448.0])
    vrow = (vc[0, 1] if paged else vc[0, 3]).astype(np.float32)
    np.testing.assert_array_equal(vrow[:4], [-448.0, 448.0, np.float32(f8(1e-4)), 2.0])
    assert np.isfinite(out).all()


def test_bf16_cache_holds_rounded_bit_patterns() -> None:
    """A bf16 KV cache reaches the reference as uint16 bit patterns (numpy has no bf16): new keys and values are
    stored as their rounded bits and read back as bf16 values, equal to attention over an f32 cache holding the
    same rounded values."""
    r = np.random.default_rng(4)
    q, k, v = (r.standard_normal((1, 2, w)) for w in (32, 16, 16))
    op = O.CachedAttention(num_heads=2, head_dim=16, num_kv_heads=1)
    past = r.standard_normal((1, 8, 16)).astype(np.float32)
    kc, vc = f32_to_bf16(past), f32_to_bf16(past[:, ::-1])
    kf, vf = bf16_to_f32(kc), bf16_to_f32(vc)
    out = reference.cached_attention(q, k, v, kc, vc, np.array([3], np.int32), op)
    k16, v16 = (bf16_to_f32(f32_to_bf16(x.astype(np.float32))) for x in (k, v))
    want = reference.cached_attention(q, k16, v16, kf, vf, np.array([3], np.int32), op)
    np.testing.assert_array_equal(kc[0, 3:5], f32_to_bf16(k[0].astype(np.float32)))
    np.testing.assert_array_equal(out, want)

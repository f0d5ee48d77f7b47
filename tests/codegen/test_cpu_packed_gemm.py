"""RLX's packed GEMM: matmuls whose right operand is a param (weights packed at set_param).

Every kernel variant the build can pick is exercised: the AVX-512 12x32 kernel (a native
build on a CPU with AVX-512), the AVX2/FMA 6x16 kernel (RLX_CPU_TARGET=x86-64-v3) and the
portable path (RLX_CPU_TARGET=x86-64: the weight stays row-major and BLAS or the C GEMM
multiplies). A target the CPU cannot run is skipped with the reason.

Shapes probe the tiling: M not a multiple of the tile rows (12 / 6) nor of the row block
(8 tiles), N not a multiple of the panel width (32 / 16) and N below one panel, K below
16 and K spanning several 2048-long K slices (partial sums through C). Tolerance: as in
test_cpu_gemm, (k+2) u (|a| @ |b|) for the product (Higham, Thm 3.5), 1.2x that plus a few
ulps for a fused activation.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from cpu_helpers import assert_within, compile_graph, cpu_flags, gemm_bound

import rlx
from rlx.ir import ops as O
from rlx.ir.decisions import GemmSiblings

_FLAGS = cpu_flags()
_X86 = os.uname().machine in ("x86_64", "AMD64")


def _target(name: str) -> str:
    """Config.cpu_target for a kernel variant, or pytest.skip when this machine cannot run it."""
    if name == "native":
        return "native"
    if not _X86:
        pytest.skip(f"{name} is an x86-64 target; this machine is {os.uname().machine}")
    if name == "x86-64-v3" and not {"avx2", "fma"} <= _FLAGS:
        pytest.skip("the CPU lacks AVX2/FMA, so an x86-64-v3 build cannot run here")
    return name


TARGETS = ["native", "x86-64-v3", "x86-64"]

# (M, K, N): tile-row, row-block, panel and K-slice edges
EDGE_SHAPES = [
    (1, 1, 1),
    (5, 3, 7),  # K < 16, N < one panel
    (13, 40, 33),  # one row past a 12-row tile; one column past a panel
    (16, 384, 384),  # a short sentence through a MiniLM projection
    (97, 64, 100),  # one row past a 96-row block; N not a multiple of 16 or 32
    (7, 4500, 20),  # three K slices: partial sums through C, bias on the last
]


def _linear_graph(m: int, k: int, n: int, act: str | None) -> rlx.Graph:
    g = rlx.Graph("linear")
    x = g.input("x", [m, k])
    w = g.param("w", [k, n])
    b = g.param("b", [n])
    g.set_outputs({"fused": g.add(O.FusedMatMulBiasAct(act), [x, w, b]),
                   "plain": g.matmul(x, w)})
    return g


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", EDGE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_edge_shapes(rng, target, shape):
    m, k, n = shape
    g = _linear_graph(m, k, n, "gelu")
    params = {"w": rng.standard_normal((k, n)).astype(np.float32),
              "b": rng.standard_normal(n).astype(np.float32)}
    xv = rng.standard_normal((m, k)).astype(np.float32)
    cg = compile_graph(g, params, cpu_target=_target(target))
    assert "packed for the GEMM kernel on set" in cg.source
    assert cg.source.count("rlx_pgemm(M, N, K") == 2
    got = cg.run(x=xv)
    want = rlx.reference.run(g, {"x": xv}, params)
    bound = gemm_bound(xv, params["w"], k)
    assert_within(got[1], want[1], bound + 1e-30, f"x @ w {shape} on {target}")
    assert_within(got[0], want[0], 1.2 * bound + 2e-6 * np.abs(want[0]) + 1e-7, f"gelu(x @ w + b) {shape}")


@pytest.mark.parametrize("target", TARGETS)
def test_every_epilogue(rng, target):
    """Each activation the packed kernel applies to its tiles, with and without bias, in one graph."""
    acts = [None, "gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "neg", "abs"]
    g = rlx.Graph("epilogues")
    x = g.input("x", [2, 15, 24])
    w = g.param("w", [24, 37])
    b = g.param("b", [37])
    outs = {}
    for act in acts:
        outs[f"bias_{act}"] = g.add(O.FusedMatMulBiasAct(act), [x, w, b])
        outs[f"nobias_{act}"] = g.add(O.FusedMatMulBiasAct(act), [x, w])
    g.set_outputs(outs)
    params = {"w": rng.standard_normal((24, 37)).astype(np.float32),
              "b": rng.standard_normal(37).astype(np.float32)}
    xv = rng.standard_normal((2, 15, 24)).astype(np.float32)
    cg = compile_graph(g, params, cpu_target=_target(target))
    assert cg.source.count("rlx_pgemm(M, N, K") == len(outs)
    got = cg.run(x=xv)
    want = rlx.reference.run(g, {"x": xv}, params)
    bound = gemm_bound(xv, params["w"], 24)
    for name, a, b_ in zip(g.output_names, got, want):
        assert_within(a, b_, 1.2 * bound + 2e-6 * np.abs(b_) + 1e-7, f"{name} on {target}")


def _siblings_graph(m: int, k: int, n: int, members: list[int], acts: list[str | None]) -> rlx.Graph:
    """GEMMs of one input x with weights w{i} and biases b{i} (i in `members`), each read by an add of z (so their
    values live in the arena, as a layer's Q, K and V do, and come out exactly)."""
    g = rlx.Graph("siblings")
    x = g.input("x", [m, k])
    z = g.input("z", [m, n])
    ys = [g.add(O.FusedMatMulBiasAct(acts[i]), [x, g.param(f"w{i}", [k, n]), g.param(f"b{i}", [n])]) for i in members]
    g.set_outputs({f"y{i}": g.add_(y, z) for i, y in zip(members, ys)})
    return g


@pytest.mark.parametrize(("m", "k", "n"), [(16, 384, 384), (97, 64, 96), (1, 40, 32), (200, 33, 64)])
def test_sibling_gemms_one_region(rng, m, k, n):
    """Consecutive GEMMs of one input with packed weights of one shape run as one parallel region (GemmSiblings,
    where the target has AVX-512): each product bit for bit what it is alone, within the GEMM bound of the reference
    (rows past a 96-row block, one row, one panel, a GELU member among plain ones)."""
    acts = [None, "gelu", None]
    params = {}
    for i in range(3):
        params[f"w{i}"] = rng.standard_normal((k, n)).astype(np.float32)
        params[f"b{i}"] = rng.standard_normal(n).astype(np.float32)
    feed = {"x": rng.standard_normal((m, k)).astype(np.float32), "z": np.zeros((m, n), np.float32)}
    g = _siblings_graph(m, k, n, [0, 1, 2], acts)
    cg = compile_graph(g, params)
    groups = cg.lir.decided(GemmSiblings)
    assert len(groups) == (1 if "avx512f" in cpu_flags() else 0)
    got = cg.run(feed)
    want = rlx.reference.run(g, feed, params)
    bound = gemm_bound(feed["x"], params["w0"], k)
    for i in range(3):
        assert_within(got[i], want[i], 1.2 * bound + 2e-6 * np.abs(want[i]) + 1e-7, f"member {i}")
        alone_g = _siblings_graph(m, k, n, [i], acts)
        alone = compile_graph(alone_g, {f"w{i}": params[f"w{i}"], f"b{i}": params[f"b{i}"]})
        assert not alone.lir.decided(GemmSiblings)
        np.testing.assert_array_equal(got[i].view(np.int32), alone.run(feed)[0].view(np.int32))


# gelu's special values (kernels/scalar.h): tails, the 0.75 range switch, the -16 cut, inf, NaN
GELU_SPECIALS = [np.inf, -np.inf, np.nan, -16.0, -15.99, -20.0, 16.0, 20.0, 0.75, -0.75, 0.7499999,
                 -0.7499999, 13.5, -13.5, 1e-30, -1e-30, 3e38, -3e38, 1e-45, 5.0, -5.0, 0.0]


@pytest.mark.parametrize("target", TARGETS)
def test_gelu_epilogue_matches_elementwise_gelu(rng, target):
    """The erf GELU epilogue (kernels/vgelu.h on the micro-kernel's ISAs, several vectors in flight)
    gives exactly what the elementwise gelu (rlx_gelu_f per element) gives on the same GEMM output,
    bit for bit, on every tile shape (13 rows: a short row group; 37 columns: a masked panel) and
    on gelu's special values (x = 0 makes C the bias), and both agree with the reference."""
    m, k, n = 13, 40, 37
    g = rlx.Graph("gelu_epilogue")
    x = g.input("x", [m, k])
    w = g.param("w", [k, n])
    b = g.param("b", [n])
    h = g.add(O.FusedMatMulBiasAct(None), [x, w, b])
    g.set_outputs({"fused": g.add(O.FusedMatMulBiasAct("gelu"), [x, w, b]), "h": h,
                   "elementwise": g.activation("gelu", h)})
    params = {"w": rng.standard_normal((k, n)).astype(np.float32),
              "b": rng.standard_normal(n).astype(np.float32)}
    cg = compile_graph(g, params, cpu_target=_target(target))
    assert cg.source.count("rlx_pgemm(M, N, K") == 2
    specials = np.resize(np.array(GELU_SPECIALS, dtype=np.float32), n)
    # |h| ~ 3: both of rlx_gelu_f's ranges (the switch at 0.75) and its tails
    cases = [(params, 0.5 * rng.standard_normal((m, k)).astype(np.float32)),
             ({**params, "b": specials}, np.zeros((m, k), np.float32))]
    for case, (ps, xv) in enumerate(cases):
        cg.set_param("b", ps["b"])
        fused, hv, elementwise = cg.run(x=xv)
        np.testing.assert_array_equal(fused.view(np.int32), elementwise.view(np.int32),
                                      err_msg=f"case {case} on {target}: epilogue gelu != elementwise gelu")
        want = rlx.reference.run(g, {"x": xv}, ps)
        bound = gemm_bound(xv, ps["w"], k)
        assert_within(hv, want[1], bound + 1e-30, f"x @ w + b, case {case} on {target}")
        # gelu of the computed h: rtol 5e-7 (rlx_gelu_f's bound, test_cpu_elementwise); -16 and below -> -0
        ref = rlx.reference.run(_gelu_graph(m, n), {"h": hv}, {})[0]
        np.testing.assert_allclose(elementwise, ref, rtol=5e-7, atol=0, err_msg=f"case {case} on {target}")
        if case == 1:
            assert np.signbit(elementwise[0, 3]) and elementwise[0, 3] == 0.0  # gelu(-16) = -0


def _gelu_graph(m: int, n: int) -> rlx.Graph:
    g = rlx.Graph("gelu")
    g.set_outputs([g.activation("gelu", g.input("h", [m, n]))])
    return g


@pytest.mark.parametrize("target", TARGETS)
def test_batched_and_broadcast_param(rng, target):
    """A batched weight [3, K, N] against x [2, 3, M, K], and a weight broadcast over x's batch."""
    g = rlx.Graph("batched")
    x = g.input("x", [2, 3, 14, 20])
    w3 = g.param("w3", [3, 20, 35])
    wb = g.param("wb", [2, 1, 20, 9])
    b = g.param("b", [35])
    g.set_outputs({"per_head": g.add(O.FusedMatMulBiasAct("relu"), [x, w3, b]),
                   "broadcast": g.matmul(x, wb)})
    params = {"w3": rng.standard_normal((3, 20, 35)).astype(np.float32),
              "wb": rng.standard_normal((2, 1, 20, 9)).astype(np.float32),
              "b": rng.standard_normal(35).astype(np.float32)}
    xv = rng.standard_normal((2, 3, 14, 20)).astype(np.float32)
    cg = compile_graph(g, params, cpu_target=_target(target))
    assert cg.source.count("(packed for the GEMM kernel on set)") == 2
    got = cg.run(x=xv)
    want = rlx.reference.run(g, {"x": xv}, params)
    bound = gemm_bound(xv, params["w3"], 20)
    assert_within(got[0], want[0], 1.2 * bound + 2e-6 * np.abs(want[0]) + 1e-7, "relu(x @ w3 + b)")
    assert_within(got[1], want[1], gemm_bound(xv, params["wb"], 20) + 1e-30, "x @ wb")


@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("target", TARGETS)
def test_transposed_weights(rng, target, opt_level):
    """PyTorch-layout weights [out, in] used as w.T: opt_level 0 folds the transpose into the GEMM,
    opt_level 2 turns it into a param layout; either way set_param takes the [out, in] array and
    packing reads it with swapped strides (no transpose pass)."""
    g = rlx.Graph("torch_linear")
    x = g.input("x", [3, 19, 40])
    w = g.param("w", [50, 40])
    wh = g.param("wh", [3, 7, 40])  # per-batch weights, transposed on their last two axes
    b = g.param("b", [50])
    y = g.add_(g.matmul(x, g.transpose(w, [1, 0])), b)
    z = g.matmul(x, g.transpose(wh, [0, 2, 1]))
    g.set_outputs({"y": y, "z": z})
    params = {"w": rng.standard_normal((50, 40)).astype(np.float32),
              "wh": rng.standard_normal((3, 7, 40)).astype(np.float32),
              "b": rng.standard_normal(50).astype(np.float32)}
    xv = rng.standard_normal((3, 19, 40)).astype(np.float32)
    cg = compile_graph(g, params, cpu_target=_target(target), opt_level=opt_level)
    assert cg.source.count("(packed for the GEMM kernel on set)") == 2
    got = cg.run(x=xv)
    want = rlx.reference.run(g, {"x": xv}, params)
    # the bias add is one more rounding of a value of size |x||w| + |b|
    bound_y = gemm_bound(xv, params["w"].T, 40) + 2 * 2.0 ** -24 * (np.abs(want[0]) + np.abs(params["b"]))
    assert_within(got[0], want[0], bound_y, f"x @ w.T + b (opt {opt_level}, {target})")
    assert_within(got[1], want[1], gemm_bound(xv, params["wh"].transpose(0, 2, 1), 40) + 1e-30, "x @ wh^T")


def test_dynamic_rows_and_threads(rng):
    """One build serves every row count; the tile split is right for 1 thread and for several."""
    seq = rlx.Dim.dynamic("seq", max=70)
    g = rlx.Graph("dyn")
    x = g.input("x", [2, seq, 48])
    w = g.param("w", [48, 70])
    b = g.param("b", [70])
    g.set_outputs([g.add(O.FusedMatMulBiasAct("gelu_tanh"), [x, w, b])])
    params = {"w": rng.standard_normal((48, 70)).astype(np.float32),
              "b": rng.standard_normal(70).astype(np.float32)}
    cg = compile_graph(g, params)
    for threads in (1, 2, 3):
        cg.num_threads = threads
        for s in (1, 6, 7, 49, 70):
            xv = rng.standard_normal((2, s, 48)).astype(np.float32)
            got = cg.run(x=xv)[0]
            want = rlx.reference.run(g, {"x": xv}, params)[0]
            bound = 1.2 * gemm_bound(xv, params["w"], 48) + 2e-6 * np.abs(want) + 1e-7
            assert_within(got, want, bound, f"seq={s} threads={threads}")


def test_row_balanced_tile_split(rng):
    """Threads split the tiles by rows (rlx_pgemm_split): boundaries inside a row block, a short last
    block, more threads than blocks; every row of C is computed once, as the reference computes it."""
    m, k, n = 2 * 96 + 40, 24, 70  # 2 full AVX-512 row blocks (4 AVX2 ones) and a 40-row one
    g = _linear_graph(m, k, n, "gelu")
    params = {"w": rng.standard_normal((k, n)).astype(np.float32),
              "b": rng.standard_normal(n).astype(np.float32)}
    cg = compile_graph(g, params)
    assert "rlx_pgemm_split(M, N, rlx_thread_id(), rlx_team_size(), &t0, &t1)" in cg.source
    xv = rng.standard_normal((m, k)).astype(np.float32)
    want = rlx.reference.run(g, {"x": xv}, params)
    bound = gemm_bound(xv, params["w"], k)
    for threads in (1, 2, 3, 7):
        cg.num_threads = threads
        got = cg.run(x=xv)
        assert_within(got[1], want[1], bound + 1e-30, f"x @ w on {threads} threads")
        assert_within(got[0], want[0], 1.2 * bound + 2e-6 * np.abs(want[0]) + 1e-7, f"gelu on {threads} threads")


def test_set_param_again_and_clone(rng):
    """Setting a packed weight again replaces it everywhere; a clone keeps the packed copy."""
    g = _linear_graph(9, 30, 41, None)
    w1, w2 = (rng.standard_normal((30, 41)).astype(np.float32) for _ in range(2))
    b = rng.standard_normal(41).astype(np.float32)
    cg = compile_graph(g, {"w": w1, "b": b})
    xv = rng.standard_normal((9, 30)).astype(np.float32)
    twin = cg.clone()
    cg.set_param("w", w2)
    for model, w in ((cg, w2), (twin, w1)):
        got = model.run(x=xv)[1]
        want = rlx.reference.run(g, {"x": xv}, {"w": w, "b": b})[1]
        assert_within(got, want, gemm_bound(xv, w, 30) + 1e-30, "x @ w")


def test_params_with_other_readers_stay_unpacked(rng):
    """A weight also read by an elementwise op, or used as a left operand, keeps the plain layout."""
    g = rlx.Graph("shared")
    x = g.input("x", [6, 12])
    w = g.param("w", [12, 12])
    v = g.param("v", [12, 5])
    g.set_outputs({"xw": g.matmul(x, w), "w2": g.add_(w, w), "wv": g.matmul(w, v)})
    params = {"w": rng.standard_normal((12, 12)).astype(np.float32),
              "v": rng.standard_normal((12, 5)).astype(np.float32)}
    xv = rng.standard_normal((6, 12)).astype(np.float32)
    cg = compile_graph(g, params)
    # v is only a right operand: packed; w is also added and multiplied from the left: not packed
    assert cg.source.count("(packed for the GEMM kernel on set)") == 1
    got = cg.run(x=xv)
    want = rlx.reference.run(g, {"x": xv}, params)
    assert_within(got[0], want[0], gemm_bound(xv, params["w"], 12) + 1e-30, "x @ w")
    np.testing.assert_array_equal(got[1], want[1])
    assert_within(got[2], want[2], gemm_bound(params["w"], params["v"], 12) + 1e-30, "w @ v")


def test_set_param_checks_size(rng):
    g = _linear_graph(4, 8, 10, None)
    cg = compile_graph(g)
    with pytest.raises(rlx.errors.ExecutionError, match="shape"):
        cg.set_param("w", np.zeros((10, 8), np.float32))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mask", ["causal", "padding"])
def test_attention_on_packed_kernel(rng, target, mask):
    """Fused attention packs each (batch, kv head)'s K^T and V for the kernel when >= 8 query rows share
    them: head_dim 48 and Skv 75 leave partial panels; grouped-query heads (6 over 2) share one packing.
    Tolerance as in test_cpu_attention: rtol 1e-5 + atol 2e-6 on unit-normal inputs."""
    from cpu_helpers import check

    b, sq, skv, h, hkv, d = 2, 70, 75, 6, 2, 48
    g = rlx.Graph(f"attn_packed_{mask}")
    q = g.input("q", [b, sq, h * d])
    k = g.input("k", [b, skv, hkv * d])
    v = g.input("v", [b, skv, hkv * d])
    feed = {"q": rng.standard_normal((b, sq, h * d)).astype(np.float32),
            "k": rng.standard_normal((b, skv, hkv * d)).astype(np.float32),
            "v": rng.standard_normal((b, skv, hkv * d)).astype(np.float32)}
    m = None
    if mask == "padding":
        m = g.input("m", [b, skv], "i64")
        mv = np.ones((b, skv), np.int64)
        mv[0, 40:] = 0
        feed["m"] = mv
    g.set_outputs([g.attention(q, k, v, num_heads=h, head_dim=d, num_kv_heads=hkv, mask=mask, mask_input=m)])
    cg = compile_graph(g, cpu_target=_target(target))
    check(g, feed, rtol=1e-5, atol=2e-6, cg=cg)

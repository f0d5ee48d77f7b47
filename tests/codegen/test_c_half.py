"""CPU GEMMs on f16/bf16 weights (rlx.codegen.cpu.half, kernels/gemm_bf16.h) against the reference.

Tolerances come from the dtypes. The f32 product of K terms is within (K + 2) u32 (|A| @ |B|) of the
exact one (u32 = 2^-24; `gemm_bound`). Weights are read exactly (bf16 and f16 widen to f32 without
error), so that bound holds wherever the activations stay f32: f16 weights on every build, bf16
weights on builds without AVX512_BF16. With AVX512_BF16 the kernel rounds the activations to bf16
(8 significant bits, round to nearest even: relative error at most 2^-8 per element) and multiplies
bf16 pairs exactly in f32 (vdpbf16ps; with AMX-BF16 and K a multiple of 32 the tile unit, TDPBF16PS, whose sums
may take another order): within the f32 bound of the reference run on the rounded activations, and within 2^-8
(|A| @ |B|) more of the exact product.
"""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.ir import ops as O
from rlx.ir.dtype import BFLOAT16, DType
from rlx.toolchain.isa import cpu_flags, required_features
from tests.codegen.cpu_helpers import U32, compile_graph

#: Unit roundoff of bf16 (8 significant bits).
U_BF16 = 2.0 ** -8
NARROW = {"bf16": BFLOAT16, "f16": np.float16}
HAS_BF16_DOT = "avx512_bf16" in (cpu_flags() or ())

#: (name, A shape, B shape, bias, activation, B a param): odd K, M = 1, N not a multiple of 16, a batch
#: of 3-D activations, batched weights, K past the kernel's 2048-deep slices, and B an input (not packed).
CASES = [
    ("m1", (1, 7), (7, 5), False, None, True),
    ("gelu", (13, 33), (33, 50), True, "gelu", True),
    ("rows", (2, 37, 130), (130, 70), True, None, True),
    ("batched", (2, 5, 9), (2, 9, 40), False, None, True),
    ("deep", (13, 2101), (2101, 40), False, None, True),
    ("input_b", (3, 8), (8, 20), False, None, False),
    # K a multiple of 32 (the AMX tile path where the CPU has AMX-BF16): 32-row chunks, the last one short; a panel
    # of 6 and one of 16 columns; three 96-row blocks, the last of 8 rows; one row
    ("tiles", (37, 64), (64, 70), True, "gelu", True),
    ("blocks", (2, 100, 96), (96, 48), True, None, True),
    ("one", (1, 32), (32, 33), False, None, True),
]


def _graph(dtype: str) -> rlx.Graph:
    g = rlx.Graph(f"half_{dtype}")
    outs = []
    for name, a_shape, b_shape, bias, act, is_param in CASES:
        x = g.input(f"x_{name}", list(a_shape))
        w = g.param(f"w_{name}", list(b_shape), dtype) if is_param else g.input(f"w_{name}", list(b_shape), dtype)
        if bias or act:
            args = [x, w] + ([g.param(f"b_{name}", [b_shape[-1]])] if bias else [])
            outs.append(g.add(O.FusedMatMulBiasAct(act), args))
        else:
            outs.append(g.matmul(x, w))
    g.set_outputs(outs)
    return g


def _data(dtype: str) -> tuple[dict, dict]:
    rng = np.random.default_rng(7)
    inputs, params = {}, {}
    for name, a_shape, b_shape, bias, _act, is_param in CASES:
        inputs[f"x_{name}"] = rng.standard_normal(a_shape).astype(np.float32)
        (params if is_param else inputs)[f"w_{name}"] = rng.standard_normal(b_shape).astype(NARROW[dtype])
        if bias:
            params[f"b_{name}"] = rng.standard_normal(b_shape[-1]).astype(np.float32)
    return inputs, params


def _check(dtype: str, cpu_target: str, rounds_activations: bool) -> None:
    g = _graph(dtype)
    inputs, params = _data(dtype)
    cg = compile_graph(g, params, cpu_target=cpu_target)
    got = cg.run(dict(inputs))
    want = rlx.reference.run(g, dict(inputs), dict(params))
    rounded = {k: (v.astype(BFLOAT16).astype(np.float32) if k.startswith("x_") else v) for k, v in inputs.items()}
    want_rounded = rlx.reference.run(g, rounded, dict(params)) if rounds_activations else want
    for i, (name, _a, b_shape, bias, act, packed) in enumerate(CASES):
        k = b_shape[-2]
        w = (params.get(f"w_{name}", inputs.get(f"w_{name}"))).astype(np.float64)
        a = np.abs(inputs[f"x_{name}"].astype(np.float64))
        mags = a @ np.abs(w) + (np.abs(params[f"b_{name}"]) if bias else 0.0)
        # gelu is 1.13-Lipschitz; its own evaluation adds a few f32 roundings of the result
        slope, extra = (1.13, 8 * U32 * np.abs(want[i])) if act else (1.0, 0.0)
        exact_rounding = (k + 2) * U32 * mags
        assert got[i].dtype == np.float32 and got[i].shape == want[i].shape, name
        if rounds_activations and packed:  # (B an input: widened, then the f32 GEMM)
            # the semantics: bf16 activations times bf16 weights, f32 sums
            assert np.all(np.abs(got[i] - want_rounded[i]) <= slope * exact_rounding + extra), name
            loose = slope * (U_BF16 + (k + 2) * U32) * mags + extra
            assert np.all(np.abs(got[i] - want[i]) <= loose), name
            # and the activations really were rounded (not an f32 product in disguise)
            if name == "rows":
                assert np.abs(got[i] - want[i]).max() > 4 * exact_rounding.max()
        else:
            assert np.all(np.abs(got[i] - want[i]) <= slope * exact_rounding + extra), name


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_native_build_matches_the_reference(dtype: str) -> None:
    _check(dtype, "native", rounds_activations=dtype == "bf16" and HAS_BF16_DOT)


@pytest.mark.parametrize(("cpu_target", "dtype"), [("x86-64-v4", "bf16"), ("x86-64-v3", "bf16"), ("x86-64-v3", "f16"),
                                                    ("x86-64", "bf16"), ("x86-64", "f16")])
def test_portable_paths_multiply_the_exact_weights(cpu_target: str, dtype: str) -> None:
    # no AVX512_BF16 in these levels: panels are widened (a shift for bf16, F16C or rlx_h2f for f16)
    # and the f32 kernel (AVX-512, AVX2) or rlx_sgemm1 (x86-64) multiplies them, f32 activations unrounded
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 levels")
    missing = sorted(set(required_features(cpu_target)) - set(cpu_flags() or ()))
    if missing:  # code built for the level would die of an illegal instruction here
        pytest.skip(f"this CPU cannot run {cpu_target} code (lacks {', '.join(missing)})")
    _check(dtype, cpu_target, rounds_activations=False)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_rows_values_do_not_depend_on_how_many_rows_the_call_has(dtype: str) -> None:
    """The kernel a bf16 GEMM takes (the tile unit, vdpbf16ps pieces of 12 / 8 / 4 / 2 / 1 rows) never depends on
    the row count, so a sentence's embedding is the same alone or in a batch: rows 0-4 of a 200-row product equal
    the 5-row product's, bit for bit."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((384, 100)).astype(NARROW[dtype])
    b = rng.standard_normal(100).astype(np.float32)
    x = rng.standard_normal((200, 384)).astype(np.float32)
    outs = []
    for m in (200, 5, 1):
        g = rlx.Graph(f"rows_{dtype}_{m}")
        args = [g.input("x", [m, 384]), g.param("w", [384, 100], dtype), g.param("b", [100])]
        g.set_outputs([g.add(O.FusedMatMulBiasAct("gelu"), args)])
        outs.append(compile_graph(g, {"w": w, "b": b}).run({"x": x[:m]})[0])
    np.testing.assert_array_equal(outs[0][:5], outs[1])
    np.testing.assert_array_equal(outs[0][:1], outs[2])


def test_weights_are_stored_in_their_precision_and_packed() -> None:
    g = _graph("bf16")
    cg = compile_graph(g, _data("bf16")[1])
    params = {p["name"]: p for p in cg.manifest["params"]}
    assert params["w_rows"]["dtype"] == "bf16"
    from rlx.driver import lower_to_lir
    from rlx.ir.decisions import PackedParam
    from rlx.opt.lowering import lower_for

    lir = lower_for(lower_to_lir(g, 0, backend="cpu"), "cpu")
    packed = {lir.graph.node(d.node).op.name for d in lir.decided(PackedParam)}
    assert {"w_m1", "w_gelu", "w_rows", "w_batched", "w_deep"} <= packed
    assert not any(n.kind == "cast" for n in lir.graph.nodes)  # no widening anywhere


def test_mixed_dtypes_are_checked() -> None:
    g = rlx.Graph("bad")
    x = g.input("x", [2, 4], "f16")
    with pytest.raises(rlx.ShapeError, match="one dtype"):
        g.matmul(x, g.param("w", [4, 3], "bf16"))
    with pytest.raises(rlx.ShapeError, match="one dtype"):
        g.matmul(g.input("y", [2, 4], "bf16"), g.param("v", [4, 3]))
    ok = g.matmul(g.input("z", [2, 4]), g.param("u", [4, 3], "f16"))
    assert g.node(ok).shape.dtype is DType.F32


def test_two_threads_under_address_sanitizer() -> None:
    """The bf16 and f16 GEMMs of CASES on one and two spinning threads, built with -fsanitize=address: the same
    values on both (a thread's tiles never change an element's sums), no report. (The AMX path's tile loads are
    not instrumented; its padding rows, bias loads and stores are.)"""
    from pathlib import Path

    from cpu_helpers import run_with_two_spinning_threads_under_asan

    script = (
        "import numpy as np, rlx\n"
        "from test_c_half import _graph, _data\n"
        "for dtype in ('bf16', 'f16'):\n"
        "    g = _graph(dtype)\n"
        "    inputs, params = _data(dtype)\n"
        "    cg = rlx.Session().compile(g, num_threads=2, opt_level=0)\n"
        "    for k, v in params.items(): cg.set_param(k, v)\n"
        "    outs = []\n"
        "    for t in (1, 2):\n"
        "        cg.num_threads = t\n"
        "        outs.append(cg.run(dict(inputs)))\n"
        "    for a, b in zip(*outs):\n"
        "        np.testing.assert_array_equal(a, b)\n"
        "print('HALF-ASAN-OK')\n")
    run_with_two_spinning_threads_under_asan(script, "HALF-ASAN-OK", Path(__file__).resolve().parent)

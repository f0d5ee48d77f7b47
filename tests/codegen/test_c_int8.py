"""The CPU's dynamic int8 linear layer (`int8_matmul`, kernels/int8_gemm.h) against the reference.

Every kernel variant the build can pick runs: AVX-512 VNNI (a native build on a CPU with it),
AVX2 (RLX_CPU_TARGET=x86-64-v3) and the portable C path (x86-64). Shapes probe the layout and
tiling: K not a multiple of 4 (the vpdpbusd group) nor of 16 (the quantizer's vector), N below
and past one 32-column panel, M = 1, one row past a 12-row tile, more rows than one 48-row
block; on one thread, and on two (rows split between the threads, or panels: in a child process
with spinning threads, as a sleeping team runs products this small on the calling thread).

The integers must match exactly: with inputs whose scales are exactly 1 (every row and column
holds +-127 and integers) the result is the integer product itself; on random data the kernel's
f32 epilogue matches the reference bit for bit too (same roundings in the same order).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from cpu_helpers import session

import rlx
from rlx.codegen.backends import supports
from rlx.errors import BuildError, ExecutionError

# (M, K, N)
#: ... and K a multiple of 64 with 16 rows or more (the AMX tile path where the CPU has AMX-INT8: 32- and
#: 16-row chunks, a 5-row rest on the vector tile, a 6-column last panel)
SHAPES = [(1, 1, 1), (1, 7, 33), (13, 67, 31), (50, 130, 70), (3, 16, 64), (37, 128, 70)]


def _target(name: str) -> str:
    if name == "native":
        return name
    if os.uname().machine not in ("x86_64", "AMD64"):
        pytest.skip(f"{name} is an x86-64 target")
    return name


def _graph(shapes: list[tuple[int, int, int]], *, bias: bool = True, act: str | None = None) -> rlx.Graph:
    g = rlx.Graph("int8")
    outs = []
    for i, (m, k, n) in enumerate(shapes):
        x = g.input(f"x{i}", [m, k])
        w = g.param(f"w{i}", [k, n])
        b = g.param(f"b{i}", [n]) if bias else None
        outs.append(g.int8_matmul(x, w, b, activation=act))
    g.set_outputs(outs)
    return g


def _unit_scale(rng: np.random.Generator, rows: int, cols: int, axis: int) -> np.ndarray:
    """Integers in [-127, 127] with +-127 in every slice along `axis` (so the scale is exactly 1)."""
    v = rng.integers(-127, 128, size=(rows, cols)).astype(np.float32)
    if axis == 1:
        v[np.arange(rows), rng.integers(0, cols, rows)] = rng.choice([-127.0, 127.0], rows)
    else:
        v[rng.integers(0, rows, cols), np.arange(cols)] = rng.choice([-127.0, 127.0], cols)
    return v


def _compile(g: rlx.Graph, params: dict, target: str, threads: int) -> rlx.CompiledGraph:
    cg = session(cpu_target=_target(target)).compile(g, num_threads=threads)
    for name, value in params.items():
        cg.set_param(name, value)
    return cg


@pytest.mark.parametrize("target", ["native", "x86-64-v3", "x86-64"])
def test_kernel_matches_the_reference_bit_for_bit(target: str) -> None:
    """Outputs 0..4: scales exactly 1, so the result is the integer product; 5..9: random data."""
    rng = np.random.default_rng(1)
    g = _graph(SHAPES + SHAPES)
    inputs, params, exact = {}, {}, []
    for i, (m, k, n) in enumerate(SHAPES):
        x, w = _unit_scale(rng, m, k, axis=1), _unit_scale(rng, k, n, axis=0)
        b = rng.integers(-1000, 1000, n).astype(np.float32)
        inputs[f"x{i}"], params[f"w{i}"], params[f"b{i}"] = x, w, b
        exact.append((x.astype(np.int64) @ w.astype(np.int64) + b.astype(np.int64)).astype(np.float32))
    for i, (m, k, n) in enumerate(SHAPES, start=len(SHAPES)):
        inputs[f"x{i}"] = rng.standard_normal((m, k)).astype(np.float32)
        params[f"w{i}"] = rng.standard_normal((k, n)).astype(np.float32)
        params[f"b{i}"] = rng.standard_normal(n).astype(np.float32)
    ref = rlx.reference.run(g, inputs, params)
    cg = _compile(g, params, target, 1)
    for threads in (1, 2):  # (two threads split only bigger products: test_two_threads_under_address_sanitizer)
        cg.num_threads = threads
        got = cg.run(inputs)
        for i, want in enumerate(exact):
            np.testing.assert_array_equal(got[i], want, err_msg=f"integer product, shape {SHAPES[i]}")
        for i, (a, b) in enumerate(zip(got, ref)):
            np.testing.assert_array_equal(a, b, err_msg=f"output {i}, {threads} threads")


def test_without_bias_on_two_threads() -> None:
    rng = np.random.default_rng(2)
    g = _graph(SHAPES, bias=False)
    inputs = {f"x{i}": rng.standard_normal((m, k)).astype(np.float32) for i, (m, k, _) in enumerate(SHAPES)}
    params = {f"w{i}": rng.standard_normal((k, n)).astype(np.float32) for i, (_, k, n) in enumerate(SHAPES)}
    got = _compile(g, params, "native", 2).run(inputs)
    for a, b in zip(got, rlx.reference.run(g, inputs, params)):
        np.testing.assert_array_equal(a, b)


def test_fused_activation_and_dynamic_rows() -> None:
    rng = np.random.default_rng(3)
    g = rlx.Graph("act")
    rows = rlx.Dim.dynamic("rows", max=64)
    x = g.input("x", [rows, 40])
    g.set_outputs([g.int8_matmul(x, g.param("w", [40, 36]), g.param("b", [36]), activation="gelu")])
    params = {"w": rng.standard_normal((40, 36)).astype(np.float32), "b": rng.standard_normal(36).astype(np.float32)}
    cg = _compile(g, params, "native", 2)
    for m in (1, 12, 64):
        feed = {"x": rng.standard_normal((m, 40)).astype(np.float32)}
        want = rlx.reference.run(g, feed, params)[0]
        np.testing.assert_allclose(cg.run(feed)[0], want, rtol=4e-6, atol=1e-6)  # C GELU vs numpy erf (see below)


@pytest.mark.parametrize("target", ["native", "x86-64-v3", "x86-64"])
def test_fused_gelu_over_its_whole_range(target: str) -> None:
    """GELU in the tile epilogue (rlx_i8_gelu16 on AVX-512, rlx_gelu_f otherwise) on pre-activations
    from -30 to 30 (the bias spreads them), +-inf and NaN; odd shapes, one and two threads (SPLIT_SHAPES
    split by rows and by panels over the spinning team). rlx_i8_gelu16's error is absolute (<= 4.3e-7,
    at most 0.21x this tolerance, measured on a 1e-4 grid over [-30, 30]), rlx_gelu_f's a few ulps."""
    rng = np.random.default_rng(8)
    shapes = [(13, 67, 70), *SPLIT_SHAPES]
    g = _graph(shapes, act="gelu")
    inputs, params = {}, {}
    for i, (m, k, n) in enumerate(shapes):
        inputs[f"x{i}"] = rng.standard_normal((m, k)).astype(np.float32)
        params[f"w{i}"] = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        b = np.linspace(-30, 30, n).astype(np.float32)
        b[[1, 2, 3]] = [np.inf, -np.inf, np.nan]
        params[f"b{i}"] = b
    want = rlx.reference.run(g, inputs, params)
    cg = _compile(g, params, target, 2)
    for threads in (1, 2):
        cg.num_threads = threads
        for i, (a, b) in enumerate(zip(cg.run(inputs), want)):
            assert np.isposinf(a[:, 1]).all() and np.isnan(a[:, 2:4]).all()
            np.testing.assert_allclose(a, b, rtol=4e-6, atol=1e-6, err_msg=f"shape {shapes[i]}, {threads} threads")


def test_few_rows_on_four_threads_share_one_quantization() -> None:
    """Few rows (M < threads x 24): the threads split the panels and quantize the rows once, each a
    share, with team barriers; 70 rows on 4 threads is two blocks of rows (48 + 22), 3 rows on 4
    threads leaves a thread without rows to quantize. Bit for bit as the reference, as on 1 thread."""
    rng = np.random.default_rng(9)
    shapes = [(70, 201, 260), (3, 700, 1000)]
    g = _graph(shapes)
    inputs = {f"x{i}": rng.standard_normal((m, k)).astype(np.float32) for i, (m, k, _) in enumerate(shapes)}
    params = {f"w{i}": rng.standard_normal((k, n)).astype(np.float32) for i, (_, k, n) in enumerate(shapes)}
    params |= {f"b{i}": rng.standard_normal(n).astype(np.float32) for i, (_, _, n) in enumerate(shapes)}
    want = rlx.reference.run(g, inputs, params)
    cg = _compile(g, params, "native", 4)
    for threads in (4, 3, 1):
        cg.num_threads = threads
        for a, b in zip(cg.run(inputs), want):
            np.testing.assert_array_equal(a, b, err_msg=f"{threads} threads")


def test_set_param_quantizes_each_new_weight() -> None:
    rng = np.random.default_rng(4)
    g = _graph([(4, 20, 9)], bias=False)
    x = {"x0": rng.standard_normal((4, 20)).astype(np.float32)}
    w1, w2 = (rng.standard_normal((20, 9)).astype(np.float32) for _ in range(2))
    cg = _compile(g, {"w0": w1}, "native", 1)
    first = cg.run(x)[0]
    cg.set_param("w0", w2)
    np.testing.assert_array_equal(cg.run(x)[0], rlx.reference.run(g, x, {"w0": w2})[0])
    cg.set_param("w0", w1)
    np.testing.assert_array_equal(cg.run(x)[0], first)
    with pytest.raises(ExecutionError, match="shape"):
        cg.set_param("w0", np.zeros((9, 20), np.float32))


def test_user_layout_of_a_pytorch_weight() -> None:
    """rlx.quantize of x @ W.T (W [out, in], PyTorch's layout): set_param still takes W as is."""
    rng = np.random.default_rng(5)
    g = rlx.Graph("lin")
    x, w, b = g.input("x", [3, 10]), g.param("w", [6, 10]), g.param("b", [6])
    g.set_outputs([g.activation("relu", g.add_(g.matmul(x, g.transpose(w, [1, 0])), b))])
    q = rlx.quantize(g, "int8-dynamic")
    params = {"w": rng.standard_normal((6, 10)).astype(np.float32), "b": rng.standard_normal(6).astype(np.float32)}
    feed = {"x": rng.standard_normal((3, 10)).astype(np.float32)}
    got = _compile(q, params, "native", 1).run(feed)[0]
    np.testing.assert_array_equal(got, rlx.reference.run(q, feed, params)[0])
    np.testing.assert_allclose(got, rlx.reference.run(g, feed, params)[0], atol=0.05)


def test_non_finite_rows_and_columns_give_nan_not_garbage() -> None:
    rng = np.random.default_rng(6)
    g = _graph([(3, 24, 40)])
    x = rng.standard_normal((3, 24)).astype(np.float32)
    x[1, 5] = np.inf
    w = rng.standard_normal((24, 40)).astype(np.float32)
    w[3, 7] = np.nan
    params = {"w0": w, "b0": np.zeros(40, np.float32)}
    got = _compile(g, params, "native", 1).run({"x0": x})[0]
    want = rlx.reference.run(g, {"x0": x}, params)[0]
    np.testing.assert_array_equal(got, want)  # equal_nan is the default for assert_array_equal
    assert np.isnan(got[1]).all() and np.isnan(got[:, 7]).all()
    assert np.isfinite(np.delete(got[[0, 2]], 7, axis=1)).all()


def test_quantizer_blocks_of_64_huge_finite_and_non_finite_values() -> None:
    """K = 150: two blocks of 64 (the quantizer's unrolled loop), one of 16, a scalar tail. Huge finite
    values (|x| near FLT_MAX, adjacent in one block) quantize like any others; inf, -inf or NaN in a
    block or in the tail makes the row NaN."""
    rng = np.random.default_rng(10)
    g = _graph([(7, 150, 40)])
    x = rng.standard_normal((7, 150)).astype(np.float32)
    x[0, [3, 19, 100]] = [3e38, 3e38, -3.3e38]  # finite, but x + x overflows
    x[1, 70] = np.inf
    x[2, 5] = -np.inf
    x[3, 140] = np.nan  # in the 16 block
    x[4, 149] = np.inf  # in the scalar tail
    params = {"w0": rng.standard_normal((150, 40)).astype(np.float32), "b0": rng.standard_normal(40).astype(np.float32)}
    got = _compile(g, params, "native", 1).run({"x0": x})[0]
    np.testing.assert_array_equal(got, rlx.reference.run(g, {"x0": x}, params)[0])
    assert np.isfinite(got[[5, 6]]).all() and np.isnan(got[1:5]).all()
    assert not np.isnan(got[0]).any()  # (its products overflow to +-inf: the scale is 3.3e38 / 127)


def test_zero_rows_and_columns() -> None:
    g = _graph([(2, 8, 3)])
    x = np.zeros((2, 8), np.float32)
    x[1] = np.arange(8)
    w = np.ones((8, 3), np.float32)
    w[:, 1] = 0
    params = {"w0": w, "b0": np.array([1, 2, 3], np.float32)}
    got = _compile(g, params, "native", 1).run({"x0": x})[0]
    np.testing.assert_array_equal(got, rlx.reference.run(g, {"x0": x}, params)[0])
    np.testing.assert_array_equal(got[0], [1, 2, 3])


def test_weight_that_is_not_a_quantized_param_is_refused_before_any_build() -> None:
    g = rlx.Graph("shared")
    x, w = g.input("x", [2, 8]), g.param("w", [8, 8])
    g.set_outputs([g.int8_matmul(x, w), g.add_(w, w)])  # w is also read as f32
    with pytest.raises(BuildError, match=r"int8_matmul: the CPU needs its weight %1 to be a 2-D f32 param"):
        rlx.Session().compile(g, opt_level=0)
    g2 = rlx.Graph("input_weight")
    g2.set_outputs([g2.int8_matmul(g2.input("x", [2, 8]), g2.input("w", [8, 4]))])
    with pytest.raises(BuildError, match="weight %1"):
        rlx.Session().compile(g2, opt_level=0)


def test_other_backends_report_it_before_any_build() -> None:
    g = _graph([(2, 8, 4)])
    assert supports(g, "cpu")
    assert not supports(g, "cuda")
    assert not supports(g, "metal")


def test_artifact_keeps_the_f32_weights_and_quantizes_again_on_load(tmp_path) -> None:
    rng = np.random.default_rng(7)
    g = _graph([(3, 12, 5)])
    params = {"w0": rng.standard_normal((12, 5)).astype(np.float32), "b0": rng.standard_normal(5).astype(np.float32)}
    feed = {"x0": rng.standard_normal((3, 12)).astype(np.float32)}
    cg = _compile(g, params, "native", 1)
    loaded = rlx.load(cg.save(tmp_path / "art", weights=True))
    np.testing.assert_array_equal(loaded.run(feed)[0], cg.run(feed)[0])


#: Products big enough to split over two spinning threads: by rows (M >= 24), by panels (few rows); each way
#: with K a multiple of 64 too (the tile path).
SPLIT_SHAPES = [(100, 203, 96), (8, 256, 520), (100, 256, 96), (20, 64, 520)]


def test_two_threads_under_address_sanitizer() -> None:
    """Every shape on one and two threads, built with -fsanitize=address, bit for bit as the reference.

    A child process with spinning OpenMP threads (RLX_OMP_WAIT=active), so that SPLIT_SHAPES really
    split over two threads (with the default sleeping team, products this small run on one).
    """
    from cpu_helpers import run_with_two_spinning_threads_under_asan

    script = (
        "import numpy as np, rlx\n"
        "from test_c_int8 import SHAPES, SPLIT_SHAPES, _graph\n"
        "r = np.random.default_rng(0)\n"
        "SHAPES = SHAPES + SPLIT_SHAPES\n"
        "g = _graph(SHAPES)\n"
        "x = {f'x{i}': r.standard_normal((m, k)).astype(np.float32) for i, (m, k, n) in enumerate(SHAPES)}\n"
        "p = {f'w{i}': r.standard_normal((k, n)).astype(np.float32) for i, (m, k, n) in enumerate(SHAPES)}\n"
        "p |= {f'b{i}': r.standard_normal(n).astype(np.float32) for i, (m, k, n) in enumerate(SHAPES)}\n"
        "cg = rlx.Session().compile(g, num_threads=2)\n"
        "for k, v in p.items(): cg.set_param(k, v)\n"
        "for t in (1, 2):\n"
        "    cg.num_threads = t\n"
        "    for a, b in zip(cg.run(x), rlx.reference.run(g, x, p)):\n"
        "        np.testing.assert_array_equal(a, b)\n"
        "print('INT8-ASAN-OK')\n")
    run_with_two_spinning_threads_under_asan(script, "INT8-ASAN-OK", Path(__file__).resolve().parent)

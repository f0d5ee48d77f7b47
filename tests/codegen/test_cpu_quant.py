"""CPU `dequant_matmul` / `dequantize` on GGUF blocks, against the reference (and under ASan).

Run as a script (`python test_cpu_quant.py`) it checks a few formats and row counts and prints
QUANT-OK: the ASan test runs it that way in a child process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_helpers import U32, assert_within, compile_graph, sanitizer_env  # noqa: E402

import rlx  # noqa: E402
from rlx.errors import BuildError, ShapeError  # noqa: E402
from rlx.ir import quant as Q  # noqa: E402
from rlx.reference import run as reference_run  # noqa: E402
from rlx.toolchain.units import units_for  # noqa: E402

FORMATS = sorted(Q.QUANT_FORMATS)
ROWS = (1, 3, 17, 64)  # GEMV (<= 16 rows) and dequantized panels + GEMM (more)
N = 37  # odd: a partial panel and an odd split over the threads


def _graph(fmt: str, k: int, n: int = N, max_m: int = 64) -> rlx.Graph:
    g = rlx.Graph(f"qmm_{fmt}")
    m = rlx.Dim.dynamic("m", max_m)
    x = g.input("x", [m, k])
    w = g.param("w", [n, Q.row_bytes(fmt, k)], "u8")
    g.set_outputs({"y": g.dequant_matmul(x, w, quant=fmt)})
    return g


def check_format(fmt: str, rows: tuple[int, ...] = ROWS, seed: int = 0) -> None:
    """dequant_matmul in `fmt` for each row count in `rows`, within the f32 dot-product bound."""
    rng = np.random.default_rng(seed)
    k = 2 * Q.QUANT_FORMATS[fmt].block_size if Q.QUANT_FORMATS[fmt].block_size == 256 else 96
    raw = Q.random_blocks(rng, N, k, fmt)
    g = _graph(fmt, k)
    cg = compile_graph(g, {"w": raw})
    # the kernels are the kernel unit's entry points of this format, linked, not compiled into the program
    source = cg.source or ""
    assert f"rlx_qgemv_{fmt}(" in source and f"rlx_qgemm_panels(rlx_q_dequant_panel_{fmt}," in source
    assert "quant.c" in [u.name for u in units_for(source)]
    mag = Q.abs_terms(raw, fmt, k).astype(np.float64)
    for m in rows:
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = cg.run({"x": x})[0]
        want = reference_run(g, {"x": x}, {"w": raw})[0]
        # an f32 accumulation of k products (Higham 3.5) plus the reference's own final rounding
        bound = (k + 4) * U32 * (np.abs(x.astype(np.float64)) @ mag.T)
        assert_within(got, want, bound, f"{fmt} dequant_matmul, {m} rows")


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_matmul_matches_reference(fmt: str) -> None:
    check_format(fmt)


def test_batched_rows_and_real_quantizer() -> None:
    """x with two leading axes, weights from the gguf quantizer, the SmolLM2 FFN width (1536 = 48 blocks)."""
    pytest.importorskip("gguf")
    rng = np.random.default_rng(5)
    k, n = 1536, 9
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    raw = Q.quantize(w, "q4_1")
    g = rlx.Graph("batched")
    b, s = rlx.Dim.dynamic("b", 2), rlx.Dim.dynamic("s", 8)
    x = g.input("x", [b, s, k])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [n, Q.row_bytes("q4_1", k)], "u8"), quant="q4_1")])
    cg = compile_graph(g, {"w": raw}, opt_level=2)
    mag = Q.abs_terms(raw, "q4_1", k).astype(np.float64)
    for shape in ((1, 1), (2, 2), (2, 7)):  # 1 and 4 rows: GEMV; 14 rows: panels
        xv = rng.standard_normal((*shape, k)).astype(np.float32)
        got = cg.run({"x": xv})[0]
        want = reference_run(g, {"x": xv}, {"w": raw})[0]
        assert got.shape == (*shape, n)
        assert_within(got, want, (k + 4) * U32 * (np.abs(xv.astype(np.float64)) @ mag.T), f"rows {shape}")


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "q4_k", "q6_k"])
def test_dequantize_rows_is_exact(fmt: str) -> None:
    """Gathered rows of blocks dequantized in C equal GGUF's dequantization bit for bit."""
    rng = np.random.default_rng(3)
    k = Q.QUANT_FORMATS[fmt].block_size * (1 if fmt.endswith("_k") else 3)
    table = Q.random_blocks(rng, 11, k, fmt)
    g = rlx.Graph("deq")
    ids = g.input("ids", [rlx.Dim.dynamic("n", 16)], "i32")
    g.set_outputs([g.dequantize(g.gather(g.param("t", [11, Q.row_bytes(fmt, k)], "u8"), ids), quant=fmt)])
    cg = compile_graph(g, {"t": table})
    idx = np.array([10, 0, 3, 3, 7], np.int32)
    got = cg.run({"ids": idx})[0]
    np.testing.assert_array_equal(got.view(np.uint32), Q.dequantize(table[idx], fmt, k).view(np.uint32))


def q8_bound(x: np.ndarray, raw: np.ndarray, fmt: str, k: int, want: np.ndarray, act: str = "q8") -> np.ndarray:
    """Rounding bound of an act="q8"/"q16" product: the integer block dots are exact, so only the f32 scale
    products and the sum over nb blocks (plus the min terms) round: (nb + 4) u sum|terms|, + u|y| for the
    reference's own rounding. Terms use |q| so either split of q4_0's offset (q - 8) is covered."""
    qx, dx = Q.quantize_act(x, act)
    qw, dw, mw = Q.weight_ints(raw, fmt, k)
    if fmt == "q4_0":
        qw, cw = qw + 8, 8 * np.abs(dw)
    else:
        cw = np.abs(mw)
    ax = np.abs(qx.reshape(x.shape[0], -1, 32).astype(np.float64))
    dots = np.einsum("mbi,nbi->mnb", ax, np.abs(qw).astype(np.float64))
    sx = np.abs(dx * ax.sum(-1))
    t = (dots * np.abs(dw[None] * dx[:, None]) + cw[None] * sx[:, None]).sum(-1)
    return (k // 32 + 4) * U32 * t + U32 * np.abs(want)


def act_bound(x: np.ndarray, raw: np.ndarray, fmt: str, k: int, want: np.ndarray, act: str) -> np.ndarray:
    """The bound of an integer-activation product: `q8_bound` for the GEMV rows (<= 4: integer block dot
    products); for more rows the kernel multiplies the quantized activations, as floats q * d, with the
    dequantized weight in f32 (the prefill GEMM): (k + 5) u sum |x' w| (the +1: rounding q * d)."""
    if x.shape[0] <= 4:
        return q8_bound(x, raw, fmt, k, want, act)
    qx, dx = Q.quantize_act(x, act)
    xr = np.abs(qx.reshape(x.shape[0], -1, 32).astype(np.float64) * dx[..., None].astype(np.float64))
    return (k + 5) * U32 * (xr.reshape(x.shape) @ Q.abs_terms(raw, fmt, k).astype(np.float64).T) + U32 * np.abs(want)


def _q8_graph(fmt: str, k: int, n: int) -> rlx.Graph:
    """Both integer activation modes of one weight: outputs "q8" and "q16"."""
    g = rlx.Graph(f"q8act_{fmt}")
    x = g.input("x", [rlx.Dim.dynamic("m", 64), k])
    w = g.param("w", [n, Q.row_bytes(fmt, k)], "u8")
    g.set_outputs({act: g.dequant_matmul(x, w, quant=fmt, act=act) for act in ("q8", "q16")})
    return g


@pytest.mark.parametrize("fmt", list(Q.Q8_ACT_FORMATS))
@pytest.mark.parametrize("k", [96, 224])
def test_int8_activations_match_their_reference(fmt: str, k: int) -> None:
    """act="q8"/"q16": the kernels quantize X exactly as the reference does (one differing integer would
    cost ~|dw * dx|, far above the bound), then integer block dot products. 3 and 7 blocks: the
    AVX-512 kernel's pairs of blocks in two chains, and an odd last block."""
    rng = np.random.default_rng(11)
    raw = Q.random_blocks(rng, N, k, fmt)
    g = _q8_graph(fmt, k, N)
    cg = compile_graph(g, {"w": raw})
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :32] = 0.0  # an all-zero block: scale 0
        x[-1, -32:] *= 1e4  # a large block: q16's high bytes at their extremes
        got = dict(zip(g.output_names, cg.run({"x": x})))
        want = dict(zip(g.output_names, reference_run(g, {"x": x}, {"w": raw})))
        for act in ("q8", "q16"):
            assert_within(got[act], want[act], act_bound(x, raw, fmt, k, want[act], act), f"{fmt} act={act}, {m} rows")


def test_int16_activations_are_close_to_exact() -> None:
    """act="q16" against the exact f32 product: within the activations' rounding (half a step of
    max|x| / 32767 per value), i.e. far closer than q8 (the reason it exists)."""
    rng = np.random.default_rng(13)
    k, n = 576, 40
    raw = Q.quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), "q4_1")
    g = _q8_graph("q4_1", k, n)
    cg = compile_graph(g, {"w": raw})
    x = rng.standard_normal((1, k)).astype(np.float32)
    got = dict(zip(g.output_names, cg.run({"x": x})))
    exact = x.astype(np.float64) @ Q.dequantize(raw, "q4_1", k).astype(np.float64).T
    wabs = np.abs(Q.dequantize(raw, "q4_1", k).astype(np.float64))
    step = np.repeat(np.abs(x.reshape(1, -1, 32)).max(-1), 32, axis=-1) / 32767  # per value
    bound = 0.5 * step @ wabs.T + (k // 32 + 4) * U32 * (np.abs(x.astype(np.float64)) @ wabs.T) * 1.01
    assert_within(got["q16"], exact, bound, "q16 vs exact")
    assert np.abs(got["q16"] - exact).max() * 50 < np.abs(got["q8"] - exact).max()


@pytest.mark.parametrize("cpu_target", ["x86-64-v3", "x86-64"])
def test_avx2_and_scalar_builds(cpu_target: str) -> None:
    """The AVX2 and the portable C paths (this machine builds AVX-512 by default)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86-64 ISA levels")
    rng = np.random.default_rng(12)
    k, n = 64, 21
    g = rlx.Graph("isa")
    x = g.input("x", [rlx.Dim.dynamic("m", 16), k])
    raws = {f: Q.random_blocks(rng, n, k, f) for f in ("q4_1", "q8_0", "q5_0")}
    ws = {f: g.param(f, [n, r.shape[1]], "u8") for f, r in raws.items()}
    g.set_outputs({**{f: g.dequant_matmul(x, ws[f], quant=f) for f in raws},
                   "q8": g.dequant_matmul(x, ws["q8_0"], quant="q8_0", act="q8"),
                   "q16": g.dequant_matmul(x, ws["q4_1"], quant="q4_1", act="q16")})
    cg = compile_graph(g, raws, cpu_target=cpu_target)
    for m in (2, 9):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        got = dict(zip(g.output_names, cg.run({"x": xv})))
        want = dict(zip(g.output_names, reference_run(g, {"x": xv}, raws)))
        for f in raws:
            bound = (k + 4) * U32 * (np.abs(xv.astype(np.float64)) @ Q.abs_terms(raws[f], f, k).astype(np.float64).T)
            assert_within(got[f], want[f], bound, f"{cpu_target} {f}, {m} rows")
        assert_within(got["q8"], want["q8"], act_bound(xv, raws["q8_0"], "q8_0", k, want["q8"], "q8"),
                      f"{cpu_target} q8")
        assert_within(got["q16"], want["q16"], act_bound(xv, raws["q4_1"], "q4_1", k, want["q16"], "q16"),
                      f"{cpu_target} q16")


def test_bad_shapes_and_inputs_raise() -> None:
    g = rlx.Graph("bad")
    x = g.input("x", [2, 64])
    with pytest.raises(ShapeError, match="u8"):
        g.dequant_matmul(x, g.param("w", [5, 40]), quant="q4_1")  # f32 weight
    cg = compile_graph(_graph("q8_0", 64, n=3, max_m=4), {"w": np.zeros((3, 68), np.uint8)})
    with pytest.raises(rlx.RlxError):
        cg.run({"x": np.zeros((5, 64), np.float32)})  # beyond the dynamic bound
    with pytest.raises(rlx.RlxError):
        cg.set_param("w", np.zeros((3, 67), np.uint8))


def test_unsupported_format_is_refused_before_any_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx.codegen.cpu import quant as c_quant

    monkeypatch.delitem(c_quant.FORMAT_IDS, "q5_1")
    with pytest.raises(BuildError, match="dequant_matmul in format 'q5_1'"):
        compile_graph(_graph("q5_1", 64))


def test_int8_activations_on_q4_k_are_refused_before_any_build() -> None:
    """act="q8" on q4_k is valid IR (CUDA runs it); the CPU's integer kernels take q8_0 / q4_0 / q4_1 only."""
    from rlx.codegen.backends import first_unsupported_op

    g = rlx.Graph("q4k_q8")
    g.set_outputs([g.dequant_matmul(g.input("x", [1, 256]), g.param("w", [3, 144], "u8"), quant="q4_k", act="q8")])
    node, reason = first_unsupported_op(g, "cpu")
    assert node.kind == "dequant_matmul" and "the CPU's integer kernels take q8_0/q4_0/q4_1" in reason


def test_is_asan_clean() -> None:
    env = sanitizer_env("address", {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1"}, HERE)
    proc = subprocess.run([sys.executable, str(Path(__file__))], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "QUANT-OK" in proc.stdout, proc.stderr[-6000:]


def asan_check() -> None:
    """One build holding the SIMD GEMV (q4_1), the generic GEMV (q4_k), the panel path of both and act=q8."""
    rng = np.random.default_rng(7)
    k, n = 256, 19
    g = rlx.Graph("asan")
    x = g.input("x", [rlx.Dim.dynamic("m", 32), k])
    raws = {f: Q.random_blocks(rng, n, k, f) for f in ("q4_1", "q4_k")}
    ws = {f: g.param(f, [n, Q.row_bytes(f, k)], "u8") for f in raws}
    g.set_outputs({**{f: g.dequant_matmul(x, ws[f], quant=f) for f in raws},
                   "q8": g.dequant_matmul(x, ws["q4_1"], quant="q4_1", act="q8"),
                   "q16": g.dequant_matmul(x, ws["q4_1"], quant="q4_1", act="q16")})
    cg = compile_graph(g, raws)
    for m in (1, 4, 17):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        got = dict(zip(g.output_names, cg.run({"x": xv})))
        want = dict(zip(g.output_names, reference_run(g, {"x": xv}, raws)))
        for f in raws:
            mag = Q.abs_terms(raws[f], f, k).astype(np.float64)
            assert_within(got[f], want[f], (k + 4) * U32 * (np.abs(xv.astype(np.float64)) @ mag.T), f"{f}, {m} rows")
        assert_within(got["q8"], want["q8"], act_bound(xv, raws["q4_1"], "q4_1", k, want["q8"], "q8"), f"q8, {m} rows")
        assert_within(got["q16"], want["q16"], act_bound(xv, raws["q4_1"], "q4_1", k, want["q16"], "q16"),
                      f"q16, {m} rows")
    # weights interleaved by 16 rows (InterleavedQuantParam): the vector path, the tile path from 10 rows where
    # the CPU has AMX, and the prefill panels
    g = rlx.Graph("asan_interleaved")
    x = g.input("x", [rlx.Dim.dynamic("m", 32), k])
    raws = {f: Q.random_blocks(rng, 32, k, f) for f in ("q4_1", "q8_0")}
    ws = {f: g.param(f, [32, Q.row_bytes(f, k)], "u8") for f in raws}
    g.set_outputs({f"{f}_{act}": g.dequant_matmul(x, ws[f], quant=f, act=act) for f in raws for act in ("q8", "q16")})
    cg = compile_graph(g, raws, opt_level=2, cpu_quant_layout="interleaved")
    assert "rlx_qi_gemm_q4_1_q16(" in (cg.source or "")
    for m in (1, 12, 17):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        got = dict(zip(g.output_names, cg.run({"x": xv})))
        want = dict(zip(g.output_names, reference_run(g, {"x": xv}, raws)))
        for name in g.output_names:
            f, act = name.rsplit("_", 1)
            assert_within(got[name], want[name], act_bound(xv, raws[f], f, k, want[name], act), f"{name}, {m} rows")


if __name__ == "__main__":
    asan_check()
    print("QUANT-OK")

"""CUDA `dequant_matmul(act="q8")` (int8 activations, templates/cuda/kernels/quant_q8.cuh) against rlx.reference on a
real GPU, for every format CUDA runs it on (q8_0, q4_0, q4_1, q4_k): a lone projection at K = 256 (the fused decode GEMV
up to 4 rows, rlx_q8_gemv over scratch records at 5-8 rows, x' = q * d through the dequantize + GEMM path beyond),
in f32 and f16 sessions; and RMSNorm + two projections fused into one launch at K = 512 and K = 12288 (one row).

Bounds: tests/codegen/q8_bounds.py. An f16 session stores x, and the output, in f16: the reference gets the same
f16-rounded x (so quantization is the same), the output adds u16 |y|, and the prefill path's x' and weight rounded
to f16 add 3 u16 sum|x' w| (f32 accumulation).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.driver import Device, Session, lower_to_lir
from rlx.ir import quant as Q
from rlx.opt.lowering_cuda import find_decode_gemvs
from rlx.toolchain.cuda import visible_gpu_arch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from q8_bounds import flip_allowance, prefill_bound, prefill_scale, q8_bound, rms

pytestmark = [pytest.mark.cuda]
U16 = 2.0 ** -11
FORMATS = ("q8_0", "q4_0", "q4_1", "q4_k")


@pytest.fixture
def gpu() -> None:
    if visible_gpu_arch() is None:
        pytest.skip("no NVIDIA GPU visible (nvidia-smi)")


def _lone(fmt: str, k: int, n: int) -> rlx.Graph:
    g = rlx.Graph(f"q8act_{fmt}")
    x = g.input("x", [rlx.Dim.dynamic("m", 64), k])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [n, Q.row_bytes(fmt, k)], "u8"), quant=fmt, act="q8")])
    return g


@pytest.mark.parametrize("precision", ["f32", "f16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_q8_activations_match_reference(gpu: None, fmt: str, precision: str) -> None:
    rng = np.random.default_rng(FORMATS.index(fmt))
    k, n = 256, 37
    raw = Q.random_blocks(rng, n, k, fmt)
    g = _lone(fmt, k, n)
    (decode,) = find_decode_gemvs(lower_to_lir(g, 2, backend="cuda"))
    assert decode.max_rows == 4
    cg = Session(Device.CUDA, precision=precision).compile(g)
    cg.set_param("w", raw)
    for m in (1, 2, 5, 8, 9, 64):  # fused GEMV, q8 GEMV over records, then x' = q * d through the GEMM
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :32] = 0.0  # an all-zero block: scale 0
        if precision == "f16":
            x = x.astype(np.float16).astype(np.float32)
        got = cg.run({"x": x})[0].astype(np.float64)
        want = reference.run(g, {"x": x}, {"w": raw})[0].astype(np.float64)
        if m <= 8:
            bound = q8_bound(x, raw, fmt, k, want)
        else:
            bound = prefill_bound(x, raw, fmt, k, want)
            if precision == "f16":
                bound += 3 * U16 * prefill_scale(x, raw, fmt, k)
        if precision == "f16":
            bound += U16 * np.abs(want)
        err = np.abs(got - want)
        assert np.all(err <= bound), f"{fmt}[{precision}] m={m}: worst excess {np.max(err - bound):.3g}"


def _fused(fmt: str, k: int, n: int) -> rlx.Graph:
    g = rlx.Graph("fused_q8")
    x = g.input("x", [rlx.Dim.dynamic("m", 8), k])
    h = g.rms_norm(x, g.param("gamma", [k]), eps=1e-5)
    a, b = (g.dequant_matmul(h, g.param(f"w{i}", [n, Q.row_bytes(fmt, k)], "u8"), quant=fmt, act="q8")
            for i in (0, 1))
    g.set_outputs({"a": a, "b": b})
    return g


@pytest.mark.parametrize("k", [512, 12288])
@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_q8_decode_gemv_matches_reference(gpu: None, fmt: str, k: int) -> None:
    """The norm staged in the kernel, then both projections from one int8 quantization of it."""
    rng = np.random.default_rng(k + FORMATS.index(fmt))
    n = 40
    g = _fused(fmt, k, n)
    (decode,) = find_decode_gemvs(lower_to_lir(g, 2, backend="cuda"))
    assert decode.norm and len(decode.members) == 2
    cg = Session(Device.CUDA, precision="f32").compile(g)
    params = {"gamma": (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32),
              "w0": Q.random_blocks(rng, n, k, fmt), "w1": Q.random_blocks(rng, n, k, fmt)}
    for name, value in params.items():
        cg.set_param(name, value)
    for m in range(1, decode.max_rows + 2):  # fused, then each node's own kernels
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = cg.run({"x": x})
        want = reference.run(g, {"x": x}, params)
        h = rms(x, params["gamma"], 1e-5)
        for j, w in enumerate(("w0", "w1")):
            bound = q8_bound(h, params[w], fmt, k, want[j]) + flip_allowance(h, params[w], fmt, k)
            err = np.abs(got[j].astype(np.float64) - want[j].astype(np.float64))
            assert np.all(err <= bound), f"{fmt} K={k} m={m} {w}: worst excess {np.max(err - bound):.3g}"

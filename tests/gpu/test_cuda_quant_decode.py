"""The fused decode GEMV (`DecodeGemv`: RMSNorm staged in the kernel, then the quantized projections) against
rlx.reference on a real GPU, for the formats with byte-permute inner loops (q4_k, q4_0, q4_1, q8_0) and one on
the general loop (q6_k), at K = 512 (up to 4 rows a launch) and K = 12288 (one row; 54 KiB of staged shared
memory, past the default limit); and the occupancy walk with int8 activations (act="q8") in a decoder's three
group shapes (bounds of tests/codegen/q8_bounds.py there).

Bound, as tests/gpu/test_cuda_quant.py's f32 one: the kernel sums scale * (integer dot with x) + min * (sum of x)
in f32 over K terms, |err| <= (K + 4) u32 (|h| @ |terms of w|^T) per projection, where h is the normalized
activation; the kernel's own RMS (a different summation order than the reference's) moves h by a few u32
relatively, which the 32 extra u32 of the bound cover ((K + 36) u32 in all).
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
from rlx.ir.graph import NodeId
from rlx.opt.lowering_cuda import find_decode_gemvs
from rlx.toolchain.cuda import visible_gpu_arch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from q8_bounds import flip_allowance, fused_checks, q8_bound, rms
from render_cases import fused_gemvs

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

U32 = 2.0 ** -24
FORMATS = ("q4_k", "q4_0", "q4_1", "q8_0", "q6_k")


@pytest.mark.parametrize("walk", ["auto", "xreg", "occ", "occ4", "occ8", "occp", "occ4p"])
@pytest.mark.parametrize("k", [512, 12288])
def test_fused_decode_gemv_matches_reference(k: int, walk: str) -> None:
    """`walk`: the one-row walk asked for (RLX_QGEMV_WALK): "auto" (rlx_qgemv_occ at K = 12288, the rows walk at 512),
    "xreg" (the register walk at K = 12288), "occ" / "occ4" / "occ8" / "occp" / "occ4p" (rlx_qgemv_occ for the four
    fast formats at both K; q6_k keeps the rows walk)."""
    import dataclasses

    from rlx.config import Config

    rng = np.random.default_rng(k)
    n = 40
    g = fused_gemvs(FORMATS, k, n)
    found = find_decode_gemvs(lower_to_lir(g, 2, backend="cuda"), walk=walk)
    assert len(found) == len(FORMATS)
    if walk.startswith("occ") or (walk == "auto" and k >= 2048):
        assert sum(d.walk == "occ" for d in found) == len(FORMATS) - 1  # all but q6_k
    config = dataclasses.replace(Config.from_env(), cuda_gemv_walk=walk)
    cg = Session(Device.CUDA, config, precision="f32").compile(g)
    params = {}
    for fmt in FORMATS:
        params[f"gamma_{fmt}"] = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
        for i in (0, 1):
            params[f"w{i}_{fmt}"] = Q.random_blocks(rng, n, k, fmt)
    for name, value in params.items():
        cg.set_param(name, value)
    for m in (1, 2, 4, 5):  # K = 512: fused up to 4 rows, then each node's own kernel; K = 12288: fused at 1
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = cg.run({"x": x})
        want = reference.run(g, {"x": x}, params)
        for j, fmt in enumerate(FORMATS):
            h = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-5) * params[f"gamma_{fmt}"]
            scale = sum(np.abs(h) @ Q.abs_terms(params[f"w{i}_{fmt}"], fmt, k).astype(np.float64).T for i in (0, 1))
            err = np.abs(got[j].astype(np.float64) - want[j].astype(np.float64))
            bound = (k + 36) * U32 * scale
            assert np.all(err <= bound), f"{fmt} K={k} m={m}: worst excess {np.max(err - bound):.3g}"


Q8_FORMATS = ("q4_k", "q4_0", "q4_1", "q8_0")


def _q8_layer(k: int, n: int) -> rlx.Graph:
    """Per format of Q8_FORMATS, act="q8" projections in the three shapes of a decoder's one-row GEMVs: RMSNorm +
    gate / up + SwiGLU (`s_<fmt>`), one projection + a residual (`y_<fmt>`), two plain members (`p0_<fmt>`,
    `p1_<fmt>`). `s` and `y` are read twice (+ z and - z, z zeros: exact), so that they stay in the arena and the
    GEMV absorbs them."""
    g = rlx.Graph("occ_q8")
    rows = rlx.Dim.dynamic("m", 8)
    x, r, z = g.input("x", [rows, k]), g.input("r", [rows, n]), g.input("z", [rows, n])
    outs = {}
    for fmt in Q8_FORMATS:
        def dm(h: NodeId, name: str, fmt: str = fmt) -> NodeId:
            return g.dequant_matmul(h, g.param(f"{name}_{fmt}", [n, Q.row_bytes(fmt, k)], "u8"), quant=fmt,
                                    act="q8")

        h = g.rms_norm(x, g.param(f"gamma_{fmt}", [k]), eps=1e-5)
        s = g.mul(g.activation("silu", dm(h, "wg")), dm(h, "wu"))
        y = g.add_(r, dm(x, "wd"))
        outs |= {f"s_{fmt}": g.add_(s, z), f"s2_{fmt}": g.sub(s, z), f"y_{fmt}": g.add_(y, z),
                 f"y2_{fmt}": g.sub(y, z), f"p0_{fmt}": dm(x, "w0"), f"p1_{fmt}": dm(x, "w1")}
    g.set_outputs(outs)
    return g


def _q8_product(x: np.ndarray, raw: np.ndarray, fmt: str) -> np.ndarray:
    g = rlx.Graph("q8_product")
    g.set_outputs([g.dequant_matmul(g.input("x", list(x.shape)), g.param("w", list(raw.shape), "u8"), quant=fmt,
                                    act="q8")])
    return reference.run(g, {"x": x}, {"w": raw})[0].astype(np.float64)


@pytest.mark.parametrize("walk", ["auto", "occ8", "occp"])
@pytest.mark.parametrize("k", [4096, 14336])
def test_int8_activation_occ_gemv_matches_reference(k: int, walk: str) -> None:
    """act="q8" (quant_act="q8") on the occupancy walk (rlx_qgemv_occ, ACT = 1: each lane quantizes its unit's x in
    registers, integer dot products; "auto": 4 rows an item) for q4_k, q4_0, q4_1 and q8_0: the norm + SwiGLU,
    residual and plain groups of `_q8_layer`, one row (the fused launch) and two (each node's own kernels), against
    the reference's int8 products. Bounds: tests/codegen/q8_bounds.py (q8_bound; with the kernel's own norm also
    flip_allowance)."""
    import dataclasses

    from rlx.config import Config

    rng = np.random.default_rng(k + len(walk))
    n = 40
    g = _q8_layer(k, n)
    found = find_decode_gemvs(lower_to_lir(g, 2, backend="cuda"), walk=walk)
    assert len(found) == 3 * len(Q8_FORMATS) and all(d.walk == "occ" and d.act == "q8" for d in found)
    config = dataclasses.replace(Config.from_env(), cuda_gemv_walk=walk)
    cg = Session(Device.CUDA, config, precision="f32").compile(g)
    params = {}
    for fmt in Q8_FORMATS:
        params[f"gamma_{fmt}"] = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
        for name in ("wg", "wu", "wd", "w0", "w1"):
            params[f"{name}_{fmt}"] = Q.random_blocks(rng, n, k, fmt)
    for name, value in params.items():
        cg.set_param(name, value)
    for m in (1, 2):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :32] = 0.0  # an all-zero block: scale 0
        r = rng.standard_normal((m, n)).astype(np.float32)
        out = dict(zip(cg.output_names, cg.run({"x": x, "r": r, "z": np.zeros((m, n), np.float32)})))
        for fmt in Q8_FORMATS:
            w = {name: params[f"{name}_{fmt}"] for name in ("wg", "wu", "wd", "w0", "w1")}
            h = rms(x, params[f"gamma_{fmt}"], 1e-5)
            a, b = _q8_product(h, w["wg"], fmt), _q8_product(h, w["wu"], fmt)
            ba = q8_bound(h, w["wg"], fmt, k, a) + flip_allowance(h, w["wg"], fmt, k)
            bb = q8_bound(h, w["wu"], fmt, k, b) + flip_allowance(h, w["wu"], fmt, k)
            checks = {"s": fused_checks("norm_swiglu", a, b, ba, bb, out[f"s_{fmt}"], out[f"s_{fmt}"], r)[0]}
            d = _q8_product(x, w["wd"], fmt)
            checks["y"] = fused_checks("residual", d, d, q8_bound(x, w["wd"], fmt, k, d), 0 * d, out[f"y_{fmt}"],
                                       out[f"y_{fmt}"], r)[0]
            p0, p1 = _q8_product(x, w["w0"], fmt), _q8_product(x, w["w1"], fmt)
            checks["p0"], checks["p1"] = fused_checks("plain", p0, p1, q8_bound(x, w["w0"], fmt, k, p0),
                                                      q8_bound(x, w["w1"], fmt, k, p1), out[f"p0_{fmt}"],
                                                      out[f"p1_{fmt}"], r)
            for name, (got, want, bound) in checks.items():
                err = np.abs(got.astype(np.float64) - want)
                assert np.all(err <= bound), \
                    f"{fmt} K={k} {walk} m={m} {name}: worst excess {np.max(err - bound):.3g}"
            np.testing.assert_array_equal(out[f"s_{fmt}"], out[f"s2_{fmt}"])
            np.testing.assert_array_equal(out[f"y_{fmt}"], out[f"y2_{fmt}"])

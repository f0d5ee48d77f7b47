"""The fused decode GEMV (`DecodeGemv`: RMSNorm staged in the kernel, then the quantized projections) against
rlx.reference on a real GPU, for the formats with byte-permute inner loops (q4_k, q4_0, q4_1, q8_0) and one on
the general loop (q6_k), at K = 512 (up to 4 rows a launch) and K = 12288 (one row; 54 KiB of staged shared
memory, past the default limit).

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

from rlx import reference
from rlx.driver import Device, Session, lower_to_lir
from rlx.ir import quant as Q
from rlx.opt.lowering_cuda import find_decode_gemvs
from rlx.toolchain.cuda import visible_gpu_arch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
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

"""A norm computed at the store of the packed GEMM before it (`NormInPgemm`).

The fused kernel normalizes a block of rows when the thread that stores its last tile is done with it. Its values
must be those of the GEMM and the norm run one after the other: the same tiles, the same row code (norm.c.j2's
norm_rows) — compared bit for bit with the GEMM alone followed by the norm alone, for every kernel variant (the
AVX-512 12x32 tiles in 96-row blocks, AVX2 6x16 in 48-row blocks, the portable 64-row blocks), row counts that end
inside a block, 1 to 3 threads, and every norm kind. The pair is also checked against rlx.reference's norm of the
GEMM's output with the row kernels' tolerance (tests/codegen/test_cpu_rows.py: rtol 5e-7, atol 1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_helpers import compile_graph
from test_cpu_packed_gemm import TARGETS, _target

import rlx
from rlx.ir import ops as O

NORM_TOL = {"rtol": 5e-7, "atol": 1e-6}
K, N = 40, 100  # N: three AVX-512 panels and a partial one; K below one slice
KINDS = ["residual_ln", "residual_ln_bias", "ln", "rms", "residual_rms"]


def _norm(g: rlx.Graph, kind: str, y: int, r: int) -> int:
    gamma, beta, bias = g.param("gamma", [N]), g.param("beta", [N]), g.param("bias2", [N])
    return {"residual_ln": lambda: g.add(O.FusedResidualLayerNorm(1e-12), [y, r, gamma, beta]),
            "residual_ln_bias": lambda: g.add(O.FusedResidualLayerNorm(1e-5), [y, r, bias, gamma, beta]),
            "ln": lambda: g.layer_norm(y, gamma, beta, eps=1e-5),
            "rms": lambda: g.rms_norm(y, gamma, eps=1e-6),
            "residual_rms": lambda: g.add(O.FusedResidualRmsNorm(1e-6), [y, r, gamma])}[kind]()


def _graphs(kind: str) -> tuple[rlx.Graph, rlx.Graph, rlx.Graph]:
    rows = rlx.Dim.dynamic("rows", max=300)
    fused = rlx.Graph("fused")
    x, r = fused.input("x", [rows, K]), fused.input("r", [rows, N])
    y = fused.add(O.FusedMatMulBiasAct(None), [x, fused.param("w", [K, N]), fused.param("b", [N])])
    fused.set_outputs([_norm(fused, kind, y, r)])
    gemm = rlx.Graph("gemm")
    gemm.set_outputs([gemm.add(O.FusedMatMulBiasAct(None), [gemm.input("x", [rows, K]), gemm.param("w", [K, N]),
                                                             gemm.param("b", [N])])])
    norm = rlx.Graph("norm")
    norm.set_outputs([_norm(norm, kind, norm.input("y", [rows, N]), norm.input("r", [rows, N]))])
    return fused, gemm, norm


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", KINDS)
def test_norm_at_store_is_the_gemm_then_the_norm(rng, target, kind):
    cpu_target = _target(target)
    fused, gemm, norm = _graphs(kind)
    params = {"w": rng.standard_normal((K, N)).astype(np.float32) * 0.3,
              "b": rng.standard_normal(N).astype(np.float32),
              **{p: rng.standard_normal(N).astype(np.float32) for p in ("gamma", "beta", "bias2")}}

    def build(g: rlx.Graph):
        names = {n.op.name for n in g.params()}
        return compile_graph(g, {k: v for k, v in params.items() if k in names}, cpu_target=cpu_target)

    cg, cg_gemm, cg_norm = build(fused), build(gemm), build(norm)
    assert "NormInPgemm" in cg.source and "NormInPgemm" not in cg_norm.source
    for threads in (1, 2, 3):
        for cg_ in (cg, cg_gemm, cg_norm):
            cg_.num_threads = threads
        for rows in (1, 5, 97, 200, 300):
            xv = rng.standard_normal((rows, K)).astype(np.float32)
            rv = rng.standard_normal((rows, N)).astype(np.float32)
            got = cg.run(x=xv, r=rv)[0]
            yv = cg_gemm.run(x=xv)[0]
            np.testing.assert_array_equal(got, cg_norm.run(y=yv, r=rv)[0], err_msg=f"rows={rows} threads={threads}")
            names = {n.op.name for n in norm.params()}
            want = rlx.reference.run(norm, {"y": yv, "r": rv}, {k: v for k, v in params.items() if k in names})[0]
            np.testing.assert_allclose(got, want, **NORM_TOL, err_msg=f"rows={rows} threads={threads}")

"""rlx_gemm_small (few-row GEMM, bias and activation in its epilogue, launched with PDL) against rlx.reference.

Row counts at and around its limits (RLX_GSM_MAX_M = 64 rows; 65 rows run cuBLASLt + the activation pass), a
partial row tile (37), partial column tiles (N = 72, 8), K = 48 / 144 / 1536 (its largest); f16 and bf16; and
the norms it computes in its prologue (layer norm, with a residual, RMS norm), whose outputs later nodes read.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from tests.gpu.gemm_common import GPU_ONLY, U, build_with_params, gemm_chain, norm_graph, scaled_normal

pytestmark = GPU_ONLY


def _graph() -> Graph:
    """gelu(x W1 + b1) -> relu(. W2) -> . W3 + b3 -> (. W4 [1536 -> 8]): K 48 / 144 / 72 / 1536."""
    return gemm_chain("small_gemm", 200, 48, [(144, True, "gelu"), (72, False, "relu"), (1536, True, None),
                                              (8, False, None)])



def _check(graph: Graph, precision: str, params: dict, rng: np.random.Generator, k_in: int) -> str:
    """Every output against the float64 reference, no worse than the build without rlx_gemm_small and PDL (cuBLASLt,
    separate norm and activation kernels: the same storage roundings, other summation orders); returns the source."""
    cg = build_with_params(graph, precision, params)
    base = build_with_params(graph, precision, params, small_gemm=False, pdl=False)
    u = U[precision]
    for m in (1, 16, 37, 64, 65, 200):
        feed = {"x": rng.standard_normal((m, k_in)).astype(np.float32)}
        refs = reference.run(graph, feed, params)
        outs, again, want = cg.run(feed), cg.run(feed), base.run(feed)
        for k, (o, o2, b, r) in enumerate(zip(outs, again, want, refs)):
            o, b, r = (np.asarray(v, np.float64) for v in (o, b, r))
            assert np.all(np.isfinite(o)), f"m={m} output {k}: not finite"
            np.testing.assert_array_equal(o, np.asarray(o2, np.float64))  # the captured graph's replay
            scale = float(np.sqrt(np.mean(r * r))) or 1e-30
            assert np.abs(o - r).max() <= 2 * np.abs(b - r).max() + 4 * u * scale, f"m={m} output {k}"
            assert np.linalg.norm(o - r) <= 2 * np.linalg.norm(b - r) + 4 * u * np.linalg.norm(r), f"m={m} output {k}"
    return cg.source


@pytest.mark.parametrize("precision", ["f16", "bf16"])
@pytest.mark.parametrize("keep_s", [True, False])
def test_norm_prologue_matches_reference(precision: str, keep_s: bool) -> None:
    # keep_s: s stays live anyway; without it s dies at h2, and the CUDA plan holds it through the GEMM after h2
    # (memplan's hold_norm_inputs) so that GEMM's output cannot take its bytes while its blocks read it
    graph = norm_graph(keep_s=keep_s)
    rng = np.random.default_rng(13)
    shapes = {"g1": (64,), "be1": (64,), "w1": (64, 128), "b1": (128,), "w2": (128, 64), "g2": (64,), "be2": (64,),
              "w3": (64, 64), "b3": (64,), "g3": (64,), "w4": (64, 32)}
    params = {k: (rng.standard_normal(v) * (0.2 if len(v) == 2 else 0.5) + (1.0 if k[0] == "g" else 0.0))
              .astype(np.float32) for k, v in shapes.items()}
    src = _check(graph, precision, params, rng, 64)
    for norm in ("1, false, 1", "1, true, 1", "2, false, 1"):  # layer norm, + residual, RMS norm
        assert f", {norm}>, dim3(" in src


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_small_gemm_matches_reference(precision: str) -> None:
    graph = _graph()
    rng = np.random.default_rng(11)
    params = scaled_normal(rng, {"w1": ((48, 144), 0.3), "b1": ((144,), 0.5), "w2": ((144, 72), 0.15),
                                 "w3": ((72, 1536), 0.2), "b3": ((1536,), 0.5), "w4": ((1536, 8), 0.05)})
    src = _check(graph, precision, params, rng, 48)
    t = "__half" if precision == "f16" else "rlx_bf16"
    assert f"rlx_gemm_small<{t}, RLX_ACT_GELU, true, 0, false, 1>" in src
    # w4 (K = 1536, N = 8: one partial column tile); w3's K = 72 is not whole 16-deep steps
    assert f"rlx_gemm_small<{t}, RLX_ACT_NONE, false, 0, false, 1>" in src


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_small_gemm_of_a_computed_b(precision: str) -> None:
    """B computed by an earlier kernel: its slab is fetched after the PDL wait (only the bias before it)."""
    g = Graph("small_computed_b")
    x = g.input("x", [Dim.dynamic("m", max=200), 48])
    wb = g.activation("tanh", g.param("w", [48, 32]))
    g.set_outputs([g.add_(g.matmul(x, wb), g.param("b", [32]))])
    rng = np.random.default_rng(17)
    params = {"w": rng.standard_normal((48, 32)).astype(np.float32), "b": rng.standard_normal(32).astype(np.float32)}
    src = _check(g, precision, params, rng, 48)
    assert "0.0f, 2, (" in src

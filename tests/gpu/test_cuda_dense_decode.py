"""The one-row decode GEMV over dense f16 / bf16 weights (`DecodeGemv` walk "dense": rlx_dgemv, kernels/dense_gemv.cuh)
on a real GPU: GEMVs against numpy (the RMS norm producing x, Q/K/V-shaped siblings with an odd width, the SwiGLU
pair, the residual add; K from 64 to 14336), and a decoder with bf16 weights in f16 and bf16 builds against
rlx.reference (f32) and against the same build with the GEMV off (RLX_DENSE_GEMV=0: its GEMMs in one-row steps).

Bound of a product against numpy in f64 on the device's inputs (x and the weights rounded to the build's type T, as
the device stores them): the kernel sums exact f32 products in f32, (K + 36) u32 S with S = |h| @ |w|; the GEMM
path of larger steps rounds the normalized h to T first (u_T S), and every output is rounded to T (u_T |y|).
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import rlx
from rlx.config import Config
from rlx.driver import Device, Session, lower_to_lir
from rlx.ir.dtype import DType
from rlx.opt.lowering_cuda import find_decode_gemvs
from rlx.toolchain.cuda import visible_gpu_arch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoder_common import assert_f16_greedy_tracks_f32

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

U32 = 2.0 ** -24
#: unit roundoff and numpy type of each build's storage
UNIT = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8}
NP = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def gemv_graph(k: int) -> rlx.Graph:
    """Three one-row GEMV groups: RMS norm -> Q/K/V of 40, 13 (odd: 2-byte loads) and 24 columns; RMS norm -> gate
    and up of 48 -> silu(gate) * up (a fused_swiglu); a product of 56 columns plus a residual (then negated, so the
    add's value, read twice, is an arena buffer the GEMV may write)."""
    g = rlx.Graph("dense_gemvs")
    m = rlx.Dim.dynamic("m", 4)
    x, x2, x3 = (g.input(n, [m, k]) for n in ("x", "x2", "x3"))
    r = g.input("r", [m, 56])
    h = g.rms_norm(x, g.param("gamma", [k]), eps=1e-5)
    q, kk, v = (g.matmul(h, g.param(f"w{n}", [k, w])) for n, w in (("q", 40), ("k", 13), ("v", 24)))
    h2 = g.rms_norm(x2, g.param("gamma2", [k]), eps=1e-5)
    s = g.mul(g.activation("silu", g.matmul(h2, g.param("wg", [k, 48]))), g.matmul(h2, g.param("wu", [k, 48])))
    y = g.add_(g.matmul(x3, g.param("wo", [k, 56])), r)
    g.set_outputs({"q": q, "k": kk, "v": v, "s": s, "y": g.activation("neg", y), "y2": g.activation("exp", y)})
    return g


def _rms(x: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 ** 2, axis=1, keepdims=True) + 1e-5) * gamma


@pytest.mark.parametrize("precision", ["f16", "bf16"])
@pytest.mark.parametrize("k", [64, 4096, 14336])
@pytest.mark.parametrize(("tile", "split"), [(0, 0), (0, 1), (128, 3), (512, 16)])
def test_dense_gemvs_match_numpy(precision: str, k: int, tile: int, split: int,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One-row steps take rlx_dgemv for the three groups (the LIR's decisions; RLX_DENSE_GEMV=1, the default), two-
    and four-row steps their GEMMs; both within the bound of numpy's products on the stored values. The tile width
    and K split chosen per launch, no split (one kernel), and forced splits (partials + rlx_dgemv_reduce) with wide
    tiles (RLX_DENSE_GEMV_TILE / RLX_DENSE_GEMV_SPLIT)."""
    monkeypatch.setenv("RLX_DENSE_GEMV", "1")
    monkeypatch.setenv("RLX_DENSE_GEMV_TILE", str(tile))
    monkeypatch.setenv("RLX_DENSE_GEMV_SPLIT", str(split))
    assert Config.from_env().cuda_dense_gemv and Config.from_env().cuda_dense_split == split
    g = gemv_graph(k)
    found = find_decode_gemvs(lower_to_lir(g, 2, backend="cuda"), dense=DType.parse(precision))
    assert sorted((len(d.members), bool(d.norm), bool(d.residual)) for d in found) == \
        [(1, False, True), (1, True, False), (3, True, False)]
    assert all(d.walk == "dense" for d in found)
    rng = np.random.default_rng(k + len(precision))
    t, u = NP[precision], UNIT[precision]
    params = {"gamma": 1.0 + 0.25 * rng.standard_normal(k), "gamma2": 1.0 + 0.25 * rng.standard_normal(k)}
    for name, width in (("wq", 40), ("wk", 13), ("wv", 24), ("wg", 48), ("wu", 48), ("wo", 56)):
        params[name] = rng.standard_normal((k, width)) / np.sqrt(k)
    params = {n: p.astype(np.float32) for n, p in params.items()}
    cg = Session(Device.CUDA, precision=precision).compile(g)
    for name, value in params.items():
        cg.set_param(name, value)
    stored = {n: p.astype(t).astype(np.float64) for n, p in params.items()}  # as the device holds them
    for m in (1, 2, 4):
        ins = {n: rng.standard_normal((m, w)).astype(np.float32) for n, w in (("x", k), ("x2", k), ("x3", k),
                                                                              ("r", 56))}
        got = dict(zip(("q", "k", "v", "s", "y", "y2"), cg.run(ins)))
        xs = {n: a.astype(t).astype(np.float64) for n, a in ins.items()}
        checks = []
        h, h2 = _rms(xs["x"], stored["gamma"]), _rms(xs["x2"], stored["gamma2"])

        def product(a: np.ndarray, w: str) -> tuple[np.ndarray, np.ndarray]:
            want = a @ stored[w]
            return want, (k + 36) * U32 * (np.abs(a) @ np.abs(stored[w])) + 2 * u * (np.abs(a) @ np.abs(stored[w]))

        for name, w in (("q", "wq"), ("k", "wk"), ("v", "wv")):
            want, bound = product(h, w)
            checks.append((name, got[name], want, bound + u * np.abs(want)))
        a, ba = product(h2, "wg")
        b, bb = product(h2, "wu")
        ba, bb = ba + u * np.abs(a), bb + u * np.abs(b)  # the GEMM path rounds gate and up to T
        want = a / (1 + np.exp(-a)) * b
        bound = 1.1 * ba * np.abs(b) + np.abs(a) * bb + 1.1 * ba * bb + 2 * u * np.abs(want)
        checks.append(("s", got["s"], want, bound))
        o, bo = product(xs["x3"], "wo")
        want = -(o + xs["r"])
        checks.append(("y", got["y"], want, bo + u * np.abs(o) + u * np.abs(want)))
        for name, have, want, bound in checks:
            err = np.abs(have.astype(np.float64) - want)
            assert np.all(np.isfinite(have)), f"{precision} K={k} m={m} {name}"
            assert np.all(err <= bound), f"{precision} K={k} m={m} {name}: worst excess {np.max(err - bound):.3g}"


CONFIG_ARGS = dict(arch="llama", vocab_size=96, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=64, ffn_size=384, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved", n_rot=64,
                   context_length=128, tie_embeddings=False, bos_id=1, eos_id=2)


def _bf16_tensors(seed: int) -> tuple[object, dict]:
    """A small LLaMA with bf16 matrices as a GGUF file holds them (raw bits), f32 norms."""
    from rlx.models.causal_lm import random_tensors
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import WeightSpec, random_specs

    config = DecoderConfig(**CONFIG_ARGS)
    tensors = {}
    for name, (spec, data) in random_tensors(random_specs(config), seed=seed, scale=2.0).items():
        if data.ndim == 2:
            bits = data.astype(ml_dtypes.bfloat16).view(np.uint16)
            tensors[name] = (WeightSpec("bf16", spec.shape), bits)
        else:
            tensors[name] = (spec, data)
    return config, tensors


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_bf16_weight_decoder_tracks_the_reference(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoder of bf16 weights in an f16 / bf16 build: its greedy tokens' logits point where the f32 reference's do
    (cosine >= 0.999, the token the row's largest logit), and over 10 one-row steps on the reference's tokens its
    error against the reference is no larger than that of the same build without the dense GEMV (RLX_DENSE_GEMV=0:
    the one-row steps on the GEMMs), each under 0.1."""
    from rlx.models.causal_lm import CausalLM

    config, tensors = _bf16_tensors(5)
    kw = dict(max_context=64, prefill_chunk=8)
    monkeypatch.setenv("RLX_DENSE_GEMV", "1")  # (the default; named for a run under RLX_DENSE_GEMV=0)
    lm = CausalLM(config, tensors, device="cuda", precision=precision, **kw)
    ref = CausalLM(config, tensors, device="reference", **kw)
    ids = [5, 9, 14, 3, 77, 41]
    assert_f16_greedy_tracks_f32(lm, ref, ids, f"bf16 weights, {precision} build", n=16)
    monkeypatch.setenv("RLX_DENSE_GEMV", "0")
    gemm = CausalLM(config, tensors, device="cuda", precision=precision, **kw)
    assert not Config.from_env().cuda_dense_gemv
    caches = [m.new_cache() for m in (lm, gemm, ref)]
    prompt = np.array([ids])
    for m, c in zip((lm, gemm, ref), caches):
        m.step(prompt, c, [len(ids) - 1])
    token, errors = 7, []
    for _ in range(10):
        dense, other, want = (m.step(np.array([[token]]), c, [0])[0] for m, c in zip((lm, gemm, ref), caches))
        errors.append((_rel(dense, want), _rel(other, want)))
        token = int(want.argmax())
    dense_err, gemm_err = np.mean(errors, axis=0)
    assert dense_err <= 1.5 * gemm_err + 1e-3, f"{precision}: (dense, GEMM) errors per step {errors}"
    assert max(max(e) for e in errors) < 0.1, f"{precision}: (dense, GEMM) errors per step {errors}"

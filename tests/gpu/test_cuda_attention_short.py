"""The short-KV attention kernels (the whole K/V of a head in shared memory, for Skv <= 128) against
rlx.reference on a GPU: rlx_attn_short2 (the default) and rlx_attn_short (`short_attention_v1=True`).

Every f16/bf16 attention whose key count is bounded by 128 runs one of them; these cases cover the launch
shapes the host picks (1..8 warps per block: small grids shrink the block), several query blocks per head
(Sq > 128 against a short KV), cross attention (Sq != Skv), GQA, head dims 16/32/64, every mask mode, key
counts in each of rlx_attn_short2's NK classes (<= 16, 32, 64, 128; not multiples of 16 too), padded keys in
every block and fully masked rows.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx import reference
from rlx.config import Config
from rlx.driver import Device, Session
from rlx.pipeline.cuda import compile_cuda
from rlx.toolchain.cuda import visible_gpu_arch

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases", Path(__file__).parent / "cases.py")
cases = importlib.util.module_from_spec(_spec)
sys.modules["rlx_cuda_cases"] = cases
_spec.loader.exec_module(cases)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

U = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8}

#: name -> _attention_case keywords; batch x heads x query blocks decides the warps per block (>= 264 blocks
#: on an H100 keeps 8 warps; fewer halves them)
SHORT = {
    "padding_d32_8warps": dict(heads=12, kv_heads=12, head_dim=32, mask="padding", sq=[128, 100], batch=24),
    "padding_d32_3warps": dict(heads=12, kv_heads=12, head_dim=32, mask="padding", sq=[40, 17], batch=24),
    "none_d64_4warps": dict(heads=12, kv_heads=12, head_dim=64, mask="none", sq=[128, 65], batch=12),
    "causal_gqa_d64": dict(heads=8, kv_heads=2, head_dim=64, mask="causal", sq=[96, 9], batch=3),
    "bias_cross_d32": dict(heads=4, kv_heads=4, head_dim=32, mask="bias", sq=[200, 33], skv=[128, 100], batch=2),
    "causal_cross_d16": dict(heads=6, kv_heads=3, head_dim=16, mask="causal", sq=[20, 130], skv=[128, 1], batch=2),
    # every sentence padded to its own length (the key-mask path in every block; see _ragged), seq in each of
    # rlx_attn_short2's key classes
    "padding_ragged_d32": dict(heads=12, kv_heads=12, head_dim=32, mask="padding", sq=[128, 61, 30, 11], batch=6),
    "none_d16_odd": dict(heads=3, kv_heads=3, head_dim=16, mask="none", sq=[77, 128, 5], batch=3),
}


#: (name, precision, CudaTarget options, the kernel expected): the first kernel, rlx_attn_short2's other
#: chunk size / block size and its persistent form (attn_pipe) on a few cases (the default build runs every case)
VARIANTS = [("padding_d32_8warps", "f16", {"short_attention_v1": True}, "rlx_attn_short<"),
            ("causal_gqa_d64", "bf16", {"short_attention_v1": True}, "rlx_attn_short<"),
            ("bias_cross_d32", "f16", {"short_attention_v1": True}, "rlx_attn_short<"),
            ("padding_d32_8warps", "f16", {"attn_bk": 128, "attn_warps": 4}, "rlx_attn_short2<"),
            ("causal_gqa_d64", "f16", {"attn_bk": 128}, "rlx_attn_short2<"),
            ("padding_ragged_d32", "bf16", {"attn_bk": 128}, "rlx_attn_short2<"),
            ("padding_ragged_d32", "f16", {"attn_bk": 32}, "rlx_attn_short2<"),
            ("causal_gqa_d64", "bf16", {"attn_bk": 32}, "rlx_attn_short2<"),
            ("bias_cross_d32", "f16", {"attn_bk": 32, "attn_warps": 2}, "rlx_attn_short2<"),
            ("padding_ragged_d32", "f16", {"attn_pipe": True}, "rlx_attn_short2p<"),
            ("padding_d32_8warps", "bf16", {"attn_pipe": True, "attn_warps": 4}, "rlx_attn_short2p<"),
            ("causal_cross_d16", "f16", {"attn_pipe": True}, "rlx_attn_short2p<"),
            ("bias_cross_d32", "f16", {"attn_pipe": True, "attn_bk": 64}, "rlx_attn_short2p<"),
            ("none_d64_4warps", "bf16", {"attn_pipe": True}, "rlx_attn_short2p<")]


def _ragged(feed: dict, seed: int) -> dict:
    """`feed` with every batch row's keys cut at its own random length (row 1 stays fully masked)."""
    m = feed["m"].copy()
    rng = np.random.default_rng(seed)
    for b in range(m.shape[0]):
        if b != 1:
            m[b, int(rng.integers(1, m.shape[1] + 1)):] = 0
    return {**feed, "m": m}


def _check(name: str, precision: str, cg, kernel: str) -> None:
    case = cases._attention_case(name, seed=len(name), **SHORT[name])
    assert kernel in cg.source, f"{kernel} was not chosen"
    feeds = [_ragged(f, i) for i, f in enumerate(case.feeds)] if "ragged" in name else case.feeds
    for i, feed in enumerate(feeds):
        (ref,) = reference.run(case.graph, feed, {})
        (out,) = cg.run(feed)
        (again,) = cg.run(feed)  # the replay of the captured CUDA graph
        o, r = np.asarray(out, np.float64), np.asarray(ref, np.float64)
        scale = max(cases.scale_of(r), 1e-30)
        rtol = 20 * U[precision]
        err = np.abs(o - r)
        assert np.all(err <= rtol * (np.abs(r) + scale)), f"{name}[{precision}] feed {i}: max err {err.max():.3g}"
        assert cases.rel_l2(o, r) <= 10 * U[precision], f"{name}[{precision}] feed {i}"
        np.testing.assert_array_equal(out, again)


@pytest.mark.parametrize("precision", ["f16", "bf16"])
@pytest.mark.parametrize("name", sorted(SHORT))
def test_short_attention_matches_reference(name: str, precision: str) -> None:
    case = cases._attention_case(name, seed=len(name), **SHORT[name])
    _check(name, precision, Session(Device.CUDA, precision=precision).compile(case.graph, opt_level=0),
           "rlx_attn_short2<")


@pytest.mark.parametrize("name,precision,options,kernel", VARIANTS)
def test_short_attention_variants_match_reference(name: str, precision: str, options: dict, kernel: str) -> None:
    case = cases._attention_case(name, seed=len(name), **SHORT[name])
    lir = Session(Device.CUDA).lower(case.graph, opt_level=0)
    _check(name, precision, compile_cuda(lir, Config.from_env(), precision=precision, **options), kernel)

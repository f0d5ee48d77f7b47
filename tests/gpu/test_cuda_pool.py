"""The pooling tail as one kernel (PoolTail, rlx_pool_tail) on the GPU: the same embeddings as rlx.reference and as
the build without it (`pool_tail=False`: the product, reductions and divisions as separate kernels), in f32, f16
and bf16, batches with padding and a sentence with no token, a mean-only tail, and the f32 output it writes
directly read through both run paths (host copies and device pointers)."""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from tests.gpu.gemm_common import GPU_ONLY, build_with_params
from tests.gpu.pool_common import pool_feed, pool_graph

pytestmark = GPU_ONLY

#: Tolerance against the f32 reference: the hidden states tanh(x W) are computed in the session precision.
ATOL = {"f32": 1e-5, "f16": 3e-3, "bf16": 2.5e-2}


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("normalize", [True, False])
def test_pool_tail_matches_reference_and_unfused(precision: str, normalize: bool) -> None:
    graph = pool_graph(hidden=48, max_batch=4, max_seq=24, normalize=normalize)
    fused = build_with_params(graph, precision, pool_feed(1, 1)[1])
    plain = build_with_params(graph, precision, pool_feed(1, 1)[1], pool_tail=False)
    assert "rlx_pool_tail<" in fused.source and "rlx_pool_tail<" not in plain.source
    for batch, seq in ((1, 16), (3, 9), (4, 24)):
        feed, params = pool_feed(batch, seq)
        ref = reference.run(graph, feed, params)[0]
        got, base = fused.run(feed)[0], plain.run(feed)[0]
        assert got.dtype == np.float32 and got.shape == (batch, 48)
        np.testing.assert_allclose(got, ref, rtol=0, atol=ATOL[precision])
        np.testing.assert_allclose(base, ref, rtol=0, atol=ATOL[precision])
        if batch > 2:
            np.testing.assert_array_equal(got[0], 0.0)  # a sentence without tokens pools to zeros


def test_pool_tail_output_through_device_pointers() -> None:
    graph = pool_graph(hidden=48, max_batch=4, max_seq=24)
    feed, params = pool_feed(3, 11, seed=7)
    cg = build_with_params(graph, "f16", params)
    ref = reference.run(graph, feed, params)[0]
    dev = {k: cg.to_device(v) for k, v in feed.items()}
    out = cg.to_device(np.full((3, 48), np.nan, np.float32))
    cg.run_device(dev, outputs={"e": out})
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=ATOL["f16"])
    step = cg.bind_device(dev, outputs={"e": out})
    for _ in range(3):  # replays of the captured graph
        step()
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=ATOL["f16"])


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("norm", ["layer_res", "rms"])
def test_the_norm_in_the_tail_matches_reference_and_its_own_kernel(precision: str, norm: str) -> None:
    """Sentences of <= 64 tokens: rlx_pool_tail_norm normalizes the norm's inputs itself; longer ones (70): the
    norm's kernel, then rlx_pool_tail. Both against the reference and the build with the norm as its own kernel."""
    graph = pool_graph(hidden=48, max_batch=3, max_seq=72, norm=norm)
    params = {k: v for k, v in pool_feed(1, 1, norm=True)[1].items() if k != "beta" or norm.startswith("layer")}
    fused = build_with_params(graph, precision, params, pool_norm=True)
    plain = build_with_params(graph, precision, params)
    assert "rlx_pool_tail_norm<" in fused.source and "rlx_pool_tail_norm<" not in plain.source
    for batch, seq in ((1, 16), (3, 9), (2, 64), (3, 70)):
        feed, _ = pool_feed(batch, seq, norm=True)
        ref = reference.run(graph, feed, params)[0]
        got, base = fused.run(feed)[0], plain.run(feed)[0]
        np.testing.assert_allclose(got, ref, rtol=0, atol=ATOL[precision])
        np.testing.assert_allclose(base, ref, rtol=0, atol=ATOL[precision])
        if batch > 2:
            np.testing.assert_array_equal(got[0], 0.0)

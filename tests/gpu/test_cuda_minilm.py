"""MiniLM-L6-shaped BERT embeddings on the GPU match the CPU backend (and the reference)."""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.driver import Device, Session
from rlx.models.bert import BertConfig, bert_inputs, build_bert, random_weights
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

MINILM = BertConfig(vocab_size=30522, hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def model() -> tuple:
    graph = build_bert(MINILM, max_batch=8, max_seq=64, output="embeddings")
    weights = random_weights(MINILM, seed=3, scale=0.05)
    rng = np.random.default_rng(5)
    ids = rng.integers(1000, MINILM.vocab_size, size=(4, 37)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 20:] = 0
    mask[3, 5:] = 0
    return graph, weights, bert_inputs(ids, mask)


def _run(session: Session, graph, weights, feed) -> np.ndarray:
    cg = session.compile(graph)
    for k, v in weights.items():
        cg.set_param(k, v)
    return cg.run(feed)[0]


def test_minilm_cuda_matches_cpu(model: tuple) -> None:
    graph, weights, feed = model
    cpu = _run(Session(Device.CPU), graph, weights, feed)
    ref = reference.run(graph, feed, weights)[0]
    assert _cosines(cpu, ref).min() > 0.999999
    f32 = _run(Session(Device.CUDA, precision="f32"), graph, weights, feed)
    np.testing.assert_allclose(f32, cpu, rtol=1e-4, atol=1e-5)
    for precision in ("f16", "bf16"):
        low = _run(Session(Device.CUDA, precision=precision), graph, weights, feed)
        cos = _cosines(low, cpu)
        # f16 keeps 11 bits: embeddings agree to cosine 1 - O(u^2 * depth); bf16's 8 bits give ~64x less
        assert cos.min() >= (0.9999 if precision == "f16" else 0.999), f"{precision}: cosines {cos}"


@pytest.mark.parametrize("shape", [(1, 16), (2, 9), (3, 21)])
def test_minilm_short_steps_match_cpu(model: tuple, shape: tuple[int, int]) -> None:
    """Steps of at most 64 rows: every GEMM on rlx_gemm_small, every rlx kernel launched with PDL; the same
    embeddings as the CPU and as the build without either (cuBLASLt, plain launches)."""
    from rlx.config import Config
    from rlx.pipeline.cuda import compile_cuda

    graph, weights, _ = model
    rng = np.random.default_rng(sum(shape))
    ids = rng.integers(1000, MINILM.vocab_size, size=shape).astype(np.int64)
    mask = np.ones_like(ids)
    mask[-1, shape[1] // 2:] = 0 if shape[0] > 1 else 1
    feed = bert_inputs(ids, mask)
    cpu = _run(Session(Device.CPU), graph, weights, feed)
    lir = Session(Device.CUDA).lower(graph)
    for precision in ("f16", "bf16"):
        outs = []
        for options in ({}, {"pdl": False, "small_gemm": False}):
            cg = compile_cuda(lir, Config.from_env(), precision=precision, **options)
            assert ("rlx_gemm_small<" in cg.source) == (not options)
            for k, v in weights.items():
                cg.set_param(k, v)
            outs.append(cg.run(feed)[0])
            np.testing.assert_array_equal(outs[-1], cg.run(feed)[0])  # the captured graph's replay
        for out in outs:
            cos = _cosines(out, cpu)
            assert cos.min() >= (0.9999 if precision == "f16" else 0.999), f"{precision} {shape}: cosines {cos}"

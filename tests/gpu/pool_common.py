"""Graphs ending in a sentence-embedding tail (masked mean over the sequence, optionally L2-normalized), built the way
rlx.models.bert builds it: shared by tests/codegen/test_cuda_pool*.py (CPU) and tests/gpu/test_cuda_pool.py."""

from __future__ import annotations

import numpy as np

from rlx.ir.graph import Graph, NodeId
from rlx.ir.shape import Dim


def pool_graph(hidden: int = 48, *, max_batch: int = 4, max_seq: int = 24, normalize: bool = True,
               dense: bool = True, leak: str = "", norm: str = "") -> Graph:
    """tanh(x W) (a producer of the hidden states: `dense`) or x itself, pooled with mask m into output "e".

    `norm` normalizes the hidden states before the pooling (params "gamma", "beta"): "layer" (layer_norm),
    "rms" (rms_norm), "layer_res" / "rms_res" (of tanh(x W) + x: the fusions make a fused_residual_* norm).
    `leak` makes the tail unfusable: "mean" (the mean is a second output), "count" (the clamped count is read
    again), "sum" (the masked sum is read again); "norm" keeps the tail but not its norm (the normalized states
    are a second output)."""
    g = Graph("pool")
    b, s = Dim.dynamic("batch", max_batch), Dim.dynamic("seq", max_seq)
    x = g.input("x", [b, s, hidden])
    m = g.input("m", [b, s])
    h = g.activation("tanh", g.matmul(x, g.param("w", [hidden, hidden]))) if dense else x
    if norm:
        if norm.endswith("_res"):
            h = g.add_(h, x)
        gamma = g.param("gamma", [hidden])
        h = (g.layer_norm(h, gamma, g.param("beta", [hidden]), eps=1e-5) if norm.startswith("layer")
             else g.rms_norm(h, gamma, eps=1e-6))
    normed = h
    summed = g.reshape(g.matmul(g.reshape(m, [b, 1, s]), h), [b, hidden])
    count = g.binary("max", g.reduce("sum", m, [1], keep_dim=True), g.constant(np.float32(1e-9)))
    mean = g.div(summed, count)
    out: NodeId = mean
    if normalize:
        norm = g.activation("sqrt", g.reduce("sum", g.mul(mean, mean), [1], keep_dim=True))
        out = g.div(mean, g.binary("max", norm, g.constant(np.float32(1e-12))))
    outputs = {"e": out}
    if leak == "mean":
        outputs["mean"] = mean
    elif leak == "count":
        outputs["c2"] = g.mul(count, count)
    elif leak == "sum":
        outputs["s2"] = g.add_(summed, summed)
    elif leak == "norm":
        outputs["h"] = normed
    g.set_outputs(outputs)
    return g


def pool_feed(batch: int, seq: int, hidden: int = 48, seed: int = 0, norm: bool = False) -> tuple[dict, dict]:
    """(inputs, params) for `pool_graph` (with `norm`: the norm's gamma and beta too): one sentence padded to half
    its length, one fully masked when batch > 2; the params depend on `hidden` only (a build's weights serve every
    feed)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    m = np.ones((batch, seq), np.float32)
    if batch > 1:
        m[-1, seq // 2:] = 0
    if batch > 2:
        m[0, :] = 0  # no token at all: the count clamps to 1e-9, the mean is 0
    # the weights from their own generator: the same for every batch and sequence length of one hidden size
    w = (np.random.default_rng(1000 + hidden).standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    if not norm:
        return {"x": x, "m": m}, {"w": w}
    nrng = np.random.default_rng(2000 + hidden)
    gamma = (1.0 + 0.2 * nrng.standard_normal(hidden)).astype(np.float32)
    beta = (0.1 * nrng.standard_normal(hidden)).astype(np.float32)
    return {"x": x, "m": m}, {"w": w, "gamma": gamma, "beta": beta}

"""Graphs ending in a sentence-embedding tail (masked mean over the sequence, optionally L2-normalized), built the way
rlx.models.bert builds it: shared by tests/codegen/test_cuda_pool*.py (CPU) and tests/gpu/test_cuda_pool.py."""

from __future__ import annotations

import numpy as np

from rlx.ir.graph import Graph, NodeId
from rlx.ir.shape import Dim


def pool_graph(hidden: int = 48, *, max_batch: int = 4, max_seq: int = 24, normalize: bool = True,
               dense: bool = True, leak: str = "") -> Graph:
    """tanh(x W) (a producer of the hidden states: `dense`) or x itself, pooled with mask m into output "e".

    `leak` makes the tail unfusable: "mean" (the mean is a second output), "count" (the clamped count is read
    again), "sum" (the masked sum is read again)."""
    g = Graph("pool")
    b, s = Dim.dynamic("batch", max_batch), Dim.dynamic("seq", max_seq)
    x = g.input("x", [b, s, hidden])
    m = g.input("m", [b, s])
    h = g.activation("tanh", g.matmul(x, g.param("w", [hidden, hidden]))) if dense else x
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
    g.set_outputs(outputs)
    return g


def pool_feed(batch: int, seq: int, hidden: int = 48, seed: int = 0) -> tuple[dict, dict]:
    """(inputs, params) for `pool_graph`: one sentence padded to half its length, one fully masked when batch > 2;
    the params depend on `hidden` only (a build's weights serve every feed)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    m = np.ones((batch, seq), np.float32)
    if batch > 1:
        m[-1, seq // 2:] = 0
    if batch > 2:
        m[0, :] = 0  # no token at all: the count clamps to 1e-9, the mean is 0
    # the weights from their own generator: the same for every batch and sequence length of one hidden size
    w = (np.random.default_rng(1000 + hidden).standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    return {"x": x, "m": m}, {"w": w}

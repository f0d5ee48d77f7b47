"""A BERT-style embedding sum (two row gathers added, times a row vector): shared by
tests/codegen/test_cuda_region_gather.py (CPU) and tests/gpu/test_cuda_region_gather.py."""

from __future__ import annotations

import numpy as np

from rlx.ir.graph import Graph
from rlx.ir.shape import Dim

VOCAB, POSITIONS, HIDDEN = 50, 20, 24


def embed_graph(*, leak: bool = False, table_input: bool = False) -> Graph:
    """e = (word[ids] + pos[positions]) * scale: word and pos are params (`table_input`: word is an input).
    `leak`: the word lookup is a second output (read twice: it keeps its own kernel)."""
    g = Graph("embed")
    b, s = Dim.dynamic("batch", 4), Dim.dynamic("seq", 12)
    ids = g.input("ids", [b, s], dtype="i64")
    pos = g.input("pos", [s], dtype="i64")
    word = g.input("word", [VOCAB, HIDDEN]) if table_input else g.param("word", [VOCAB, HIDDEN])
    w = g.gather(word, ids)
    p = g.gather(g.param("pos_table", [POSITIONS, HIDDEN]), pos)
    e = g.mul(g.add_(w, p), g.param("scale", [HIDDEN]))
    g.set_outputs({"e": e, "w": w} if leak else {"e": e})
    return g


def embed_feed(batch: int, seq: int, seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    feed = {"ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64), "pos": np.arange(seq, dtype=np.int64)}
    wr = np.random.default_rng(77)
    params = {"word": wr.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
              "pos_table": wr.standard_normal((POSITIONS, HIDDEN)).astype(np.float32),
              "scale": (1 + 0.1 * wr.standard_normal(HIDDEN)).astype(np.float32)}
    return feed, params

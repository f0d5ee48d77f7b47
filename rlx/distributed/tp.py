"""Tensor parallelism for the BERT encoder, Megatron-style: `shard(embedder, tp=N)`.

Each of the N ranks holds 1/N of every layer's attention heads and FFN columns:

- query / key / value and the FFN's first linear are *column-parallel*: rank r keeps
  rows `[r*n/N, (r+1)*n/N)` of the HF `[out, in]` weight and of its bias, so it computes
  its own heads (attention runs on `num_heads/N` heads) and its own FFN columns;
- the attention output dense and the FFN's second linear are *row-parallel*: rank r keeps
  the matching columns of the weight and multiplies its slice of the activations,
  giving a partial sum; one `all_reduce` (sum) after attention and one after the FFN
  complete it, then the (replicated) bias, residual and layer norm follow on every rank.

Embeddings, layer norms and pooling are replicated. Every rank's graph is an ordinary
MIR graph with `all_reduce` nodes (`rlx.ir.ops.AllReduce`); `ShardedEncoder.run_reference`
runs the N ranks as threads over the `LocalTransport` (`rlx.reference.run_ranks`);
`ShardedEncoder.load(rank)` compiles rank r's graph inside `rlx.distributed.launch`.

>>> from rlx.models.bert import BertConfig, random_weights, build_bert, bert_inputs
>>> from rlx import reference
>>> cfg = BertConfig(vocab_size=10, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)
>>> w = random_weights(cfg)
>>> tp2 = shard_bert(cfg, w, tp=2, max_batch=1, max_seq=4)
>>> feed = bert_inputs(np.array([[2, 5, 7, 3]]), np.ones((1, 4), np.int64))
>>> one = reference.run(build_bert(cfg, max_batch=1, max_seq=4), feed, w)[0]
>>> bool(np.allclose(tp2.run_reference(feed)[0], one, atol=1e-5))
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx.errors import RlxError
from rlx.ir import ops as O
from rlx.ir.graph import Graph, NodeId
from rlx.ir.hir import HirModule
from rlx.ir.shape import Dim
from rlx.models import bert as B

#: Column-parallel linears (rows of the HF [out, in] weight split) and row-parallel ones (columns split).
_COLUMN = ("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense")
_ROW = ("attention.output.dense", "output.dense")


@dataclass(frozen=True)
class ShardedEncoder:
    """The per-rank graphs and weights of a tensor-parallel encoder (`graphs[r]` runs with `weights[r]`)."""

    tp: int
    graphs: tuple[Graph, ...]
    weights: tuple[dict[str, np.ndarray], ...]

    def run_reference(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run every rank on the same `inputs` (threads over the LocalTransport); rank 0's outputs."""
        from rlx import reference

        outs = reference.run_ranks(list(self.graphs), [dict(inputs)] * self.tp, list(self.weights))
        return outs[0]

    def load(self, rank: Any, device: str = "cpu", num_threads: int | None = None) -> Any:
        """Rank `rank.rank`'s compiled graph (a `rlx.distributed.Rank` from `launch`), its weights set
        and its transport attached; every rank compiles the same graph (one cache entry)."""
        from rlx.driver import Session

        if rank.world != self.tp:
            raise RlxError(f"this encoder is split over {self.tp} ranks, the launch has {rank.world}")
        compiled = Session(device).compile(self.graphs[rank.rank], num_threads=num_threads)
        for name, arr in self.weights[rank.rank].items():
            if name in compiled.param_names:
                compiled.set_param(name, arr)
        return rank.attach(compiled)


def shard(model: Any, tp: int) -> Any:
    """Split `model` over `tp` ranks, Megatron-style: a `SentenceEmbedder` (BERT) gives a
    `ShardedEncoder` (`shard_bert`), a `CausalLM` (LLaMA family) a `ShardedDecoder`
    (`rlx.distributed.tp_decoder`). Each rank then loads its share inside `rlx.distributed.launch`."""
    if hasattr(model, "tensors") and hasattr(model, "generate"):
        from rlx.distributed.tp_decoder import shard_causal_lm

        return shard_causal_lm(model, tp)
    embedder = model
    return shard_bert(embedder.config, embedder.weights, tp, max_batch=embedder.max_batch,
                      max_seq=embedder.max_seq, pooling=embedder.sentence.pooling,
                      normalize=embedder.sentence.normalize)


def shard_bert(config: B.BertConfig, weights: Mapping[str, np.ndarray], tp: int, *, max_batch: int, max_seq: int,
               output: str = "embeddings", pooling: str = "mean", normalize: bool = True) -> ShardedEncoder:
    """Split a BERT encoder over `tp` ranks (heads and FFN columns; see the module docstring)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise RlxError(f"tp must be a positive int, got {tp!r}")
    for what, n in (("num_heads", config.num_heads), ("intermediate_size", config.intermediate_size)):
        if n % tp:
            raise RlxError(f"tp={tp} does not divide the model's {what} {n}")
    graphs, rank_weights = [], []
    for rank in range(tp):
        hir = _sharded_hir(config, tp, max_batch=max_batch, max_seq=max_seq, output=output, pooling=pooling,
                           normalize=normalize)
        graphs.append(hir.lower_to_mir())
        rank_weights.append(_slice_weights(config, weights, tp, rank))
    return ShardedEncoder(tp, tuple(graphs), tuple(rank_weights))


def _slice_weights(config: B.BertConfig, weights: Mapping[str, np.ndarray], tp: int,
                   rank: int) -> dict[str, np.ndarray]:
    out = {}
    for name, arr in weights.items():
        arr = np.asarray(arr)
        module = name.rsplit(".", 1)[0].split(".", 3)[-1] if name.startswith("encoder.layer.") else ""
        if module in _COLUMN:
            n = arr.shape[0] // tp  # [out, in] weight or [out] bias: split the outputs
            arr = arr[rank * n:(rank + 1) * n]
        elif module in _ROW and name.endswith(".weight"):
            n = arr.shape[1] // tp  # [out, in]: split the inputs; the bias stays whole (added after the sum)
            arr = arr[:, rank * n:(rank + 1) * n]
        out[name] = np.ascontiguousarray(arr)
    return out


class _ShardedEncoder(B._Encoder):
    """`_Encoder` with one rank's share of each layer and the two all-reduces."""

    def __init__(self, g: HirModule, config: B.BertConfig, tp: int) -> None:
        super().__init__(g, config)
        self.tp = tp
        for name, shape in list(self.shapes.items()):
            module = name.rsplit(".", 1)[0].split(".", 3)[-1] if name.startswith("encoder.layer.") else ""
            if module in _COLUMN:
                self.shapes[name] = (shape[0] // tp, *shape[1:])
            elif module in _ROW and name.endswith(".weight"):
                self.shapes[name] = (shape[0], shape[1] // tp)

    def row_parallel(self, x: NodeId, prefix: str) -> NodeId:
        """This rank's partial product, summed over the ranks, then the bias."""
        g = self.g
        partial = g.linear(x, self.param(prefix + ".weight"), transpose_weight=True, name=prefix)
        total = g.add(O.AllReduce(world=self.tp, reduce="sum"), [partial], name=prefix + ".all_reduce")
        return g.add_(total, self.param(prefix + ".bias"))

    def layer(self, x: NodeId, i: int, mask: NodeId) -> NodeId:
        g, cfg = self.g, self.cfg
        p = f"encoder.layer.{i}."
        q = self.linear(x, p + "attention.self.query")
        k = self.linear(x, p + "attention.self.key")
        v = self.linear(x, p + "attention.self.value")
        a = g.attention(q, k, v, num_heads=cfg.num_heads // self.tp, head_dim=cfg.head_dim, mask="padding",
                        mask_input=mask, name=p + "attention.self")
        x = self.layer_norm(g.add_(self.row_parallel(a, p + "attention.output.dense"), x),
                            p + "attention.output.LayerNorm")
        hidden = self.linear(x, p + "intermediate.dense", act=B.HF_ACTIVATIONS[cfg.hidden_act])
        return self.layer_norm(g.add_(self.row_parallel(hidden, p + "output.dense"), x), p + "output.LayerNorm")


def _sharded_hir(config: B.BertConfig, tp: int, *, max_batch: int, max_seq: int, output: str, pooling: str,
                 normalize: bool) -> HirModule:
    # The inputs, embeddings and pooling of rlx.models.bert.bert_hir; only the layers differ.
    if output not in B.OUTPUTS:
        raise RlxError(f"unknown BERT output {output!r}; expected one of {B.OUTPUTS}")
    batch = Dim.dynamic("batch", max=max_batch)
    seq = Dim.dynamic("seq", max=max_seq)
    g = HirModule(f"bert_tp{tp}")
    ids = g.input("input_ids", [batch, seq], "i64")
    mask_i = g.input("attention_mask", [batch, seq], "i64")
    positions = g.input("position_ids", [seq], "i64")
    mask = g.cast(mask_i, "f32")
    enc = _ShardedEncoder(g, config, tp)
    x = enc.embeddings(ids, positions, None)
    for i in range(config.num_layers):
        x = enc.layer(x, i, mask)
    if output == "tokens":
        g.set_outputs({"last_hidden_state": x})
        return g
    pooled = B._pool(g, x, mask, pooling, batch, seq, config.hidden_size)
    if normalize:
        pooled = B._l2_normalize(g, pooled)
    g.set_outputs({"embeddings": pooled})
    return g


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays taken as flat vectors.

    >>> cosine(np.array([1.0, 0.0]), np.array([1.0, 0.0]))
    1.0
    """
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))


__all__: Sequence[str] = ("ShardedEncoder", "cosine", "shard", "shard_bert")

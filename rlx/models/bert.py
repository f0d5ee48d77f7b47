"""BERT-family encoders as RLX graphs, for any BERT config.

`build_bert` returns a MIR graph with dynamic `batch` and `seq` dims (bounded
by `max_batch` / `max_seq`, one compiled library serves every size up to
them). Its inputs are

- `input_ids` i64 `[batch, seq]`, `attention_mask` i64 `[batch, seq]` (1 = token, 0 = padding),
- `position_ids` i64 `[seq]` (`arange(seq)`, fed by the caller: a dynamic-length
  range cannot be a constant),
- `token_type_ids` i64 `[batch, seq]` only with `token_types=True`; otherwise
  every token has type 0 (what single-sentence embedding uses).

Params carry the checkpoint's own names (`encoder.layer.0.attention.self.query.weight`,
HF `[out, in]` layout), so a safetensors dict feeds `set_param` directly.
Output "tokens" is the last hidden state `[batch, seq, hidden]`; output
"embeddings" is the sentence embedding `[batch, hidden]` pooled the way
sentence-transformers does (mean over unmasked tokens, or the CLS token) and
optionally L2-normalized.

>>> cfg = BertConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
>>> g = build_bert(cfg, max_batch=4, max_seq=16, output="embeddings")
>>> import numpy as np
>>> from rlx import reference
>>> ids = np.array([[2, 7, 9, 3], [2, 5, 3, 0]])
>>> feed = bert_inputs(ids, (ids != 0).astype(np.int64))
>>> out = reference.run(g, feed, random_weights(cfg))[0]
>>> out.shape, bool(np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6))
((2, 32), True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlx.errors import ArtifactError, IRError
from rlx.models import weights as W

if TYPE_CHECKING:  # the IR loads when a graph is built: a warm start (compiled by recipe) builds none
    from rlx.ir.graph import Graph, NodeId
    from rlx.ir.hir import HirModule
    from rlx.ir.shape import Dim

#: HF `hidden_act` values and the RLX activation each one is.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
#: `model_type` values whose checkpoints have exactly the BERT layout and position scheme.
SUPPORTED_MODEL_TYPES = ("bert", "")
POOLING_MODES = ("mean", "cls")
OUTPUTS = ("tokens", "embeddings")
#: Checkpoint name prefixes of BertModel weights saved inside a task model.
NAME_PREFIXES = ("bert.", "model.")


@dataclass(frozen=True)
class BertConfig:
    """The hyper-parameters a BERT encoder graph depends on (HF names in `from_hf`)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArtifactError(f"BERT config {name} must be a positive int, got {v!r}")
        if self.hidden_size % self.num_heads:
            raise ArtifactError(f"BERT config hidden_size {self.hidden_size} is not divisible by "
                                f"num_attention_heads {self.num_heads}")
        if self.hidden_act not in HF_ACTIVATIONS:
            raise ArtifactError(f"unsupported hidden_act {self.hidden_act!r}; supported: {sorted(HF_ACTIVATIONS)}")
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ArtifactError(f"BERT config layer_norm_eps must be a float in (0, 1), got {eps!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @staticmethod
    def from_hf(cfg: Mapping[str, object]) -> BertConfig:
        """Read a HF `config.json` dict, rejecting configs whose graph would differ from BERT's."""
        model_type = str(cfg.get("model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ArtifactError(f"unsupported model_type {model_type!r}: only BERT-layout encoders "
                                f"({', '.join(t for t in SUPPORTED_MODEL_TYPES if t)}) are supported")
        pos = cfg.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ArtifactError(f"unsupported position_embedding_type {pos!r}; only 'absolute' is supported")
        if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
            raise ArtifactError("decoder / cross-attention BERT configs are not supported")
        required = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                    "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size"}
        missing = [hf for hf in required.values() if hf not in cfg]
        if missing:
            raise ArtifactError(f"config.json lacks {missing}")
        kwargs = {ours: cfg[hf] for ours, hf in required.items()}
        optional = {"max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
                    "layer_norm_eps": "layer_norm_eps", "hidden_act": "hidden_act"}
        kwargs.update({ours: cfg[hf] for ours, hf in optional.items() if hf in cfg})
        return BertConfig(**kwargs)  # type: ignore[arg-type]

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the encoder uses, by checkpoint name, with its HF shape."""
        h, f = self.hidden_size, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {
            "embeddings.word_embeddings.weight": (self.vocab_size, h),
            "embeddings.position_embeddings.weight": (self.max_position_embeddings, h),
            "embeddings.token_type_embeddings.weight": (self.type_vocab_size, h),
            "embeddings.LayerNorm.weight": (h,),
            "embeddings.LayerNorm.bias": (h,),
        }
        for i in range(self.num_layers):
            p = f"encoder.layer.{i}."
            for lin, (out, inp) in (("attention.self.query", (h, h)), ("attention.self.key", (h, h)),
                                    ("attention.self.value", (h, h)), ("attention.output.dense", (h, h)),
                                    ("intermediate.dense", (f, h)), ("output.dense", (h, f))):
                shapes[p + lin + ".weight"] = (out, inp)
                shapes[p + lin + ".bias"] = (out,)
            for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
                shapes[p + ln + ".weight"] = (h,)
                shapes[p + ln + ".bias"] = (h,)
        return shapes

    def flops(self, batch: int, seq: int) -> int:
        """Multiply-add FLOPs (2 per MAC) of the encoder's matmuls and attention for one run."""
        h, f, t = self.hidden_size, self.intermediate_size, batch * seq
        per_layer = 2 * t * h * (4 * h + 2 * f) + 2 * 2 * batch * seq * seq * h
        return self.num_layers * per_layer


def load_config(model_dir: str | Path) -> BertConfig:
    """The `BertConfig` of a HF model directory."""
    return BertConfig.from_hf(W.load_config(model_dir))


def load_weights(model_dir: str | Path, config: BertConfig) -> dict[str, np.ndarray]:
    """The encoder's weights from `model_dir`, shape-checked against `config`: float32 checkpoints as
    read-only views of the mapped file (`load_safetensors(mapped=True)`: a compiled model copies them in
    once, and nothing reads the file before)."""
    path = W.find_weights(model_dir)
    tensors = W.strip_prefix(W.load_safetensors(path, mapped=True), NAME_PREFIXES)
    return W.check_tensors(tensors, config.param_shapes(), source=str(path))


def random_weights(config: BertConfig, seed: int = 0, scale: float = 0.1) -> dict[str, np.ndarray]:
    """Random float32 weights of the right shapes (layer-norm gains near 1), for tests and benchmarks."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in config.param_shapes().items():
        arr = rng.standard_normal(shape) * scale
        if "LayerNorm.weight" in name:
            arr = arr + 1.0
        out[name] = arr.astype(np.float32)
    return out


def bert_inputs(input_ids: np.ndarray, attention_mask: np.ndarray,
                token_type_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The input dict of a `build_bert` graph for a padded token batch."""
    ids = np.ascontiguousarray(input_ids, dtype=np.int64)
    feed = {"input_ids": ids,
            "attention_mask": np.ascontiguousarray(attention_mask, dtype=np.int64),
            "position_ids": np.arange(ids.shape[1], dtype=np.int64)}
    if token_type_ids is not None:
        feed["token_type_ids"] = np.ascontiguousarray(token_type_ids, dtype=np.int64)
    return feed


class _Encoder:
    """Emits the encoder as HIR blocks (one method per BERT module, HF param names)."""

    def __init__(self, g: HirModule, config: BertConfig) -> None:
        self.g, self.cfg = g, config
        self.shapes = config.param_shapes()

    def param(self, name: str) -> NodeId:
        return self.g.param(name, list(self.shapes[name]))

    def linear(self, x: NodeId, prefix: str, act: str | None = None) -> NodeId:
        # HF stores [out, in]: the block lowers to x @ transpose(W), which the layout pass folds into the param.
        return self.g.linear(x, self.param(prefix + ".weight"), self.param(prefix + ".bias"), activation=act,
                             transpose_weight=True, name=prefix)

    def layer_norm(self, x: NodeId, prefix: str) -> NodeId:
        return self.g.layer_norm(x, self.param(prefix + ".weight"), self.param(prefix + ".bias"),
                                 eps=self.cfg.layer_norm_eps, name=prefix)

    def embeddings(self, ids: NodeId, positions: NodeId, types: NodeId | None) -> NodeId:
        g, h = self.g, self.cfg.hidden_size
        x = g.gather(self.param("embeddings.word_embeddings.weight"), ids)
        x = g.add_(x, g.gather(self.param("embeddings.position_embeddings.weight"), positions))
        table = self.param("embeddings.token_type_embeddings.weight")
        if types is None:
            # Every token is type 0: add row 0 of the table (a [hidden] vector broadcast over the batch).
            x = g.add_(x, g.reshape(g.narrow(table, 0, 0, 1), [h]))
        else:
            x = g.add_(x, g.gather(table, types))
        return self.layer_norm(x, "embeddings.LayerNorm")

    def layer(self, x: NodeId, i: int, mask: NodeId) -> NodeId:
        g, cfg = self.g, self.cfg
        p = f"encoder.layer.{i}."
        q = self.linear(x, p + "attention.self.query")
        k = self.linear(x, p + "attention.self.key")
        v = self.linear(x, p + "attention.self.value")
        a = g.attention(q, k, v, num_heads=cfg.num_heads, head_dim=cfg.head_dim, mask="padding", mask_input=mask,
                        name=p + "attention.self")
        x = self.layer_norm(g.add_(self.linear(a, p + "attention.output.dense"), x), p + "attention.output.LayerNorm")
        hidden = self.linear(x, p + "intermediate.dense", act=HF_ACTIVATIONS[cfg.hidden_act])
        return self.layer_norm(g.add_(self.linear(hidden, p + "output.dense"), x), p + "output.LayerNorm")


def build_bert(config: BertConfig, *, max_batch: int, max_seq: int, output: str = "embeddings",
               pooling: str = "mean", normalize: bool = True, token_types: bool = False,
               name: str = "bert") -> Graph:
    """The encoder as a MIR graph; `output` is "tokens" (hidden states) or "embeddings" (pooled).

    Built from HIR blocks (`bert_hir`) and lowered, so the optimizer sees the
    canonical matmul + bias + activation and residual + layer-norm patterns.
    """
    return bert_hir(config, max_batch=max_batch, max_seq=max_seq, output=output, pooling=pooling,
                    normalize=normalize, token_types=token_types, name=name).lower_to_mir()


def bert_hir(config: BertConfig, *, max_batch: int, max_seq: int, output: str = "embeddings",
             pooling: str = "mean", normalize: bool = True, token_types: bool = False,
             name: str = "bert") -> HirModule:
    """The encoder as a `HirModule` of linear / attention / layer-norm blocks (see `build_bert`)."""
    if output not in OUTPUTS:
        raise IRError(f"unknown BERT output {output!r}; expected one of {OUTPUTS}")
    if pooling not in POOLING_MODES:
        raise IRError(f"unsupported pooling {pooling!r}; supported: {POOLING_MODES}")
    if isinstance(max_seq, bool) or not isinstance(max_seq, int) or not 1 <= max_seq <= config.max_position_embeddings:
        raise IRError(f"max_seq must be an int in [1, {config.max_position_embeddings}] "
                      f"(the model's max_position_embeddings), got {max_seq!r}")
    from rlx.ir.hir import HirModule
    from rlx.ir.shape import Dim

    batch = Dim.dynamic("batch", max=max_batch)
    seq = Dim.dynamic("seq", max=max_seq)
    g = HirModule(name)
    ids = g.input("input_ids", [batch, seq], "i64")
    mask_i = g.input("attention_mask", [batch, seq], "i64")
    positions = g.input("position_ids", [seq], "i64")
    types = g.input("token_type_ids", [batch, seq], "i64") if token_types else None
    mask = g.cast(mask_i, "f32")
    enc = _Encoder(g, config)
    x = enc.embeddings(ids, positions, types)
    for i in range(config.num_layers):
        x = enc.layer(x, i, mask)
    if output == "tokens":
        g.set_outputs({"last_hidden_state": x})
        return g
    pooled = _pool(g, x, mask, pooling, batch, seq, config.hidden_size)
    if normalize:
        pooled = _l2_normalize(g, pooled)
    g.set_outputs({"embeddings": pooled})
    return g


def _pool(g: Graph, x: NodeId, mask: NodeId, mode: str, batch: Dim, seq: Dim, hidden: int) -> NodeId:
    if mode == "cls":
        first = g.gather(x, g.constant(np.zeros(1, np.int64)), axis=1)  # [B, 1, H]
        return g.reshape(first, [batch, hidden])
    # Masked mean as sentence-transformers computes it: sum(h * m) / max(sum(m), 1e-9).
    # The masked sum is a batched [1, S] @ [S, H] product per sentence.
    summed = g.reshape(g.matmul(g.reshape(mask, [batch, 1, seq]), x), [batch, hidden])
    count = g.binary("max", g.reduce("sum", mask, [1], keep_dim=True), g.constant(np.float32(1e-9)))
    return g.div(summed, count)


def _l2_normalize(g: Graph, x: NodeId) -> NodeId:
    # torch.nn.functional.normalize: x / max(||x||_2, 1e-12).
    norm = g.activation("sqrt", g.reduce("sum", g.mul(x, x), [1], keep_dim=True))
    return g.div(x, g.binary("max", norm, g.constant(np.float32(1e-12))))

"""Tensor parallelism for LLaMA-family decoders, Megatron-style: `shard_decoder(config, tensors, tp=N)`.

Rank r of N holds, per layer, 1/N of the query heads and of the KV heads (with their KV
cache) and 1/N of the FFN columns:

- `attn_q` / `attn_k` / `attn_v` (and qwen2's biases), `ffn_gate`, `ffn_up` are
  *column-parallel*: rank r keeps rows `[r*n/N, (r+1)*n/N)` of the GGUF `[out, in]` matrix —
  whole rows, so quantized blocks are kept as they are;
- `attn_output` and `ffn_down` are *row-parallel*: rank r keeps the matching input columns,
  and the graph sums the ranks' partial products with one `all_reduce` after attention and one
  after the FFN (`rlx.models.llama.build_decoder(tp=N)`). A quantized row is cut between its
  blocks (32 values for q4_0/q4_1/q8_0/q5_*, 256 for the k-quants): a share that would split a
  block is refused;
- the vocabulary projection is split by rows when N divides the vocabulary (each rank computes
  its logits, an `all_gather` concatenates them); tied embeddings keep the whole table for the
  token lookup. Norms and the embedding are replicated.

Every rank runs the same graph on its own weights: `ShardedDecoder.load(rank)` builds rank
`rank.rank`'s `CausalLM` and attaches its transport (inside `rlx.distributed.launch`);
`ShardedDecoder.run_reference(fn)` runs `fn(model)` for every rank on threads of this process
in the reference evaluator.

>>> from rlx.models.decoder_config import DecoderConfig
>>> from rlx.models.causal_lm import CausalLM, random_tensors
>>> from rlx.models.llama import random_specs
>>> cfg = DecoderConfig(arch="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
...                     num_kv_heads=2, head_dim=8, ffn_size=48, rms_eps=1e-5, rope_base=10000.0,
...                     rope_variant="interleaved", n_rot=8, context_length=64, tie_embeddings=True,
...                     bos_id=1, eos_id=2)
>>> tensors = random_tensors(random_specs(cfg), seed=0)
>>> one = CausalLM(cfg, tensors, device="reference", max_context=16).generate([5, 6], 4).token_ids
>>> two = shard_decoder(cfg, tensors, tp=2, max_context=16)
>>> two.run_reference(lambda lm: lm.generate([5, 6], 4).token_ids) == [one, one]
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.errors import RlxError
from rlx.ir.quant import QUANT_FORMATS
from rlx.models import llama as L
from rlx.models.decoder_config import DecoderConfig

Tensors = Mapping[str, tuple[L.WeightSpec, np.ndarray]]
#: Per-layer roles split by output rows (column-parallel) and by input columns (row-parallel).
COLUMN_ROLES = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
BIAS_ROLES = ("attn_q", "attn_k", "attn_v")
ROW_ROLES = ("attn_output", "ffn_down")


@dataclass(frozen=True)
class ShardedDecoder:
    """A decoder split over `tp` ranks and how to build rank r's model: its tensors are `tensors[r]`,
    or (`shard_gguf`) sliced in the rank from the GGUF file at `path`, so a rank process receives a
    path, not the weights."""

    config: DecoderConfig
    tp: int
    tensors: tuple[dict[str, tuple[L.WeightSpec, np.ndarray]], ...]
    #: CausalLM keyword arguments every rank uses (max_context, max_batch, prefill_chunk, threads).
    options: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None
    path: str | None = None

    def rank_tensors(self, rank: int) -> dict[str, tuple[L.WeightSpec, np.ndarray]]:
        """Rank `rank`'s share of the tensors (read from `path` when the shards were not made here)."""
        if self.tensors:
            return self.tensors[rank]
        from rlx.models.gguf import read_gguf

        model = read_gguf(self.path)
        return _rank_tensors(self.config, _gguf_tensors(model), self.tp, rank)

    def _tokenizer(self) -> Any:
        if self.tokenizer is not None or self.path is None:
            return self.tokenizer
        from rlx.models.gguf import read_gguf
        from rlx.models.gguf_tokenizer import GgufTokenizer

        return GgufTokenizer.from_metadata(read_gguf(self.path).metadata)

    def load(self, rank: Any, device: str = "cpu", **overrides: Any) -> Any:
        """Rank `rank.rank`'s `CausalLM` (a `rlx.distributed.Rank` from `launch`), its transport attached."""
        from rlx.models.causal_lm import CausalLM

        if rank.world != self.tp:
            raise RlxError(f"this decoder is split over {self.tp} ranks, the launch has {rank.world}")
        lm = CausalLM(self.config, self.rank_tensors(rank.rank), self._tokenizer(), device=device, tp=self.tp,
                      **{**self.options, **overrides})
        if lm._compiled is not None:
            rank.attach(lm._compiled)
        return lm

    def run_reference(self, fn: Callable[[Any], Any]) -> list[Any]:
        """`fn(model)` on every rank's reference-evaluated model (threads over the LocalTransport)."""
        from rlx.ir.transport import run_ranks
        from rlx.models.causal_lm import CausalLM

        models = [CausalLM(self.config, self.rank_tensors(r), self._tokenizer(), device="reference", tp=self.tp,
                           **self.options) for r in range(self.tp)]
        return run_ranks(self.tp, lambda r: fn(models[r]))


def shard_gguf(path: str, tp: int, **options: Any) -> ShardedDecoder:
    """Split the decoder of a GGUF file over `tp` ranks without reading its weights here: each rank
    maps the file and slices its own share (`ShardedDecoder.load`). The split is checked now."""
    from rlx.models.gguf import read_gguf

    model = read_gguf(path)
    options.setdefault("max_context", min(2048, model.config.context_length))
    _check_tp(model.config, tp)
    _rank_tensors(model.config, _gguf_tensors(model), tp, 0)  # refuses a split that cuts a block, now
    return ShardedDecoder(model.config, tp, (), options, None, str(path))


def _gguf_tensors(model: Any) -> dict[str, tuple[L.WeightSpec, Any]]:
    return {name: (L.WeightSpec(t.ggml_type, tuple(t.shape)), t.data) for name, t in model.tensors.items()}


def shard_causal_lm(lm: Any, tp: int) -> ShardedDecoder:
    """`shard_decoder` for a `CausalLM`: its config, tensors, tokenizer and sizes."""
    return shard_decoder(lm.config, lm.tensors, tp, tokenizer=lm.tokenizer, max_context=lm.max_context,
                         max_batch=lm.max_batch, prefill_chunk=lm.prefill_chunk)


def shard_decoder(config: DecoderConfig, tensors: Tensors, tp: int, *, tokenizer: Any = None,
                  **options: Any) -> ShardedDecoder:
    """Split a decoder's GGUF-named tensors over `tp` ranks (see the module docstring)."""
    _check_tp(config, tp)
    ranks = tuple(_rank_tensors(config, tensors, tp, r) for r in range(tp))
    return ShardedDecoder(config, tp, ranks, dict(options), tokenizer)


def _check_tp(c: DecoderConfig, tp: Any) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise RlxError(f"tp must be a positive int, got {tp!r}")
    for what, n in (("num_heads", c.num_heads), ("num_kv_heads", c.num_kv_heads), ("ffn_size", c.ffn_size)):
        if n % tp:
            raise RlxError(f"tp={tp} does not divide the model's {what} {n}")


def _rank_tensors(c: DecoderConfig, tensors: Tensors, tp: int, rank: int) -> dict[str, tuple[L.WeightSpec, Any]]:
    out: dict[str, tuple[L.WeightSpec, Any]] = {}
    for name, (spec, data) in tensors.items():
        role = name.split(".")[2] if name.startswith("blk.") and name.count(".") >= 3 else ""
        if (role in COLUMN_ROLES and name.endswith(".weight")) or (role in BIAS_ROLES and name.endswith(".bias")):
            out[name] = _rows(spec, data, tp, rank, name)
        elif role in ROW_ROLES and name.endswith(".weight"):
            out[name] = _columns(spec, data, tp, rank, name)
        else:
            out[name] = (spec, data)
    # the vocabulary projection by rows when tp divides it (tied: a slice of the embedding table)
    source = L.output_weight_name(c, {n: s for n, (s, _) in tensors.items()})
    if tp > 1 and c.vocab_size % tp == 0:
        out["output.weight"] = _rows(*tensors[source], tp, rank, source)
    return out


def _rows(spec: L.WeightSpec, data: Any, tp: int, rank: int, name: str) -> tuple[L.WeightSpec, np.ndarray]:
    n = spec.shape[0] // tp
    if spec.shape[0] % tp:
        raise RlxError(f"tp={tp} does not divide the {spec.shape[0]} rows of {name!r}")
    rows = np.ascontiguousarray(np.asarray(data)[rank * n:(rank + 1) * n])
    return L.WeightSpec(spec.ggml_type, (n, *spec.shape[1:])), rows


def _columns(spec: L.WeightSpec, data: Any, tp: int, rank: int, name: str) -> tuple[L.WeightSpec, np.ndarray]:
    n_out, n_in = spec.shape
    k = n_in // tp
    if n_in % tp:
        raise RlxError(f"tp={tp} does not divide the {n_in} columns of {name!r}")
    arr = np.asarray(data)
    if not spec.quantized:
        return L.WeightSpec(spec.ggml_type, (n_out, k)), np.ascontiguousarray(arr[:, rank * k:(rank + 1) * k])
    fmt = QUANT_FORMATS[spec.ggml_type]
    if k % fmt.block_size:
        raise RlxError(f"{name!r} is {spec.ggml_type} (blocks of {fmt.block_size} values along a row): a "
                       f"{k}-column share per rank at tp={tp} would cut a block")
    nbytes = k // fmt.block_size * fmt.block_bytes  # whole blocks: the share's bytes of each row
    return L.WeightSpec(spec.ggml_type, (n_out, k)), np.ascontiguousarray(arr[:, rank * nbytes:(rank + 1) * nbytes])


__all__ = ["ShardedDecoder", "shard_causal_lm", "shard_decoder", "shard_gguf"]

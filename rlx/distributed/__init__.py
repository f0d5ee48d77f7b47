"""Beyond one process: corpus embedding to Parquet, and the same on a Ray cluster.

- `rlx.distributed.corpus`: `embed_corpus` streams a .txt/.jsonl/.parquet corpus in
  shards, writes each atomically, resumes after an interruption (`rlxc embed --input`).
- `rlx.distributed.bundle`: `save_bundle` / `BundledEmbedder.load` — a compiled
  sentence embedder as files that load without compiling (what workers receive).
- `rlx.distributed.ray_embed`: `embed_dataset(ds, model=...)` over Ray Data (needs `rlx[ray]`).
- `rlx.distributed.tp`: `shard(model, tp=N)` (also `rlx.shard`) — Megatron-style tensor-parallel
  BERT and LLaMA-family graphs with `all_reduce` nodes, in the reference or compiled per rank.
- `rlx.distributed.launch`: `launch(fn, nprocs=N)` runs N ranks (processes, or threads) with a
  transport each for their collectives (CPU shared memory; NCCL on CUDA).
"""

from __future__ import annotations

from rlx.distributed.bundle import BundledEmbedder, save_bundle
from rlx.distributed.corpus import CorpusError, embed_corpus, local_executor, read_embeddings
from rlx.distributed.launch import Rank, RankError, launch, local_ranks
from rlx.distributed.tp import shard, shard_bert
from rlx.distributed.tp_decoder import shard_decoder, shard_gguf


def __getattr__(name: str) -> object:
    # Ray is optional: rlx.distributed.embed_dataset imports it only when asked for.
    if name == "embed_dataset":
        from rlx.distributed.ray_embed import embed_dataset

        return embed_dataset
    raise AttributeError(f"module 'rlx.distributed' has no attribute {name!r}")


__all__ = ["BundledEmbedder", "CorpusError", "Rank", "RankError", "embed_corpus", "embed_dataset", "launch",
           "local_executor", "local_ranks", "read_embeddings", "save_bundle", "shard", "shard_bert", "shard_decoder",
           "shard_gguf"]

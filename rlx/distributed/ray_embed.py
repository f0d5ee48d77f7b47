"""Sentence embedding on Ray Data: one actor per worker, each loading the compiled bundle once.

`embed_dataset(ds, model=bundle_dir)` returns `ds.map_batches(...)` with an
actor pool (`ActorPoolStrategy(size=workers)`): each actor receives the bundle's
files (packed bytes, so workers need no shared disk), writes them to a local
temporary directory and `BundledEmbedder.load`s them — a dlopen of the RLX
artifact; workers never compile. Each batch gets an `embedding` column
(`[rows, dim]` float32) beside its other columns.

`ray_executor(bundle)` is the executor `embed_corpus` uses for `rlxc embed --ray`.
The shards still to do are handed to Ray as one dataset (their texts held in the
driver's memory), results stream back and each shard is written as soon as all
its rows are in.

Needs `pip install 'rlx[ray]'`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from rlx.distributed.bundle import BundledEmbedder, pack_bundle, unpack_bundle
from rlx.distributed.corpus import CorpusError, Shard


def _ray() -> Any:
    try:
        import ray
        import ray.data
    except ModuleNotFoundError:
        raise CorpusError("Ray is not installed: pip install 'rlx[ray]'") from None
    return ray


class EmbedActor:
    """A Ray Data actor: loads the bundle once, then embeds the `text_column` of each batch."""

    def __init__(self, files: Mapping[str, bytes] | Any, text_column: str = "text", output_column: str = "embedding",
                 num_threads: int | None = None) -> None:
        t0 = time.perf_counter()
        if not isinstance(files, Mapping):  # an ObjectRef to the packed bundle (one copy in the object store)
            files = _ray().get(files)
        self.model = BundledEmbedder.load(unpack_bundle(files), num_threads=num_threads)
        #: seconds from actor start to a loaded model (artifact dlopen, weights, tokenizer; no compile)
        self.startup_s = time.perf_counter() - t0
        self.text_column = text_column
        self.output_column = output_column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch[self.text_column].tolist()]
        out = dict(batch)
        out[self.output_column] = self.model.embed(texts)
        out["_rlx_startup_s"] = np.full(len(texts), self.startup_s)
        return out


def embed_dataset(ds: Any, model: str | os.PathLike[str] | Mapping[str, bytes] | Any, *, text_column: str = "text",
                  output_column: str = "embedding", batch_size: int = 256, workers: int = 2,
                  num_cpus_per_worker: float = 1, num_threads: int | None = None) -> Any:
    """`ds` with an `output_column` of sentence embeddings, computed by `workers` actors on Ray Data.

    `model` is a bundle directory (`rlx.distributed.save_bundle`), its packed files
    (`pack_bundle`), or an ObjectRef to those (shared by several calls). The result
    also carries `_rlx_startup_s` (each row's actor's model-load time; drop it with `drop_columns`).

    Example (a running Ray; tests/distributed/test_ray_embed.py runs it)::

        ds = ray.data.from_items([{"id": 0, "text": "a man eats food"}])
        embed_dataset(ds, model="bundle_dir").take(1)[0]["embedding"].shape   # (384,) for MiniLM
    """
    ray = _ray()
    if workers < 1:
        raise CorpusError(f"workers must be >= 1, got {workers}")
    if isinstance(model, ray.ObjectRef):
        files = model
    else:
        # Put once into the object store: captured in the actor's constructor arguments, the
        # bundle (~110 MB for MiniLM with its BLAS) would be pickled with every actor.
        files = ray.put(dict(model) if isinstance(model, Mapping) else pack_bundle(model))
    return ds.map_batches(EmbedActor, batch_size=batch_size, batch_format="numpy",
                          compute=ray.data.ActorPoolStrategy(size=workers),
                          fn_constructor_kwargs={"files": files, "text_column": text_column,
                                                 "output_column": output_column, "num_threads": num_threads},
                          num_cpus=num_cpus_per_worker)


def ray_executor(bundle: str | os.PathLike[str], *, address: str | None = None, workers: int = 2,
                 batch_size: int = 256, num_threads: int | None = 1) -> Callable[..., Iterator[tuple[Shard, Any]]]:
    """An `embed_corpus` executor running the pending shards on Ray (`address` None: a new local cluster)."""
    ray = _ray()
    files = pack_bundle(bundle)

    def run(shards: Iterator[Shard], progress: Callable[[int], None]) -> Iterator[tuple[Shard, np.ndarray]]:
        import pyarrow as pa

        todo = {s.index: s for s in shards}
        if not todo:
            return
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False,
                     include_dashboard=False) if address else ray.init(num_cpus=workers, log_to_driver=False,
                                                                      include_dashboard=False)
        shard_col = np.concatenate([np.full(len(s.texts), s.index, np.int64) for s in todo.values()])
        pos_col = np.concatenate([np.arange(len(s.texts), dtype=np.int64) for s in todo.values()])
        text_col = [t for s in todo.values() for t in s.texts]
        table = pa.table({"shard": shard_col, "pos": pos_col, "text": text_col})
        # Several blocks, so every actor gets work (one block is one task for one actor).
        block = max(batch_size, -(-len(table) // (4 * workers)))
        ds = ray.data.from_arrow([table.slice(i, block) for i in range(0, len(table), block)])
        out = embed_dataset(ds, ray.put(files), batch_size=batch_size, workers=workers, num_threads=num_threads)
        results: dict[int, np.ndarray] = {}
        filled: dict[int, int] = {}
        for batch in out.iter_batches(batch_format="numpy", batch_size=None):
            emb = np.asarray(batch["embedding"], np.float32)
            for idx in np.unique(batch["shard"]):
                sel = batch["shard"] == idx
                shard = todo[int(idx)]
                buf = results.setdefault(int(idx), np.empty((len(shard.texts), emb.shape[1]), np.float32))
                buf[batch["pos"][sel]] = emb[sel]
                filled[int(idx)] = filled.get(int(idx), 0) + int(sel.sum())
                if filled[int(idx)] == len(shard.texts):
                    yield shard, results.pop(int(idx))
            progress(len(emb))

    return run

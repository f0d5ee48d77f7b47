"""An embedder bundle: a compiled sentence-embedding model that loads without compiling.

`save_bundle(embedder, dir)` writes a directory that holds everything a worker
needs to embed sentences, and nothing it has to build:

| file | what |
| --- | --- |
| `artifact/` | the compiled pooled-encoder graph as an RLX artifact, weights included (`rlx.load`) |
| `tokenizer.json` | the model's tokenizer |
| `embedder.json` | batch bound, truncation length, pad id, embedding size, the artifact's key |

`BundledEmbedder.load(dir)` reads it back: `rlx.load` of the artifact (a
dlopen, no compiler, no code generator imported) plus the tokenizer. Its
`embed(texts)` sorts by token length and pads each batch to its own longest
sentence, exactly as `SentenceEmbedder.embed` does, so both give the same
numbers. Ray workers load a bundle once each (`rlx.distributed.ray_embed`).

`pack_bundle` / `unpack_bundle` turn a bundle into a `{file: bytes}` mapping and
back, so it can travel to workers that do not share the driver's file system.

>>> from tokenizers import Tokenizer, models, pre_tokenizers
>>> from rlx.models.bert import BertConfig, random_weights
>>> from rlx.models.embedder import SentenceEmbedder
>>> import tempfile, numpy as np
>>> vocab = {w: i for i, w in enumerate("[PAD] [UNK] [CLS] [SEP] a man eats food".split())}
>>> tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
>>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
>>> cfg = BertConfig(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
>>> emb = SentenceEmbedder(cfg, random_weights(cfg), tok, max_seq=8, max_batch=2)
>>> with tempfile.TemporaryDirectory() as d:
...     _ = save_bundle(emb, d)
...     again = BundledEmbedder.load(d)
...     bool(np.array_equal(again.embed(["a man", "food"]), emb.embed(["a man", "food"])))
True
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ArtifactError, ExecutionError
from rlx.models.embedder import pad_batch

BUNDLE_FORMAT = "rlx-embedder"
BUNDLE_VERSION = 1
ARTIFACT_DIR = "artifact"
TOKENIZER = "tokenizer.json"
META = "embedder.json"


def save_bundle(embedder: Any, directory: str | os.PathLike[str]) -> Path:
    """Compile `embedder`'s pooled graph (through the AOT cache) and write it as a bundle; returns the path.

    `embedder` is a `rlx.models.embedder.SentenceEmbedder` on device "cpu" or "cuda"
    with a tokenizer. `embedder.json` is written last: a directory without it is no bundle.
    """
    if embedder.device == "reference":
        raise ArtifactError("a bundle holds a compiled graph; build the embedder with device='cpu' or 'cuda'")
    if embedder.tokenizer is None:
        raise ArtifactError("a bundle needs an embedder with a tokenizer")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    compiled = embedder.runner("embeddings").compiled
    compiled.save(out / ARTIFACT_DIR, weights=True)
    embedder.tokenizer.save(str(out / TOKENIZER))
    meta = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "max_batch": embedder.max_batch,
            "truncate_to": embedder.truncate_to, "pad_id": embedder.pad_id, "dim": embedder.dim,
            "key": compiled.key}
    _atomic_write(out / META, json.dumps(meta, indent=1).encode())
    return out


class BundledEmbedder:
    """A loaded bundle: `embed(texts)` → float32 `[n, dim]`, in input order."""

    def __init__(self, compiled: Any, tokenizer: Any, meta: Mapping[str, Any]) -> None:
        self.compiled = compiled
        self.tokenizer = tokenizer
        self.max_batch = int(meta["max_batch"])
        self.pad_id = int(meta["pad_id"])
        self.dim = int(meta["dim"])
        self.key = str(meta["key"])

    @staticmethod
    def load(directory: str | os.PathLike[str], *, num_threads: int | None = None) -> BundledEmbedder:
        """Load a bundle written by `save_bundle` (dlopen and tokenizer; never compiles)."""
        d = Path(directory)
        meta = read_bundle_meta(d)
        from tokenizers import Tokenizer

        from rlx.runtime.artifact_load import load

        compiled = load(d / ARTIFACT_DIR, num_threads=num_threads)
        if compiled.key != meta["key"]:
            raise ArtifactError(f"{d / ARTIFACT_DIR} does not belong to {d / META} (their keys differ)")
        try:
            tokenizer = Tokenizer.from_file(str(d / TOKENIZER))
        except Exception as exc:  # the tokenizers package raises its own exception type
            raise ArtifactError(f"cannot load tokenizer {d / TOKENIZER}: {exc}") from None
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=int(meta["truncate_to"]))
        return BundledEmbedder(compiled, tokenizer, meta)

    def embed(self, texts: Sequence[str], on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """Embeddings of `texts` `[n, dim]` float32, in input order.

        Sorted by token length and run `max_batch` at a time, each batch padded to its own
        longest sentence (the order of `SentenceEmbedder.embed`); `on_batch(n)` after each batch.
        """
        if isinstance(texts, str):
            raise ExecutionError("embed() takes a list of texts; wrap a single text in a list")
        if not (hasattr(texts, "__len__") and hasattr(texts, "__iter__")):
            raise ExecutionError(f"embed() takes a list of texts (str), got {type(texts).__name__}")
        for i, s in enumerate(texts):
            if not isinstance(s, str):
                raise ExecutionError(f"text {i} is {type(s).__name__}, not str")
        out = np.empty((len(texts), self.dim), np.float32)
        if not texts:
            return out
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), self.max_batch):
            chunk = order[start:start + self.max_batch]
            tok, mask = pad_batch([ids[i] for i in chunk], self.pad_id)
            pos = np.arange(tok.shape[1], dtype=np.int64)
            out[chunk] = self.compiled.run({"input_ids": tok, "attention_mask": mask, "position_ids": pos})[0]
            if on_batch is not None:
                on_batch(len(chunk))
        return out


def read_bundle_meta(directory: Path) -> dict[str, Any]:
    """`embedder.json` of a bundle, checked; `ArtifactError` naming what is wrong."""
    path = directory / META
    if not path.is_file():
        raise ArtifactError(f"{directory} is not an embedder bundle (no {META}; written by save_bundle)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"cannot read {path}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != BUNDLE_FORMAT:
        raise ArtifactError(f"{path} is not an {BUNDLE_FORMAT} manifest")
    if meta.get("version") != BUNDLE_VERSION:
        raise ArtifactError(f"{path} has bundle version {meta.get('version')!r}; this RLX reads {BUNDLE_VERSION}")
    for k in ("max_batch", "truncate_to", "pad_id", "dim"):
        if isinstance(meta.get(k), bool) or not isinstance(meta.get(k), int) or meta[k] < 0:
            raise ArtifactError(f"{path}: {k} must be a non-negative int, got {meta.get(k)!r}")
    if not isinstance(meta.get("key"), str):
        raise ArtifactError(f"{path}: key must be a string")
    return meta


def pack_bundle(directory: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file of a bundle as `{relative path: bytes}` (to ship it to workers without a shared disk)."""
    d = Path(directory)
    read_bundle_meta(d)
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def unpack_bundle(files: Mapping[str, bytes], directory: str | os.PathLike[str] | None = None) -> Path:
    """Write a packed bundle into `directory` (a new temporary one by default); returns its path."""
    d = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="rlx-bundle-"))
    for rel, data in files.items():
        target = (d / rel).resolve()
        if d.resolve() not in target.parents:
            raise ArtifactError(f"packed bundle entry {rel!r} points outside the bundle")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if rel.endswith(".so"):
            target.chmod(0o755)
    return d


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)

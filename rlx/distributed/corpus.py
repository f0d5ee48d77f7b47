"""Embedding a corpus to Parquet: streamed, sharded, resumable.

`embed_corpus(input, output, bundle=...)` reads `.txt` (one text a line, id =
line number), `.jsonl` (one JSON object a line; text in `text_field`) or
`.parquet` (text in the `text_field` column), `shard_size` records at a time,
and writes each shard's embeddings with their ids as one Parquet file.

The output is a directory (a Parquet dataset: `pyarrow.parquet.read_table`,
pandas, DuckDB and Spark read it as one table):

| file | what |
| --- | --- |
| `shard-00000.parquet`, ... | `id` (int64 record number, or `id_field` as string), `embedding` (f32 list) |
| `_job.json` | the job: input (path, size, mtime), text/id fields, shard size, model key — written first |
| `_manifest.json` | written last, when every shard is there: shards, rows, embedding size |

A shard is written to a hidden temporary file and renamed into place, so a
shard file that exists is complete. After an interruption the same command
resumes: shards already on disk (with the expected row count) are skipped,
leftover temporary files removed, and the manifest written at the end. A
different job into the same directory is refused (`CorpusError`).

Within a shard, `BundledEmbedder.embed` sorts by token length so each batch
pads only to its own longest text.

>>> import tempfile, os
>>> with tempfile.TemporaryDirectory() as d:
...     path = os.path.join(d, "c.jsonl")
...     _ = open(path, "w").write('{"text": "a"}\\n{"text": "b c"}\\n')
...     [r for r in iter_records(path, "text")]
[(0, 'a'), (1, 'b c')]
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import RlxError

FORMATS = ("txt", "jsonl", "parquet")
JOB = "_job.json"
MANIFEST = "_manifest.json"
CORPUS_FORMAT = "rlx-corpus-embeddings"


class CorpusError(RlxError):
    """A corpus that cannot be read, or an output directory that belongs to another job."""


@dataclass(frozen=True)
class Shard:
    """`texts[i]` has id `ids[i]`; shard `index` covers records `[index*shard_size, ...)`."""

    index: int
    ids: list
    texts: list[str]


#: An executor embeds shards: given the shards still to do and a progress callback (texts done),
#: it yields each shard with its `[len(shard.texts), dim]` float32 embeddings, in any order.
Executor = Callable[[Iterator[Shard], Callable[[int], None]], Iterator[tuple[Shard, np.ndarray]]]


def _arrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise CorpusError("corpus embedding writes Parquet with pyarrow: pip install 'rlx[corpus]'") from None
    return pa, pq


def input_format(path: str | os.PathLike[str]) -> str:
    """The corpus format from the file name's extension."""
    ext = Path(path).suffix.lstrip(".").lower()
    if ext not in FORMATS:
        raise CorpusError(f"{path}: unknown corpus format {ext!r}; expected one of .txt, .jsonl, .parquet")
    return ext


def iter_records(path: str | os.PathLike[str], text_field: str = "text",
                 id_field: str | None = None) -> Iterator[tuple[Any, str]]:
    """Stream `(id, text)` from a corpus; id = record number, or `str(record[id_field])`."""
    p = Path(path)
    fmt = input_format(p)
    if not p.is_file():
        raise CorpusError(f"corpus file {p} does not exist")
    if fmt == "txt":
        if id_field is not None:
            raise CorpusError("--id-field needs a .jsonl or .parquet corpus (a .txt line's id is its number)")
        with open(p, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                yield i, line.rstrip("\r\n")
    elif fmt == "jsonl":
        with open(p, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CorpusError(f"{p}:{i + 1}: not JSON: {exc}") from None
                yield _pick(rec, i, text_field, id_field, f"{p}:{i + 1}")
    else:
        _, pq = _arrow()
        try:
            pf = pq.ParquetFile(p)
        except Exception as exc:  # pyarrow raises ArrowInvalid / OSError
            raise CorpusError(f"cannot read {p} as Parquet: {exc}") from None
        names = pf.schema_arrow.names
        for field in (text_field, id_field):
            if field is not None and field not in names:
                raise CorpusError(f"{p} has no column {field!r}; its columns are {names}")
        cols = [text_field] + ([id_field] if id_field else [])
        i = 0
        for batch in pf.iter_batches(batch_size=4096, columns=cols):
            texts = batch.column(text_field).to_pylist()
            ids = batch.column(id_field).to_pylist() if id_field else range(i, i + len(texts))
            for rid, text in zip(ids, texts):
                if not isinstance(text, str):
                    raise CorpusError(f"{p} row {i}: {text_field!r} is {type(text).__name__}, not a string")
                yield (str(rid) if id_field else rid), text
                i += 1


def _pick(rec: object, i: int, text_field: str, id_field: str | None, where: str) -> tuple[Any, str]:
    if not isinstance(rec, dict):
        raise CorpusError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    text = rec.get(text_field)
    if not isinstance(text, str):
        raise CorpusError(f"{where}: field {text_field!r} is {'missing' if text is None else type(text).__name__}, "
                          "not a string (set --text-field)")
    if id_field is None:
        return i, text
    if id_field not in rec:
        raise CorpusError(f"{where}: no id field {id_field!r}")
    return str(rec[id_field]), text


def iter_shards(records: Iterable[tuple[Any, str]], shard_size: int) -> Iterator[Shard]:
    """Group a record stream into shards of `shard_size` (the last one may be shorter)."""
    ids: list = []
    texts: list[str] = []
    index = 0
    for rid, text in records:
        ids.append(rid)
        texts.append(text)
        if len(texts) == shard_size:
            yield Shard(index, ids, texts)
            ids, texts, index = [], [], index + 1
    if texts:
        yield Shard(index, ids, texts)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.parquet"


@dataclass(frozen=True)
class CorpusResult:
    """What `embed_corpus` did: rows and shards in the output, shards computed now, shards reused."""

    output: Path
    rows: int
    shards: int
    computed: int
    reused: int


def embed_corpus(input: str | os.PathLike[str], output: str | os.PathLike[str], *, executor: Executor,
                 model_key: str, dim: int, text_field: str = "text", id_field: str | None = None,
                 shard_size: int = 4096, progress: bool = True,
                 on_shard: Callable[[Shard], None] | None = None) -> CorpusResult:
    """Embed every record of `input` into the Parquet dataset directory `output`, resuming a previous run.

    `executor` embeds shards (`local_executor(bundle)` in this process, or Ray's);
    `model_key` identifies the model (a bundle's artifact key) so a resume never mixes
    two models. `on_shard(shard)` runs after each shard is on disk.
    """
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise CorpusError(f"shard_size must be a positive int, got {shard_size!r}")
    src, out = Path(input), Path(output)
    input_format(src)
    if not src.is_file():
        raise CorpusError(f"corpus file {src} does not exist")
    st = src.stat()
    job = {"format": CORPUS_FORMAT, "input": str(src.resolve()), "input_size": st.st_size,
           "input_mtime_ns": st.st_mtime_ns, "text_field": text_field, "id_field": id_field,
           "shard_size": shard_size, "model_key": model_key, "dim": dim}
    _start_job(out, job)
    pa, pq = _arrow()

    done: list[tuple[int, int]] = []  # (index, rows) of shards on disk
    reused = 0

    def pending() -> Iterator[Shard]:
        nonlocal reused
        for shard in iter_shards(iter_records(src, text_field, id_field), shard_size):
            if _shard_complete(out / shard_name(shard.index), len(shard.texts), pq):
                done.append((shard.index, len(shard.texts)))
                reused += 1
                bar.update(len(shard.texts))
                continue
            yield shard

    bar = _progress(progress)
    computed = 0
    try:
        for shard, emb in executor(pending(), bar.update):
            emb = np.asarray(emb, np.float32)
            if emb.shape != (len(shard.texts), dim):
                raise CorpusError(f"shard {shard.index}: the executor returned embeddings {emb.shape}, "
                                  f"expected {(len(shard.texts), dim)}")
            _write_shard(out / shard_name(shard.index), shard.ids, emb, pa, pq)
            done.append((shard.index, len(shard.texts)))
            computed += 1
            if on_shard is not None:
                on_shard(shard)
    finally:
        bar.close()
    done.sort()
    manifest = dict(job, shards=[{"file": shard_name(i), "rows": n} for i, n in done],
                    rows=sum(n for _, n in done))
    _atomic_write(out / MANIFEST, json.dumps(manifest, indent=1).encode())
    return CorpusResult(out, manifest["rows"], len(done), computed, reused)


def local_executor(model: Any) -> Executor:
    """Embed shards one after another in this process with `model.embed(texts, on_batch)` (a `BundledEmbedder`)."""

    def run(shards: Iterator[Shard], progress: Callable[[int], None]) -> Iterator[tuple[Shard, np.ndarray]]:
        for shard in shards:
            yield shard, model.embed(shard.texts, on_batch=progress)

    return run


def read_embeddings(output: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """`(ids, embeddings [n, dim] float32)` of a finished output directory, in shard order."""
    out = Path(output)
    if not (out / MANIFEST).is_file():
        raise CorpusError(f"{out} has no {MANIFEST}: the job did not finish (run it again to resume)")
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    _, pq = _arrow()
    ids, embs = [], []
    for s in manifest["shards"]:
        table = pq.read_table(out / s["file"])
        ids.append(table.column("id").to_numpy(zero_copy_only=False))
        flat = table.column("embedding").combine_chunks().flatten().to_numpy()
        embs.append(flat.reshape(len(table), manifest["dim"]))
    return np.concatenate(ids), np.concatenate(embs).astype(np.float32, copy=False)


# ── files ──────────────────────────────────────────────────────────────


def _start_job(out: Path, job: dict) -> None:
    """Create `out` or check that it holds this same job; remove leftover temporary files."""
    if out.exists() and not out.is_dir():
        raise CorpusError(f"output {out} exists and is not a directory (the output is a Parquet dataset directory)")
    out.mkdir(parents=True, exist_ok=True)
    job_path = out / JOB
    if job_path.is_file():
        try:
            previous = json.loads(job_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            previous = None
        if previous != job:
            diff = sorted(k for k in job if not isinstance(previous, dict) or previous.get(k) != job[k])
            raise CorpusError(f"{out} holds the output of another job (differs in {diff or 'its job file'}); "
                              "remove it or choose another --output")
    else:
        stray = [p.name for p in out.iterdir() if not p.name.startswith(".")]
        if stray:
            raise CorpusError(f"output directory {out} is not empty and holds no {JOB}: {stray[:5]}")
        _atomic_write(job_path, json.dumps(job, indent=1).encode())
    for p in out.glob(".*.tmp-*"):
        p.unlink()  # a shard or manifest whose writer was killed before the rename
    (out / MANIFEST).unlink(missing_ok=True)  # rewritten when this run completes


def _shard_complete(path: Path, rows: int, pq: Any) -> bool:
    if not path.is_file():
        return False
    try:
        return pq.read_metadata(path).num_rows == rows
    except Exception:  # unreadable footer: not a finished shard, recompute it
        return False


def _write_shard(path: Path, ids: list, emb: np.ndarray, pa: Any, pq: Any) -> None:
    id_array = pa.array(ids, type=pa.string() if ids and isinstance(ids[0], str) else pa.int64())
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
    table = pa.table({"id": id_array, "embedding": vectors})
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        raise CorpusError("the progress bar needs tqdm: pip install 'rlx[corpus]' (or pass progress=False)") from None
    # unit_scale off: the count stays whole sentences ("7 sentences", not tqdm's scaled "7.00 sentences")
    return tqdm(unit=" sentences", dynamic_ncols=True, smoothing=0.1)

"""Embed sentences with all-MiniLM-L6-v2 (or any BERT directory) and print their similarities.

    python -m rlx.examples.embed "A man is eating food." "A man is riding a horse."
    rlxc embed --model path/to/bert-dir "first sentence" "second sentence"
    rlxc embed --quantize int8 "first sentence" "second sentence"   # int8 linear layers

With `--input corpus.{txt,jsonl,parquet} --output out.parquet` it embeds a whole
corpus instead (`rlx.distributed.corpus`): streamed in shards, a progress bar with
sentences/s, embeddings and ids written as a Parquet dataset directory, resumable;
`--ray [ADDRESS]` runs the shards on a Ray cluster (workers load the compiled
bundle, never compile).

Tokenizes with the model's `tokenizer.json`, compiles the encoder (through
the AOT cache: the second run loads the built library), prints the
embeddings' shape and the pairwise cosine similarity matrix; `--output
vectors.npy` (or `.parquet`: id, text, embedding) writes the vectors, and
`--bench` times the embedding (the median of `--repeat` runs after a warm-up).
Set `RLX_NUM_THREADS` to pin the thread count.

>>> import contextlib, io
>>> with contextlib.redirect_stderr(io.StringIO()):
...     main(["--max-seq", "0", "x"])
2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import RlxError
from rlx.examples.devices import device_missing
from rlx.runtime.team import contention_note

DEMO_SENTENCES = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlxc embed", description="Sentence embeddings and their cosine similarities.")
    p.add_argument("sentences", nargs="*", help="sentences to embed (default: four demo sentences)")
    p.add_argument("--model", metavar="DIR", default=None,
                   help="a HF BERT / sentence-transformers directory (default: the packaged all-MiniLM-L6-v2)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "reference"))
    p.add_argument("--max-seq", type=int, default=256, help="sequence bound of the compiled graph (default 256)")
    p.add_argument("--max-batch", type=int, default=32, help="batch bound of the compiled graph (default 32)")
    p.add_argument("--output", metavar="FILE|DIR",
                   help="sentences: write their vectors to FILE.npy ([n, dim] float32) or FILE.parquet (id, text, "
                        "embedding); with --input: the output Parquet dataset directory (resumed when it exists)")
    p.add_argument("--bench", action="store_true", help="time the embedding: --repeat runs after a warm-up")
    p.add_argument("--repeat", type=int, default=None, help="with --bench: timed runs (default 10)")
    p.add_argument("--quantize", choices=("int8",), default=None,
                   help="int8: dynamic int8 linear layers (weights per channel, activations per row; CPU)")
    c = p.add_argument_group("corpus", "embed a corpus file into Parquet (rlx.distributed.corpus)")
    c.add_argument("--input", metavar="FILE", help="corpus: .txt (a text a line), .jsonl or .parquet")
    c.add_argument("--text-field", default="text", help="JSON field / Parquet column of the text (default text)")
    c.add_argument("--id-field", default=None, help="field / column of the id (default: the record number)")
    c.add_argument("--batch-size", type=int, default=None, help="sentences per run (default: --max-batch)")
    c.add_argument("--shard-size", type=int, default=4096, help="records per output shard (default 4096)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray: a new local cluster, or the cluster at ADDRESS (needs rlx[ray])")
    c.add_argument("--workers", type=int, default=2, help="Ray actors, one model each (default 2)")
    return p


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_similarity(sentences: Sequence[str], emb: np.ndarray, width: int = 40) -> str:
    """The cosine similarity matrix as a table, one row per sentence.

    >>> print(format_similarity(["a", "b"], np.array([[1.0, 0.0], [0.6, 0.8]])))
               [0]    [1]
    [0] a    1.000  0.600
    [1] b    0.600  1.000
    """
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    unit = emb / np.maximum(norms, 1e-12)
    sim = unit @ unit.T
    labels = [f"[{i}] {_short(s, width)}" for i, s in enumerate(sentences)]
    pad = max(len(s) for s in labels) + 2
    lines = [" " * pad + "".join(f"{f'[{j}]':>7}" for j in range(len(sentences)))]
    lines += [label.ljust(pad) + "".join(f"{v:7.3f}" for v in row) for label, row in zip(labels, sim)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; returns the process exit status (errors are printed, not raised)."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    sentences = list(args.sentences) or list(DEMO_SENTENCES)
    try:
        if args.repeat is not None and not args.bench:
            raise RlxError("--repeat sets how many runs --bench times; add --bench")
        repeat = 10 if args.repeat is None else args.repeat
        for flag, value in (("--repeat", repeat), ("--max-seq", args.max_seq), ("--max-batch", args.max_batch)):
            if value < 1:
                raise RlxError(f"{flag} must be >= 1, got {value}")
        missing = device_missing(args.device)
        if missing is not None:
            print(f"rlxc embed: error: {missing}", file=sys.stderr)
            return 1
        if args.input is not None:
            if args.bench:
                raise RlxError("--bench times the embedding of sentences; corpus embedding shows its rate in the "
                               "progress bar")
            return _run_corpus(args)
        if args.output is not None:
            vectors_format(args.output)  # a bad name or a missing pyarrow fails before the model is loaded
        return _run(args, sentences, repeat if args.bench else 0)
    except RlxError as exc:
        print(f"rlxc embed: error: {exc}", file=sys.stderr)
        return 2


def _run_corpus(args: argparse.Namespace) -> int:
    import tempfile

    from rlx.distributed import corpus
    from rlx.distributed.bundle import BundledEmbedder, save_bundle
    from rlx.models.embedder import SentenceEmbedder, default_model_dir

    if args.output is None:
        raise RlxError("corpus embedding needs both --input and --output")
    if args.sentences:
        raise RlxError("give sentences or --input, not both")
    if args.device == "reference":
        raise RlxError("corpus embedding runs a compiled model: --device cpu or cuda")
    batch = args.batch_size if args.batch_size is not None else args.max_batch
    for flag, value in (("--batch-size", batch), ("--shard-size", args.shard_size), ("--workers", args.workers)):
        if value < 1:
            raise RlxError(f"{flag} must be >= 1, got {value}")
    corpus.input_format(args.input)  # a bad extension fails before the model is loaded
    model_dir = args.model if args.model is not None else default_model_dir()
    emb = SentenceEmbedder.from_pretrained(model_dir, device=args.device, max_seq=args.max_seq, max_batch=batch,
                                           quantize=args.quantize)
    with tempfile.TemporaryDirectory(prefix="rlx-bundle-") as tmp:
        bundle = save_bundle(emb, tmp)  # compiles through the AOT cache: a second run loads
        model = BundledEmbedder.load(bundle)
        if args.ray is not None:
            from rlx.distributed.ray_embed import ray_executor

            executor = ray_executor(bundle, address=args.ray or None, workers=args.workers)
        else:
            executor = corpus.local_executor(model)
        result = corpus.embed_corpus(args.input, args.output, executor=executor, model_key=model.key,
                                     dim=model.dim, text_field=args.text_field, id_field=args.id_field,
                                     shard_size=args.shard_size, progress=not args.no_progress)
    print(f"{result.output}: {result.rows} embeddings of size {model.dim} in {result.shards} shards "
          f"({result.computed} computed now, {result.reused} from an earlier run)")
    return 0


def vectors_format(path: str) -> str:
    """"npy" or "parquet", from the name of the file `--output` writes the sentences' vectors to.

    >>> vectors_format("vectors.npy")
    'npy'
    """
    suffix = Path(path).suffix.lower()
    if suffix == ".npy":
        return "npy"
    if suffix == ".parquet":
        _arrow()
        return "parquet"
    raise RlxError(f"--output {path}: the sentences' vectors are written to FILE.npy or FILE.parquet "
                   "(a corpus directory needs --input)")


def _arrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise RlxError("writing .parquet needs pyarrow: pip install 'rlx[corpus]' (or write FILE.npy)") from None
    return pa, pq


def write_vectors(path: str, sentences: Sequence[str], vectors: np.ndarray) -> None:
    """The vectors as FILE.npy (`[n, dim]` float32) or FILE.parquet (columns id, text, embedding)."""
    if vectors_format(path) == "npy":
        np.save(path, vectors)
        return
    pa, pq = _arrow()
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), vectors.shape[1])
    pq.write_table(pa.table({"id": pa.array(range(len(sentences)), pa.int64()), "text": list(sentences),
                             "embedding": embedding}), path)


def _run(args: argparse.Namespace, sentences: list[str], repeat: int) -> int:
    from rlx.models.embedder import SentenceEmbedder, default_model_dir

    model_dir = args.model if args.model is not None else default_model_dir()
    t0 = time.perf_counter()
    emb = SentenceEmbedder.from_pretrained(model_dir, device=args.device, max_seq=args.max_seq,
                                           max_batch=args.max_batch, quantize=args.quantize)
    t_load = time.perf_counter() - t0
    cfg = emb.config
    t0 = time.perf_counter()
    emb.runner("embeddings")
    t_compile = time.perf_counter() - t0
    out = emb.embed(sentences)  # with --bench, also the warm-up: first touch of the arena and BLAS threads
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        emb.embed(sentences)
        times.append(time.perf_counter() - t0)

    print(f"model:      {model_dir}")
    print(f"            BERT {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads, "
          f"{emb.sentence.pooling} pooling{', normalized' if emb.sentence.normalize else ''}")
    quant = f", {emb.quantize} linear layers" if emb.quantize else ""
    print(f"device:     {args.device}{quant} (load {t_load * 1e3:.0f} ms, "
          f"compile or cache load {t_compile * 1e3:.0f} ms)")
    print(f"embeddings: {out.shape} {out.dtype}")
    print()
    print("cosine similarity:")
    print(format_similarity(sentences, out))
    if args.output is not None:
        write_vectors(args.output, sentences, out)
        print(f"\nwrote {out.shape[0]} vectors of size {out.shape[1]} to {args.output}")
    if times:
        ids, _ = emb.tokenize(sentences)
        per_batch = statistics.median(times) / -(-len(sentences) // emb.max_batch)
        print(f"\ntime per batch: {per_batch * 1e3:.2f} ms (batch {min(len(sentences), emb.max_batch)}, "
              f"{ids.shape[1]} tokens, median of {repeat}, tokenization included{contention_note(emb.team)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Corpus embedding: formats, equality with SentenceEmbedder.embed by id, resume after a crash, atomic shards."""

from __future__ import annotations

import json

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from rlx.distributed import corpus  # noqa: E402
from rlx.distributed.bundle import BundledEmbedder  # noqa: E402
from rlx.errors import RlxError  # noqa: E402

from .conftest import sentences  # noqa: E402

N = 300


def _write(path, texts, fmt):
    if fmt == "txt":
        path.write_text("".join(t + "\n" for t in texts))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({"body": t, "key": f"k{i}"}) + "\n" for i, t in enumerate(texts)))
    else:
        pq.write_table(pa.table({"key": [f"k{i}" for i in range(len(texts))], "body": texts}), path,
                       row_group_size=64)
    return path


@pytest.fixture(scope="module")
def model(bundle):
    return BundledEmbedder.load(bundle)


@pytest.fixture(scope="module")
def expected(embedder):
    texts = sentences(N)
    return texts, embedder.embed(texts)


def _run(model, src, out, **kw):
    return corpus.embed_corpus(src, out, executor=corpus.local_executor(model), model_key=model.key,
                               dim=model.dim, progress=False, **kw)


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "parquet"])
def test_each_format_equals_sentence_embedder_by_id(tmp_path, model, expected, fmt):
    texts, want = expected
    src = _write(tmp_path / f"c.{fmt}", texts, fmt)
    fields = {} if fmt == "txt" else {"text_field": "body", "id_field": "key"}
    res = _run(model, src, tmp_path / "out.parquet", shard_size=128, **fields)
    assert (res.rows, res.shards, res.computed, res.reused) == (N, 3, 3, 0)
    ids, emb = corpus.read_embeddings(res.output)
    rows = [int(i) if fmt == "txt" else int(i[1:]) for i in ids]
    assert sorted(rows) == list(range(N))
    # Same sort-by-length batching within the whole list vs per shard: batches differ, so the
    # GEMM sees other row counts; rows agree to f32 rounding.
    np.testing.assert_allclose(emb, want[rows], rtol=1e-5, atol=1e-6)
    # The dataset directory reads as one table in pyarrow too.
    assert pq.read_table(res.output).num_rows == N


def test_resume_after_crash_recomputes_only_missing_shards(tmp_path, model, expected):
    texts, want = expected
    src = _write(tmp_path / "c.txt", texts, "txt")
    out = tmp_path / "out"

    class Crash(Exception):
        pass

    def crash_after_two(shard):
        if shard.index == 1:
            raise Crash  # killed between shards 1 and 2

    with pytest.raises(Crash):
        _run(model, src, out, shard_size=64, on_shard=crash_after_two)
    assert not (out / corpus.MANIFEST).exists()
    with pytest.raises(corpus.CorpusError, match="did not finish"):
        corpus.read_embeddings(out)
    # A writer killed mid-shard leaves only a hidden temporary file, and a damaged shard file is redone.
    (out / ".shard-00002.parquet.tmp-999").write_bytes(b"PAR1 half")
    (out / corpus.shard_name(1)).write_bytes(b"not parquet")
    embedded = []

    class Counting:
        key, dim = model.key, model.dim

        def embed(self, texts, on_batch=None):
            embedded.extend(texts)
            return model.embed(texts, on_batch)

    res = corpus.embed_corpus(src, out, executor=corpus.local_executor(Counting()), model_key=model.key,
                              dim=model.dim, shard_size=64, progress=False)
    assert (res.computed, res.reused, res.shards) == (4, 1, 5)
    assert len(embedded) == N - 64  # shard 0 was not recomputed
    assert not list(out.glob(".*"))
    ids, emb = corpus.read_embeddings(out)
    assert ids.tolist() == list(range(N))
    np.testing.assert_allclose(emb, want, rtol=1e-5, atol=1e-6)
    # Running again computes nothing.
    again = _run(model, src, out, shard_size=64)
    assert (again.computed, again.reused) == (0, 5)


def test_another_job_into_the_same_output_is_refused(tmp_path, model):
    src = _write(tmp_path / "c.txt", sentences(10), "txt")
    out = tmp_path / "out"
    _run(model, src, out, shard_size=4)
    with pytest.raises(corpus.CorpusError, match="shard_size"):
        _run(model, src, out, shard_size=5)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(corpus.CorpusError, match="not empty"):
        _run(model, src, tmp_path / "busy")


def test_bad_corpora_raise_clear_errors(tmp_path, model):
    with pytest.raises(corpus.CorpusError, match="unknown corpus format"):
        _run(model, tmp_path / "c.csv", tmp_path / "o")
    with pytest.raises(corpus.CorpusError, match="does not exist"):
        _run(model, tmp_path / "missing.txt", tmp_path / "o")
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(corpus.CorpusError, match=r"c.jsonl:2: field 'text' is missing"):
        _run(model, bad, tmp_path / "o2")
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(corpus.CorpusError, match=r"c.jsonl:2: not JSON"):
        _run(model, bad, tmp_path / "o3")
    pqf = _write(tmp_path / "c.parquet", ["x"], "parquet")
    with pytest.raises(corpus.CorpusError, match="no column 'text'"):
        _run(model, pqf, tmp_path / "o4")
    with pytest.raises(RlxError, match="shard_size"):
        _run(model, pqf, tmp_path / "o5", shard_size=0, text_field="body")


def test_the_progress_bar_counts_whole_sentences(capsys):
    pytest.importorskip("tqdm")
    bar = corpus._progress(True)
    bar.update(3)
    bar.update(4)
    bar.close()
    err = capsys.readouterr().err
    assert "7 sentences" in err and "7.00" not in err


def test_bundle_embeds_no_texts_and_names_a_bad_argument(model):
    assert model.embed([]).shape == (0, model.dim)
    with pytest.raises(RlxError, match=r"list of texts \(str\), got NoneType"):
        model.embed(None)


def test_bundle_load_imports_no_code_generator(bundle):
    import subprocess
    import sys

    code = ("import sys; from rlx.distributed.bundle import BundledEmbedder; "
            f"m = BundledEmbedder.load({str(bundle)!r}); print(m.embed(['a man']).shape); "
            "print(sorted(k for k in sys.modules\n"
            "             if k.startswith(('rlx.codegen', 'rlx.toolchain.compiler', 'jinja2'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["(1, 32)", "[]"]


def test_bundle_loads_without_compiling_and_matches(bundle, embedder, model):
    texts = sentences(20, seed=5)
    assert np.array_equal(model.embed(texts), embedder.embed(texts))
    with pytest.raises(RlxError, match="not an embedder bundle"):
        BundledEmbedder.load(bundle / "artifact")


def test_cli_embeds_a_corpus_and_resumes(tmp_path, model_dir, embedder, capsys):
    from rlx.examples import embed

    texts = sentences(40, seed=7)
    src = _write(tmp_path / "c.jsonl", texts, "jsonl")
    out = tmp_path / "out.parquet"
    argv = ["--model", str(model_dir), "--max-seq", "32", "--input", str(src), "--output", str(out),
            "--text-field", "body", "--batch-size", "8", "--shard-size", "16", "--no-progress"]
    assert embed.main(argv) == 0
    assert "40 embeddings of size 32 in 3 shards (3 computed now, 0 from an earlier run)" in capsys.readouterr().out
    ids, emb = corpus.read_embeddings(out)
    np.testing.assert_allclose(emb, embedder.embed(texts), rtol=1e-5, atol=1e-6)
    assert ids.tolist() == list(range(40))
    assert embed.main(argv) == 0
    assert "(0 computed now, 3 from an earlier run)" in capsys.readouterr().out
    assert embed.main(["--input", str(src)]) == 2
    assert "needs both --input and --output" in capsys.readouterr().err


def test_sigkill_between_shards_then_resume(tmp_path, bundle, model, expected):
    """A real kill (SIGKILL, no cleanup) after two shards: the rerun keeps them and finishes the rest."""
    import os
    import signal
    import subprocess
    import sys

    texts, want = expected
    src = _write(tmp_path / "c.txt", texts, "txt")
    out = tmp_path / "out"
    code = f"""
import os, signal
from rlx.distributed import corpus
from rlx.distributed.bundle import BundledEmbedder
m = BundledEmbedder.load({str(bundle)!r})
def on_shard(s):
    if s.index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
corpus.embed_corpus({str(src)!r}, {str(out)!r}, executor=corpus.local_executor(m), model_key=m.key, dim=m.dim,
                    shard_size=100, progress=False, on_shard=on_shard)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(corpus.Path(corpus.__file__).parents[2]),
                                                       os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [corpus.JOB, "shard-00000.parquet", "shard-00001.parquet"]
    res = _run(model, src, out, shard_size=100)
    assert (res.computed, res.reused, res.rows) == (1, 2, N)
    ids, emb = corpus.read_embeddings(out)
    assert ids.tolist() == list(range(N))
    np.testing.assert_allclose(emb, want, rtol=1e-5, atol=1e-6)

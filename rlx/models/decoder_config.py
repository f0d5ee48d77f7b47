"""Hyper-parameters of a LLaMA-family decoder (provisional: replaced by the GGUF reader's version)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    rms_eps: float
    rope_base: float
    rope_variant: str
    n_rot: int
    context_length: int
    tie_embeddings: bool
    bos_id: int | None = None
    eos_id: int | None = None

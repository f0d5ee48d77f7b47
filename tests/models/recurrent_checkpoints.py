"""Tiny random recurrent and hybrid Hugging Face checkpoints (Mamba-2, Qwen3-Next) and their checks.

Each config switches on what a tiny model can show: Mamba-2 with two groups of B/C, Qwen3-Next with a
gated DeltaNet layer (value heads twice the key heads) before a gated attention layer (partial RoPE).
Weights are redrawn large enough for peaked logits; A_log, dt_bias and Qwen3-Next's (1 + w) norms near 0.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # collected alone (doctests), its sibling is importable
from hf_checkpoints import BOS, EOS, VOCAB, cosine

SHARED = dict(hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=EOS,
              pad_token_id=0, tie_word_embeddings=False)
CONFIGS: dict[str, dict[str, Any]] = {
    "mamba2": dict(state_size=16, n_groups=2, head_dim=16, num_heads=8, expand=2, conv_kernel=4),
    "qwen3_next": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                       layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                       linear_conv_kernel_dim=4, mlp_only_layers=[0, 1]),
}
#: Parameters drawn near 0 rather than 1: log-scale decays, and norms stored as an offset from one.
NEAR_ZERO = ("A_log", "dt_bias", "layernorm.weight", "q_norm.weight", "k_norm.weight", "model.norm.weight")


def random_model(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **{**SHARED, **CONFIGS[model_type], **overrides})
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (0.0 if name.endswith(NEAR_ZERO) else 1.0))
            else:
                p.normal_(0.0, 0.2)
    return model


def assert_close(ours: np.ndarray, theirs: np.ndarray, what: object) -> None:
    """The f32 parity bar of the dense families: cos >= 0.99999 and max abs <= 1e-4 x max |logit|."""
    err = float(np.abs(ours - theirs).max())
    assert cosine(ours, theirs) >= 0.99999, what
    assert err <= 1e-4 * float(np.abs(theirs).max()), (what, err)


def hf_generate(model: Any, ids: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """transformers' greedy tokens after `ids` (cut before the first EOS) and each step's logits."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=EOS,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(ids):].tolist()
    tokens = tokens[:tokens.index(EOS)] if EOS in tokens else tokens
    return tokens, [s[0].float().numpy() for s in out.scores]


def check_decode(lm: Any, model: Any, ids: list[int], n: int = 24) -> None:
    """`n` greedy tokens equal transformers' `generate`, and every decode step's logits (one token through the
    cache) equal transformers' scores for that step."""
    expected, scores = hf_generate(model, ids, n)
    assert len(expected) >= 8, "the random model stopped too early to compare"
    assert lm.generate(ids, max_new_tokens=n).token_ids == expected
    cache = lm.new_cache()
    logits = lm.step(np.array([ids]), cache, [len(ids) - 1])
    for step, token in enumerate(expected):
        assert_close(logits[0], scores[step], f"decode step {step}")
        assert int(np.argmax(logits[0])) == token
        logits = lm.step(np.array([[token]]), cache, [0])

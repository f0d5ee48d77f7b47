"""Tiny random Hugging Face checkpoints for the tests: transformers' `from_config` + `save_pretrained`.

Every family has one config (hidden 64, 2 layers, vocab 300) with its features switched on where a
tiny model can show them (sliding windows of 24 tokens, shorter than the 40-token prompts: Mistral on
every layer, Gemma 3 on its sliding layer beside a global one; soft-capping; SmolLM3: a NoPE layer;
Mixtral and Qwen3-MoE: sparse MoE layers, Qwen3-MoE's beside a dense one).
A word-level `tokenizer.json` (built with `tokenizers`) and a `tokenizer_config.json` with a chat
template go beside the weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 300
BOS, EOS = 1, 2
#: Per family: config overrides on top of the shared tiny shape.
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
    "qwen2": {},
    "qwen3": {},
    "mistral": {"sliding_window": 24},
    "phi3": {},
    "smollm3": {"no_rope_layers": [1, 0]},
    "gemma3_text": {"layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 16,
                    "sliding_window": 24, "final_logit_softcapping": 30.0},
    # sparse MoE: Mixtral renormalizes its top-2 of 8 experts on every layer; Qwen3-MoE (4 experts, top-2, not
    # renormalized) has a dense MLP on layer 1 (mlp_only_layers) beside a sparse layer 0
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": False,
                  "mlp_only_layers": [1]},
}
#: A ChatML template (system prompt handled inline) and a Llama-2 style one (bos_token, raise_exception).
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}"
          "{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content | trim + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' ' + content | trim + ' ' + eos_token }}{% endif %}"
          "{% endfor %}")


def tiny_config(model_type: str, **overrides: Any) -> Any:
    from transformers import AutoConfig

    kw = dict(hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, head_dim=16, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0,
              tie_word_embeddings=model_type in ("gemma3_text", "smollm3"))
    kw.update(FAMILY_CONFIGS[model_type])
    kw.update(overrides)
    return AutoConfig.for_model(model_type, **kw)


def random_model(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    """A transformers model of `model_type` with random weights large enough for peaked logits (f32, eval)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides)).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (0.0 if "gemma" in model_type else 1.0))
            else:
                p.normal_(0.0, 0.2)
    return model


def write_tokenizer(directory: Path, chat_template: str = CHATML) -> None:
    """A word-level tokenizer.json over "w3".."w299" plus special tokens, and its tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": BOS, "</s>": EOS} | {f"w{i}": i for i in range(3, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "pad_token": "<pad>", "unk_token": "<pad>", "chat_template": chat_template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def save_checkpoint(model: Any, directory: Path, dtype: Any = None, **save_kw: Any) -> Path:
    """`model` saved (in `dtype` when given) with a tokenizer; returns the directory."""
    import copy

    directory.mkdir(parents=True, exist_ok=True)
    # a copy is cast: the caller's f32 model stays as it was
    (copy.deepcopy(model).to(dtype) if dtype is not None else model).save_pretrained(str(directory), **save_kw)
    write_tokenizer(directory)
    return directory


def hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of `ids`, cut before the first EOS (RLX stops there)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=EOS,
                             pad_token_id=0)[0, len(ids):].tolist()
    return out[:out.index(EOS)] if EOS in out else out


def q8_0_twin(model: Any, kept: tuple[str, ...] = ()) -> Any:
    """A copy of `model` whose matrices (2-D and stacked experts, rows of whole Q8_0 blocks) are replaced by
    their dequantized Q8_0 blocks, but for the parameters whose names end with one of `kept` (those
    `quantize="q8_0"` keeps f32): the model RLX's q8_0 load computes."""
    import copy

    import torch

    from rlx.ir.quant import dequantize
    from rlx.models.hf_load import quantize_q8_0

    twin = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if p.ndim >= 2 and p.shape[-1] % 32 == 0 and not name.endswith(kept):
                w = p.detach().numpy().reshape(-1, p.shape[-1])
                p.copy_(torch.from_numpy(dequantize(quantize_q8_0(w), "q8_0", p.shape[-1]).reshape(p.shape)))
    return twin


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def prompt(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, VOCAB, n)]

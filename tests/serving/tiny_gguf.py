"""A tiny random LLaMA written as a GGUF file with a byte-level tokenizer and a ChatML chat template:
what the serving tests load as a fast stand-in for SmolLM2 (same loader, tokenizer and chat paths, and its
matrices in Q8_0 blocks, as a quantized GGUF's: the decode kernels SmolLM2 runs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlx.models.causal_lm import random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.gguf import GgufTensor, config_metadata, write_gguf
from rlx.models.gguf_tokenizer import byte_level_alphabet
from rlx.models.llama import random_specs

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONFIG = DecoderConfig(arch="llama", vocab_size=257 + len(SPECIALS), hidden_size=32, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8, ffn_size=64, rms_eps=1e-5, rope_base=10000.0,
                       rope_variant="interleaved", n_rot=8, context_length=256, tie_embeddings=True,
                       bos_id=-1, eos_id=258, name="tiny-llama")


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """Write the tiny model to `path` (weights scaled so greedy decoding wanders through the bytes)."""
    import gguf

    tensors = {}
    for name, (_, data) in random_tensors(random_specs(CONFIG), seed=seed, scale=2.0).items():
        if data.ndim == 2:  # Q8_0 blocks, quantized by the gguf package
            raw = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0).view(np.uint8)
            tensors[name] = GgufTensor(name, "q8_0", data.shape, raw)
        else:
            tensors[name] = data
    tokens = [*byte_level_alphabet(), "Ġt", *SPECIALS]  # one merge: " t"
    metadata = {**config_metadata(CONFIG), "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
                "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["Ġ t"],
                "tokenizer.ggml.token_type": [1] * 257 + [3] * len(SPECIALS), "tokenizer.chat_template": CHATML}
    write_gguf(path, metadata, tensors)
    return path

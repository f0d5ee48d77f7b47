"""Which loader reads a Hugging Face checkpoint directory: one per `model_type` that has its own graph.

`load_checkpoint(dir)` reads config.json's `model_type` and hands the directory to its loader:
`rlx.models.hf_mamba2` (Mamba-2), `rlx.models.hf_qwen3_next` (Qwen3-Next), otherwise
`rlx.models.hf_load.load_pretrained` (the dense families of `rlx.models.hf_config`, which names
the supported ones when it refuses a model_type). `CausalLM.from_pretrained` and
`rlxc inspect --model` both go through it.

>>> sorted(LOADERS)
['mamba2', 'qwen3_next']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlx.models.hf_load import Pretrained, load_pretrained
from rlx.models.hf_mamba2 import load_mamba2
from rlx.models.hf_qwen3_next import load_qwen3_next
from rlx.models.weights import load_json

#: model_type -> the loader of a family with its own graph builder.
LOADERS: dict[str, Any] = {"mamba2": load_mamba2, "qwen3_next": load_qwen3_next}


def load_checkpoint(path: str | Path, *, dtype: str | None = None, quantize: str | None = None) -> Pretrained:
    """Read and check the checkpoint in `path` with its family's loader (see the module docstring)."""
    config_file = Path(path) / "config.json"
    model_type = load_json(config_file).get("model_type") if config_file.is_file() else None
    return LOADERS.get(model_type, load_pretrained)(path, dtype=dtype, quantize=quantize)

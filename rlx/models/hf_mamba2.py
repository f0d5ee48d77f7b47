"""Load a transformers Mamba-2 checkpoint directory (`model_type: "mamba2"`) into what `CausalLM` takes.

As `rlx.models.hf_load.load_pretrained` for the attention families: config.json through
`rlx.models.mamba2.mamba2_config`, the safetensors memory-mapped, every tensor checked against the
shape the config implies before anything is compiled (an `ArtifactError` naming the file, the tensor
and the shape), matrices kept in their stored dtype unless `dtype="f32"`, and `quantize="q8_0"` /
`"q4_k"` turning the in/out projections and the output head into GGUF blocks (the conv, norms and
per-head vectors stay f32).

>>> QUANTIZABLE_ROLES
('ssm_in', 'ssm_out', 'output')
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlx.models.hf_load import (
    Pretrained,
    check_load_options,
    checked_shape,
    conv1d_as_ours,
    finish_pretrained,
    missing_tensor,
    stored_weight,
)
from rlx.models.hf_weights import StoredTensor, open_checkpoint
from rlx.models.llama import WeightSpec
from rlx.models.mamba2 import checkpoint_names, mamba2_config, tensor_shapes
from rlx.models.weights import load_json

#: Matrices `quantize=` turns into blocks (by role: `blk.N.<role>.weight`, or the output head).
QUANTIZABLE_ROLES = ("ssm_in", "ssm_out", "output")


def _role(name: str) -> str:
    return name.split(".")[-2]


def _as_ours(ours: str, t: StoredTensor, want: tuple[int, ...]) -> StoredTensor:
    """The checkpoint tensor in our layout: the conv weight `[conv_dim, 1, k]` as `[k, conv_dim]` (a view)."""
    if _role(ours) == "ssm_conv1d" and ours.endswith(".weight"):
        return conv1d_as_ours(t, want)
    return checked_shape(t, want)


def _prepare(ours: str, t: StoredTensor, dtype: str | None, quantize: str | None) -> tuple[WeightSpec, np.ndarray]:
    role = _role(ours)
    return stored_weight(t, dtype, quantize, quantizable=role in QUANTIZABLE_ROLES, keep_f32=role == "ssm_conv1d")


def load_mamba2(path: str | Path, *, dtype: str | None = None, quantize: str | None = None) -> Pretrained:
    """Read and check a Mamba-2 checkpoint directory (see the module docstring)."""
    d = Path(path)
    check_load_options(dtype, quantize)
    raw = load_json(d / "config.json")
    config = mamba2_config(raw, str(d / "config.json"))
    stored = open_checkpoint(d)
    names = checkpoint_names(config)
    tensors: dict[str, tuple[WeightSpec, np.ndarray]] = {}
    for ours, shape in tensor_shapes(config).items():
        theirs = names[ours]
        if theirs not in stored:
            raise missing_tensor(d, stored, theirs, shape)
        tensors[ours] = _prepare(ours, _as_ours(ours, stored[theirs], shape), dtype, quantize)
    return finish_pretrained(d, raw, config, tensors)

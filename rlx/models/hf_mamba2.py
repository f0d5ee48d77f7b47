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

from rlx.errors import ArtifactError
from rlx.models import hf_config as H
from rlx.models.hf_load import Pretrained, check_load_options, stored_weight
from rlx.models.hf_tokenizer import HfTokenizer
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
        k, conv_dim = want
        if t.shape != (conv_dim, 1, k):
            raise ArtifactError(f"{t.file}: tensor {t.name!r} has shape {list(t.shape)}, expected "
                                f"{[conv_dim, 1, k]} from config.json")
        return StoredTensor(t.file, t.name, t.dtype, want, t.data.reshape(conv_dim, k).T)
    if t.shape != want:
        raise ArtifactError(f"{t.file}: tensor {t.name!r} has shape {list(t.shape)}, expected {list(want)} "
                            "from config.json")
    return t


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
    files = sorted({t.file.name for t in stored.values()})
    names = checkpoint_names(config)
    tensors: dict[str, tuple[WeightSpec, np.ndarray]] = {}
    for ours, shape in tensor_shapes(config).items():
        theirs = names[ours]
        if theirs not in stored:
            raise ArtifactError(f"{d}: the checkpoint ({', '.join(files)}) has no tensor {theirs!r}, expected shape "
                                f"{list(shape)} from config.json")
        tensors[ours] = _prepare(ours, _as_ours(ours, stored[theirs], shape), dtype, quantize)
    stop = H.eos_ids(raw)
    if (d / "generation_config.json").is_file():
        stop |= H.eos_ids(load_json(d / "generation_config.json"))
    stop = frozenset(i for i in stop if i < config.vocab_size)
    return Pretrained(config, tensors, HfTokenizer.from_dir(d, stop), stop, raw)  # type: ignore[arg-type]

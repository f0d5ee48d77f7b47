"""Model files on disk: HF-style `config.json` and `.safetensors` weights.

Everything read here is checked before a graph sees it: a missing file, a
malformed config, a missing tensor or one of the wrong shape raises
`ArtifactError` naming the file, the tensor, the expected and the found shape.
Weights come back as float32 numpy arrays keyed by their checkpoint names
(half-precision checkpoints are widened; bf16 is decoded from its bit pattern).

>>> import tempfile, pathlib, numpy as np
>>> from safetensors.numpy import save_file
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> save_file({"bert.pooler.dense.bias": np.zeros(4, np.float32)}, str(d / "model.safetensors"))
>>> w = load_safetensors(d / "model.safetensors")
>>> strip_prefix(w, ("bert.",)).keys()
dict_keys(['pooler.dense.bias'])
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from rlx.errors import ArtifactError
from rlx.ir.dtype import bf16_to_f32

#: File names tried, in order, for the weights of a model directory.
WEIGHT_FILES = ("model.safetensors",)

# Older TF-converted BERT checkpoints name layer-norm parameters gamma/beta.
_LEGACY_SUFFIXES = ((".gamma", ".weight"), (".beta", ".bias"))


def load_json(path: str | Path, kind: type = dict) -> dict | list:
    """Read a JSON value of type `kind` (object or array) from `path`; `ArtifactError` if missing or malformed."""
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"missing file {p}")
    try:
        value = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"cannot read {p} as JSON: {exc}") from None
    if not isinstance(value, kind):
        want = "object" if kind is dict else "array"
        raise ArtifactError(f"{p} must hold a JSON {want}, got {type(value).__name__}")
    return value


def load_config(model_dir: str | Path) -> dict:
    """The HF `config.json` of `model_dir` as a dict."""
    d = Path(model_dir)
    if not d.is_dir():
        raise ArtifactError(f"model directory {d} does not exist")
    return load_json(d / "config.json")


def find_weights(model_dir: str | Path) -> Path:
    """The safetensors file of `model_dir` (sharded checkpoints are not supported)."""
    d = Path(model_dir)
    for name in WEIGHT_FILES:
        if (d / name).is_file():
            return d / name
    if (d / "model.safetensors.index.json").is_file():
        raise ArtifactError(f"{d} holds a sharded checkpoint (model.safetensors.index.json); "
                            "only a single model.safetensors is supported")
    if (d / "pytorch_model.bin").is_file():
        raise ArtifactError(f"{d} holds pytorch_model.bin only; convert it to model.safetensors first")
    raise ArtifactError(f"no model.safetensors in {d}")


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file; floating tensors become float32.

    Integer tensors (such as a checkpoint's `position_ids` buffer) keep their type.
    """
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"missing weights file {p}")
    from safetensors import SafetensorError, safe_open

    out: dict[str, np.ndarray] = {}
    bf16_names: list[str] = []
    try:
        with safe_open(str(p), framework="np") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if f.get_slice(name).get_dtype() == "BF16":
                    bf16_names.append(name)  # numpy has no bfloat16: decoded from raw bits below
                    continue
                out[name] = _widen(f.get_tensor(name))
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise ArtifactError(f"cannot read safetensors file {p}: {exc}") from None
    if bf16_names:
        out.update(_read_bf16(p, bf16_names))
    return out


def _widen(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind == "f" and arr.dtype != np.float32:
        return arr.astype(np.float32)
    return arr


def _read_bf16(path: Path, names: Iterable[str]) -> dict[str, np.ndarray]:
    """Decode bf16 tensors straight from the file layout (8-byte header size, JSON header, data)."""
    with open(path, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(header_len))
        base = 8 + header_len
        out = {}
        for name in names:
            info = header[name]
            start, end = info["data_offsets"]
            fh.seek(base + start)
            bits = np.frombuffer(fh.read(end - start), dtype="<u2").reshape(info["shape"])
            out[name] = bf16_to_f32(bits).astype(np.float32)
    return out


def strip_prefix(tensors: Mapping[str, np.ndarray], prefixes: Iterable[str]) -> dict[str, np.ndarray]:
    """Drop the first of `prefixes` that starts any name (e.g. "bert." of BertFor* checkpoints).

    Names are also normalized from the legacy `LayerNorm.gamma/beta` spelling
    to `LayerNorm.weight/bias`.
    """
    prefixes = tuple(prefixes)
    out: dict[str, np.ndarray] = {}
    for name, arr in tensors.items():
        for pre in prefixes:
            if name.startswith(pre):
                name = name[len(pre):]
                break
        for old, new in _LEGACY_SUFFIXES:
            if "LayerNorm" in name and name.endswith(old):
                name = name[: -len(old)] + new
        if name in out:
            raise ArtifactError(f"two checkpoint tensors map to the name {name!r}")
        out[name] = arr
    return out


def check_tensors(tensors: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]],
                  source: str = "checkpoint") -> dict[str, np.ndarray]:
    """Select `expected` names from `tensors`, checking each one's shape.

    Extra tensors are ignored (checkpoints carry poolers and heads a graph may
    not use). Returns float32, C-contiguous arrays.
    """
    missing = [n for n in expected if n not in tensors]
    if missing:
        shown = ", ".join(f"{n} {list(expected[n])}" for n in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ArtifactError(f"{source} is missing {len(missing)} tensor(s): {shown}{more}")
    out: dict[str, np.ndarray] = {}
    for name, shape in expected.items():
        arr = tensors[name]
        if tuple(arr.shape) != tuple(shape):
            raise ArtifactError(f"{source} tensor {name!r} has shape {list(arr.shape)}, expected {list(shape)}")
        if arr.dtype.kind != "f":
            raise ArtifactError(f"{source} tensor {name!r} has dtype {arr.dtype}, expected a floating type")
        out[name] = np.ascontiguousarray(arr, dtype=np.float32)
    return out

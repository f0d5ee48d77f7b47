"""Memory-mapped safetensors checkpoints: one `model.safetensors` or shards named by its index.

`open_checkpoint(dir)` reads every header and maps every file (`numpy.memmap`, read-only): each
tensor is a view of the mapped file, so nothing is read until a weight is used and nothing is
copied to get at it. F32/F16 tensors are views of their own dtype; BF16 ones are `uint16` bit
patterns (numpy has no bfloat16), the form `rlx.models.llama.decoder_params` takes them in.
Headers are checked first: a truncated file, a missing shard, an index naming a tensor its shard
lacks all raise `ArtifactError` naming the file and the tensor.

>>> import tempfile, pathlib, numpy as np
>>> from safetensors.numpy import save_file
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> save_file({"w": np.ones((2, 3), np.float16)}, str(d / "model.safetensors"))
>>> t = open_checkpoint(d)["w"]
>>> t.dtype, t.shape, t.data.dtype.name
('f16', (2, 3), 'float16')
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlx.errors import ArtifactError
from rlx.models.weights import MAX_HEADER_BYTES, load_json

#: safetensors dtype -> (the name `WeightSpec` uses, the numpy dtype of the view).
STORED_DTYPES = {"F32": ("f32", "<f4"), "F16": ("f16", "<f2"), "BF16": ("bf16", "<u2")}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True)
class StoredTensor:
    """One checkpoint tensor: where it lives, its dtype ("f32", "f16", "bf16"), shape and mapped data."""

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of `model_dir`: the shards its index names, or `model.safetensors`."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = load_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ArtifactError(f"{index} has no weight_map object")
        files: dict[str, str] = {}
        for tensor, shard in weight_map.items():
            files.setdefault(str(shard), tensor)
        for shard, tensor in files.items():
            if not (model_dir / shard).is_file():
                raise ArtifactError(f"missing shard {model_dir / shard} (named by {index} for tensor {tensor!r})")
        return [model_dir / shard for shard in files]
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    raise ArtifactError(f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}")


def read_header(path: Path) -> tuple[dict, int]:
    """(header, offset of the data) of safetensors file `path`, checked against the file's size."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if size < 8:
            raise ArtifactError(f"{path} has {size} bytes, fewer than a safetensors header size (truncated?)")
        (header_len,) = struct.unpack("<Q", fh.read(8))
        if header_len > min(size - 8, MAX_HEADER_BYTES):
            raise ArtifactError(f"{path}: header size {header_len} does not fit the file's {size} bytes (truncated?)")
        try:
            header = json.loads(fh.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArtifactError(f"{path}: the safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ArtifactError(f"{path}: the safetensors header is not a JSON object")
    return header, 8 + header_len


def map_file(path: Path) -> dict[str, StoredTensor]:
    """Every float tensor of one safetensors file, as views of the mapped file (other dtypes are skipped)."""
    header, start = read_header(path)
    data_bytes = path.stat().st_size - start
    mapped = np.memmap(path, dtype=np.uint8, mode="r", offset=start, shape=(data_bytes,)) if data_bytes else \
        np.zeros(0, np.uint8)
    out: dict[str, StoredTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            kind, shape = info["dtype"], tuple(int(d) for d in info["shape"])
            lo, hi = (int(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ArtifactError(f"{path}: tensor {name!r} has a malformed header entry {info!r}") from None
        if kind not in STORED_DTYPES:
            continue  # integer buffers (position ids) are not weights
        dtype, np_dtype = STORED_DTYPES[kind]
        count = int(np.prod(shape, dtype=np.int64))
        if min(shape, default=0) < 0 or not 0 <= lo <= hi or hi - lo != count * np.dtype(np_dtype).itemsize:
            raise ArtifactError(f"{path}: tensor {name!r} of shape {list(shape)} {kind} disagrees with its data "
                                f"offsets [{lo}, {hi})")
        if hi > data_bytes:
            raise ArtifactError(f"{path} is truncated: tensor {name!r} {list(shape)} needs bytes [{lo}, {hi}) of "
                                f"the data, the file holds {data_bytes}")
        out[name] = StoredTensor(path, name, dtype, shape, mapped[lo:hi].view(np_dtype).reshape(shape))
    return out


def open_checkpoint(model_dir: str | Path) -> dict[str, StoredTensor]:
    """Every float tensor of the checkpoint in `model_dir`, by its checkpoint name (memory-mapped)."""
    d = Path(model_dir)
    files = checkpoint_files(d)
    out: dict[str, StoredTensor] = {}
    for path in files:
        out.update(map_file(path))
    index = d / INDEX_FILE
    if index.is_file():
        for tensor, shard in load_json(index)["weight_map"].items():
            if tensor in out and out[tensor].file.name != Path(str(shard)).name:
                raise ArtifactError(f"{index} places tensor {tensor!r} in {d / str(shard)}, which does not hold it")
    return out

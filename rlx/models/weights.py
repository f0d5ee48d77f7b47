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
from typing import Any

import numpy as np

from rlx.errors import ArtifactError

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


#: safetensors dtype names -> numpy dtypes (the format is little-endian); BF16's bits are decoded below.
SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
                      "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
#: A header longer than this is not a real checkpoint's (the format's own reader caps it at 100 MB too).
MAX_HEADER_BYTES = 100 << 20


def load_safetensors(path: str | Path, *, mapped: bool = False) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file; floating tensors become float32.

    Integer tensors (such as a checkpoint's `position_ids` buffer) keep their type. The file is read
    with one `readinto` and each tensor is a view of that buffer (float32 and integer tensors are not
    copied again); the header is checked first: dtypes, shapes, and offsets inside the data.
    `mapped=True` maps the file instead (`numpy.memmap`, read-only) and reads nothing more than the
    header: float32 and integer tensors are read-only views of the file's pages, read when first used
    (a weight copied once into a compiled model is read once, not read and then copied; one the model
    stores as given is read in place, `CompiledGraph.set_param`, only the pages its runs touch). The file
    must then stay as it is while the arrays live (replacing it by a rename, as downloaders do, is
    fine; rewriting it in place is not).
    """
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"missing weights file {p}")
    try:
        with open(p, "rb") as fh:
            header, data = _read_safetensors(fh, p.stat().st_size, p if mapped else None)
        out: dict[str, np.ndarray] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            out[name] = _tensor(name, info, data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"cannot read safetensors file {p}: {exc}") from None
    return out


def _read_safetensors(fh: Any, size: int, mapped: Path | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """(header, data bytes) of an open safetensors file: 8-byte header size, JSON header, data (the
    file `mapped` mapped read-only rather than read, when given)."""
    if size < 8:
        raise ValueError(f"the file has {size} bytes, fewer than its 8-byte header size")
    (header_len,) = struct.unpack("<Q", fh.read(8))
    if header_len > min(size - 8, MAX_HEADER_BYTES):
        raise ValueError(f"its header size {header_len} does not fit the file's {size} bytes")
    header = json.loads(fh.read(header_len))
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    if mapped is not None:
        if size == 8 + header_len:  # no tensor data: nothing to map (mmap refuses an empty range)
            return header, np.zeros(0, np.uint8)
        # map_file records the mapped file's signature: params set from these views keep their packed layout
        # in the AOT cache (rlx.toolchain.param_store)
        from rlx.toolchain.param_store import map_file

        return header, map_file(fh, 8 + header_len, size - 8 - header_len)
    data = np.empty(size - 8 - header_len, np.uint8)
    view, got = memoryview(data), 0
    while got < data.size:
        n = fh.readinto(view[got:])
        if not n:
            raise ValueError(f"the file ended after {8 + header_len + got} of {size} bytes")
        got += n
    return header, data


def _tensor(name: str, info: Any, data: np.ndarray) -> np.ndarray:
    """Tensor `name` of a safetensors header entry, a view of `data` (float32 for floating types)."""
    if not isinstance(info, dict):
        raise ValueError(f"tensor {name!r}: its header entry is not an object")
    kind = info["dtype"]
    if kind not in SAFETENSORS_DTYPES:
        raise ValueError(f"tensor {name!r}: unsupported dtype {kind!r}")
    dtype = np.dtype(SAFETENSORS_DTYPES[kind])
    shape = [int(d) for d in info["shape"]]
    start, end = (int(v) for v in info["data_offsets"])
    count = int(np.prod(shape, dtype=np.int64))
    if min(shape, default=0) < 0 or not 0 <= start <= end <= data.size or end - start != count * dtype.itemsize:
        raise ValueError(f"tensor {name!r}: shape {shape} of {kind} does not match its data offsets "
                         f"[{start}, {end}) in {data.size} bytes of data")
    arr = data[start:end].view(dtype).reshape(shape)
    if kind == "BF16":
        from rlx.ir.dtype import bf16_to_f32

        return bf16_to_f32(arr).astype(np.float32)  # numpy has no bfloat16: decoded from the raw bits
    return _widen(arr)


def _widen(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind == "f" and arr.dtype != np.float32:
        return arr.astype(np.float32)
    return arr


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


def release_pages(data: np.ndarray) -> bool:
    """Drop the pages of a memory-mapped file under `data` (a `numpy.memmap` view) from this process's resident set.

    For a weight that was read once, copied into a compiled model: the mapping stays valid and a later read
    faults the pages in again from the file (they are never written), so the values do not change; meanwhile
    the process's peak RSS does not count the checkpoint a second time beside the model's own copy. Returns
    whether anything was released (False for an array that is not a view of a mapped file, or where the
    platform has no `madvise`). An object with its own `release_pages()` (a tensor stacked from mapped parts
    when read) is asked to release them.

    >>> release_pages(np.zeros(4))
    False
    """
    import mmap

    own = getattr(data, "release_pages", None)  # a tensor read from mapped parts (hf_load.StackedExperts)
    if callable(own):
        return bool(own())
    mapped = getattr(data, "_mmap", None)
    if not isinstance(data, np.memmap) or not isinstance(mapped, mmap.mmap) or not hasattr(mapped, "madvise") \
            or data.nbytes == 0:
        return False
    base = np.frombuffer(mapped, dtype=np.uint8).ctypes.data
    start = data.ctypes.data - base
    page = mmap.PAGESIZE
    lo, hi = start // page * page, min(-(-(start + data.nbytes) // page) * page, len(mapped))
    mapped.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return True

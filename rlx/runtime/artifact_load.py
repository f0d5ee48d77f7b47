"""`load(directory)`: an artifact directory as a ready-to-run `CompiledGraph`.

Kept apart from `rlx.runtime.artifact` (which writes artifacts and reads their manifest) so
the runtime's modules stay acyclic: `CompiledGraph.save` uses the writer, this module uses
`CompiledGraph`.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlx.errors import ArtifactError
from rlx.runtime.artifact import (
    CUDA_SOURCE,
    FORMAT,
    FORMAT_VERSION,
    LIBRARY,
    MANIFEST,
    SOURCE,
    WEIGHTS,
    _preload_blas,
    _preload_cublas,
    check_gpu_arch,
    check_loadable,
    elf_dependencies,
    read_manifest,
    save,
)
from rlx.runtime.compiled import CompiledGraph


def load(directory: str | os.PathLike[str], *, num_threads: int | None = None) -> CompiledGraph:
    """Load the artifact in `directory` as a ready-to-run `CompiledGraph` (weights set when saved).

    Raises ArtifactError when the artifact cannot run here (other ABI, target,
    CPU without the features it was built for, a GPU of another arch, damaged library).
    A CUDA artifact loads as a `CudaGraph` (params uploaded to the device; `run_device` works).
    """
    d = Path(directory)
    manifest = read_manifest(d)
    check_loadable(manifest, d)
    _preload_blas(manifest)
    _preload_cublas(manifest)
    from rlx.runtime.loader import load_library

    library = load_library(d / LIBRARY)
    if library.manifest.get("key") != manifest.get("key"):
        raise ArtifactError(f"{d / LIBRARY} does not belong to {d / MANIFEST} (their keys differ; was another "
                            "library loaded from this path earlier in this process? dlopen reuses it)")
    source = d / (CUDA_SOURCE if manifest["target"] == "cuda" else SOURCE)
    source_path = source if source.is_file() else None
    compiled: CompiledGraph
    if manifest["target"] == "cuda":
        from rlx.runtime.cuda_device import CudaGraph

        compiled = CudaGraph(library, source=source_path, key=manifest["key"], cache_hit=True)
    else:
        compiled = CompiledGraph(library, source=source_path, key=manifest["key"], cache_hit=True,
                                 num_threads=num_threads)
    weights = d / WEIGHTS
    if weights.is_file():
        _load_weights(compiled, weights, manifest)
    return compiled


#: safetensors dtype names → RLX dtypes (the ones `save` writes).
_ST_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f64", "I8": "i8", "I16": "i16", "I32": "i32",
              "I64": "i64", "U8": "u8", "U16": "u16", "U32": "u32", "U64": "u64", "BOOL": "bool"}


def _load_weights(compiled: CompiledGraph, path: Path, manifest: dict) -> None:
    """Set the params from the artifact's safetensors file, bit for bit (bf16 as stored)."""
    from safetensors import SafetensorError, deserialize

    want = manifest["files"].get(WEIGHTS)
    if isinstance(want, dict) and path.stat().st_size != want.get("size"):
        raise ArtifactError(f"{path} is {path.stat().st_size} bytes, {MANIFEST} says {want.get('size')} "
                            "(truncated or replaced?)")
    try:
        tensors = deserialize(path.read_bytes())
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read {path}: {exc}") from None
    shapes = {p["name"]: tuple(int(d) for d in p["shape"]) for p in manifest["params"]}
    unknown = sorted(name for name, _ in tensors if name not in shapes)
    if unknown:
        raise ArtifactError(f"{path} holds tensors that are not params of the graph: {unknown[:5]}")
    for name, info in tensors:
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ArtifactError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        if tuple(info["shape"]) != shapes[name]:
            raise ArtifactError(f"{path}: tensor {name!r} has shape {tuple(info['shape'])}, the param is "
                                f"{shapes[name]}")
        compiled.set_param_typed(name, info["data"], dtype)


__all__ = ["FORMAT", "FORMAT_VERSION", "check_gpu_arch", "check_loadable", "elf_dependencies", "load",
           "read_manifest", "save"]

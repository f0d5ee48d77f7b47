"""Relocatable artifacts: a directory that loads in a new process without a compiler.

`save(compiled, dir)` (also `CompiledGraph.save(dir)`) writes:

| file | what |
| --- | --- |
| `model.so` | the built library (the C ABI of `rlx.h`); its RUNPATH starts with `$ORIGIN` |
| `libscipy_openblas.so` | CPU: the BLAS model.so links against, copied from the build environment |
| `model.c` / `model.cu` | the generated source it was built from (`.cu` for the CUDA target) |
| `rlx.h` | the ABI header, for C programs that dlopen or link the library |
| `rlx_cuda.h` | CUDA: the exports a CUDA library adds (`rlx_run_device`, device memory) |
| `manifest.json` | ABI version, IO, params, dynamic dims and bounds, target, ISA or GPU arch, key, checksums |
| `weights.safetensors` | optional: the params that were set (`save(dir, weights=True)`) |

A CUDA artifact records the GPU arch it was built for (`"arch": "sm_90"`) and its GEMM provider; it
does not bundle cuBLASLt (hundreds of MB, installed with the CUDA toolkit or the `nvidia-cublas`
wheel): `load` makes the installed one resolvable, as it does for the CPU BLAS.

Bundled libraries are the ones model.so finds through its build-time
RUNPATH (the BLAS wheel's directory); model.so also carries `$ORIGIN` in
front of that RUNPATH, so wherever the directory is moved, the copy beside
it is the one the dynamic linker loads, from Python or from plain C.

`load(dir)` (also `rlx.load`) checks the manifest's format and ABI version,
the target, that this CPU has every instruction-set feature the library may
use (a clear `ArtifactError` instead of SIGILL) — for a CUDA artifact, that
the visible GPU can run code built for the recorded arch — and the library's checksum;
then it dlopens the library and sets the params from `weights.safetensors`
when present. It never runs or probes a compiler, and imports neither the
code generators nor jinja2.

>>> import tempfile, numpy as np, rlx
>>> g = rlx.Graph("scale")
>>> x = g.input("x", [3])
>>> g.set_outputs([g.mul(x, g.param("a", [3]))])
>>> cg = rlx.Session().compile(g)
>>> cg.set_param("a", np.array([1, 2, 3], np.float32))
>>> with tempfile.TemporaryDirectory() as d:
...     _ = cg.save(d, weights=True)
...     again = rlx.load(d)
...     again.run(x=np.ones(3, np.float32))[0].tolist()
[1.0, 2.0, 3.0]
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlx.errors import ArtifactError
from rlx.toolchain.cache import META, file_sha256
from rlx.toolchain.isa import check_cpu

FORMAT = "rlx-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LIBRARY = "model.so"
SOURCE = "model.c"
CUDA_SOURCE = "model.cu"
HEADER = "rlx.h"
CUDA_HEADER = "rlx_cuda.h"
WEIGHTS = "weights.safetensors"
#: Targets this build of RLX can load artifacts for.
LOADABLE_TARGETS = ("cpu", "cuda")
#: Every file name an artifact may hold besides the manifest (never overwritten by a bundled library).
_OWN_FILES = (LIBRARY, SOURCE, CUDA_SOURCE, HEADER, CUDA_HEADER, WEIGHTS, MANIFEST)


# ── save ─────────────────────────────────────────────────────────────────


def save(compiled: Any, directory: str | os.PathLike[str], *,
         weights: bool | Mapping[str, Any] = False) -> Path:
    """Write `compiled` as an artifact into `directory` (created if needed); returns its path.

    `weights=True` saves the params that were set on `compiled`; a mapping
    saves those arrays instead (names must be params of the graph). Files
    are replaced one by one and `manifest.json` is written last, so a reader
    never sees a manifest describing files that are not there yet.
    """
    tensors = _weights_to_save(compiled, weights)
    return _write(out_dir=Path(directory), lib_manifest=compiled.manifest, library=Path(compiled.library_path),
                  source=compiled.source_path, key=compiled.key, tensors=tensors)


def save_library(library: str | os.PathLike[str], directory: str | os.PathLike[str], *,
                 source: str | os.PathLike[str] | None = None) -> Path:
    """Write an artifact (without weights) from a built library that this process need not run.

    For libraries built but not started here: a CUDA library cross-compiled for an arch
    (`rlx.pipeline.cuda.build_cuda(..., arch="sm_90")`) on a machine without that GPU.
    """
    from rlx.runtime.loader import load_library

    lib = load_library(library)
    return _write(out_dir=Path(directory), lib_manifest=lib.manifest, library=Path(library),
                  source=Path(source) if source is not None else None, key=str(lib.manifest.get("key", "")),
                  tensors={})


def _write(*, out_dir: Path, lib_manifest: Mapping[str, Any], library: Path, source: Path | None, key: str,
           tensors: dict[str, tuple[str, Any]]) -> Path:
    """The files of an artifact, then its manifest (last)."""
    out = out_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(f"cannot create artifact directory {out}: {exc.strerror}") from None
    target = str(lib_manifest.get("target", "cpu"))

    files: dict[str, dict] = {}
    _install_copy(library, out / LIBRARY, mode=0o755)
    # cuBLASLt (the CUDA target's only dynamic dependency) is too large to copy: load finds the installed one.
    bundled = _bundle_libraries(library, out) if target == "cpu" else []
    source_name = CUDA_SOURCE if target == "cuda" else SOURCE
    for name in (SOURCE, CUDA_SOURCE):
        _remove(out / name)  # a previous save for the other target leaves nothing behind
    if source is not None and Path(source).is_file():
        _install_copy(Path(source), out / source_name)
    # the common ABI, every target; the RLX headers it includes inlined, so it stands alone
    from rlx.runtime.abi import standalone_header

    _atomic_write(out / HEADER, standalone_header(_header_path("cpu")))
    if target == "cuda":
        _install_copy(_header_path("cuda", CUDA_HEADER), out / CUDA_HEADER)
    else:
        _remove(out / CUDA_HEADER)
    if tensors:
        _write_safetensors(tensors, out / WEIGHTS, key=key)
    else:
        _remove(out / WEIGHTS)  # never leave a previous save's weights behind
    for name in (LIBRARY, *bundled, SOURCE, CUDA_SOURCE, HEADER, CUDA_HEADER, WEIGHTS):
        path = out / name
        if path.is_file():
            files[name] = {"sha256": file_sha256(path), "size": path.stat().st_size}

    from rlx.version import __version__

    manifest = {
        **lib_manifest,
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "key": key or lib_manifest.get("key", ""),
        "components": _cache_components(library, key),
        "files": files,
        "weights": sorted(tensors),
        "bundled_libraries": bundled,
        "rlx_version": __version__,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _atomic_write(out / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return out


def _weights_to_save(compiled: Any, weights: bool | Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """{param name: (declared dtype, storage-dtype array)} to write."""
    from rlx.ir.dtype import DType

    specs = {p["name"]: p for p in compiled.manifest["params"]}
    if weights is False or weights is None:
        return {}
    if weights is True:
        arrays = compiled.param_arrays()
        if not arrays and specs:
            raise ArtifactError("save(weights=True): no params have been set on this compiled graph")
        return {name: (specs[name]["dtype"], arr) for name, arr in arrays.items()}
    if not isinstance(weights, Mapping):
        raise ArtifactError(f"weights must be True, False or a dict of arrays, got {type(weights).__name__}")
    from rlx.errors import ExecutionError
    from rlx.runtime.conversions import _to_param_dtype

    out = {}
    for name, value in weights.items():
        if name not in specs:
            raise ArtifactError(f"weights has {name!r}, which is not a param of the graph "
                                f"(params: {sorted(specs)[:8]}{' ...' if len(specs) > 8 else ''})")
        dt = DType.parse(specs[name]["dtype"])
        try:  # the dtype rules of set_param: lossless conversions only
            arr = _to_param_dtype(name, value, dt)
        except ExecutionError as exc:
            raise ArtifactError(f"weights: {exc}") from None
        want = tuple(int(d) for d in specs[name]["shape"])
        if arr.shape != want:
            raise ArtifactError(f"weights: param {name!r} must have shape {want}, got {arr.shape}")
        out[name] = (dt.value, arr)
    return out


def _write_safetensors(tensors: Mapping[str, tuple[str, Any]], path: Path, key: str) -> None:
    import numpy as np
    from safetensors import TensorSpec, serialize_file

    specs = {}
    keep = []
    for name, (dtype, arr) in sorted(tensors.items()):
        a = np.ascontiguousarray(arr)
        if a.dtype.byteorder == ">":
            a = a.byteswap().view(a.dtype.newbyteorder("<"))
        keep.append(a)
        # numpy has no bfloat16: bf16 params are held as uint16 bit patterns and stored as BF16.
        st_dtype = "bfloat16" if dtype == "bf16" else a.dtype.name
        specs[name] = TensorSpec(dtype=st_dtype, shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        serialize_file(specs, str(tmp), metadata={"format": "rlx-weights", "key": key})
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except Exception as exc:
        _remove(tmp)
        raise ArtifactError(f"cannot write {path}: {exc}") from None
    finally:
        del keep


def _bundle_libraries(library: Path, out: Path) -> list[str]:
    """Copy next to the artifact's model.so the shared libraries it finds through its build-time RUNPATH.

    Those are the environment-specific ones (the BLAS wheel's); system libraries
    (libc, libm, libgomp) are found through the system paths and stay out.
    Returns the names copied (each a DT_NEEDED name, so `$ORIGIN` resolves it).
    """
    try:
        needed, runpath = elf_dependencies(library)
    except (OSError, ValueError):
        return []  # not an ELF library (or unreadable): nothing we know how to bundle
    dirs = [d for d in runpath if "$ORIGIN" not in d and "${ORIGIN}" not in d]
    bundled = []
    for name in needed:
        found = next((Path(d) / name for d in dirs if (Path(d) / name).is_file()), None)
        if found is None or name in _OWN_FILES:
            continue
        _install_copy(found.resolve(), out / name, mode=0o755)
        bundled.append(name)
    if bundled and not any("ORIGIN" in d for d in runpath):
        warnings.warn(f"{library} has no $ORIGIN in its RUNPATH (built by an older RLX?): the copied "
                      f"{', '.join(bundled)} will not be used; the artifact needs {', '.join(dirs)}",
                      stacklevel=3)
    return bundled


def elf_dependencies(path: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """(DT_NEEDED names, RUNPATH or RPATH directories) of a 64-bit little-endian ELF shared object.

    Read from the dynamic segment, as the dynamic linker does (no readelf, no patchelf).
    ValueError for anything else.

    >>> import sys
    >>> needed, runpath = elf_dependencies(sys.executable)
    >>> "libc.so.6" in needed
    True
    """
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads: list[tuple[int, int, int]] = []
    dynamic = None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return [], []
    entries: list[tuple[int, int]] = []
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:  # DT_NULL
            break
        entries.append((tag, val))
    strtab_vaddr = next((v for t, v in entries if t == 5), None)  # DT_STRTAB
    strtab = next((off + strtab_vaddr - va for va, off, size in loads
                   if strtab_vaddr is not None and va <= strtab_vaddr < va + size), None)
    if strtab is None:
        raise ValueError(f"{path}: the dynamic string table is not in a loaded segment")

    def string(index: int) -> str:
        end = data.index(b"\0", strtab + index)
        return data[strtab + index:end].decode("utf-8", "replace")

    needed = [string(v) for t, v in entries if t == 1]  # DT_NEEDED
    paths = [string(v) for t, v in entries if t == 29] or [string(v) for t, v in entries if t == 15]  # RUNPATH, RPATH
    return needed, [d for p in paths for d in p.split(":") if d]


def _header_path(target: str, name: str = HEADER) -> Path:
    """A C header of the RLX templates: `rlx.h` (the common ABI, in templates/cpu) or a target's own."""
    from rlx.templates_path import templates_dir

    header = templates_dir() / target / name
    if not header.is_file():
        raise ArtifactError(f"the ABI header {target}/{name} is missing from the RLX templates ({header})")
    return header


def _cache_components(library: Path, key: str) -> dict:
    """The key components recorded by the cache entry the library came from (empty when unknown)."""
    try:
        meta = json.loads((library.parent / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(meta, dict) or meta.get("key") != key or not isinstance(meta.get("components"), dict):
        return {}
    return meta["components"]


def _install_copy(src: Path, dest: Path, mode: int = 0o644) -> None:
    # Copy then rename: a process that has the old model.so mapped keeps its inode intact.
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except OSError as exc:
        _remove(tmp)
        raise ArtifactError(f"cannot write {dest}: {exc.strerror or exc}") from None


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        _remove(Path(tmp))
        raise ArtifactError(f"cannot write {path}: {exc.strerror or exc}") from None


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


# ── load ─────────────────────────────────────────────────────────────────


def read_manifest(directory: str | os.PathLike[str]) -> dict:
    """The artifact's manifest.json, checked for format and required fields."""
    d = Path(directory)
    path = d / MANIFEST
    if not d.is_dir():
        raise ArtifactError(f"{d} is not an artifact directory")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{d} is not an RLX artifact: it has no {MANIFEST}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{path} is unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not an RLX artifact manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path} has artifact format version {version!r}; this RLX reads version {FORMAT_VERSION}")
    for field in ("abi_version", "target", "inputs", "outputs", "params", "files"):
        if field not in manifest:
            raise ArtifactError(f"{path} lacks {field!r}")
    return manifest


def check_loadable(manifest: dict, directory: Path) -> None:
    """Every check `load` makes before touching the library: ABI, target, CPU features, checksum."""
    from rlx.runtime.abi import ABI_VERSION

    if manifest["abi_version"] != ABI_VERSION:
        raise ArtifactError(f"artifact {directory} uses RLX ABI {manifest['abi_version']}; this RLX speaks ABI "
                            f"{ABI_VERSION}: rebuild it with this version (rlxc compile)")
    target = manifest["target"]
    if target not in LOADABLE_TARGETS:
        raise ArtifactError(f"artifact {directory} targets {target!r}; this RLX loads {', '.join(LOADABLE_TARGETS)} "
                            "artifacts")
    isa = manifest.get("isa")
    if isinstance(isa, dict):
        check_cpu(isa, what=f"artifact {directory}")
    if target == "cuda":
        from rlx.toolchain.cuda import visible_gpu_arch  # nvidia-smi: only for CUDA artifacts

        check_gpu_arch(manifest.get("arch"), visible_gpu_arch(), what=f"artifact {directory}")
    want = manifest["files"].get(LIBRARY)
    lib = directory / LIBRARY
    if not isinstance(want, dict) or not lib.is_file():
        raise ArtifactError(f"artifact {directory} has no {LIBRARY}")
    if lib.stat().st_size != want.get("size") or file_sha256(lib) != want.get("sha256"):
        raise ArtifactError(f"{lib} does not match the checksum in {MANIFEST} (truncated or modified copy?)")
    for name in manifest.get("bundled_libraries", []):
        info, path = manifest["files"].get(name), directory / name
        if not isinstance(info, dict) or not path.is_file() or path.stat().st_size != info.get("size"):
            raise ArtifactError(f"artifact {directory} lacks its copy of {name} (or it was truncated): "
                                "copy the whole directory")


_SM_RE = re.compile(r"^sm_(\d+)(\d)(a?)$")


def check_gpu_arch(built: Any, device: str | None, *, what: str = "artifact") -> None:
    """ArtifactError unless a GPU of arch `device` (sm_XY, None: no GPU) runs machine code built for `built`.

    RLX builds machine code only (no PTX), so the GPU must be the arch built for, or a later minor
    revision of the same major (sm_86 runs sm_80 code); an `a` build (sm_90a) runs only on its own
    major.minor (an sm_90 GPU; nvidia-smi reports no suffix).

    >>> check_gpu_arch("sm_80", "sm_86")
    >>> check_gpu_arch("sm_90", "sm_80")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlx.errors.ArtifactError: artifact was built for sm_90 GPUs; this machine's GPU is sm_80, which cannot run it: ...
    """
    b = _SM_RE.match(str(built)) if isinstance(built, str) else None
    if b is None:
        raise ArtifactError(f"{what} records no valid GPU arch ({built!r}) in its manifest")
    rebuild = "rebuild it here (Session(Device.CUDA).compile, or rlxc compile --target cuda)"
    if device is None:
        raise ArtifactError(f"{what} was built for {built} GPUs; no NVIDIA GPU is visible here (nvidia-smi "
                            "found none)")
    d = _SM_RE.match(device)
    runs = d is not None and d.group(1) == b.group(1) and (
        d.group(2) == b.group(2) if b.group(3) else int(d.group(2)) >= int(b.group(2)))
    if not runs:
        raise ArtifactError(f"{what} was built for {built} GPUs; this machine's GPU is {device}, which cannot "
                            f"run it: {rebuild}")


def _preload_cublas(manifest: dict) -> None:
    """Make the installed cuBLASLt resolvable for a CUDA artifact built against another copy of it.

    Like `_preload_blas`: a library loaded globally first satisfies model.so's dependency by soname,
    wherever model.so's recorded RUNPATH pointed at build time.
    """
    if manifest.get("target") != "cuda" or manifest.get("gemm") != "cublaslt":
        return
    try:
        import ctypes

        from rlx.toolchain.cuda import find_cublas_library

        path = find_cublas_library()
        if path:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass  # the recorded runpath may still work; a failure shows up as a clear dlopen error


def _preload_blas(manifest: dict) -> None:
    """Make the BLAS library the artifact links against resolvable even if its recorded path moved.

    The dynamic linker matches an already-loaded library by soname, so loading
    this environment's scipy-openblas32 globally first satisfies the artifact's
    dependency wherever that package lives now.
    """
    if manifest.get("blas") != "openblas32" or manifest.get("bundled_libraries"):
        return  # no BLAS, or the artifact carries its own (found through model.so's $ORIGIN RUNPATH)
    try:
        import ctypes

        import scipy_openblas32 as sob

        from rlx.toolchain.blas_load import blas_loading

        with blas_loading():
            ctypes.CDLL(os.path.join(sob.get_lib_dir(), sob.get_library(fullname=True)), mode=ctypes.RTLD_GLOBAL)
    except (ImportError, OSError, AttributeError):
        pass  # the recorded runpath may still work; a failure shows up as a clear dlopen error



"""The CUDA toolchain (nvcc, the GPU arch, cuBLASLt) and the build of one `.cu` through the AOT cache.

- `find_nvcc(name)`: the resolved nvcc and its `--version` text (CUDA version parsed from it).
- `detect_arch(target)`: `-arch` from an explicit target (`"cuda:sm_90"`, `"sm_90"`, `"90"`) or, without one, from
  the visible GPU's compute capability (`nvidia-smi`). No GPU and no target is a `BuildError` naming both ways out.
- `find_cublas(nvcc)`: include and library directories of cuBLASLt: the toolkit's own, or the `nvidia-cublas`
  wheel's (`nvidia/cublas/include`, `nvidia/cublas/lib`). Without them the generated code uses its built-in GEMM.
- `build_cuda(source, components, config, toolchain, gemm)`: `nvcc -shared` of a rendered `.cu` (rendered by
  `rlx.pipeline.cuda`), cached. The key folds in the sha256 of the rendered `.cu` (taken with the manifest's key
  empty, as for the CPU: see `rlx.toolchain.cpu`), the LIR hash, the CUDA version and compiler identity, the
  arch, precision and GEMM provider and every flag (`cuda_source_components`). The toolchain never imports
  codegen, so `cuda_toolchain_components` (the driver's warm path) does not load it.

>>> normalize_arch("cuda:sm_90"), normalize_arch("8.6"), normalize_arch("sm_90a")
('sm_90', 'sm_86', 'sm_90a')
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from rlx.config import Config
from rlx.errors import BuildError
from rlx.toolchain.cache import AotCache
from rlx.toolchain.compiler import run_compiler, version_text
from rlx.toolchain.cpu import components_key, source_digest, templates_digest
from rlx.toolchain.cuda_units import (
    ACTIVATIONS,
    DTYPES,
    TILES,
    build_units,
    cutlass_for,
    cutlass_objects,
    cutlass_status,
)
from rlx.toolchain.nccl import Nccl, find_nccl

#: A CUDA target (`rlx.codegen.cuda.CudaTarget`: a frozen dataclass with arch, gemm, cutlass_gemm, ...), which
#: the toolchain reads and resolves without importing codegen.
CudaTarget = TypeVar("CudaTarget")

#: Flags of every build.
BASE_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden",
              "-diag-suppress=177,550")
_ARCH_RE = re.compile(r"^(?:cuda:)?(?:sm_|compute_)?(\d{2,3})(a?)$")
_CAP_RE = re.compile(r"^(\d+)\.(\d+)$")
_PROBE_TIMEOUT = 60


def normalize_arch(target: str) -> str:
    """`sm_XY` from "cuda:sm_90", "sm_90", "90", "9.0" (an `a` suffix is kept: sm_90a)."""
    text = str(target).strip().lower()
    m = _CAP_RE.match(text.removeprefix("cuda:"))
    if m:
        return f"sm_{m.group(1)}{m.group(2)}"
    m = _ARCH_RE.match(text)
    if not m:
        raise BuildError(f"CUDA target {target!r} is not an arch like 'cuda:sm_90' or 'sm_90'")
    return f"sm_{m.group(1)}{m.group(2)}"


@functools.lru_cache(maxsize=8)
def find_nvcc(name: str = "nvcc") -> tuple[str, str]:
    """(resolved path, `--version` text) of nvcc; looks on PATH, then CUDA_HOME and /usr/local/cuda."""
    found = shutil.which(name)
    if found is None and os.sep not in name:
        for root in (os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"):
            cand = os.path.join(root, "bin", name) if root else ""
            if cand and os.access(cand, os.X_OK):
                found = cand
                break
    if found is None:
        raise BuildError(f"nvcc ({name!r}) not found: install the CUDA toolkit or set RLX_NVCC to nvcc's path")
    resolved = os.path.realpath(found)
    return resolved, version_text(resolved, "nvcc", _PROBE_TIMEOUT)


def cuda_version(version_text: str) -> str:
    """'13.0' from nvcc's `--version` text ('' when it says no release)."""
    m = re.search(r"release (\d+\.\d+)", version_text)
    return m.group(1) if m else ""


def visible_gpu_arch() -> str | None:
    """The arch (sm_XY) of the GPU a CUDA program starts on (device 0), by nvidia-smi; None when there is none.

    Device 0 is the first GPU of `CUDA_VISIBLE_DEVICES` when that is set (an index or a GPU UUID; empty
    or -1 hides every GPU), else the first GPU nvidia-smi lists.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    select: list[str] = []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        first = visible.split(",")[0].strip()
        if not first or first.startswith("-"):
            return None
        select = ["-i", first]
    try:
        proc = subprocess.run([smi, *select, "--query-gpu=compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=_PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines or not _CAP_RE.match(lines[0]):
        return None
    return normalize_arch(lines[0])


def detect_arch(target: str | None = None) -> str:
    """The `-arch` to build for: `target` if given, else the visible GPU's; BuildError if neither."""
    if target:
        return normalize_arch(target)
    arch = visible_gpu_arch()
    if arch is None:
        raise BuildError("no NVIDIA GPU is visible (nvidia-smi found none) to choose -arch from; "
                         "pass an explicit target such as 'cuda:sm_90' to cross-compile")
    return arch


def _wheel_dirs(sub: str) -> list[Path]:
    """`nvidia/*/<sub>` directories of installed NVIDIA wheels (nvidia-cublas: `cublas/` to CUDA 12, `cu13/` after)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return sorted(d for r in roots for d in Path(r).glob(f"*/{sub}") if d.is_dir())


@dataclass(frozen=True)
class Cublas:
    """Where cuBLASLt's header and library are (empty when not found)."""

    include_dir: str = ""
    lib_dir: str = ""
    library: str = ""  # the file linked against

    @property
    def found(self) -> bool:
        return bool(self.include_dir and self.library)

    @property
    def link_args(self) -> tuple[str, ...]:
        if not self.found:
            return ()
        return (f"-L{self.lib_dir}", f"-l:{os.path.basename(self.library)}", f"-Xlinker=-rpath,{self.lib_dir}")

    def identity(self) -> str:
        return f"cublasLt {self.library} include={self.include_dir}" if self.found else "none"


@functools.lru_cache(maxsize=8)
def find_cublas(nvcc: str) -> Cublas:
    """cuBLASLt next to nvcc (the toolkit) or from the nvidia-cublas wheel; `Cublas()` when absent."""
    toolkit = Path(nvcc).resolve().parent.parent
    includes = [toolkit / "include", Path("/usr/local/cuda/include"), Path("/usr/include"), *_wheel_dirs("include")]
    libs = [toolkit / "lib64", toolkit / "lib", Path("/usr/local/cuda/lib64"), Path("/usr/lib/x86_64-linux-gnu"),
            *_wheel_dirs("lib")]
    inc = next((str(d) for d in includes if (d / "cublasLt.h").is_file()), "")
    for d in libs:
        cands = sorted(glob.glob(str(d / "libcublasLt.so*")), key=len)
        if cands:
            return Cublas(inc, str(d), cands[0]) if inc else Cublas()
    return Cublas()


def find_cublas_library() -> str:
    """The installed libcublasLt (the `nvidia-cublas` wheel's, else the CUDA toolkit's), '' when none.

    No nvcc needed: loading a CUDA artifact uses this to resolve the cuBLASLt its library links against.
    """
    roots = [*_wheel_dirs("lib"), Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64",
             Path("/usr/local/cuda/lib64"), Path("/usr/lib/x86_64-linux-gnu")]
    for d in roots:
        cands = sorted(glob.glob(str(d / "libcublasLt.so.*")), key=len)
        if cands:
            return cands[0]
    return ""


@dataclass(frozen=True)
class NvccToolchain:
    """A resolved nvcc plus everything needed to build one generated .cu for one arch."""

    nvcc: str
    version_text: str
    arch: str
    cublas: Cublas

    @property
    def cuda_version(self) -> str:
        return cuda_version(self.version_text)

    @property
    def arch_flags(self) -> tuple[str, ...]:
        num = self.arch.removeprefix("sm_")
        return (f"-gencode=arch=compute_{num},code=sm_{num}",)

    def flags(self, gemm: str) -> tuple[str, ...]:
        inc = (f"-I{self.cublas.include_dir}",) if gemm == "cublaslt" and self.cublas.found else ()
        return (*BASE_FLAGS, *self.arch_flags, *inc)

    def link_flags(self, gemm: str) -> tuple[str, ...]:
        return self.cublas.link_args if gemm == "cublaslt" else ()

    def identity(self) -> str:
        return f"{self.nvcc}\n{self.version_text}"

    def command(self, source: Path, output: Path, gemm: str, compile_only: bool = False,
                extra: tuple[str, ...] = (), extra_link: tuple[str, ...] = (),
                objects: tuple[Path, ...] = ()) -> list[str]:
        """nvcc's command line; `extra` / `extra_link`: what one program adds (NCCL for collectives);
        `objects`: compiled kernel units linked in (the CUTLASS GEMMs, `rlx.toolchain.cuda_units`)."""
        if compile_only:
            flags = [f for f in self.flags(gemm) if f != "-shared"]
            return [self.nvcc, *flags, *extra, "-c", "-o", str(output), str(source)]
        return [self.nvcc, *self.flags(gemm), *extra, "-o", str(output), str(source), *map(str, objects),
                *self.link_flags(gemm), *extra_link]

    def compile(self, source: Path, output: Path, gemm: str, compile_only: bool = False,
                extra: tuple[str, ...] = (), extra_link: tuple[str, ...] = (),
                objects: tuple[Path, ...] = ()) -> None:
        """Build `source` into `output`; BuildError with nvcc's message (source path kept)."""
        run_compiler(self.command(source, output, gemm, compile_only, extra, extra_link, objects), source, output,
                     "nvcc", timeout=900)


def detect_nvcc_toolchain(config: Config | None = None, target: str | None = None) -> NvccToolchain:
    """nvcc from `config.nvcc`, the arch from `target` or the visible GPU, cuBLASLt if present."""
    config = config or Config.from_env()
    nvcc, text = find_nvcc(config.nvcc)
    return NvccToolchain(nvcc, text, detect_arch(target), find_cublas(nvcc))


def resolve_target(toolchain: NvccToolchain, target: CudaTarget, config: Config | None = None) -> CudaTarget:
    """`target` with the toolchain's arch, the built-in GEMM when cuBLASLt is not installed, and no CUTLASS
    GEMMs where `config` turns them off (RLX_CUTLASS=0) or they cannot be built (not sm_90, headers missing:
    `cutlass_note` says which)."""
    gemm = resolve_gemm(toolchain, target.gemm)
    allowed = config is None or config.cutlass
    cutlass = (target.cutlass_gemm and allowed and gemm == "cublaslt"
               and not cutlass_status(toolchain, cutlass_for(config)))
    return replace(target, arch=toolchain.arch, gemm=gemm, cutlass_gemm=cutlass)  # type: ignore[type-var]


def cutlass_identity(toolchain: NvccToolchain) -> str:
    """The CUTLASS headers a build may link GEMM units from, or 'off: <why none>'."""
    cutlass = cutlass_for()
    why = cutlass_status(toolchain, cutlass)
    return f"off: {why}" if why else cutlass.identity()


def cutlass_note(toolchain: NvccToolchain, target: Any) -> str:
    """What the manifest says of the CUTLASS GEMMs: 'on', 'off (not asked)' or 'off (<why it cannot be>)'."""
    if target.cutlass_gemm:
        return "on"
    why = cutlass_status(toolchain, cutlass_for()) if toolchain.arch else ""
    return f"off ({why})" if why else "off (CudaTarget(cutlass_gemm=False), RLX_CUTLASS=0 or no cuBLASLt)"


def resolve_gemm(toolchain: NvccToolchain, gemm: str) -> str:
    """The GEMM provider a build uses: the built-in one when cuBLASLt is asked for but not installed."""
    return gemm if (gemm != "cublaslt" or toolchain.cublas.found) else "builtin"


def cuda_toolchain_components(toolchain: NvccToolchain, gemm: str) -> dict[str, str]:
    """The key components that do not depend on the program: nvcc, arch, flags, templates, cuBLASLt.

    Cheap (no rendering, no codegen import): the driver's compile index is keyed by these too.
    """
    gemm = resolve_gemm(toolchain, gemm)
    return {
        "target": "cuda",
        "compiler": toolchain.identity(),
        "flags": " ".join((*toolchain.flags(gemm), *toolchain.link_flags(gemm))),
        # Redundant with "source" for the compiled file, but names a template change in `cache explain`.
        "templates": templates_digest("cuda"),
        "blas": toolchain.cublas.identity() if gemm == "cublaslt" else "builtin",
        # the CUTLASS GEMM units (headers found and an sm_90 build) or why not: installing the headers rebuilds
        "cutlass": cutlass_identity(toolchain) if gemm == "cublaslt" else "off",
    }


def cuda_source_components(lir_hash: str, pending_source: str, toolchain: NvccToolchain,
                           target: Any) -> dict[str, str]:
    """Every input of the CUDA build, as strings: the AOT cache key is a digest of these.

    `lir_hash`: the hash of the decided LIR that was rendered; `pending_source`: the `.cu` rendered with
    `KEY_PENDING`; `target`: the resolved `CudaTarget` (`resolve_target`). A source that includes NCCL
    (collectives) adds NCCL's identity (`nccl_for`).
    """
    components = {
        "lir": lir_hash,
        "source": source_digest(pending_source),
        "target_options": f"{target.identity()} cuda={toolchain.cuda_version}",
        **cuda_toolchain_components(toolchain, target.gemm),
    }
    nccl = nccl_for(pending_source)
    if nccl is not None:  # collectives: NCCL's header and library (only these graphs' keys name it)
        components["nccl"] = nccl.identity()
    return components


def nccl_for(source: str) -> Nccl | None:
    """NCCL for a rendered `.cu` that includes it (a graph with collectives), None for any other;
    BuildError when the source needs NCCL and none is installed."""
    if "#include <nccl.h>" not in source:
        return None
    nccl = find_nccl()
    if not nccl.found:
        raise BuildError("the graph has collective ops, which the CUDA backend renders as NCCL calls, and no NCCL "
                         "was found (nccl.h and libnccl): pip install nvidia-nccl-cu12 (rlx[cuda]) or set "
                         "RLX_NCCL_HOME")
    return nccl


@dataclass(frozen=True)
class CudaBuild:
    """Result of `build_cuda`: where the library is and what went into it."""

    library: Path
    source: Path
    key: str
    hit: bool
    components: dict[str, str]
    toolchain: NvccToolchain
    seconds: float


def build_cuda(source: Callable[[str], str], components: dict[str, str], config: Config | None = None,
               toolchain: NvccToolchain | None = None, gemm: str = "cublaslt") -> CudaBuild:
    """nvcc-compile (or find in the AOT cache) the CUDA library of a rendered `.cu`.

    `source(key)`: the text with `key` in its manifest (called once, on a miss); `components`: its key
    components (`cuda_source_components`); `gemm`: the resolved target's GEMM provider (its flags).
    """
    config = config or Config.from_env()
    toolchain = toolchain or detect_nvcc_toolchain(config)
    key = components_key(components)
    start = time.perf_counter()

    def build(workdir: Path) -> None:
        path = workdir / "model.cu"
        # Rendered again with the key: only on a miss, where nvcc's seconds dwarf it.
        text = source(key)
        path.write_text(text)
        nccl = nccl_for(text)
        # the CUTLASS GEMMs it calls: compiled once per machine and configuration into the cache root
        objects = cutlass_objects(text, toolchain, workdir, config)
        toolchain.compile(path, workdir / "model.so", gemm, extra=nccl.flags if nccl else (),
                          extra_link=nccl.link_args if nccl else (), objects=objects)

    entry = AotCache(config).get_or_build(components, build)
    return CudaBuild(Path(entry.library), Path(entry.source), entry.key, bool(entry.hit), components, toolchain,
                     time.perf_counter() - start)


def prebuild_cutlass(config: Config | None = None, arch: str | None = None) -> tuple[Path, ...]:
    """Compile every configuration of the unit into the AOT cache now (in parallel), e.g. while setting a machine
    up, so that no model build waits for CUTLASS. BuildError when CUTLASS cannot be built here."""
    toolchain = detect_nvcc_toolchain(config, arch)
    cutlass = cutlass_for(config)
    why = cutlass_status(toolchain, cutlass)
    if why:
        raise BuildError(f"the CUTLASS GEMM units cannot be built: {why}")
    store_dir = Path(tempfile.mkdtemp(prefix="rlx-cutlass-"))
    try:
        return build_units([(d, a, t) for d in DTYPES for a in ACTIVATIONS for t in TILES], toolchain, cutlass,
                           store_dir, config)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)

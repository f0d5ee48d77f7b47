"""CUDA kernel units: CUTLASS GEMMs compiled once per machine and configuration, linked into every program.

A CUTLASS sm90 GEMM takes nvcc about a minute to instantiate (measured: ~50 s and ~3.8 GB on one core for one
configuration), far more than a whole generated model. So the GEMM lives in its own translation unit,
`templates/cuda/kernels/gemm_cutlass.cu`, defining one plain C function per (element type, activation, tile):
the generated `.cu` calls `rlx_cutlass_gemm_<dt>_<act>_m<tile>(...)` (declared in `gemm_cutlass.cuh`), and the build
compiles each configuration the source calls into an object kept in the AOT cache root (`UnitStore` of
`rlx.toolchain.units`: keyed, locked, published atomically, checked on every use), then links it into
`model.so`. The first model that needs a configuration pays the minute; every later build on that machine
links the object.

CUTLASS's headers come from the `nvidia-cutlass` wheel (`cutlass_library/source/include`, found without
importing it) or `RLX_CUTLASS_DIR` (a directory holding `cutlass/cutlass.h`, e.g. a CUTLASS checkout's
`include/`). They are an optional dependency: without them `cutlass_status` says why, and the GEMMs stay on
cuBLASLt (plus a separate activation pass where its epilogue cannot fuse the activation).

>>> units_in_source("rc = big ? rlx_cutlass_gemm_f16_gelu_m256(a, ...) : rlx_cutlass_gemm_f16_gelu_m128(a, ...);")
(('f16', 'gelu', 128), ('f16', 'gelu', 256))
>>> units_in_source("RLX_CUTLASS_DECL(f16_gelu_m128);")
()
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rlx.config import Config
from rlx.errors import BuildError
from rlx.ir.activation_table import activation_table
from rlx.templates_path import templates_dir
from rlx.toolchain.compiler import run_compiler


class NvccToolchain(Protocol):
    """What the units need of `rlx.toolchain.cuda.NvccToolchain` (which imports this module)."""

    nvcc: str
    arch: str

    def identity(self) -> str: ...

#: The unit's source (compiled once per configuration with -D flags).
UNIT = "cuda/kernels/gemm_cutlass.cu"
#: Element types and activations the unit is built for: (rlx dtype name, RLX_CUTLASS_DT) and
#: (rlx activation, its RLX_ACT_* id): the entries of templates/activations.toml marked `cutlass`.
DTYPES = {"f16": 1, "bf16": 2}
ACTIVATIONS = activation_table().cutlass_ids
#: The tiles' rows (x 128 columns): 256 for grids that cover the GPU twice, 128 below (gemm_cutlass.cu says why).
TILES = (128, 256)
#: The archs the sm90 kernels run on (wgmma, TMA multicast: compiled for sm_90a).
ARCHS = ("sm_90", "sm_90a")
#: nvcc flags of the unit beyond the program's (CUTLASS needs relaxed constexpr; NDEBUG drops device asserts,
#: whose calls would serialize the wgmma pipeline).
UNIT_FLAGS = ("-O3", "-std=c++17", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC,-fvisibility=hidden",
              "-diag-suppress=177,550")

_CALL_RE = re.compile(rf"\brlx_cutlass_gemm_({'|'.join(DTYPES)})_({'|'.join(ACTIVATIONS)})_m(128|256)\b")

#: One configuration of the unit: (dtype, activation, tile rows).
UnitConfig = tuple[str, str, int]


def activation_defines() -> tuple[str, ...]:
    """-D flags giving the unit the RLX_ACT_* ids of the activations it fuses (gemm_cutlass.cu selects its
    epilogue by comparing RLX_CUTLASS_ACT with them), from the table: never a hand-kept copy.

    >>> activation_defines()
    ('-DRLX_ACT_GELU=1', '-DRLX_ACT_SILU=3')
    """
    table = activation_table()
    return tuple(f"-D{table.enum(name)}={i}" for name, i in ACTIVATIONS.items())


def units_in_source(source: str) -> tuple[UnitConfig, ...]:
    """The (dtype, activation, tile) configurations a rendered `.cu` names, sorted (gemm_cutlass.cuh's
    declarations spell the names in pieces, so they do not count)."""
    return tuple(sorted({(d, a, int(t)) for d, a, t in _CALL_RE.findall(source)}))


def unit_function(dtype: str, act: str, tile: int) -> str:
    """The C name of one configuration's launcher.

    >>> unit_function("bf16", "silu", 256)
    'rlx_cutlass_gemm_bf16_silu_m256'
    """
    if dtype not in DTYPES or act not in ACTIVATIONS or tile not in TILES:
        raise BuildError(f"no CUTLASS GEMM for dtype {dtype!r}, activation {act!r}, tile {tile!r} "
                         f"(built: {sorted(DTYPES)} x {sorted(ACTIVATIONS)} x {TILES})")
    return f"rlx_cutlass_gemm_{dtype}_{act}_m{tile}"


@dataclass(frozen=True)
class Cutlass:
    """Where CUTLASS's headers are (`include_dir` holds cutlass/cutlass.h), or why there are none (`reason`)."""

    include_dir: str = ""
    version: str = ""
    reason: str = ""

    @property
    def found(self) -> bool:
        return bool(self.include_dir)

    def identity(self) -> str:
        """What the unit objects depend on besides the unit's text: the headers' place, version and a digest of
        CUTLASS's version header (a different CUTLASS at the same path is another key)."""
        if not self.found:
            return "none"
        head = Path(self.include_dir) / "cutlass" / "version.h"
        digest = hashlib.sha256(head.read_bytes()).hexdigest()[:16] if head.is_file() else "?"
        return f"cutlass {self.version or '?'} include={self.include_dir} version_h={digest}"


def _wheel_version(package_dir: Path) -> str:
    """The nvidia-cutlass wheel's version from its dist-info next to the package ('' when not found)."""
    for d in sorted(package_dir.parent.glob("nvidia_cutlass-*.dist-info")):
        return d.name.removeprefix("nvidia_cutlass-").removesuffix(".dist-info")
    return ""


@functools.lru_cache(maxsize=4)
def find_cutlass(env_dir: str | None = None) -> Cutlass:
    """CUTLASS's include directory: `RLX_CUTLASS_DIR` (passed as `env_dir`), else the nvidia-cutlass wheel's."""
    if env_dir:
        inc = Path(env_dir)
        if not (inc / "cutlass" / "cutlass.h").is_file():
            return Cutlass(reason=f"RLX_CUTLASS_DIR={env_dir} holds no cutlass/cutlass.h")
        return Cutlass(str(inc.resolve()), "RLX_CUTLASS_DIR")
    try:
        spec = importlib.util.find_spec("cutlass_library")  # locates the package without importing it
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return Cutlass(reason="CUTLASS headers not found (pip install --no-deps nvidia-cutlass, as make install "
                              "does where a GPU is visible or with CUDA=1, or set RLX_CUTLASS_DIR)")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    inc = pkg / "source" / "include"
    if not (inc / "cutlass" / "cutlass.h").is_file():
        return Cutlass(reason=f"the nvidia-cutlass package at {pkg} has no source/include/cutlass/cutlass.h")
    return Cutlass(str(inc.resolve()), _wheel_version(pkg))


def cutlass_for(config: Config | None = None) -> Cutlass:
    """`find_cutlass` with the configured override (`Config.cutlass_dir`, RLX_CUTLASS_DIR; None: from the
    environment)."""
    return find_cutlass((config or Config.from_env()).cutlass_dir or None)


def cutlass_status(toolchain: NvccToolchain, cutlass: Cutlass) -> str:
    """'' when the CUTLASS GEMMs can be built for `toolchain`, else why not (recorded in the manifest)."""
    if toolchain.arch not in ARCHS:
        return f"the CUTLASS GEMMs are sm_90 kernels (wgmma, TMA); this build is for {toolchain.arch}"
    if not cutlass.found:
        return cutlass.reason
    return ""


@dataclass(frozen=True)
class CutlassUnitToolchain:
    """nvcc compiling one CUTLASS configuration, in the shape `UnitStore` expects of a toolchain.

    `object_flags` carries the -D flags of the configuration and the include directory, so each configuration
    (and each CUTLASS) is its own unit key; `isa` the arch the unit is compiled for.
    """

    nvcc: NvccToolchain
    cutlass: Cutlass
    dtype: str
    act: str
    tile: int
    openmp: bool = False
    sanitize: str = ""

    @property
    def arch(self) -> str:
        return "sm_90a"  # the arch-specific features of sm_90 (wgmma); runs on any sm_90 GPU

    @property
    def isa(self) -> str:
        return self.arch

    @property
    def isa_identity(self) -> str:
        return self.cutlass.identity()

    @property
    def object_flags(self) -> tuple[str, ...]:
        num = self.arch.removeprefix("sm_")
        return (*UNIT_FLAGS, f"-gencode=arch=compute_{num},code=sm_{num}", f"-I{self.cutlass.include_dir}",
                f"-DRLX_CUTLASS_DT={DTYPES[self.dtype]}", *activation_defines(),
                f"-DRLX_CUTLASS_ACT={ACTIVATIONS[self.act]}",
                f"-DRLX_CUTLASS_TILE_M={self.tile}",
                f"-DRLX_CUTLASS_FN={unit_function(self.dtype, self.act, self.tile)}")

    def compiler_identity(self) -> str:
        return self.nvcc.identity()

    def compile_object(self, source: Path, output: Path) -> None:
        run_compiler([self.nvcc.nvcc, *self.object_flags, "-c", "-o", str(output), str(source)], source, output,
                     "nvcc", timeout=1800)


def unit_path() -> Path:
    return templates_dir() / UNIT


def cutlass_objects(source: str, toolchain: NvccToolchain, workdir: Path,
                    config: Config | None = None) -> tuple[Path, ...]:
    """The compiled unit objects the rendered `source` needs (built once into the AOT cache), in a stable order."""
    wanted = units_in_source(source)
    if not wanted:
        return ()
    cutlass = cutlass_for(config)
    why = cutlass_status(toolchain, cutlass)
    if why:
        names = ", ".join(unit_function(*w) for w in wanted)
        raise BuildError(f"the generated CUDA source calls CUTLASS GEMMs ({names}) but they cannot be built: {why}")
    return build_units(wanted, toolchain, cutlass, workdir, config)


def build_units(wanted: Sequence[UnitConfig], toolchain: NvccToolchain, cutlass: Cutlass, workdir: Path,
                config: Config | None = None) -> tuple[Path, ...]:
    """The objects of the (dtype, activation, tile) configurations `wanted`: from the cache, the missing ones compiled
    in parallel (one nvcc each: about a minute and 4 GB apiece; at most one per CPU core), in the order of `wanted`.
    The first failure is raised once every build has ended."""
    from rlx.toolchain.units import UnitStore

    store = UnitStore(config)

    def build(unit: UnitConfig) -> Path:
        unit_tc = CutlassUnitToolchain(toolchain, cutlass, *unit)
        if store.enabled:
            return store.get(unit_path(), unit_tc, workdir)  # type: ignore[arg-type]
        out = workdir / f"{unit_function(*unit)}.unit.o"  # no cache: into the build's directory
        unit_tc.compile_object(unit_path(), out)
        return out

    with ThreadPoolExecutor(max_workers=max(1, min(len(wanted), os.cpu_count() or 1)),
                            thread_name_prefix="rlx-cutlass") as pool:
        futures = [pool.submit(build, w) for w in wanted]
    return tuple(f.result() for f in futures)

"""RLX configuration: the `RLX_*` environment variables, read into one frozen object.

`Config.from_env()` reads the environment each time it is called, so tests and
programs can change variables between compiles; code that wants different
settings passes `dataclasses.replace(config, ...)` explicitly.

| variable | meaning | default |
| --- | --- | --- |
| RLX_CACHE | 0 disables the AOT cache | 1 |
| RLX_CACHE_DIR | writable cache root | per-user cache dir |
| RLX_CACHE_PATH | read-only cache layers, `:`-separated | none |
| RLX_CACHE_MAX_BYTES | LRU bound of the writable root | 4 GiB |
| RLX_CACHE_LOCK_TIMEOUT | seconds to wait for another process's build | 600 |
| RLX_NUM_THREADS | threads for OpenMP and BLAS together | all cores |
| RLX_BLAS | `openblas32` (scipy-openblas32), `system`, a path to a BLAS .so, or `none` | openblas32 |
| RLX_OPT_LEVEL | optimizer level 0-3 | 2 |
| RLX_DEBUG | 1 verifies the graph after every pass | 0 |
| RLX_SANITIZE | `address` (AddressSanitizer), `undefined` or `thread` (ThreadSanitizer) builds | none |
| RLX_CPU_TARGET | `native` or an ISA level like `x86-64-v3` | native |
| RLX_OMP_WAIT | idle OpenMP threads: `adaptive`, a spin count, `passive`, `active`, `default` (below) | adaptive |
| RLX_TEAM_TRACE | a file (or `-`: stderr) for the team governor's line per measured run (`rlx.runtime.team`) | none |
| RLX_TEMPLATES_DIR | templates (`cpu/`, `cuda/`) to render from (`rlx.templates_path`) | the installed ones |
| RLX_PROFILE | 1 builds the profiled variant: per-kernel (and per-thread) time spans (`CompiledGraph.trace`) | 0 |
| RLX_CHECK_NANS | 1 builds the checked variant: a kernel writing NaN/inf fails the run naming its op | 0 |
| RLX_CUTLASS | 0: erf GELU / SiLU GEMMs on cuBLASLt + a pass, not the CUTLASS unit (~1 min to build once) | 1 |
| RLX_CUTLASS_DIR | a directory holding `cutlass/cutlass.h` (instead of the nvidia-cutlass wheel's headers) | none |
| RLX_CUDA_P2P | 0: CUDA all-reduces always call NCCL (no one-shot sums through the peers' memory) | 1 |
| RLX_QUANT_LAYOUT | CPU integer decode GEMVs' weights: `auto`, `interleaved` (by 16 rows) or `rows` (GGUF's) | auto |
| RLX_QGEMV_WALK | CUDA one-row decode GEMVs: `auto` (occ4, K 2048..16384), `xreg`, `rows`, an `occ` walk | auto |
| RLX_QGEMV_XR_GROUPS | CUDA register-walk GEMVs: groups of 8 weight rows a block takes, 1, 2, 4 (0: chosen) | 0 |
| RLX_CUDA_SMALL_GEMM | 0: CUDA f16/bf16 GEMMs of <= 64 rows (quantized copies too) on cuBLASLt | 1 |
| RLX_DENSE_GEMV | 0: CUDA f16/bf16 float projections' one-row steps on their GEMMs, not rlx_dgemv | 1 |
| RLX_DENSE_GEMV_TILE | rlx_dgemv's tile width in output columns, 8 .. 512, powers of 2 (0: chosen per launch) | 0 |
| RLX_DENSE_GEMV_SPLIT | rlx_dgemv's K splits over blocks (0: chosen per launch, 1: none, n: forced, at most 64) | 0 |
| RLX_CUDA_DEQUANT_COPIES | bytes of CUDA quantized weights also kept dequantized for many-row steps (0: none) | 2 GiB |
| RLX_NCCL_HOME | an NCCL install (`include/`, `lib/`) for CUDA collectives (`rlx.toolchain.nccl`) | none |
| RLX_RECORD | a directory where compiled graphs record their `run` calls for `rlxc replay` | none |
| RLX_RECORD_MAX_CALLS | calls recorded per compiled program (the first ones) | 16 |
| RLX_RECORD_MAX_BYTES | bytes a program's recording may hold (inputs, outputs, params snapshots) | 256 MiB |
| CC / RLX_NVCC | C compiler / nvcc | cc / nvcc on PATH |

RLX_OMP_WAIT applies once per process, just before the first generated
library is loaded (that load is what brings in the OpenMP runtime, which
reads its settings then). `adaptive` (the default) sets GOMP_SPINCOUNT=200000:
an idle thread spins about a millisecond, then sleeps, so the team stays awake
across the kernels of one run and between the steps of a decode loop, and a
fork costs a few microseconds instead of the tens a sleeping thread's wake-up
costs (MiniLM at 1x16 on 2 cores: 3.6 ms against 6.2 ms with sleeping
threads); and the runtime sizes each run's team (`rlx.runtime.team`): when
other processes take the cores, spinning against a descheduled partner would
cost 30-50x, so runs use fewer threads (one on 2 cores) until a core is free
again, or, for long runs that measure faster so, one thread more than the
cores (libgomp then sleeps at once, since its threads outnumber the cores).
A number N sets GOMP_SPINCOUNT=N with a fixed team (200000: the adaptive
policy's spin without the governor). `passive` sets
OMP_WAIT_POLICY=PASSIVE (idle threads sleep at once), `active` sets
OMP_WAIT_POLICY=ACTIVE (spin forever, a machine dedicated to RLX), and
`default` leaves the OpenMP runtime's own default; these keep the team fixed.
If OMP_WAIT_POLICY or GOMP_SPINCOUNT is already set, RLX leaves both alone
and keeps the team fixed. The quantized and int8 kernels split small products
across the team only when its threads spin (the runtime passes that with
each run: `rlx_set_team`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rlx.errors import RlxError


def _int(env: Mapping[str, str], key: str, default: int, lo: int = 0) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RlxError(f"{key} must be an integer, got {raw!r}") from None
    if value < lo:
        raise RlxError(f"{key} must be >= {lo}, got {value}")
    return value


def _choice(env: Mapping[str, str], key: str, choices: tuple[str, ...]) -> str:
    raw = env.get(key, "").strip().lower() or choices[0]
    if raw not in choices:
        raise RlxError(f"{key} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def _flag(env: Mapping[str, str], key: str, default: bool) -> bool:
    raw = env.get(key, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise RlxError(f"{key} must be 0 or 1, got {raw!r}")


#: Spin about a millisecond, then sleep, with the team sized to the free cores (see the module docstring).
DEFAULT_OMP_WAIT = "adaptive"
#: The GOMP_SPINCOUNT the adaptive policy sets.
ADAPTIVE_SPINCOUNT = "200000"


def _omp_wait(env: Mapping[str, str]) -> str:
    raw = env.get("RLX_OMP_WAIT", "").strip().lower() or DEFAULT_OMP_WAIT
    if raw in ("adaptive", "passive", "active", "default") or (raw.isdigit() and len(raw) <= 12):
        return raw
    raise RlxError(f"RLX_OMP_WAIT must be adaptive, passive, active, default or a spin count, got {raw!r}")


def omp_environment(omp_wait: str) -> dict[str, str]:
    """The OpenMP variables `omp_wait` (Config.omp_wait) stands for.

    >>> omp_environment("passive"), omp_environment("2000"), omp_environment("default")
    ({'OMP_WAIT_POLICY': 'PASSIVE'}, {'GOMP_SPINCOUNT': '2000'}, {})
    >>> omp_environment("adaptive")
    {'GOMP_SPINCOUNT': '200000'}
    """
    if omp_wait == "adaptive":
        return {"GOMP_SPINCOUNT": ADAPTIVE_SPINCOUNT}
    if omp_wait in ("passive", "active"):
        return {"OMP_WAIT_POLICY": omp_wait.upper()}
    if omp_wait.isdigit():
        return {"GOMP_SPINCOUNT": omp_wait}
    return {}


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("rlx", appauthor=False))


@dataclass(frozen=True)
class Config:
    """Every tunable setting of RLX. Build one with `Config.from_env()`."""

    cache_enabled: bool = True
    cache_dir: Path | None = None
    cache_path: tuple[Path, ...] = ()
    cache_max_bytes: int = 4 << 30
    cache_lock_timeout: float = 600.0
    num_threads: int = 0  # 0 = all cores
    blas: str = "openblas32"
    opt_level: int = 2
    debug: bool = False
    sanitize: str = ""
    cpu_target: str = "native"
    omp_wait: str = DEFAULT_OMP_WAIT
    #: Build variants (each its own cache key): record time spans / check every float output.
    profile: bool = False
    check_nans: bool = False
    #: CUDA sm_90 builds may link the CUTLASS GEMM units (`rlx.toolchain.cuda_units`); False: never.
    cutlass: bool = True
    #: CUTLASS's include directory ("": the nvidia-cutlass wheel's).
    cutlass_dir: str = ""
    #: CUDA tensor-parallel cliques sum small all-reduces one-shot through the peers' memory (`AllReduceP2P`).
    cuda_p2p: bool = True
    #: CPU q8_0/q4_x weights of integer-activation matmuls: "auto", "interleaved" or "rows" (`InterleavedQuantParam`).
    cpu_quant_layout: str = "auto"
    #: CUDA one-row decode GEMVs: "auto", "rows", "xreg" or an occupancy walk (`CudaTarget.gemv_walk`); xreg's groups.
    cuda_gemv_walk: str = "auto"
    cuda_xr_groups: int = 0
    #: RLX_CUDA_DEQUANT_COPIES: bytes of quantized weights CUDA also keeps dequantized (`CudaTarget.dequant_copies`;
    #: -1: the target's default, 0: none).
    cuda_dequant_copies: int = -1
    #: RLX_CUDA_SMALL_GEMM: GEMMs of few rows on rlx_gemm_small (`CudaTarget.small_gemm`; off: cuBLASLt).
    cuda_small_gemm: bool = True
    #: RLX_DENSE_GEMV: one-row steps of float projections on rlx_dgemv (`CudaTarget.dense_gemv`; 0: their GEMMs).
    cuda_dense_gemv: bool = True
    cuda_dense_tile: int = 0
    #: RLX_DENSE_GEMV_SPLIT: rlx_dgemv's K splits over blocks (`CudaTarget.dense_split`; 0: chosen per launch).
    cuda_dense_split: int = 0
    cc: str = "cc"
    nvcc: str = "nvcc"
    #: RLX_RECORD: where compiled graphs record their calls (None: not recorded), and the bounds.
    record_dir: Path | None = None
    record_max_calls: int = 16
    record_max_bytes: int = 256 << 20

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        cache_dir = env.get("RLX_CACHE_DIR", "").strip()
        layers = tuple(Path(p) for p in env.get("RLX_CACHE_PATH", "").split(":") if p.strip())
        sanitize = env.get("RLX_SANITIZE", "").strip()
        if sanitize not in ("", "address", "undefined", "address,undefined", "thread"):
            raise RlxError(f"RLX_SANITIZE must be 'address', 'undefined' or 'thread', got {sanitize!r}")
        opt = _int(env, "RLX_OPT_LEVEL", 2)
        if opt > 3:
            raise RlxError(f"RLX_OPT_LEVEL must be 0..3, got {opt}")
        return Config(
            cache_enabled=_flag(env, "RLX_CACHE", True),
            cache_dir=Path(cache_dir) if cache_dir else None,
            cache_path=layers,
            cache_max_bytes=_int(env, "RLX_CACHE_MAX_BYTES", 4 << 30),
            cache_lock_timeout=float(_int(env, "RLX_CACHE_LOCK_TIMEOUT", 600)),
            num_threads=_int(env, "RLX_NUM_THREADS", 0),
            blas=env.get("RLX_BLAS", "").strip() or "openblas32",
            opt_level=opt,
            debug=_flag(env, "RLX_DEBUG", False),
            sanitize=sanitize,
            cpu_target=env.get("RLX_CPU_TARGET", "").strip() or "native",
            omp_wait=_omp_wait(env),
            profile=_flag(env, "RLX_PROFILE", False),
            check_nans=_flag(env, "RLX_CHECK_NANS", False),
            cutlass=_flag(env, "RLX_CUTLASS", True),
            cutlass_dir=env.get("RLX_CUTLASS_DIR", "").strip(),
            cuda_p2p=_flag(env, "RLX_CUDA_P2P", True),
            cpu_quant_layout=_choice(env, "RLX_QUANT_LAYOUT", ("auto", "interleaved", "rows")),
            cuda_gemv_walk=env.get("RLX_QGEMV_WALK", "").strip() or "auto",
            cuda_xr_groups=_int(env, "RLX_QGEMV_XR_GROUPS", 0),
            cuda_dequant_copies=_int(env, "RLX_CUDA_DEQUANT_COPIES", -1),
            cuda_small_gemm=_flag(env, "RLX_CUDA_SMALL_GEMM", True),
            cuda_dense_gemv=_flag(env, "RLX_DENSE_GEMV", True),
            cuda_dense_tile=_int(env, "RLX_DENSE_GEMV_TILE", 0),
            cuda_dense_split=_int(env, "RLX_DENSE_GEMV_SPLIT", 0),
            cc=env.get("CC", "").strip() or "cc",
            nvcc=env.get("RLX_NVCC", "").strip() or "nvcc",
            record_dir=Path(env["RLX_RECORD"].strip()) if env.get("RLX_RECORD", "").strip() else None,
            record_max_calls=_int(env, "RLX_RECORD_MAX_CALLS", 16),
            record_max_bytes=_int(env, "RLX_RECORD_MAX_BYTES", 256 << 20),
        )

    @property
    def cache_root(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else default_cache_dir()

    @property
    def variant(self) -> str:
        """The build variant these settings ask for: "" (the normal build), "profile", "check_nans" or both.

        >>> Config(profile=True, check_nans=True).variant
        'profile+check_nans'
        """
        return "+".join(name for name, on in (("profile", self.profile), ("check_nans", self.check_nans)) if on)

    @property
    def threads(self) -> int:
        return self.num_threads or (os.cpu_count() or 1)

"""C toolchain discovery: the compiler, its flags, OpenMP and the BLAS provider.

Everything here is probed once per process and cached, because each probe
runs the compiler. The resulting `Toolchain` is an immutable description of
how to turn one generated C file into a shared object; its `identity()` feeds
the AOT cache key, so a different compiler, flag set, ISA or BLAS never
reuses a stale library.

BLAS providers (`Config.blas` / `RLX_BLAS`):

- ``openblas32`` (default): the `scipy-openblas32` wheel. Its symbols carry a
  ``scipy_`` prefix (``scipy_cblas_sgemm``); if the wheel is missing, RLX
  falls back to its own blocked C GEMM.
- ``system``: a system library found by linking ``-lopenblas``, ``-lcblas`` or
  ``-lblas``; a `BuildError` if none links.
- a path to a BLAS shared object exporting ``cblas_sgemm`` (optionally
  prefixed like scipy-openblas).
- ``none``: the built-in C GEMM (correct, slower).

Only 32-bit-integer (LP64) BLAS builds are supported: generated code declares
``cblas_sgemm`` with ``int`` dimensions.

>>> from rlx.config import Config
>>> tc = detect_toolchain(Config(blas="none", cache_enabled=False))
>>> tc.blas.provider, "-fPIC" in tc.flags
('none', True)
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config import Config
from rlx.errors import BuildError
from rlx.templates_path import templates_dir
from rlx.toolchain.blas_load import blas_loading

if TYPE_CHECKING:
    import subprocess

#: Flags every CPU build uses. -fwrapv gives integer ops numpy's wrap-around semantics;
#: -fno-math-errno and -fno-trapping-math let math calls inline and float selects vectorize
#: without changing any result (generated code never reads errno or floating-point traps).
BASE_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-fwrapv", "-fno-math-errno", "-fno-trapping-math",
              "-fvisibility=hidden", "-Wno-unknown-pragmas", "-Werror=implicit-function-declaration")
_TARGET_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
_PROBE_TIMEOUT = 60


@dataclass(frozen=True)
class Blas:
    """How generated code reaches sgemm (or that it does not)."""

    provider: str  # openblas32 | system | path | none
    prefix: str = ""  # symbol prefix: "scipy_" for scipy-openblas32
    include_dirs: tuple[str, ...] = ()
    link_args: tuple[str, ...] = ()
    library: str = ""  # full path of the shared library, when known
    version: str = ""
    has_thread_api: bool = False  # exports <prefix>openblas_set_num_threads

    @property
    def enabled(self) -> bool:
        return self.provider != "none"

    def identity(self) -> str:
        return f"{self.provider} {self.version} {self.library} prefix={self.prefix!r} threads={self.has_thread_api}"


@dataclass(frozen=True)
class Toolchain:
    """A resolved C compiler plus every flag needed to build one generated file."""

    cc: str  # resolved absolute path
    cc_version: str  # first line of `cc --version`
    cc_version_text: str  # the whole `--version` output (cache identity)
    isa: str  # what the code targets, e.g. "native:znver4" or "x86-64-v3"
    isa_flags: tuple[str, ...]
    isa_identity: str  # digest of the target options the compiler resolved
    openmp_flags: tuple[str, ...]
    sanitize: str
    blas: Blas

    @property
    def openmp(self) -> bool:
        return bool(self.openmp_flags)

    @property
    def sanitize_flags(self) -> tuple[str, ...]:
        if not self.sanitize:
            return ()
        return (f"-fsanitize={self.sanitize}", "-fno-omit-frame-pointer", "-g")

    @property
    def flags(self) -> tuple[str, ...]:
        """The complete flag list before the source and output paths."""
        # -I: generated files #include the fixed kernel headers they need (templates/cpu/kernels/).
        base = BASE_FLAGS
        if self.sanitize:
            # A sanitized build checks, it is not timed: -O1, the level the sanitizers' documentation
            # recommends. At -O3 gcc spends most of its time allocating registers for the inlined,
            # instrumented SIMD kernels: the quantized-matmul unit (kernels/quant.c) took over 10 minutes
            # under ASan at -O3 on a 2-core host, ~2 at -O1 (23 s unsanitized at -O3).
            base = tuple("-O1" if f == "-O3" else f for f in BASE_FLAGS)
        return (*base, *self.isa_flags, *self.openmp_flags, *self.sanitize_flags,
                f"-I{templates_dir() / 'cpu'}", *(f"-I{d}" for d in self.blas.include_dirs))

    @property
    def link_flags(self) -> tuple[str, ...]:
        return (*self.blas.link_args, "-lm")

    def compiler_identity(self) -> str:
        return f"{self.cc}\n{self.cc_version_text}"

    @property
    def object_flags(self) -> tuple[str, ...]:
        """`flags` for compiling one file into an object (`-c`): the same, less `-shared`."""
        return tuple(f for f in self.flags if f != "-shared")

    def command(self, source: Path, output: Path, objects: tuple[Path, ...] = ()) -> list[str]:
        return [self.cc, *self.flags, "-o", str(output), str(source), *map(str, objects), *self.link_flags]

    def compile(self, source: Path, output: Path, objects: tuple[Path, ...] = ()) -> None:
        """Build `source` (linked with `objects`, e.g. kernel units) into the shared object `output`;
        BuildError with the compiler's message."""
        run_compiler(self.command(source, output, objects), source, output, "C compiler", timeout=600)

    def compile_object(self, source: Path, output: Path) -> None:
        """Compile `source` into the object file `output` (position-independent, same flags)."""
        cmd = [self.cc, *self.object_flags, "-c", "-o", str(output), str(source)]
        run_compiler(cmd, source, output, "C compiler", timeout=600)

    def link(self, objects: tuple[Path, ...], output: Path) -> None:
        """Link `objects` into the shared object `output` (with the flags and libraries `compile` uses)."""
        cmd = [self.cc, *self.flags, "-o", str(output), *map(str, objects), *self.link_flags]
        run_compiler(cmd, objects[0], output, "C compiler (link)", timeout=600)


def detect_toolchain(config: Config | None = None) -> Toolchain:
    """Resolve the toolchain `config` asks for.

    Probing runs the compiler several times (~0.1 s), so the result is cached per
    process and, with the AOT cache enabled, memoized in the cache keyed by the
    compiler's and BLAS's path, size and mtime, the CPU and the settings: a fresh
    process reuses it without running anything.
    """
    config = config or Config.from_env()
    root = str(config.cache_root) if config.cache_enabled else ""
    return _detect_cached(config.cc, config.blas, config.cpu_target, config.sanitize, root)


#: Bumped when the probes or the Toolchain fields change (invalidates memoized probes).
PROBE_VERSION = 2


@functools.lru_cache(maxsize=16)
def _detect_cached(cc: str, blas: str, cpu_target: str, sanitize: str, cache_root: str) -> Toolchain:
    if not cache_root:
        return _detect(cc, blas, cpu_target, sanitize)
    from rlx.toolchain.cache import AotCache

    fingerprint = _fingerprint(cc, blas, cpu_target, sanitize)
    if fingerprint is None:
        return _detect(cc, blas, cpu_target, sanitize)
    cache = AotCache(Config(cache_dir=Path(cache_root)))
    doc = cache.memo("toolchain", fingerprint, lambda: _to_json(_detect(cc, blas, cpu_target, sanitize)))
    try:
        return _from_json(doc)
    except (KeyError, TypeError, ValueError):
        return _detect(cc, blas, cpu_target, sanitize)


def _openblas32_files() -> list[str]:
    """The scipy-openblas32 wheel's libraries (what `get_library()` picks from), found without importing
    the package (its `__init__` reads importlib.metadata: ~30 ms on every warm start)."""
    import importlib.util

    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not spec.submodule_search_locations:
        return ["no-openblas32"]
    lib_dir = os.path.join(next(iter(spec.submodule_search_locations)), "lib")
    found = sorted(x for x in os.listdir(lib_dir) if x.startswith("libscipy_openblas"))
    return [os.path.join(lib_dir, x) for x in found] or ["no-openblas32"]


def _fingerprint(cc: str, blas: str, cpu_target: str, sanitize: str) -> dict | None:
    """Cheap facts that determine every probe result, or None when they cannot be read."""
    found = which(cc)
    if found is None:
        return None
    files = [os.path.realpath(found)]
    if blas.strip() not in ("none", "", "system"):
        try:
            if Path(blas).expanduser().is_file():
                files.append(os.path.realpath(Path(blas).expanduser()))
            else:
                files.extend(_openblas32_files())
        except (ImportError, OSError, IndexError):
            files.append("no-openblas32")
    stats = []
    for f in files:
        try:
            st = os.stat(f)
            stats.append([f, st.st_size, st.st_mtime_ns])
        except OSError:
            stats.append([f, -1, -1])
    cpu = ""
    if cpu_target == "native":
        try:
            cpu = hashlib.sha256(Path("/proc/cpuinfo").read_bytes().split(b"\n\n")[0]).hexdigest()
        except OSError:
            return None  # no way to tell CPUs apart: probe every time
    return {"probe": PROBE_VERSION, "cc": cc, "blas": blas, "cpu_target": cpu_target, "sanitize": sanitize,
            "files": stats, "cpu": cpu, "path": os.environ.get("PATH", "")}


def _to_json(tc: Toolchain) -> dict:
    return dataclasses.asdict(tc)


def _from_json(doc: dict) -> Toolchain:
    blas = dict(doc["blas"])
    for k in ("include_dirs", "link_args"):
        blas[k] = tuple(blas[k])
    fields = dict(doc)
    fields["blas"] = Blas(**blas)
    for k in ("isa_flags", "openmp_flags"):
        fields[k] = tuple(fields[k])
    return Toolchain(**fields)


def _detect(cc: str, blas: str, cpu_target: str, sanitize: str) -> Toolchain:
    path, version_text = find_compiler(cc)
    # The probes are independent compiler runs (and a dlopen of the BLAS): run them side by side,
    # since the very first compile on a machine waits for all of them.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="rlx-probe") as pool:
        isa_probe = pool.submit(_isa, path, cpu_target)
        openmp_probe = pool.submit(_openmp_flags, path)
        blas_found = _blas(path, blas)
        isa, isa_flags, isa_identity = isa_probe.result()
        openmp_flags = openmp_probe.result()
    return Toolchain(
        cc=path,
        cc_version=version_text.splitlines()[0] if version_text else "",
        cc_version_text=version_text,
        isa=isa,
        isa_flags=isa_flags,
        isa_identity=isa_identity,
        openmp_flags=openmp_flags,
        sanitize=sanitize,
        blas=blas_found,
    )


def which(cmd: str) -> str | None:
    """The path `shutil.which(cmd)` gives: `cmd` if it names a file (with a directory part), else the first
    executable of that name on PATH; None if none. On POSIX without importing shutil, which loads zlib,
    bz2 and lzma (~3 ms of a warm start, whose toolchain fingerprint resolves the compiler).

    >>> which("sh") is not None, which("no-such-command-rlx") is None
    (True, True)
    """
    if os.name != "posix":
        import shutil

        return shutil.which(cmd)

    def runnable(path: str) -> bool:
        return os.path.exists(path) and os.access(path, os.X_OK) and not os.path.isdir(path)

    if os.path.dirname(cmd):
        return cmd if runnable(cmd) else None
    path = os.environ.get("PATH")
    if path is None:
        path = os.confstr("CS_PATH") if "CS_PATH" in os.confstr_names else os.defpath
    for directory in dict.fromkeys(path.split(os.pathsep)) if path else ():
        candidate = os.path.join(directory, cmd)
        if runnable(candidate):
            return candidate
    return None


@functools.lru_cache(maxsize=16)
def find_compiler(cc: str) -> tuple[str, str]:
    """(resolved path, `--version` text) of the C compiler named `cc` (a name or a path)."""
    found = which(cc)
    if found is None:
        raise BuildError(f"C compiler {cc!r} not found (set CC or Config.cc to a working compiler)")
    resolved = os.path.realpath(found)
    return resolved, version_text(resolved, "C compiler")


#: A compiler-command observer: `fn(cmd, started, seconds)`, called with seconds=None just before the
#: command runs and with its wall time after it ends (failed or not). `started` is `time.perf_counter()`.
CommandObserver = Callable[[list[str], float, "float | None"], None]
_OBSERVERS: list[CommandObserver] = []


@contextlib.contextmanager
def observe_commands(fn: CommandObserver) -> Iterator[None]:
    """Call `fn` around every cc/nvcc build command run inside the block (`rlxc -v` prints them).

    Observability only: an observer never changes a build, and one that raises is ignored.
    """
    _OBSERVERS.append(fn)
    try:
        yield
    finally:
        _OBSERVERS.remove(fn)


def _notify(cmd: list[str], started: float, seconds: float | None) -> None:
    for fn in list(_OBSERVERS):
        with contextlib.suppress(Exception):
            fn(list(cmd), started, seconds)


def run_compiler(cmd: list[str], source: Path, output: Path, what: str, timeout: float) -> None:
    """Run one compiler command; BuildError with the compiler's own message and the command."""
    import subprocess  # here: a warm start runs no compiler, and need not import subprocess

    started = time.perf_counter()
    _notify(cmd, started, None)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise BuildError(f"{what} {cmd[0]!r} disappeared; source kept at {source}") from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"{what} timed out after {timeout:.0f} s building {source}") from None
    finally:
        _notify(cmd, started, time.perf_counter() - started)
    if proc.returncode != 0 or not output.exists():
        message = (proc.stderr or proc.stdout).strip()
        if len(message) > 8000:
            message = message[:8000] + "\n... (truncated)"
        raise BuildError(f"{what} failed (exit {proc.returncode}) on {source}:\n{message}\n"
                         f"command: {' '.join(cmd)}")


def version_text(resolved: str, what: str, timeout: float = _PROBE_TIMEOUT) -> str:
    """`resolved --version` output: part of a compiler's identity in the cache key."""
    import subprocess  # here: a warm start runs no compiler, and need not import subprocess

    try:
        proc = subprocess.run([resolved, "--version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{what} {resolved!r} cannot be run: {exc}") from None
    if proc.returncode != 0:
        raise BuildError(f"`{resolved} --version` failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _probe(cc: str, source: str, flags: list[str], link: bool = True) -> subprocess.CompletedProcess[str]:
    import subprocess  # here: a warm start runs no compiler, and need not import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlx-probe-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(source)
        out = Path(tmp) / ("probe" if link else "probe.o")
        cmd = [cc, *flags, "-o", str(out), str(src)] if link else [cc, *flags, "-c", "-o", str(out), str(src)]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=_PROBE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(cmd, 1, "", str(exc))


def _openmp_flags(cc: str) -> tuple[str, ...]:
    src = "#include <omp.h>\nint main(void){int n=0;\n#pragma omp parallel reduction(+:n)\nn+=1;\nreturn n>0?0:1;}\n"
    if _probe(cc, src, ["-fopenmp"]).returncode == 0:
        return ("-fopenmp",)
    return ()


def _isa(cc: str, target: str) -> tuple[str, tuple[str, ...], str]:
    if not _TARGET_RE.match(target):
        raise BuildError(f"RLX_CPU_TARGET {target!r} is not a valid -march value")
    flags = ("-march=native",) if target == "native" else (f"-march={target}", "-mtune=generic")
    import subprocess

    try:
        proc = subprocess.run([cc, *flags, "-Q", "--help=target"], capture_output=True, text=True,
                              timeout=_PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        proc = subprocess.CompletedProcess([], 1, "", "")
    if proc.returncode != 0:
        # Compilers without -Q --help=target (clang): still check that the flag is accepted.
        check = _probe(cc, "int rlx_probe(void){return 0;}\n", [*flags], link=False)
        if check.returncode != 0:
            raise BuildError(f"C compiler rejects {' '.join(flags)}: {check.stderr.strip()}")
        return target, flags, hashlib.sha256(" ".join(flags).encode()).hexdigest()
    resolved = target
    if target == "native":
        m = re.search(r"^\s*-march=\s*(\S+)", proc.stdout, re.MULTILINE)
        resolved = f"native:{m.group(1)}" if m else "native"
    return resolved, flags, hashlib.sha256(proc.stdout.encode()).hexdigest()


def _blas(cc: str, setting: str) -> Blas:
    setting = setting.strip()
    if setting in ("none", ""):
        return Blas("none")
    if setting in ("openblas32", "scipy-openblas32", "scipy_openblas32"):
        try:
            import scipy_openblas32 as sob
        except ImportError:
            return Blas("none")
        lib_dir = sob.get_lib_dir()
        lib_file = os.path.join(lib_dir, sob.get_library(fullname=True))
        prefix = _pkg_prefix(sob) or "scipy_"
        return Blas(
            provider="openblas32",
            prefix=prefix,
            include_dirs=(),
            link_args=(lib_file, *_runpath(lib_dir)),
            library=os.path.realpath(lib_file),
            version=getattr(sob, "__version__", ""),
            has_thread_api=_has_symbol(lib_file, f"{prefix}openblas_set_num_threads"),
        )
    if setting == "system":
        for lib in ("openblas", "cblas", "blas"):
            src = ("void cblas_sgemm(int,int,int,int,int,int,float,const float*,int,const float*,int,"
                   "float,float*,int);\nint main(void){float a=1,b=1,c=0;"
                   "cblas_sgemm(101,111,111,1,1,1,1.f,&a,1,&b,1,0.f,&c,1);return c==1.f?0:1;}\n")
            if _probe(cc, src, [f"-l{lib}"]).returncode == 0:
                threads_src = ("void openblas_set_num_threads(int);\n"
                               "int main(void){openblas_set_num_threads(1);return 0;}\n")
                has_threads = _probe(cc, threads_src, [f"-l{lib}"]).returncode == 0
                return Blas("system", "", (), (f"-l{lib}",), f"-l{lib}", "", has_threads)
        raise BuildError("RLX_BLAS=system but no system CBLAS links (tried -lopenblas, -lcblas, -lblas); "
                         "install OpenBLAS or set RLX_BLAS=openblas32 / none")
    path = Path(setting).expanduser()
    if not path.is_file():
        raise BuildError(f"RLX_BLAS={setting!r} is neither openblas32, system, none nor an existing library file")
    real = os.path.realpath(path)
    for prefix in ("", "scipy_"):
        if _has_symbol(real, f"{prefix}cblas_sgemm"):
            return Blas("path", prefix, (), (real, *_runpath(os.path.dirname(real))), real, "",
                        _has_symbol(real, f"{prefix}openblas_set_num_threads"))
    raise BuildError(f"BLAS library {real} exports no cblas_sgemm")


def _runpath(lib_dir: str) -> tuple[str, ...]:
    """Link flags giving a library the RUNPATH `$ORIGIN:lib_dir`.

    `lib_dir` (where the BLAS lives at build time) serves libraries in the
    cache; `$ORIGIN` (the library's own directory, searched first) lets a saved
    artifact carry its own copy of the BLAS next to model.so
    (`rlx.runtime.artifact.save` copies it), so the artifact still loads
    once moved to a machine without this environment.
    """
    return ("-Wl,-rpath,$ORIGIN", f"-Wl,-rpath,{lib_dir}")


def _pkg_prefix(sob: object) -> str:
    try:
        text = sob.get_pkg_config()  # type: ignore[attr-defined]
    except Exception:
        return ""
    m = re.search(r"-DBLAS_SYMBOL_PREFIX=(\w+)", text)
    return m.group(1) if m else ""


def _has_symbol(library: str, symbol: str) -> bool:
    try:
        with blas_loading():  # loading it starts no thread pool (the runs use it single-threaded)
            lib = ctypes.CDLL(library)
    except OSError:
        return False
    return hasattr(lib, symbol)

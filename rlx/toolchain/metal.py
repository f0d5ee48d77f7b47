"""The Metal toolchain (`xcrun metal`, `xcrun metallib`) and the build of one `.metal` program.

- `find_metal_toolchain()`: the Metal compiler and linker of the Xcode command-line tools, or None where
  there is none (every non-macOS system, and a Mac without the tools). `metal_toolchain_report()` says
  which, in words (`rlxc doctor`).
- `write_metal(out_dir, source, manifest, components, ...)`: write a rendered program's `model.metal` and
  `manifest.json` (and, with a toolchain, `model.metallib`) — what `rlxc compile --target metal -o DIR`
  produces. The program is rendered by `rlx.pipeline.metal` (the toolchain never imports codegen).
- `build_metal(source, manifest, components, config)`: the same into the AOT cache root
  (`<cache>/metal/<key>/`), keyed like the other backends: a digest of the LIR hash, the rendered source,
  the target options and the toolchain's identity and flags (`metal_source_components`); a second build
  of the same program is a hit, and `find_metal_build` finds it by its key (the compile index).

The `.metallib` step runs only on macOS and has not run on Apple hardware in RLX's CI (Linux): there the
generated source is checked by the emulator in `tests/metal/` instead.

>>> tc = find_metal_toolchain()
>>> tc is None or tc.identity().startswith("metal")
True
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlx.config import Config
from rlx.errors import BuildError
from rlx.toolchain.cache import cache_key
from rlx.toolchain.cpu import source_digest, templates_digest

#: Flags of every `xcrun metal` compile. Fast math is off: the kernels rely on IEEE NaN / inf semantics
#: (NaN-propagating max, -inf masked scores) like every other backend.
METAL_FLAGS = ("-fno-fast-math",)
_PROBE_TIMEOUT = 60


@dataclass(frozen=True)
class MetalToolchain:
    """`xcrun metal` and `xcrun metallib` of the active developer directory, and their version text."""

    metal: str
    metallib: str
    version: str

    def identity(self) -> str:
        return f"metal {self.version}"

    def flags(self, msl: str) -> tuple[str, ...]:
        return (f"-std=metal{msl}", *METAL_FLAGS)

    def compile(self, source: Path, air: Path, metallib: Path, msl: str) -> None:
        """source → .air → .metallib (errors carry the compiler's output)."""
        for cmd in ([self.metal, *self.flags(msl), "-c", str(source), "-o", str(air)],
                    [self.metallib, str(air), "-o", str(metallib)]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(f"{' '.join(cmd[:2])} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def _xcrun_find(tool: str) -> str | None:
    try:
        proc = subprocess.run(["xcrun", "-sdk", "macosx", "--find", tool], capture_output=True, text=True,
                              timeout=_PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = proc.stdout.strip()
    return path if proc.returncode == 0 and path else None


def find_metal_toolchain() -> MetalToolchain | None:
    """The Metal compiler and linker, or None (not macOS, or no Xcode command-line tools)."""
    if platform.system() != "Darwin" or shutil.which("xcrun") is None:
        return None
    metal, metallib = _xcrun_find("metal"), _xcrun_find("metallib")
    if metal is None or metallib is None:
        return None
    try:
        proc = subprocess.run([metal, "--version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT)
        version = (proc.stdout or proc.stderr).strip().splitlines()[0] if proc.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired, IndexError):
        version = "unknown"
    return MetalToolchain(metal, metallib, version)


def metal_toolchain_report() -> str:
    """One line for `rlxc doctor`: the Metal toolchain found, or why there is none."""
    tc = find_metal_toolchain()
    if tc is not None:
        return f"metal: {tc.metal} ({tc.version}); metallib: {tc.metallib}"
    if platform.system() != "Darwin":
        return (f"metal: no Metal toolchain on {platform.system()} (xcrun metal is macOS only); "
                "`rlxc compile --target metal` still writes the .metal source and manifest")
    return "metal: xcrun cannot find metal/metallib: install the Xcode command-line tools (xcode-select --install)"


@dataclass(frozen=True)
class MetalBuild:
    """What a Metal build wrote: the source, the manifest, the metallib (None without a toolchain)."""

    dir: Path
    source: Path
    manifest: Path
    metallib: Path | None
    key: str
    hit: bool
    components: dict[str, str]


def metal_source_components(lir_hash: str, source: str, target_identity: str,
                            toolchain: MetalToolchain | None, msl: str) -> dict[str, str]:
    """Every input of a Metal build, as strings (the key is their digest, as for CPU and CUDA builds)."""
    return {
        "lir": lir_hash,
        "source": source_digest(source),
        "target_options": target_identity,
        "templates": templates_digest("metal"),
        "toolchain": toolchain.identity() if toolchain is not None else "none",
        "flags": " ".join(toolchain.flags(msl)) if toolchain is not None else "",
    }


def _write(out: Path, source: str, manifest: dict, toolchain: MetalToolchain | None, msl: str) -> Path | None:
    (out / "model.metal").write_text(source)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if toolchain is None:
        return None
    metallib = out / "model.metallib"
    toolchain.compile(out / "model.metal", out / "model.air", metallib, msl)
    return metallib


def write_metal(out_dir: str | Path, source: str, manifest: dict, components: dict[str, str], msl: str, *,
                toolchain: MetalToolchain | None = None) -> MetalBuild:
    """Write a rendered Metal program into `out_dir`: model.metal, manifest.json (+ model.metallib with a
    toolchain)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metallib = _write(out, source, manifest, toolchain, msl)
    return MetalBuild(out, out / "model.metal", out / "manifest.json", metallib, cache_key(components), False,
                      components)


def _cached(final: Path, key: str, components: dict[str, str], toolchain: MetalToolchain | None,
            hit: bool) -> MetalBuild:
    return MetalBuild(final, final / "model.metal", final / "manifest.json",
                      final / "model.metallib" if toolchain else None, key, hit, components)


def find_metal_build(config: Config, key: str, toolchain: MetalToolchain | None) -> MetalBuild | None:
    """The program built before under `key` in the cache root (with its metallib where there is a
    toolchain), or None. The components of a found program are its key alone (`{"key": key}`)."""
    final = Path(config.cache_root).expanduser() / "metal" / key
    if (final / "manifest.json").is_file() and (toolchain is None or (final / "model.metallib").is_file()):
        return _cached(final, key, {"key": key}, toolchain, True)
    return None


def build_metal(source: str, manifest: dict, components: dict[str, str], msl: str, config: Config | None = None,
                *, toolchain: MetalToolchain | None = None) -> MetalBuild:
    """`write_metal` into the cache root's `metal/<key>/` (a hit when that program was built before)."""
    config = config or Config.from_env()
    key = cache_key(components)
    final = Path(config.cache_root).expanduser() / "metal" / key
    if find_metal_build(config, key, toolchain) is not None:
        return _cached(final, key, components, toolchain, True)
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=final.parent))
    _write(work, source, manifest, toolchain, msl)
    try:
        os.replace(work, final)  # atomic: another process's identical build may have won the race
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
    return _cached(final, key, components, toolchain, False)

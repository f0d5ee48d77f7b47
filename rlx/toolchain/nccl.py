"""Where NCCL is: the header for building graphs with collective ops on CUDA, the library for running them.

Searched in `RLX_NCCL_HOME` / `NCCL_HOME` (`include/`, `lib/`), the `nvidia-nccl-cu12` wheel
(`nvidia/nccl/include`, `nvidia/nccl/lib`; the `cuda` extra), then the CUDA toolkit and the
system directories. Only graphs with collectives need it: their build adds `-I`, the link and
an rpath (`Nccl.flags` / `link_args`), and their cache key names the NCCL found.

>>> isinstance(find_nccl().found, bool)
True
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Nccl:
    """NCCL's include directory and library (empty when not found)."""

    include_dir: str = ""
    lib_dir: str = ""
    library: str = ""

    @property
    def found(self) -> bool:
        return bool(self.include_dir and self.library)

    @property
    def flags(self) -> tuple[str, ...]:
        return (f"-I{self.include_dir}",) if self.include_dir else ()

    @property
    def link_args(self) -> tuple[str, ...]:
        if not self.library:
            return ()
        return (f"-L{self.lib_dir}", f"-l:{os.path.basename(self.library)}", f"-Xlinker=-rpath,{self.lib_dir}")

    def identity(self) -> str:
        return f"nccl {self.library} include={self.include_dir}" if self.found else "none"


def _roots() -> list[Path]:
    roots = [Path(os.environ[v]) for v in ("RLX_NCCL_HOME", "NCCL_HOME") if os.environ.get(v)]
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        roots += [Path(r) / "nccl" for r in spec.submodule_search_locations or []]
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    return [*roots, cuda, Path("/usr/local/cuda"), Path("/usr")]


@functools.lru_cache(maxsize=4)
def find_nccl() -> Nccl:
    """The first root with `include/nccl.h` and a `libnccl.so*` (`lib`, `lib64` or the multiarch dir)."""
    for root in _roots():
        inc = root / "include"
        if not (inc / "nccl.h").is_file():
            continue
        for lib in (root / "lib", root / "lib64", root / "lib" / "x86_64-linux-gnu"):
            cands = sorted(glob.glob(str(lib / "libnccl.so*")), key=len)
            if cands:
                return Nccl(str(inc), str(lib), cands[0])
    return Nccl()


def find_nccl_library() -> str:
    """The libnccl to load at run time (creating the unique id), '' when none."""
    return find_nccl().library


__all__ = ["Nccl", "find_nccl", "find_nccl_library"]

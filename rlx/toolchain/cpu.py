"""Build one LIR module into a CPU shared object, through the AOT cache.

`cpu_key_components(lir, toolchain)` lists everything that determines the
built library (the cache key's components); `build_cpu(lir, config)` renders
the C file, compiles it inside the cache's private work directory and returns
the cache entry.

>>> from rlx.config import Config
>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("k")
>>> g.set_outputs([g.activation("neg", g.input("x", [2]))])
>>> tc = detect_toolchain(Config(blas="none", cache_enabled=False))
>>> comps = cpu_key_components(plan(g), tc)
>>> sorted(comps)
['blas', 'codegen_version', 'compiler', 'flags', 'lir', 'target', 'target_options', 'templates']
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlx.codegen.c import ABI_VERSION, CODEGEN_VERSION, CTarget, render_c
from rlx.config import Config
from rlx.errors import BuildError
from rlx.ir.lir import LirModule
from rlx.templates_path import templates_dir
from rlx.toolchain.cache import AotCache, cache_key
from rlx.toolchain.compiler import Toolchain, detect_toolchain
from rlx.toolchain.isa import describe as describe_isa


def templates_digest(target: str = "cpu") -> str:
    """sha256 over every file under templates/<target> (names and contents)."""
    root = templates_dir() / target
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def c_target(toolchain: Toolchain) -> CTarget:
    return CTarget(blas=toolchain.blas.enabled, blas_prefix=toolchain.blas.prefix,
                   blas_threads=toolchain.blas.has_thread_api, openmp=toolchain.openmp)


def cpu_key_components(lir: LirModule, toolchain: Toolchain) -> dict[str, str]:
    """Every input of the CPU build, as strings: the AOT cache key is a digest of these."""
    return {"lir": lir.hash(), **cpu_toolchain_components(toolchain)}


def cpu_toolchain_components(toolchain: Toolchain) -> dict[str, str]:
    """The key components that do not depend on the program: target, compiler, flags, templates, BLAS."""
    return {
        "target": "cpu",
        "target_options": f"isa={toolchain.isa} isa_digest={toolchain.isa_identity} "
                          f"openmp={toolchain.openmp} sanitize={toolchain.sanitize or 'none'}",
        "compiler": toolchain.compiler_identity(),
        "flags": " ".join((*toolchain.flags, *toolchain.link_flags)),
        "templates": templates_digest("cpu"),
        "blas": toolchain.blas.identity(),
        "codegen_version": f"{CODEGEN_VERSION} abi={ABI_VERSION}",
    }


def components_key(components: dict[str, str]) -> str:
    """The AOT cache key of `components` (the same digest `rlx.toolchain.cache.cache_key` computes)."""
    return cache_key(components)


def cpu_manifest(lir: LirModule, toolchain: Toolchain, key: str, cpu_target: str) -> dict:
    """LirModule.manifest() plus what the builder knows: ABI, target, ISA record, BLAS, key."""
    m = lir.manifest()
    isa = describe_isa(cpu_target)
    isa.update({"march": toolchain.isa, "flags": list(toolchain.isa_flags)})
    m.update({"abi_version": ABI_VERSION, "target": "cpu", "isa": isa, "key": key,
              "blas": toolchain.blas.provider, "codegen_version": CODEGEN_VERSION})
    return m


def render_source(lir: LirModule, config: Config | None = None, toolchain: Toolchain | None = None) -> str:
    """The C source `build_cpu` would compile for `lir` (manifest and key included)."""
    config = config or Config.from_env()
    toolchain = toolchain or detect_toolchain(config)
    key = cache_key(cpu_key_components(lir, toolchain))
    return render_c(lir, c_target(toolchain), cpu_manifest(lir, toolchain, key, config.cpu_target))


@dataclass(frozen=True)
class CpuBuild:
    """Result of `build_cpu`: where the library is and what went into it."""

    library: Path
    source: Path
    key: str
    hit: bool
    components: dict[str, str]
    toolchain: Toolchain


def build_cpu(lir: LirModule, config: Config | None = None, toolchain: Toolchain | None = None) -> CpuBuild:
    """Render, compile (or find in the AOT cache) the CPU library for `lir`."""
    config = config or Config.from_env()
    toolchain = toolchain or detect_toolchain(config)
    components = cpu_key_components(lir, toolchain)
    key = cache_key(components)

    def build(workdir: Path) -> None:
        source = workdir / "model.c"
        text = render_c(lir, c_target(toolchain), cpu_manifest(lir, toolchain, key, config.cpu_target))
        source.write_text(text)
        try:
            toolchain.compile(source, workdir / "model.so")
        except BuildError as exc:
            # the cache discards its work dir on failure: keep the source where the message points
            fd, kept = tempfile.mkstemp(prefix=f"rlx-failed-{key[:12]}-", suffix=".c")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            raise BuildError(f"{str(exc).replace(str(source), kept)}\n(generated source kept at {kept})") from None

    entry = AotCache(config).get_or_build(components, build)
    return CpuBuild(Path(entry.library), Path(entry.source), entry.key, bool(entry.hit), components, toolchain)

"""Build one LIR module into a CPU shared object, through the AOT cache.

The cache key of a built object is a digest of what produced it: the sha256 of
the C source it was compiled from, the compiler's identity, flags, ISA, BLAS
(and the LIR hash and the templates' digest, which name the program and a
template change in `rlxc cache explain`). So a change anywhere in codegen,
its templates or its tunables changes the key: there is no hand-bumped
version to forget. The source embeds its own key (in
the manifest `rlx_manifest()` returns), so the digest is taken of the source
rendered with an empty key (`KEY_PENDING`); the compiled file is that same
render with the key filled in, and nothing else differs.

`cpu_key_components(lir, toolchain)` renders and lists the components;
`build_cpu(lir, config)` renders, keys, and on a miss compiles inside the
cache's private work directory. Codegen (and jinja2) are imported only when a
source is rendered: `rlx.driver`'s warm path uses `cpu_toolchain_components`
without loading them.

>>> from rlx.config import Config
>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("k")
>>> g.set_outputs([g.activation("neg", g.input("x", [2]))])
>>> config = Config(blas="none", cache_enabled=False)
>>> tc = detect_toolchain(config)
>>> comps = cpu_key_components(plan(g), tc, config)
>>> sorted(comps)
['blas', 'compiler', 'flags', 'lir', 'source', 'target', 'target_options', 'templates']
>>> comps["source"] == source_digest(render_source(plan(g), config, tc, key=KEY_PENDING))
True
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config import Config
from rlx.errors import BuildError, CacheError
from rlx.ir.lir import LirModule
from rlx.templates_path import templates_dir
from rlx.toolchain.cache import AotCache, _mkdir_private, cache_key, check_private
from rlx.toolchain.compiler import Toolchain, detect_toolchain
from rlx.toolchain.isa import describe as describe_isa
from rlx.toolchain.units import compile_program

if TYPE_CHECKING:
    from rlx.codegen.c import CTarget

#: The manifest's "key" while the source digest is taken (the key depends on that digest).
KEY_PENDING = ""


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


def source_digest(text: str) -> str:
    """sha256 of a rendered source (the "source" key component)."""
    return hashlib.sha256(text.encode()).hexdigest()


def c_target(toolchain: Toolchain, config: Config | None = None) -> CTarget:
    from rlx.codegen.c import CTarget

    config = config or Config()
    return CTarget(blas=toolchain.blas.enabled, blas_prefix=toolchain.blas.prefix,
                   blas_threads=toolchain.blas.has_thread_api, openmp=toolchain.openmp,
                   profile=config.profile, check_nans=config.check_nans)


def cpu_key_components(lir: LirModule, toolchain: Toolchain, config: Config | None = None, *,
                       pending_source: str | None = None) -> dict[str, str]:
    """Every input of the CPU build, as strings: the AOT cache key is a digest of these.

    `pending_source` is the source rendered with `KEY_PENDING` when the caller has it already
    (rendered here otherwise).
    """
    if pending_source is None:
        pending_source = render_source(lir, config, toolchain, key=KEY_PENDING)
    return {"lir": lir.hash(), "source": source_digest(pending_source),
            **cpu_toolchain_components(toolchain, config)}


def cpu_toolchain_components(toolchain: Toolchain, config: Config | None = None) -> dict[str, str]:
    """The key components that do not depend on the program: target, compiler, flags, templates, BLAS,
    and the build variant (`Config.variant`: profiled / NaN-checked builds), present only when not "".

    Cheap (no rendering, no codegen import): the driver's compile index is keyed by these too.
    """
    variant = config.variant if config is not None else ""
    return ({"variant": variant} if variant else {}) | {
        "target": "cpu",
        "target_options": f"isa={toolchain.isa} isa_digest={toolchain.isa_identity} "
                          f"openmp={toolchain.openmp} sanitize={toolchain.sanitize or 'none'}",
        "compiler": toolchain.compiler_identity(),
        "flags": " ".join((*toolchain.flags, *toolchain.link_flags)),
        # Redundant with "source" for the compiled file, but names a template change in `cache explain`.
        "templates": templates_digest("cpu"),
        "blas": toolchain.blas.identity(),
    }


def components_key(components: dict[str, str]) -> str:
    """The AOT cache key of `components` (the same digest `rlx.toolchain.cache.cache_key` computes)."""
    return cache_key(components)


def cpu_manifest(lir: LirModule, toolchain: Toolchain, key: str, cpu_target: str) -> dict:
    """LirModule.manifest() plus what the builder knows: ABI, target, ISA record, BLAS, key."""
    from rlx.codegen.c import ABI_VERSION, CODEGEN_VERSION

    m = lir.manifest()
    isa = describe_isa(cpu_target)
    isa.update({"march": toolchain.isa, "flags": list(toolchain.isa_flags)})
    m.update({"abi_version": ABI_VERSION, "target": "cpu", "isa": isa, "key": key,
              "blas": toolchain.blas.provider, "codegen_version": CODEGEN_VERSION})
    return m


def render_source(lir: LirModule, config: Config | None = None, toolchain: Toolchain | None = None, *,
                  key: str | None = None) -> str:
    """The C source `build_cpu` would compile for `lir` (manifest and key included).

    `key` fills the manifest's key instead of the one the source's digest gives (`KEY_PENDING`: the
    source that digest is taken of).
    """
    from rlx.codegen.c import render_c

    config = config or Config.from_env()
    toolchain = toolchain or detect_toolchain(config)
    if key is None:
        key = cache_key(cpu_key_components(lir, toolchain, config))
    manifest = cpu_manifest(lir, toolchain, key, config.cpu_target)
    if config.variant:
        manifest["variant"] = config.variant
    return render_c(lir, c_target(toolchain, config), manifest, bytecode_dir=template_bytecode_dir(config))


def template_bytecode_dir(config: Config) -> Path | None:
    """The private directory of the AOT cache root where compiled Jinja templates are kept
    (`rlx.codegen.template_cache`), or None with the cache disabled or unusable."""
    if not config.cache_enabled:
        return None
    from rlx.codegen.template_cache import bytecode_tag

    cache = AotCache(config)
    path = cache.root / "templates" / bytecode_tag()
    try:
        cache._ensure_root()
        _mkdir_private(path.parent)
        _mkdir_private(path)
        check_private(path, "compiled templates directory")
    except (OSError, CacheError):
        return None  # compiled in memory only: slower, never wrong
    return path


@dataclass(frozen=True)
class CpuBuild:
    """Result of `build_cpu`: where the library is and what went into it (`components["source"]`:
    the digest of the source rendered with `KEY_PENDING`)."""

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
    pending = render_source(lir, config, toolchain, key=KEY_PENDING)
    components = cpu_key_components(lir, toolchain, config, pending_source=pending)
    key = cache_key(components)

    def build(workdir: Path) -> None:
        source = workdir / "model.c"
        # Rendered again with the key: only on a miss, where the C compiler's seconds dwarf it.
        text = render_source(lir, config, toolchain, key=key)
        source.write_text(text)
        try:
            # linked with the kernel units its headers name (compiled once per toolchain: units.py)
            compile_program(toolchain, source, workdir / "model.so", config)
        except BuildError as exc:
            # the cache discards its work dir on failure: keep the source where the message points
            fd, kept = tempfile.mkstemp(prefix=f"rlx-failed-{key[:12]}-", suffix=".c")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            raise BuildError(f"{str(exc).replace(str(source), kept)}\n(generated source kept at {kept})") from None

    entry = AotCache(config).get_or_build(components, build)
    return CpuBuild(Path(entry.library), Path(entry.source), entry.key, bool(entry.hit), components, toolchain)

"""Build one rendered C source into a CPU shared object, through the AOT cache.

The cache key of a built object is a digest of what produced it: the sha256 of
the C source it was compiled from, the compiler's identity, flags, ISA, BLAS
(and the LIR hash and the templates' digest, which name the program and a
template change in `rlxc cache explain`). So a change anywhere in codegen,
its templates or its tunables changes the key: there is no hand-bumped
version to forget. The source embeds its own key (in
the manifest `rlx_manifest()` returns), so the digest is taken of the source
rendered with an empty key (`KEY_PENDING`); the compiled file is that same
render with the key filled in, and nothing else differs.

The toolchain never renders: `rlx.pipeline.cpu` renders (and decides) and
hands `build_cpu` the source (a function from the key to the text) and the key
components (`cpu_source_components`). `cpu_toolchain_components` is what the
driver's warm path keys the compile index by, without loading codegen.

>>> from rlx.config import Config
>>> config = Config(blas="none", cache_enabled=False)
>>> tc = detect_toolchain(config)
>>> comps = cpu_source_components("0" * 64, "int main(void) { return 0; }", tc, config)
>>> sorted(comps)
['blas', 'compiler', 'flags', 'lir', 'source', 'target', 'target_options', 'templates']
>>> comps["source"] == source_digest("int main(void) { return 0; }")
True
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlx.config import Config
from rlx.errors import BuildError
from rlx.templates_path import templates_dir
from rlx.toolchain.cache import AotCache, cache_key
from rlx.toolchain.compiler import Toolchain, detect_toolchain
from rlx.toolchain.walk import files_with_stats, stat_digest

#: The manifest's "key" while the source digest is taken (the key depends on that digest).
KEY_PENDING = ""


def templates_digest(target: str = "cpu", cache: AotCache | None = None) -> str:
    """sha256 over every file under templates/<target> (names and contents).

    The files are read only when their stat signature changed (`rlx.toolchain.walk.stat_digest`, as for
    `rlx.driver.compiler_source_digest`); given an enabled `cache`, its memo (`templates_digest`) keeps the
    digest across processes, so a warm start stats the files and reads none.

    >>> len(templates_digest("cpu"))
    64
    """
    top = str(templates_dir() / target)
    return stat_digest("templates_digest", files_with_stats(top), cache, slot=f"templates_digest:{top}")


def source_digest(text: str) -> str:
    """sha256 of a rendered source (the "source" key component)."""
    return hashlib.sha256(text.encode()).hexdigest()


def cpu_toolchain_components(toolchain: Toolchain, config: Config | None = None) -> dict[str, str]:
    """The key components that do not depend on the program: target, compiler, flags, templates, BLAS,
    the build variant (`Config.variant`: profiled / NaN-checked builds), present only when not "", and a
    lowering choice the config forces (RLX_QUANT_LAYOUT other than auto), likewise.

    Cheap (no rendering, no codegen import): the driver's compile index is keyed by these too.
    """
    variant = config.variant if config is not None else ""
    layout = config.cpu_quant_layout if config is not None else "auto"
    return ({"variant": variant} if variant else {}) | ({"quant_layout": layout} if layout != "auto" else {}) | {
        "target": "cpu",
        "target_options": f"isa={toolchain.isa} isa_digest={toolchain.isa_identity} "
                          f"openmp={toolchain.openmp} sanitize={toolchain.sanitize or 'none'}",
        "compiler": toolchain.compiler_identity(),
        "flags": " ".join((*toolchain.flags, *toolchain.link_flags)),
        # Redundant with "source" for the compiled file, but names a template change in `cache explain`.
        "templates": templates_digest("cpu", AotCache(config) if config is not None else None),
        "blas": toolchain.blas.identity(),
    }


def cpu_source_components(lir_hash: str, pending_source: str, toolchain: Toolchain,
                          config: Config | None = None) -> dict[str, str]:
    """Every input of the CPU build, as strings: the AOT cache key is a digest of these.

    `lir_hash`: the hash of the decided LIR that was rendered; `pending_source`: the source rendered
    with `KEY_PENDING`.
    """
    return {"lir": lir_hash, "source": source_digest(pending_source),
            **cpu_toolchain_components(toolchain, config)}


def components_key(components: dict[str, str]) -> str:
    """The AOT cache key of `components` (the same digest `rlx.toolchain.cache.cache_key` computes)."""
    return cache_key(components)


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


def build_cpu(source: Callable[[str], str], components: dict[str, str], config: Config | None = None,
              toolchain: Toolchain | None = None) -> CpuBuild:
    """Compile (or find in the AOT cache) the CPU library of a rendered source.

    `source(key)`: the C text with `key` in its manifest (called once, on a miss); `components`: its
    key components (`cpu_source_components`), whose digest is the key.
    """
    config = config or Config.from_env()
    toolchain = toolchain or detect_toolchain(config)
    key = cache_key(components)

    def build(workdir: Path) -> None:
        import tempfile

        from rlx.toolchain.units import compile_program  # a miss's build only (a warm hit builds nothing)

        path = workdir / "model.c"
        # Rendered again with the key: only on a miss, where the C compiler's seconds dwarf it.
        text = source(key)
        path.write_text(text)
        try:
            # linked with the kernel units its headers name (compiled once per toolchain: units.py)
            compile_program(toolchain, path, workdir / "model.so", config)
        except BuildError as exc:
            # the cache discards its work dir on failure: keep the source where the message points
            fd, kept = tempfile.mkstemp(prefix=f"rlx-failed-{key[:12]}-", suffix=".c")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            raise BuildError(f"{str(exc).replace(str(path), kept)}\n(generated source kept at {kept})") from None

    entry = AotCache(config).get_or_build(components, build)
    return CpuBuild(Path(entry.library), Path(entry.source), entry.key, bool(entry.hit), components, toolchain)

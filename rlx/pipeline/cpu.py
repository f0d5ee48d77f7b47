"""The CPU backend's stages: decide, render (one C file), build (the C compiler, through the AOT cache),
load (`CompiledGraph`), and the memory estimate of the decided plan.

Codegen (and jinja2) load only when `render` or `estimate` runs: `request` (the compile index's
components) and `find` / `load` (a warm hit) need only the toolchain and the runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx.config import Config
from rlx.errors import ArtifactError, CacheError
from rlx.pipeline.decide import decide
from rlx.pipeline.values import Built, Rendered
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.loader import load_library
from rlx.toolchain.cache import AotCache, _mkdir_private, cache_key, check_private
from rlx.toolchain.compiler import Toolchain, detect_toolchain
from rlx.toolchain.cpu import KEY_PENDING, build_cpu, cpu_source_components, cpu_toolchain_components
from rlx.toolchain.param_store import ParamStore

if TYPE_CHECKING:  # annotations only (the memory estimate and the ISA record load when a compile needs them)
    from rlx.ir.lir import LirModule
    from rlx.runtime.memory import MemoryEstimate


def c_target(toolchain: Toolchain, config: Config | None = None) -> Any:
    """The `rlx.codegen.cpu.emit.CTarget` of a toolchain (BLAS, OpenMP) and a configuration (build variant)."""
    from rlx.codegen.cpu.emit import CTarget

    config = config or Config()
    return CTarget(blas=toolchain.blas.enabled, blas_prefix=toolchain.blas.prefix,
                   blas_threads=toolchain.blas.has_thread_api, openmp=toolchain.openmp,
                   profile=config.profile, check_nans=config.check_nans)


def cpu_manifest(lir: LirModule, toolchain: Toolchain, key: str, cpu_target: str) -> dict:
    """LirModule.manifest() plus what the builder knows: ABI, target, ISA record, BLAS, key."""
    from rlx.codegen.cpu.emit import ABI_VERSION, CODEGEN_VERSION
    from rlx.toolchain.isa import describe as describe_isa

    m = lir.manifest()
    isa = describe_isa(cpu_target)
    isa.update({"march": toolchain.isa, "flags": list(toolchain.isa_flags)})
    m.update({"abi_version": ABI_VERSION, "target": "cpu", "isa": isa, "key": key,
              "blas": toolchain.blas.provider, "codegen_version": CODEGEN_VERSION})
    return m


def conv_vector(cpu_target: str) -> int:
    """Floats per vector of the conv register tiles for code built for `cpu_target` (`ConvPlan.vector`): 16 where
    the target's features include AVX-512F (an x86-64-v4 level, or `native` on a CPU that has it), else 8."""
    from rlx.opt.lowering_conv import tile_vector
    from rlx.toolchain.isa import required_features

    try:
        return tile_vector(required_features(cpu_target))
    except ArtifactError:  # an x86-64 level named on another architecture: the build refuses it, not this
        return 8


def quant_interleave(config: Config) -> bool:
    """Whether q8_0 / q4_0 / q4_1 weights of integer-activation matmuls are stored interleaved by 16 rows
    (`InterleavedQuantParam`): RLX_QUANT_LAYOUT, or by default where `config.cpu_target` has AVX-512 VNNI (the
    interleaved kernels' vector path; elsewhere they run a portable loop)."""
    if config.cpu_quant_layout != "auto":
        return config.cpu_quant_layout == "interleaved"
    from rlx.toolchain.isa import required_features

    try:
        return {"avx512_vnni", "avx512bw", "avx512vl"} <= set(required_features(config.cpu_target))
    except ArtifactError:
        return False


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


def render_c(lir: LirModule, target: Any, manifest: dict, *, bytecode_dir: Path | None = None) -> str:
    """The C source of `lir` for `target` (a `CTarget`): decided here (idempotent on a decided LIR), then
    rendered by codegen (`rlx.codegen.cpu.emit.render_c`, which renders a decided LIR only)."""
    from rlx.codegen.cpu.emit import render_c as render

    return render(decide(lir, "cpu"), target, manifest, bytecode_dir=bytecode_dir)


def c_context(lir: LirModule, target: Any, manifest: dict) -> dict:
    """The CPU template context of `lir`, decided here first (as `render_c`)."""
    from rlx.codegen.cpu.emit import c_context as context

    return context(decide(lir, "cpu"), target, manifest)


class CpuStages:
    """The CPU's decide, render, build, load and estimate, for one configuration (and its toolchain)."""

    backend = "cpu"
    hold_norm_inputs = False
    #: memplan's option: residual adds live from the conv they read, which computes them in its store
    early_residual_adds = True

    def __init__(self, config: Config, toolchain: Toolchain | None = None, *, num_threads: int | None = None) -> None:
        self.config = config
        self._toolchain = toolchain
        self.num_threads = num_threads

    @property
    def toolchain(self) -> Toolchain:
        if self._toolchain is None:
            self._toolchain = detect_toolchain(self.config)
        return self._toolchain

    def request(self) -> dict[str, str]:
        """What the build is asked for beyond the program (the compile index's components): no codegen import."""
        return cpu_toolchain_components(self.toolchain, self.config)

    def decide(self, lir: LirModule) -> LirModule:
        return decide(lir, "cpu", conv_vector=conv_vector(self.config.cpu_target),
                      quant_interleave=quant_interleave(self.config))

    def render(self, lir: LirModule) -> Rendered:
        """The C source of a decided LIR, with its key pending, and its key components."""
        from rlx.codegen.cpu.emit import render_c

        config, toolchain = self.config, self.toolchain
        target = c_target(toolchain, config)
        bytecode = template_bytecode_dir(config)

        def with_key(key: str) -> str:
            manifest = cpu_manifest(lir, toolchain, key, config.cpu_target)
            if config.variant:
                manifest["variant"] = config.variant
            return render_c(lir, target, manifest, bytecode_dir=bytecode)

        text = with_key(KEY_PENDING)
        return Rendered("cpu", lir, text, with_key, cpu_source_components(lir.hash(), text, toolchain, config))

    def build(self, rendered: Rendered) -> Built:
        built = build_cpu(rendered.with_key, rendered.components, self.config, self.toolchain)
        return Built(built.library, built.source, built.key, built.hit, rendered.digest)

    def find(self, key: str) -> Built | None:
        """The library built before under `key` (a compile-index hit), verified as any cache hit is."""
        entry = AotCache(self.config).lookup(key)
        if entry is None:
            return None
        return Built(Path(entry.library), Path(entry.source), entry.key, True, str(entry.components.get("source")))

    def load(self, built: Built) -> CompiledGraph:
        threads = self.num_threads if self.num_threads is not None else self.config.num_threads
        return CompiledGraph(load_library(built.library), source=built.source, key=built.key, cache_hit=built.hit,
                             num_threads=threads or 0, param_store=ParamStore.for_library(built.library, self.config))

    def estimate(self, lir: LirModule, num_threads: int | None = None) -> MemoryEstimate:
        """The bytes one context allocates for a decided LIR: the code generator's memory plan."""
        from rlx.codegen.cpu.emit import memory_plan
        from rlx.runtime.memory import estimate_lir

        return estimate_lir(memory_plan(lir, profile=self.config.profile),
                            num_threads if num_threads is not None else self.config.threads,
                            profiled=self.config.profile)


def render_source(lir: LirModule, config: Config | None = None, toolchain: Toolchain | None = None, *,
                  key: str | None = None) -> str:
    """The C source the pipeline builds for `lir` (decided here if it is not yet), manifest and key included.

    `key` fills the manifest's key instead of the one the source's digest gives (`KEY_PENDING`: the
    source that digest is taken of).
    """
    stages = CpuStages(config or Config.from_env(), toolchain)
    rendered = stages.render(stages.decide(lir))
    return rendered.with_key(cache_key(rendered.components) if key is None else key)


def cpu_key_components(lir: LirModule, toolchain: Toolchain, config: Config | None = None) -> dict[str, str]:
    """Every input of the CPU build of `lir` (decided and rendered here), as strings: the key is their digest."""
    stages = CpuStages(config or Config.from_env(), toolchain)
    return stages.render(stages.decide(lir)).components


__all__ = ["CpuStages", "c_context", "c_target", "cpu_key_components", "cpu_manifest", "render_c", "render_source",
           "template_bytecode_dir"]

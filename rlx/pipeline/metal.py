"""The Metal backend's stages: decide (its one-buffer layout), render (one .metal file and its dispatch
manifest), build (`xcrun metal` into the cache root: macOS only; elsewhere the source and manifest are
written and the program is not built), load (`MetalGraph` through PyObjC), and the estimate of the layout.

`build_metal(lir, config)` and `write_metal(lir, out_dir)` run decide → render → build of one LIR (what
`rlxc compile --target metal` writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlx.config import Config
from rlx.errors import BuildError
from rlx.ir.lir import LirModule
from rlx.pipeline.decide import decide
from rlx.pipeline.values import Built, Rendered
from rlx.runtime.memory import MemoryEstimate
from rlx.toolchain.cpu import source_digest, templates_digest
from rlx.toolchain.metal import (
    MetalBuild,
    MetalToolchain,
    find_metal_build,
    find_metal_toolchain,
    metal_source_components,
)
from rlx.toolchain.metal import (
    build_metal as build_metal_source,
)
from rlx.toolchain.metal import (
    write_metal as write_metal_source,
)

#: "not probed yet" (None is a probed absence: no Metal toolchain here).
_UNPROBED: Any = object()


def render_metal(lir: LirModule, target: Any, manifest: dict) -> Any:
    """The Metal program (`MetalProgram`: source and dispatch manifest) of `lir` for `target`: decided here
    (idempotent on a decided LIR), then rendered by codegen (`rlx.codegen.metal.render_metal`)."""
    from rlx.codegen.metal import render_metal as render

    return render(decide(lir, "metal"), target, manifest)


class MetalStages:
    """The Metal backend's decide, render, build, load and estimate for one configuration."""

    backend = "metal"
    hold_norm_inputs = False

    def __init__(self, config: Config, *, toolchain: MetalToolchain | None = _UNPROBED, msl: str | None = None) -> None:
        self.config = config
        self._toolchain = toolchain
        self.msl = msl
        self._target: Any = None

    @property
    def toolchain(self) -> MetalToolchain | None:
        if self._toolchain is _UNPROBED:
            self._toolchain = find_metal_toolchain()
        return self._toolchain

    @property
    def target(self) -> Any:
        """The `MetalTarget` (imports codegen on first use)."""
        if self._target is None:
            from rlx.codegen.metal import MetalTarget

            self._target = MetalTarget() if self.msl is None else MetalTarget(msl=self.msl)
        return self._target

    def request(self) -> dict[str, str]:
        """The compile index's components beyond the program: the toolchain (none on Linux) and templates."""
        tc = self.toolchain
        return {"target": "metal", "toolchain": tc.identity() if tc is not None else "none",
                "templates": templates_digest("metal"), "msl": self.msl or "default"}

    def decide(self, lir: LirModule) -> LirModule:
        return decide(lir, "metal")

    def render(self, lir: LirModule) -> Rendered:
        """The .metal source of a decided LIR (it names no key) and its dispatch manifest (`extra`)."""
        from rlx.codegen.metal import render_metal

        target = self.target
        program = render_metal(lir, target, lir.manifest())
        components = metal_source_components(lir.hash(), program.source, target.identity(), self.toolchain,
                                             target.msl)
        return Rendered("metal", lir, program.source, lambda key: program.source, components,
                        extra=(program.manifest, target.msl))

    def build(self, rendered: Rendered) -> Built:
        manifest, msl = rendered.extra
        built = build_metal_source(rendered.text, manifest, rendered.components, msl, self.config,
                                   toolchain=self.toolchain)
        return _built(built, rendered.digest)

    def find(self, key: str) -> Built | None:
        """The program built before under `key` (a compile-index hit); its digest is read from its source."""
        built = find_metal_build(self.config, key, self.toolchain)
        if built is None or not built.source.is_file():
            return None
        return _built(built, source_digest(built.source.read_text()))

    def load(self, built: Built) -> Any:
        if self.toolchain is None or not (built.library / "model.metallib").is_file():
            raise BuildError(f"no Metal toolchain here (xcrun metal is macOS only): the Metal source is at "
                             f"{built.source}; `rlxc doctor` says what is missing")
        from rlx.runtime.metal_device import load_metal

        return load_metal(built.library)

    def estimate(self, lir: LirModule, num_threads: int | None = None) -> MemoryEstimate:
        """The one Metal buffer of a decided LIR (its `metal_layout`): params, the arena, and the rest (constants,
        inputs' and outputs' slots, the error flag) as the context; `total` is the buffer."""
        from rlx.pipeline.cuda import _estimate

        layout = next(d for d in lir.decisions if d.kind == "metal_layout")
        after_params = min([*layout.constants, *layout.inputs, *layout.outputs, layout.arena])
        params = after_params - layout.params[0] if layout.params else 0
        arena = layout.flag - layout.arena
        return _estimate(lir, arena=arena, params=params, scratch=0, context=layout.total - arena - params)


def _built(built: MetalBuild, digest: str) -> Built:
    return Built(built.dir, built.source, built.key, built.hit, digest)


def build_metal(lir: LirModule, config: Config | None = None, *, toolchain: MetalToolchain | None = _UNPROBED
                ) -> MetalBuild:
    """Decide, render and write `lir`'s Metal program into the cache root (a hit when built before)."""
    stages = MetalStages(config or Config.from_env(), toolchain=toolchain)
    rendered = stages.render(stages.decide(lir))
    manifest, msl = rendered.extra
    return build_metal_source(rendered.text, manifest, rendered.components, msl, stages.config,
                              toolchain=stages.toolchain)


def write_metal(lir: LirModule, out_dir: str | Path, *, toolchain: MetalToolchain | None = None,
                use_toolchain: bool = True) -> MetalBuild:
    """Decide and render `lir` for Metal into `out_dir`: model.metal, manifest.json (+ model.metallib on macOS)."""
    tc = (toolchain or find_metal_toolchain()) if use_toolchain else None
    stages = MetalStages(Config.from_env(), toolchain=tc)
    rendered = stages.render(stages.decide(lir))
    manifest, msl = rendered.extra
    return write_metal_source(out_dir, rendered.text, manifest, rendered.components, msl, toolchain=tc)


__all__ = ["MetalStages", "build_metal", "render_metal", "write_metal"]

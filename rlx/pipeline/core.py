"""`Pipeline`: the stages of one compile, each a function from one value to the next.

    optimize → precision → legalize → decompose → plan → decide → render → build → load
    MIR        MIR         MIR        MIR         LIR    LIR      Rendered  Built   CompiledGraph

The first five are target-independent functions (`rlx.pipeline.front`) given the backend's name;
`decide`, `render`, `build` and `load` are the backend's (`rlx.pipeline.cpu`, `.cuda`, `.metal`:
`stages_for`). The caller (the driver, `rlxc`) holds every value: `Pipeline.decided` is the LIR with
every decision that `render` renders, `Rendered.digest` the sha256 of the rendered source.

>>> from rlx.config import Config
>>> from rlx.ir.graph import Graph
>>> g = Graph("mlp")
>>> g.set_outputs([g.activation("gelu", g.matmul(g.input("x", [2, 4]), g.param("w", [4, 3])))])
>>> pipe = Pipeline(stages_for("cpu", Config(blas="none", cache_enabled=False)), level=2)
>>> lir = pipe.decided(g)
>>> lir.backend, [d.kind for d in lir.decisions]
('cpu', ['packed_param'])
>>> rendered = pipe.render(lir)
>>> len(rendered.digest), "rlx_run" in rendered.text
(64, True)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlx.config import Config
from rlx.errors import RlxError
from rlx.pipeline import front
from rlx.pipeline.values import Built, Rendered

if TYPE_CHECKING:  # annotations only: a warm compile builds no graph
    from rlx.ir.graph import Graph
    from rlx.ir.lir import LirModule

#: The backends and the module and class of their stages (imported when first asked for: a CPU compile
#: never loads the CUDA runtime or toolchain).
BACKENDS: dict[str, tuple[str, str]] = {"cpu": ("rlx.pipeline.cpu", "CpuStages"),
                                        "cuda": ("rlx.pipeline.cuda", "CudaStages"),
                                        "metal": ("rlx.pipeline.metal", "MetalStages")}


def stages_for(backend: str, config: Config, **options: Any) -> Any:
    """The backend-specific stages of `backend` for `config` (`options`: that backend's, e.g. CUDA's
    `precision`, `arch`, CudaTarget fields; the CPU's `num_threads`)."""
    try:
        module, name = BACKENDS[backend]
    except KeyError:
        raise RlxError(f"no backend {backend!r}; expected one of {sorted(BACKENDS)}") from None
    return getattr(importlib.import_module(module), name)(config, **options)


@dataclass(frozen=True)
class Pipeline:
    """The stages of one compile for one backend (`stages`), opt level and params precision."""

    stages: Any
    level: int | None = None
    debug: bool | None = None
    #: the precision f32 params are stored in ("f32": as is; the CPU's reading of Session's `precision`)
    params_in: str = "f32"
    #: `rlx.opt.memplan.plan`'s option (None: the backend's default, on for CUDA)
    hold_norm_inputs: bool | None = None

    @property
    def backend(self) -> str:
        return self.stages.backend

    # ── the stages, one value to the next ─────────────────────────────────────
    def optimize(self, mir: Graph) -> Graph:
        return front.optimize(mir, self.level, debug=self.debug)

    def precision(self, mir: Graph) -> Graph:
        return front.precision(mir, self.params_in)

    def legalize(self, mir: Graph) -> Graph:
        return front.legalize(mir, self.backend)

    def decompose(self, mir: Graph) -> Graph:
        return front.decompose(mir, self.backend)

    def plan(self, mir: Graph) -> LirModule:
        hold = self.stages.hold_norm_inputs if self.hold_norm_inputs is None else self.hold_norm_inputs
        return front.plan(mir, hold_norm_inputs=hold,
                          early_residual_adds=getattr(self.stages, "early_residual_adds", False))

    def decide(self, lir: LirModule) -> LirModule:
        return self.stages.decide(lir)

    def render(self, lir: LirModule) -> Rendered:
        return self.stages.render(lir)

    def build(self, rendered: Rendered) -> Built:
        return self.stages.build(rendered)

    def load(self, built: Built) -> Any:
        return self.stages.load(built)

    # ── runs of several stages ────────────────────────────────────────────────
    def lower(self, mir: Graph) -> LirModule:
        """optimize → precision → legalize → decompose → plan: the LIR before the backend's decisions."""
        return self.plan(self.decompose(self.legalize(self.precision(self.optimize(mir)))))

    def decided(self, graph: Graph | LirModule) -> LirModule:
        """The LIR `render` renders: `lower` (a MIR graph) then `decide`."""
        from rlx.ir.lir import LirModule

        return self.decide(graph if isinstance(graph, LirModule) else self.lower(graph))

    def rendered(self, graph: Graph | LirModule) -> Rendered:
        """Every stage up to `render` (a LIR is decided and rendered as is)."""
        return self.render(self.decided(graph))

    def request(self) -> dict[str, str]:
        """What the build is asked for beyond the program (the compile index's components): no codegen import."""
        extra = {"params_in": self.params_in} if self.params_in != "f32" else {}
        return {**self.stages.request(), **extra}

    def find(self, key: str) -> Built | None:
        """A program built before under `key` (the compile index's hit), or None."""
        return self.stages.find(key)

    def estimate(self, graph: Graph | LirModule, num_threads: int | None = None) -> Any:
        """The memory one execution context allocates, from the decided plan (nothing rendered or built)."""
        return self.stages.estimate(self.decided(graph), num_threads)


__all__ = ["BACKENDS", "Pipeline", "stages_for"]

"""`Session`: the entry point that compiles graphs for a device.

The CPU pipeline: lower to MIR (for HIR / GraphModule inputs), optimize
(`rlx.opt.pipeline.optimize` when available), plan memory (LIR), render one C
file, build it through the AOT cache, dlopen it, wrap it in a `CompiledGraph`.

>>> import numpy as np, rlx
>>> g = rlx.Graph("mlp")
>>> x = g.input("x", [2, 4])
>>> w = g.param("w", [4, 3])
>>> g.set_outputs([g.activation("relu", g.matmul(x, w))])
>>> cg = Session(Device.CPU).compile(g)
>>> cg.set_param("w", np.eye(4, 3, dtype=np.float32))
>>> cg.run(x=np.array([[1, -2, 3, 4], [0, 1, 0, 0]], np.float32))[0].tolist()
[[1.0, 0.0, 3.0], [0.0, 1.0, 0.0]]
"""

from __future__ import annotations

import enum
import inspect
from typing import Any

from rlx.config import Config
from rlx.errors import IRError, RlxError
from rlx.ir.graph import Graph
from rlx.ir.lir import LirModule
from rlx.opt.memplan import plan
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.loader import load_library


class Device(enum.Enum):
    """Where a compiled graph runs."""

    CPU = "cpu"
    CUDA = "cuda"

    @staticmethod
    def parse(value: Device | str) -> Device:
        if isinstance(value, Device):
            return value
        try:
            return Device(str(value).strip().lower())
        except ValueError:
            raise RlxError(f"unknown device {value!r}; expected one of {[d.value for d in Device]}") from None


class Session:
    """Compiles graphs for one device with one configuration."""

    def __init__(self, device: Device | str = Device.CPU, config: Config | None = None, *,
                 precision: str = "f32", target: str | None = None) -> None:
        self.device = Device.parse(device)
        self.config = config if config is not None else Config.from_env()
        # CUDA only: f32 tensors are stored and computed in `precision` on the GPU (f32 accumulation);
        # `target` ("cuda:sm_90") picks the arch instead of the visible GPU's.
        if precision not in ("f32", "f16", "bf16"):
            raise RlxError(f"precision must be 'f32', 'f16' or 'bf16', got {precision!r}")
        if self.device is not Device.CUDA and (precision != "f32" or target is not None):
            raise RlxError("precision and target apply to Device.CUDA only")
        self.precision = precision
        self.target = target

    def __repr__(self) -> str:
        return f"Session({self.device.name})"

    def lower(self, graph: Any, *, opt_level: int | None = None) -> LirModule:
        """The LIR that `compile` would build: MIR, optimized, memory-planned."""
        if isinstance(graph, LirModule):
            return graph
        if getattr(graph, "stage", None) == "lir" and isinstance(getattr(graph, "lir", None), LirModule):
            return graph.lir
        mir = to_mir(graph)
        level = self.config.opt_level if opt_level is None else opt_level
        return plan(optimize(mir, level, self.device.value, self.config.debug))

    def compile(self, graph: Any, *, num_threads: int | None = None, opt_level: int | None = None) -> CompiledGraph:
        """Compile a Graph (MIR), HirModule, GraphModule or LirModule into a ready-to-run `CompiledGraph`.

        An LirModule (or a GraphModule at the LIR stage) is built as is, without optimizing again.
        """
        if opt_level is not None and not (isinstance(opt_level, int) and 0 <= opt_level <= 3):
            raise RlxError(f"opt_level must be 0..3, got {opt_level!r}")
        lir = self.lower(graph, opt_level=opt_level)
        if self.device is Device.CUDA:
            from rlx.runtime.cuda_device import compile_cuda

            return compile_cuda(lir, self.config, precision=self.precision, arch=self.target)
        from rlx.build.cpu import build_cpu

        threads = num_threads if num_threads is not None else self.config.num_threads
        built = build_cpu(lir, self.config)
        library = load_library(built.library)
        return CompiledGraph(library, source=built.source, key=built.key, cache_hit=built.hit,
                             num_threads=threads or 0)


def to_mir(graph: Any) -> Graph:
    """Accept a MIR Graph, an HIR module (lowered here) or a GraphModule at the HIR/MIR stage."""
    stage = getattr(graph, "stage", None)
    if isinstance(graph, Graph):
        if stage in (None, "mir"):
            return graph
        if callable(getattr(graph, "lower_to_mir", None)):
            return graph.lower_to_mir()
    elif stage in ("hir", "mir") and callable(getattr(graph, "lower", None)):
        module = graph.lower("mir") if stage == "hir" else graph
        out = module.graph
        if isinstance(out, Graph):
            return out
    raise IRError(f"cannot compile a {type(graph).__name__}: expected a MIR Graph, an HirModule or a GraphModule")


def optimize(graph: Graph, level: int, target: str, debug: bool = False) -> Graph:
    """Run the optimizer pipeline when it is installed; otherwise verify the graph as is."""
    try:
        from rlx.opt.pipeline import optimize as run_pipeline
    except ImportError:
        graph.verify()
        return graph
    params = inspect.signature(run_pipeline).parameters
    kwargs: dict[str, Any] = {}
    for name in ("opt_level", "level"):
        if name in params:
            kwargs[name] = level
            break
    if "target" in params:
        kwargs["target"] = target
    if "debug" in params:
        kwargs["debug"] = debug
    out = run_pipeline(graph, **kwargs)
    return out if isinstance(out, Graph) else getattr(out, "graph", out)


__all__ = ["Device", "Session", "optimize", "to_mir"]

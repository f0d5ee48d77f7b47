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
import functools
import hashlib
from pathlib import Path
from typing import Any

from rlx.config import Config
from rlx.errors import IRError, RlxError
from rlx.ir.graph import Graph
from rlx.ir.lir import LirModule
from rlx.opt.memplan import plan
from rlx.opt.pipeline import optimize
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
        return plan(optimize(mir, level, debug=self.config.debug))

    def compile(self, graph: Any, *, num_threads: int | None = None, opt_level: int | None = None) -> CompiledGraph:
        """Compile a Graph (MIR), HirModule, GraphModule or LirModule into a ready-to-run `CompiledGraph`.

        An LirModule (or a GraphModule at the LIR stage) is built as is, without optimizing again.
        """
        if opt_level is not None and not (isinstance(opt_level, int) and 0 <= opt_level <= 3):
            raise RlxError(f"opt_level must be 0..3, got {opt_level!r}")
        if self.device is Device.CUDA:
            from rlx.runtime.cuda_device import compile_cuda

            lir = self.lower(graph, opt_level=opt_level)
            return compile_cuda(lir, self.config, precision=self.precision, arch=self.target)
        threads = num_threads if num_threads is not None else self.config.num_threads
        library_path, source, key, hit = self._build_cpu(graph, opt_level)
        return CompiledGraph(load_library(library_path), source=source, key=key, cache_hit=hit,
                             num_threads=threads or 0)

    def _build_cpu(self, graph: Any, opt_level: int | None) -> tuple[Path, Path, str, bool]:
        """The CPU library for `graph`: (library, source, key, cache hit).

        A fresh process compiling a graph that was built before skips optimizing,
        planning and rendering: the compile index maps a fingerprint of the input
        graph, the opt level, the toolchain/templates and the compiler's own source
        to the AOT cache key, and the entry behind it is verified as on any hit.
        The optimizer is a pure function of that fingerprint, so the key it maps to
        is the key a full compile would compute.
        """
        from rlx.toolchain.cache import AotCache
        from rlx.toolchain.compiler import detect_toolchain
        from rlx.toolchain.cpu import build_cpu, cpu_toolchain_components

        config = self.config
        if isinstance(graph, LirModule) or getattr(graph, "stage", None) == "lir":
            built = build_cpu(self.lower(graph), config)
            return built.library, built.source, built.key, built.hit
        mir = to_mir(graph)
        level = config.opt_level if opt_level is None else opt_level
        cache = AotCache(config)
        toolchain = detect_toolchain(config)
        full_build = None

        def compile_fully() -> str:
            nonlocal full_build
            full_build = build_cpu(plan(optimize(mir, level, debug=config.debug)), config, toolchain)
            return full_build.key

        if not cache.enabled:
            compile_fully()
        else:
            fingerprint = {
                "graph": hashlib.sha256(mir.to_json().encode()).hexdigest(),
                "opt_level": str(level),
                "compiler_source": compiler_source_digest(),
                **cpu_toolchain_components(toolchain),
            }
            key = cache.memo("compile_index", fingerprint, compile_fully)
            if full_build is None:
                entry = cache.lookup(key)
                if entry is not None:
                    return Path(entry.library), Path(entry.source), entry.key, True
                compile_fully()  # indexed but evicted or damaged: build it again under the same key
        assert full_build is not None
        return full_build.library, full_build.source, full_build.key, full_build.hit


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


@functools.cache
def compiler_source_digest() -> str:
    """sha256 of the Python source that turns a graph into a LIR and C (IR, optimizer, codegen).

    Part of the compile-index fingerprint, so a changed optimizer never maps an old
    graph fingerprint to a library built by the old code.
    """
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for sub in ("ir", "opt", "codegen", "toolchain"):
        for path in sorted((root / sub).glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update((root / "reference.py").read_bytes())
    return h.hexdigest()


__all__ = ["Device", "Session", "compiler_source_digest", "to_mir"]

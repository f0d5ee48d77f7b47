"""The driver: `Session`, the entry point that compiles graphs for a device.

It is the one layer that sees the whole pipeline (IR → `rlx.opt` → `rlx.codegen`
→ `rlx.toolchain` → `rlx.runtime`): lower to MIR (for HIR / GraphModule inputs),
optimize, plan memory (LIR), render one C or CUDA file, build it through the
AOT cache, dlopen it, wrap it in a `CompiledGraph`. It also registers the
MIR → LIR lowering `rlx.ir.module.GraphModule.plan()` uses (the IR sits below
the optimizer and cannot import it).

>>> import numpy as np, rlx
>>> g = rlx.Graph("mlp")
>>> x = g.input("x", [2, 4])
>>> w = g.param("w", [4, 3])
>>> g.set_outputs([g.activation("relu", g.matmul(x, w))])
>>> cg = Session(Device.CPU).compile(g)
>>> cg.set_param("w", np.eye(4, 3, dtype=np.float32))
>>> cg.run(x=np.array([[1, -2, 3, 4], [0, 1, 0, 0]], np.float32))[0].tolist()
[[1.0, 0.0, 3.0], [0.0, 1.0, 0.0]]

The warm path (the compile index)
---------------------------------
A fresh process compiling a graph that was built before skips optimizing,
planning and rendering (and never imports `rlx.codegen` or jinja2): the
compile index (`AotCache.memo("compile_index", ...)`) maps a fingerprint of
the input MIR, the opt level, the toolchain and `compiler_source_digest()`
(every file of rlx.ir, rlx.opt, rlx.codegen, rlx.toolchain, rlx/reference.py
and every template) to the object key, whose entry is then verified as on any
hit. The objects' keys themselves come from the rendered source
(`rlx.toolchain.cpu`), so a full compile is right by construction; the index
is right as long as the code that runs is the code whose files were digested.

That is not so after a monkeypatch (`rlx.codegen.c.GRAIN = 4096` in a test or
a tuning script): no file changed. So the index is used only while the
compiler's modules are *pristine* (`rlx.pristine.compiler_is_pristine`): every
loaded module of those packages is bound as it was when it came from its file,
which an import hook records as each one loads (so the optimizer, the code
generators and the toolchain may load lazily: a warm hit loads none of
`rlx.opt` and `rlx.codegen`). A rebound name (a patched constant, function or
method) or a compiler module the hook did not see load makes the process
non-pristine: it neither reads nor writes the index, and every compile renders
and keys by the rendered source, which sees the patch. See `rlx.pristine`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlx.config import Config
from rlx.errors import BuildError, IRError, RlxError
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.lir import LirModule
from rlx.ir.module import register_lir_lowering
from rlx.pristine import (
    COMPILER_MODULES,
    COMPILER_PACKAGES,
    compiler_is_pristine,
    trusting_own_loads,
)
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.loader import load_library
from rlx.runtime.memory import MemoryEstimate, estimate_lir
from rlx.templates_path import templates_dir

#: Bumped when the compile index's fingerprint or value changes shape.
INDEX_FORMAT = 2


class Device(enum.Enum):
    """Where a compiled graph runs."""

    CPU = "cpu"
    CUDA = "cuda"
    #: Apple GPUs: the .metal source renders and is checked everywhere; it builds and runs on macOS only.
    METAL = "metal"

    @staticmethod
    def parse(value: Device | str) -> Device:
        if isinstance(value, Device):
            return value
        try:
            return Device(str(value).strip().lower())
        except ValueError:
            raise RlxError(f"unknown device {value!r}; expected one of {[d.value for d in Device]}") from None


def lower_to_lir(graph: Graph, level: int | None = None, *, debug: bool | None = None,
                 backend: str | None = None, params_in: str = "f32",
                 hold_norm_inputs: bool | None = None) -> LirModule:
    """MIR → LIR: optimize at `level` (None: RLX_OPT_LEVEL), decompose for `backend`, then plan memory.

    With `backend`, ops that backend has no rule for are decomposed into primitives it has
    (`rlx.opt.decompose`). `params_in` ("bf16", "f16"): f32 params are stored in that precision
    and widened where read, GEMM weights excepted (`rlx.opt.precision`), after optimizing, so the
    layout pass has already folded weight transposes into the params and no transpose runs per call.
    `pipeline.optimize` is looked up at call time, so a patched optimizer is the one that runs
    (and, being a rebound name, takes the compile index out of play: see the module docstring).
    `hold_norm_inputs` (None: for the CUDA backend only): `rlx.opt.memplan.plan`'s option, which lets CUDA's
    small GEMMs compute the norm before them in their prologue.
    """
    # The optimizer and the memory planner load here, on the first lowering: a warm hit never lowers.
    from rlx.opt import pipeline
    from rlx.opt.memplan import plan

    mir = pipeline.optimize(graph, level=level, debug=debug)
    if params_in != "f32":
        from rlx.opt.precision import store_params_in

        mir = store_params_in(mir, params_in)
    if backend is not None:
        mir = legalize_for(mir, backend)
    hold = backend == "cuda" if hold_norm_inputs is None else hold_norm_inputs
    return plan(mir, hold_norm_inputs=hold)


def legalize_for(mir: Graph, backend: str) -> Graph:
    """`mir` as `backend` can build it: f16/bf16 ops it lacks run in f32 between casts
    (`rlx.opt.legalize`), ops it has no rule for decompose into primitives (`rlx.opt.decompose`)."""
    from rlx.opt.decompose import decompose
    from rlx.opt.legalize import legalize

    rules = _rules(backend)
    mir = legalize(mir, rules.accepts)
    return decompose(mir, lambda g, node: rules.why_not(g, node) is None)


def _rules(backend: str) -> Any:
    """The rule table of `backend`, with its rules registered (imports that backend's codegen)."""
    from rlx.codegen import backends

    return backends.load_rules(backend)


register_lir_lowering(lower_to_lir)


class Session:
    """Compiles graphs for one device with one configuration."""

    def __init__(self, device: Device | str = Device.CPU, config: Config | None = None, *,
                 precision: str = "f32", target: str | None = None, profile: bool | None = None,
                 check_nans: bool | None = None) -> None:
        self.device = Device.parse(device)
        self.config = config if config is not None else Config.from_env()
        # Build variants (each its own cache key): None keeps the config's (RLX_PROFILE / RLX_CHECK_NANS).
        variant = {k: bool(v) for k, v in (("profile", profile), ("check_nans", check_nans)) if v is not None}
        if variant:
            self.config = dataclasses.replace(self.config, **variant)
        # CUDA: f32 tensors are stored and computed in `precision` on the GPU (f32 accumulation).
        # CPU: f32 params are stored in `precision` (half the bytes; set_param rounds once); GEMMs
        # read them as stored (rlx.codegen.c_half), other ops widen them to f32 (rlx.opt.precision).
        # `target` ("cuda:sm_90", CUDA only) picks the arch instead of the visible GPU's.
        if precision not in ("f32", "f16", "bf16"):
            raise RlxError(f"precision must be 'f32', 'f16' or 'bf16', got {precision!r}")
        if self.device not in (Device.CPU, Device.CUDA) and precision != "f32":
            raise RlxError("precision applies to Device.CPU and Device.CUDA only")
        if self.device is not Device.CUDA and target is not None:
            raise RlxError("target applies to Device.CUDA only")
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
        level = self.config.opt_level if opt_level is None else opt_level
        return lower_to_lir(to_mir(graph), level, debug=self.config.debug, backend=self.device.value,
                            params_in=self._params_in)

    @property
    def _params_in(self) -> str:
        """The precision f32 params are stored in on this device (the CPU's reading of `precision`)."""
        return self.precision if self.device is Device.CPU else "f32"

    def first_unsupported_op(self, graph: Any, *, opt_level: int | None = None) -> tuple[Any, str] | None:
        """The first node this session's backend cannot run (after optimizing and decomposing), with why.

        >>> import rlx
        >>> g = rlx.Graph("s")
        >>> g.set_outputs([g.activation("softplus", g.input("x", [4]))])
        >>> rlx.Session().first_unsupported_op(g) is None
        True
        """
        from rlx.codegen.backends import first_unsupported_op

        backend = self.device.value
        if _is_lir(graph):
            return first_unsupported_op(self.lower(graph).graph, backend)
        level = self.config.opt_level if opt_level is None else opt_level
        lir = lower_to_lir(to_mir(graph), level, debug=self.config.debug, backend=backend, params_in=self._params_in)
        return first_unsupported_op(lir.graph, backend)

    def supports(self, graph: Any, *, opt_level: int | None = None) -> bool:
        """True when every op of `graph` runs on this session's device (checked before any build)."""
        return self.first_unsupported_op(graph, opt_level=opt_level) is None

    def estimate(self, graph: Any, *, num_threads: int | None = None, opt_level: int | None = None) -> MemoryEstimate:
        """The bytes one execution context of `graph` will allocate, without building it.

        Optimizes, decomposes and plans exactly as `compile` does and sizes params and scratch the
        way the CPU code generator will (no C is rendered or compiled); `num_threads` (default: the
        config's) sizes the per-thread scratch. State (KV cache) and IO bytes are reported apart.

        >>> import rlx
        >>> g = rlx.Graph("m")
        >>> x = g.input("x", [rlx.Dim.dynamic("n", max=16), 64])
        >>> g.set_outputs([g.activation("relu", g.matmul(x, g.param("w", [64, 64])))])
        >>> est = rlx.Session().estimate(g)
        >>> est.params, est.inputs
        (16384, 4096)
        """
        if self.device is not Device.CPU:
            raise RlxError("Session.estimate covers the CPU backend (the CUDA backend plans device memory itself)")
        from rlx.codegen.c import memory_plan

        if _is_lir(graph):
            lir = self.lower(graph)
        else:
            level = self.config.opt_level if opt_level is None else opt_level
            lir = lower_to_lir(to_mir(graph), level, debug=self.config.debug, backend="cpu",
                               params_in=self._params_in)
        return estimate_lir(memory_plan(lir, profile=self.config.profile),
                            num_threads if num_threads is not None else self.config.threads,
                            profiled=self.config.profile)

    def compile(self, graph: Any, *, num_threads: int | None = None, opt_level: int | None = None) -> CompiledGraph:
        """Compile a Graph (MIR), HirModule, GraphModule or LirModule into a ready-to-run `CompiledGraph`.

        An LirModule (or a GraphModule at the LIR stage) is built as is, without optimizing again.
        """
        if opt_level is not None and not (isinstance(opt_level, int) and 0 <= opt_level <= 3):
            raise RlxError(f"opt_level must be 0..3, got {opt_level!r}")
        with trusting_own_loads() as pristine:
            if self.device is Device.CUDA:
                return self._compile_cuda(graph, opt_level, pristine)
            if self.device is Device.METAL:
                return self._compile_metal(graph, opt_level)
            library_path, source, key, hit = self._build_cpu(graph, opt_level, pristine)
        threads = num_threads if num_threads is not None else self.config.num_threads
        return CompiledGraph(load_library(library_path), source=source, key=key, cache_hit=hit,
                             num_threads=threads or 0)

    def _build_cpu(self, graph: Any, opt_level: int | None, pristine: bool) -> tuple[Path, Path, str, bool]:
        """The CPU library for `graph`: (library, source, key, cache hit), through the compile index."""
        # Imported here: loading a program never needs the toolchain (tests/toolchain/test_artifact.py).
        from rlx.toolchain.compiler import detect_toolchain
        from rlx.toolchain.cpu import build_cpu, cpu_toolchain_components

        config = self.config
        if _is_lir(graph):
            built = build_cpu(self.lower(graph), config)
            return built.library, built.source, built.key, built.hit
        mir = to_mir(graph)
        level = config.opt_level if opt_level is None else opt_level
        toolchain = detect_toolchain(config)
        params_in = self._params_in

        def compile_fully() -> tuple[Path, Path, str, bool, str]:
            lir = lower_to_lir(mir, level, debug=config.debug, backend="cpu", params_in=params_in)
            built = build_cpu(lir, config, toolchain)
            return built.library, built.source, built.key, built.hit, built.components["source"]

        # the params' precision is part of what is asked for (f32 keys stay as they were)
        request = {**cpu_toolchain_components(toolchain, config),
                   **({"params_in": params_in} if params_in != "f32" else {})}
        return _through_index(config, mir, level, request, compile_fully, pristine)[:4]

    def _compile_cuda(self, graph: Any, opt_level: int | None, pristine: bool) -> CompiledGraph:
        """The CUDA library for `graph`, through the compile index, loaded as a `CudaGraph`."""
        from rlx.runtime.cuda_device import CudaGraph, compile_cuda
        from rlx.toolchain.cuda import build_cuda, cuda_toolchain_components, detect_nvcc_toolchain

        config = self.config
        if config.check_nans:
            raise RlxError("check_nans (RLX_CHECK_NANS) covers the CPU backend; run the graph on Device.CPU "
                           "with check_nans=True to find the op that makes a NaN")
        if _is_lir(graph):
            return compile_cuda(self.lower(graph), config, precision=self.precision, arch=self.target,
                                profile=config.profile)
        mir = to_mir(graph)
        level = config.opt_level if opt_level is None else opt_level
        toolchain = detect_nvcc_toolchain(config, self.target)
        seconds = 0.0

        def compile_fully() -> tuple[Path, Path, str, bool, str]:
            nonlocal seconds
            from rlx.codegen.cuda import CudaTarget  # only when rendering: the warm path never loads codegen

            target = CudaTarget(precision=DType.parse(self.precision), profile=config.profile)
            lir = lower_to_lir(mir, level, debug=config.debug, backend="cuda")
            built = build_cuda(lir, config, target, toolchain=toolchain)
            seconds = built.seconds
            return built.library, built.source, built.key, built.hit, built.components["source"]

        # What the build is asked for beyond the toolchain: the precision and CudaTarget's defaults
        # (cuBLASLt GEMM, resolved against the toolchain in the components).
        request = {**cuda_toolchain_components(toolchain, "cublaslt"),
                   "request": f"precision={self.precision} arch={toolchain.arch} cuda={toolchain.cuda_version}"
                              + (" profile=1" if config.profile else "")}
        library, source, key, hit, _ = _through_index(config, mir, level, request, compile_fully, pristine)
        return CudaGraph(load_library(library), source=source, key=key, cache_hit=hit, build_seconds=seconds)


    def _compile_metal(self, graph: Any, opt_level: int | None) -> Any:
        """The Metal program for `graph` (macOS: `xcrun metal` into the cache, run through PyObjC)."""
        if self.config.variant:
            raise RlxError(f"{self.config.variant} builds cover the CPU (and, for profile, CUDA) backends, "
                           "not Metal")
        from rlx.toolchain.metal import build_metal

        config = self.config
        level = config.opt_level if opt_level is None else opt_level
        lir = self.lower(graph) if _is_lir(graph) else lower_to_lir(to_mir(graph), level, debug=config.debug,
                                                                    backend="metal")
        built = build_metal(lir, config)
        if built.metallib is None:
            raise BuildError(f"no Metal toolchain here (xcrun metal is macOS only): the Metal source is at "
                             f"{built.source}; `rlxc doctor` says what is missing")
        from rlx.runtime.metal_device import load_metal

        return load_metal(built.dir)


def _is_lir(graph: Any) -> bool:
    return isinstance(graph, LirModule) or getattr(graph, "stage", None) == "lir"


def _through_index(config: Config, mir: Graph, level: int, toolchain_components: dict[str, str],
                   compile_fully: Callable[[], tuple[Path, Path, str, bool, str]], pristine: bool
                   ) -> tuple[Path, Path, str, bool, str]:
    """(library, source, key, hit, source digest) of `mir`: from the compile index when it can be trusted.

    `compile_fully` optimizes, plans, renders and builds (keyed by the rendered source). `pristine`:
    the compiler modules were pristine when this compile began (see the module docstring); modules
    this compile has loaded since came from their files. An indexed key whose entry was evicted is
    built again.
    """
    from rlx.toolchain.cache import AotCache

    cache = AotCache(config)
    if not (cache.enabled and pristine):
        return compile_fully()
    full: list[tuple[Path, Path, str, bool, str]] = []

    def index_value() -> dict[str, str]:
        result = compile_fully()
        full.append(result)
        return {"key": result[2], "source": result[4]}

    fingerprint = {
        "index_format": str(INDEX_FORMAT),
        "graph": hashlib.sha256(mir.to_json().encode()).hexdigest(),
        "opt_level": str(level),
        "compiler_source": compiler_source_digest(),
        **toolchain_components,
    }
    value = cache.memo("compile_index", fingerprint, index_value)
    if full:
        return full[0]
    if isinstance(value, dict) and isinstance(value.get("key"), str):
        entry = cache.lookup(value["key"])
        # The entry's recorded source digest must be the one the index promised (the key covers it;
        # this guards against a hand-edited or foreign index file).
        if entry is not None and entry.components.get("source") == value.get("source"):
            return Path(entry.library), Path(entry.source), entry.key, True, str(value["source"])
    return compile_fully()  # indexed but evicted or damaged: build it again (same key: same source)


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


# ── what the compile index's fingerprint covers ─────────────────────────────────────────────────


def _compiler_files() -> Iterator[tuple[str, Path]]:
    """(label, path) of every file whose content decides what a graph compiles to."""
    root = Path(__file__).resolve().parent
    for package in COMPILER_PACKAGES:
        sub = package.removeprefix("rlx.").replace(".", "/")
        for path in sorted((root / sub).rglob("*.py")):
            yield f"py:{path.relative_to(root).as_posix()}", path
    for module in COMPILER_MODULES:
        yield f"py:{module.removeprefix('rlx.')}.py", root / f"{module.removeprefix('rlx.')}.py"
    templates = templates_dir()
    for path in sorted(p for p in templates.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        yield f"template:{path.relative_to(templates).as_posix()}", path


_digest_memo: dict[tuple, str] = {}


def compiler_source_digest() -> str:
    """sha256 of the Python source and templates that turn a graph into a built object.

    Covers rlx.ir, rlx.opt, rlx.codegen, rlx.toolchain, rlx/reference.py and every file of the
    templates directory (`RLX_TEMPLATES_DIR` honoured). Part of the compile-index fingerprint, so
    changed compiler code or templates never map an old graph fingerprint to an object built by
    the old code. Files are re-read only when a path, size or mtime changed (a few dozen stats).
    """
    files = list(_compiler_files())
    signature = tuple((label, st.st_size, st.st_mtime_ns) for label, st in ((lb, p.stat()) for lb, p in files))
    cached = _digest_memo.get(signature)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    for label, path in files:
        h.update(label.encode() + b"\0" + path.read_bytes() + b"\0")
    _digest_memo.clear()
    _digest_memo[signature] = h.hexdigest()
    return _digest_memo[signature]


__all__ = ["Device", "Session", "compiler_is_pristine", "compiler_source_digest", "lower_to_lir", "to_mir"]

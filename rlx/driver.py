"""The driver: `Session`, the entry point that compiles graphs for a device.

It holds the pipeline (`rlx.pipeline.Pipeline`: optimize → precision → legalize
→ decompose → plan → decide → render → build → load) and every value it gives:
`compiled.lir` is the decided LIR that was rendered, `compiled.source_digest`
the sha256 of the rendered source (`Session.render` stops before the build).
It lowers HIR / GraphModule inputs to MIR, keys the compile index, and
registers the MIR → LIR lowering `rlx.ir.module.GraphModule.plan()` uses (the
IR sits below the optimizer and cannot import it).

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
planning, deciding and rendering (and never imports `rlx.codegen` or jinja2): the
compile index (`AotCache.memo("compile_index", ...)`) maps a fingerprint of
the input MIR, the opt level, the toolchain and `compiler_source_digest()`
(every file of rlx.ir, rlx.opt, rlx.codegen, rlx.pipeline, rlx.toolchain,
rlx/reference.py and every template) to the object key and the source digest,
whose entry is then verified as on any hit (every backend: CPU, CUDA, Metal).
The objects' keys themselves come from the rendered source (`rlx.pipeline`),
so a full compile is right by construction; the index is right as long as the
code that runs is the code whose files were digested. On a hit,
`compiled.lir` is computed on first access (`rlx.runtime.provenance`).

That is not so after a monkeypatch (`rlx.codegen.cpu.rules.GRAIN = 4096` in a test or
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
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx.config import Config
from rlx.errors import IRError, RlxError
from rlx.ir.lir_lowering import register_lir_lowering
from rlx.pristine import COMPILER_MODULES, COMPILER_PACKAGES, compiler_is_pristine, trusting_own_loads
from rlx.templates_path import templates_dir

if TYPE_CHECKING:
    from rlx.ir.graph import Graph
    from rlx.ir.lir import LirModule
    from rlx.pipeline import Built, Pipeline, Rendered, legalize_for, lower_to_lir
    from rlx.runtime.memory import MemoryEstimate

# The IR's graphs, the pipeline and the runtime load when a compile first needs them (`import rlx` loads
# this module, and a warm start that finds its object by recipe builds no graph): imported inside the
# functions below, and `legalize_for` / `lower_to_lir` (rlx.pipeline's, re-exported) by `__getattr__`.
_REEXPORTED = ("legalize_for", "lower_to_lir")


def __getattr__(name: str) -> object:
    if name not in _REEXPORTED:
        raise AttributeError(f"module 'rlx.driver' has no attribute {name!r}")
    import rlx.pipeline

    return getattr(rlx.pipeline, name)


def _lower_to_lir(graph: Graph, level: int | None, **options: Any) -> LirModule:
    """`rlx.pipeline.lower_to_lir`, looked up at call time (the lowering GraphModule.plan() calls)."""
    from rlx.pipeline import lower_to_lir

    return lower_to_lir(graph, level, **options)

#: Bumped when the compile index's fingerprint or value changes shape.
INDEX_FORMAT = 3
#: Bumped when the recipe index's fingerprint or value changes shape (a value is written once: an entry of
#: an older shape would otherwise stay unusable).
RECIPE_INDEX_FORMAT = 2


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


register_lir_lowering(_lower_to_lir)


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
        # read them as stored (rlx.codegen.cpu.half), other ops widen them to f32 (rlx.opt.precision).
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

    def pipeline(self, opt_level: int | None = None, *, num_threads: int | None = None) -> Pipeline:
        """The pipeline this session compiles with (its backend's stages, the opt level, the params' precision)."""
        from rlx.pipeline import Pipeline, stages_for

        config = self.config
        if self.device is Device.CPU:
            stages = stages_for("cpu", config, num_threads=num_threads)
        elif self.device is Device.CUDA:
            stages = stages_for("cuda", config, precision=self.precision, arch=self.target)
        else:
            if config.variant:
                raise RlxError(f"{config.variant} builds cover the CPU (and, for profile, CUDA) backends, "
                               "not Metal")
            stages = stages_for("metal", config)
        level = config.opt_level if opt_level is None else opt_level
        return Pipeline(stages, level, config.debug, params_in=self._params_in)

    def lower(self, graph: Any, *, opt_level: int | None = None) -> LirModule:
        """The LIR that `compile` would build, before the backend's decisions: MIR, optimized, memory-planned."""
        from rlx.ir.lir import LirModule
        from rlx.pipeline import lower_to_lir

        if isinstance(graph, LirModule):
            return graph
        if getattr(graph, "stage", None) == "lir" and isinstance(getattr(graph, "lir", None), LirModule):
            return graph.lir
        return lower_to_lir(to_mir(graph), self._level(opt_level), debug=self.config.debug,
                            backend=self.device.value, params_in=self._params_in)

    def _level(self, opt_level: int | None) -> int:
        return self.config.opt_level if opt_level is None else opt_level

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
        from rlx.pipeline import first_unsupported_op

        return first_unsupported_op(self.lower(graph, opt_level=opt_level).graph, self.device.value)

    def supports(self, graph: Any, *, opt_level: int | None = None) -> bool:
        """True when every op of `graph` runs on this session's device (checked before any build)."""
        return self.first_unsupported_op(graph, opt_level=opt_level) is None

    def estimate(self, graph: Any, *, num_threads: int | None = None, opt_level: int | None = None) -> MemoryEstimate:
        """The bytes one execution context of `graph` will allocate, without building it.

        Runs the pipeline exactly as `compile` does up to `decide` and sizes what the backend allocates
        from the decided plan (no source is rendered or compiled). CPU: params, arena, scratch (for
        `num_threads`, default the config's) and the context record; CUDA and Metal: the one device
        allocation of the decided layout. State (KV cache) and IO bytes are reported apart.

        >>> import rlx
        >>> g = rlx.Graph("m")
        >>> x = g.input("x", [rlx.Dim.dynamic("n", max=16), 64])
        >>> g.set_outputs([g.activation("relu", g.matmul(x, g.param("w", [64, 64])))])
        >>> est = rlx.Session().estimate(g)
        >>> est.params, est.inputs
        (16384, 4096)
        >>> rlx.Session(rlx.Device.METAL).estimate(g).params
        16384
        """
        return self.pipeline(opt_level).estimate(self.lower(graph, opt_level=opt_level), num_threads)

    def render(self, graph: Any, *, opt_level: int | None = None) -> Rendered:
        """Every stage of `compile` up to the build: `.lir` is the decided LIR, `.text` the source, `.digest`
        its sha256 (`compiled.source_digest` of the same compile). Needs no device (CUDA: the toolchain)."""
        return self.pipeline(opt_level).rendered(self.lower(graph, opt_level=opt_level))

    def compile(self, graph: Any, *, num_threads: int | None = None, opt_level: int | None = None) -> Any:
        """Compile a Graph (MIR), HirModule, GraphModule or LirModule into a ready-to-run `CompiledGraph`.

        An LirModule (or a GraphModule at the LIR stage) is decided and built as is, without optimizing again.
        """
        if opt_level is not None and not (isinstance(opt_level, int) and 0 <= opt_level <= 3):
            raise RlxError(f"opt_level must be 0..3, got {opt_level!r}")
        with trusting_own_loads() as pristine:
            pipe = self.pipeline(opt_level, num_threads=num_threads)
            if _is_lir(graph):
                rendered = pipe.rendered(self.lower(graph))
                compiled = pipe.load(pipe.build(rendered))
                compiled.record_build(rendered.digest, rendered.lir)
                return compiled
            from rlx.ir.ops_user import check_current

            mir = to_mir(graph)
            check_current([n.op for n in mir.nodes])  # a user op's header edited since tracing: refuse
            decided: list[LirModule] = []

            def compile_fully() -> Built:
                rendered = pipe.rendered(mir)
                decided.append(rendered.lir)
                return pipe.build(rendered)

            built = _through_index(self.config, mir, self._level(opt_level), pipe, compile_fully, pristine)
            compiled = pipe.load(built)
        # on an index hit nothing was decided: the LIR is computed when first asked for
        compiled.record_build(built.digest, decided[0] if decided else (lambda: pipe.decided(mir)))
        if self.config.record_dir is not None and hasattr(compiled, "record_to"):
            self._start_recording(compiled, mir, built.digest, self._level(opt_level))
        return compiled

    def compile_recipe(self, recipe: Mapping[str, Any], build: Callable[[], Any], *, num_threads: int | None = None,
                       opt_level: int | None = None) -> Any:
        """`compile(build())`, found without calling `build` when the same recipe was compiled before.

        `recipe` says how `build` makes its graph: a JSON-able mapping naming the builder and every
        argument it depends on (a model's config, its bounds, its options; not the weights, which are
        params). The recipe index (`AotCache.memo("recipe_index", ...)`) maps it, with the opt level,
        the build request and `compiler_source_digest` (whose files include the builders, e.g.
        `rlx.models.bert`), to the object key and source digest a full compile gave; a hit loads that
        object, verified like a compile-index hit, and builds the graph only when its LIR is asked for.
        Used, like the compile index, only while the compiler's modules are pristine (and not while
        runs are recorded, which need the graph), and never for a graph with custom ops (their headers are
        read by a build only); otherwise, and on a miss, it is `compile(build())`.

        >>> import rlx
        >>> def double() -> rlx.Graph:
        ...     g = rlx.Graph("double_recipe")
        ...     x = g.input("x", [2])
        ...     g.set_outputs([g.add_(x, x)])
        ...     return g
        >>> cg = Session().compile_recipe({"builder": "doctest.double"}, double)
        >>> cg.run(x=rlx.np.ones(2, rlx.np.float32))[0].tolist()
        [2.0, 2.0]
        """
        if opt_level is not None and not (isinstance(opt_level, int) and 0 <= opt_level <= 3):
            raise RlxError(f"opt_level must be 0..3, got {opt_level!r}")
        from rlx.toolchain.cache import AotCache

        with trusting_own_loads() as pristine:
            cache = AotCache(self.config)
            fingerprint: dict[str, str] | None = None
            if cache.enabled and pristine and self.config.record_dir is None:
                pipe = self.pipeline(opt_level, num_threads=num_threads)
                fingerprint = {
                    "index_format": f"{INDEX_FORMAT}.{RECIPE_INDEX_FORMAT}",
                    "recipe": json.dumps(recipe, sort_keys=True),
                    "opt_level": str(self._level(opt_level)),
                    "compiler_source": compiler_source_digest(cache),
                    **pipe.request(),
                }
                value = _peek(cache, "recipe_index", fingerprint)
                if isinstance(value, dict) and isinstance(value.get("key"), str) and value.get("user_ops") is False:
                    found = pipe.find(value["key"])
                    if found is not None and found.digest == value.get("source"):
                        compiled = pipe.load(found)
                        compiled.record_build(found.digest, lambda: pipe.decided(to_mir(build())))
                        return compiled
        mir = to_mir(build())
        compiled = self.compile(mir, num_threads=num_threads, opt_level=opt_level)
        if fingerprint is not None and compiled.key and compiled.source_digest:
            # A graph with custom ops also depends on their headers, which only a build reads (and checks):
            # its recipe is recorded as such and never trusted.
            from rlx.ir.ops_user import user_ops_of

            user_ops = bool(user_ops_of([n.op for n in mir.nodes]))
            cache.memo("recipe_index", fingerprint,
                       lambda: {"key": compiled.key, "source": compiled.source_digest, "user_ops": user_ops})
        return compiled

    def _start_recording(self, compiled: Any, mir: Graph, digest: str, level: int) -> None:
        """RLX_RECORD: `compiled` records its runs for `rlxc replay` (`rlx.runtime.record`)."""
        from rlx.runtime.record import Recorder

        meta = {"device": self.device.value, "target": self.target or "", "precision": self.precision,
                "opt_level": level, "source_digest": digest}
        compiled.record_to(Recorder.start(self.config.record_dir, mir.to_json(), meta,
                                          max_calls=self.config.record_max_calls,
                                          max_bytes=self.config.record_max_bytes))


class _NotIndexed(Exception):
    pass


def _peek(cache: Any, namespace: str, fingerprint: Mapping[str, str]) -> Any:
    """The memo's value for `fingerprint`, or None (nothing is computed nor written)."""

    def missing() -> Any:
        raise _NotIndexed

    try:
        return cache.memo(namespace, fingerprint, missing)
    except _NotIndexed:
        return None


def _is_lir(graph: Any) -> bool:
    from rlx.ir.lir import LirModule

    return isinstance(graph, LirModule) or getattr(graph, "stage", None) == "lir"


def _through_index(config: Config, mir: Graph, level: int, pipe: Pipeline, compile_fully: Callable[[], Built],
                   pristine: bool) -> Built:
    """The built program of `mir`: from the compile index when it can be trusted.

    `compile_fully` runs every stage up to the build (keyed by the rendered source). `pristine`:
    the compiler modules were pristine when this compile began (see the module docstring); modules
    this compile has loaded since came from their files. An indexed key whose program was evicted is
    built again.
    """
    from rlx.toolchain.cache import AotCache

    cache = AotCache(config)
    if not (cache.enabled and pristine):
        return compile_fully()
    full: list[Built] = []

    def index_value() -> dict[str, str]:
        result = compile_fully()
        full.append(result)
        return {"key": result.key, "source": result.digest}

    fingerprint = {
        "index_format": str(INDEX_FORMAT),
        "graph": hashlib.sha256(mir.to_json().encode()).hexdigest(),
        "opt_level": str(level),
        "compiler_source": compiler_source_digest(cache),
        **pipe.request(),
    }
    value = cache.memo("compile_index", fingerprint, index_value)
    if full:
        return full[0]
    if isinstance(value, dict) and isinstance(value.get("key"), str):
        found = pipe.find(value["key"])
        # The program's recorded source digest must be the one the index promised (the key covers it;
        # this guards against a hand-edited or foreign index file).
        if found is not None and found.digest == value.get("source"):
            return found
    return compile_fully()  # indexed but evicted or damaged: build it again (same key: same source)


def to_mir(graph: Any) -> Graph:
    """Accept a MIR Graph, an HIR module (lowered here) or a GraphModule at the HIR/MIR stage."""
    from rlx.ir.graph import Graph

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


def _compiler_file_stats() -> list[tuple[str, str, os.stat_result]]:
    """(label, path, stat) of every file whose content decides what a graph compiles to."""
    from rlx.toolchain.walk import files_with_stats

    root = os.path.dirname(os.path.abspath(__file__))
    files = []
    for package in COMPILER_PACKAGES:
        sub = package.removeprefix("rlx.").replace(".", "/")
        files += [(f"py:{sub}/{rel}", path, st) for rel, path, st in files_with_stats(os.path.join(root, sub), ".py")]
    for module in COMPILER_MODULES:
        sub = module.removeprefix("rlx.").replace(".", "/")
        path = os.path.join(root, f"{sub}.py")
        files.append((f"py:{sub}.py", path, os.stat(path)))
    files += [(f"template:{rel}", path, st) for rel, path, st in files_with_stats(str(templates_dir()))]
    return files


def _compiler_files() -> Iterator[tuple[str, Path]]:
    """(label, path) of every file whose content decides what a graph compiles to."""
    for label, path, _ in _compiler_file_stats():
        yield label, Path(path)


def compiler_source_digest(cache: Any = None) -> str:
    """sha256 of the Python source and templates that turn a graph into a built object.

    Covers rlx.ir, rlx.opt, rlx.codegen, rlx.toolchain, rlx/reference.py and every file of the
    templates directory (`RLX_TEMPLATES_DIR` honoured). Part of the compile-index fingerprint, so
    changed compiler code or templates never map an old graph fingerprint to an object built by
    the old code. Files are re-read only when the files' signature changed: each one's path, size,
    mtime, ctime and inode (a few hundred stats). An edit changes the mtime and the ctime (which no
    tool sets back), a replaced file (a checkout, a reinstall) its inode or ctime. The digest of a
    signature is kept in this process and, given an enabled `AotCache`, in its memo
    (`compiler_digest`), so a fresh process reads no file when nothing changed.
    """
    from rlx.toolchain.walk import stat_digest

    return stat_digest("compiler_digest", _compiler_file_stats(), cache)


__all__ = ["Device", "Session", "compiler_is_pristine", "compiler_source_digest", "legalize_for", "lower_to_lir",
           "to_mir"]

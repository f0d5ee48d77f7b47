"""`rlxc`: the RLX command-line compiler.

    rlxc compile GRAPH.json|MODEL.onnx -o DIR   build a graph into a relocatable artifact
    rlxc inspect GRAPH.json|DIR --stage lir     show a stage of the pipeline
    rlxc run DIR --input x=x.npy                run an artifact or graph on .npy inputs
    rlxc bench DIR --reps 50                    time calls (median, min, max)
    rlxc cache ls|stat|verify|gc|clear|explain
    rlxc doctor                                 what this machine has: compiler, OpenMP, BLAS, sgemm peak, GPUs, cache
    rlxc devices                                what this machine can run on: CPU ISA, GPUs, Metal
    rlxc replay DIR --target cuda               rerun the calls RLX_RECORD=DIR recorded; the first mismatch
    rlxc embed "a sentence" "another"           the sentence-embedding example
    rlxc train --model mlp --steps 300          train a small model (loss, grads, Adam in one graph)
    rlxc --version                              rlx, python and compiler versions

Commands that compile take `-O0`..`-O3`, `--target cpu|cpu:avx2|cpu:avx512|cuda|cuda:sm_90`,
`-v` (the cc/nvcc command lines and per-stage timings on stderr) and `-q` (no progress on stderr).
Every option either takes effect or is refused with exit status 2: none is silently ignored.

Exit status: 0 success, 1 a build or runtime failure, 2 a usage error.
Errors are one line on stderr; `--debug` shows the traceback. A closed output
pipe (`rlxc cache ls | head -1`) ends rlxc quietly with status 0.

>>> import contextlib, io
>>> with contextlib.redirect_stderr(io.StringIO()):
...     main(["run", "no-such-artifact", "--input", "x"])
2
>>> parse_target("cpu:avx2").cpu_target, parse_target("cuda:sm_90").arch
('x86-64-v3', 'sm_90')
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rlx.errors import ExecutionError, RlxError, UnboundedDimsError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A command line that names nothing valid, or options that do not go together: exit status 2."""


# ── targets ───────────────────────────────────────────────────────────────

#: `cpu:NAME` shorthands for the x86-64 psABI levels the packed GEMM kernels are written for.
CPU_LEVELS = {"avx2": "x86-64-v3", "avx512": "x86-64-v4", "native": "native"}
_MARCH_RE = re.compile(r"^[a-z0-9_.+-]{1,64}$")
_SM_RE = re.compile(r"^(?:sm_)?(\d{2,3})(a?)$")
TARGET_HELP = "cpu (default), cpu:avx2, cpu:avx512, cpu:MARCH, cuda, cuda:sm_XY (e.g. cuda:sm_90), metal"


@dataclasses.dataclass(frozen=True)
class Target:
    """A parsed `--target`: the device and, optionally, the instruction set or GPU arch to build for."""

    device: str = "cpu"  # "cpu" | "cuda" | "metal"
    cpu_target: str | None = None  # a -march value ("x86-64-v3"); None: RLX_CPU_TARGET (default native)
    arch: str | None = None  # "sm_90"; None: the visible GPU's arch
    text: str = "cpu"

    def __str__(self) -> str:
        return self.text


def parse_target(text: str) -> Target:
    """`--target` text to a Target; `argparse.ArgumentTypeError` (exit 2) for anything this build cannot do."""
    spec = text.strip().lower()
    device, sep, variant = spec.partition(":")
    if device == "metal":
        if sep:
            raise argparse.ArgumentTypeError(f"{text!r}: the metal target has no variants; expected 'metal'")
        return Target("metal", None, None, "metal")
    if sep and not variant:
        raise argparse.ArgumentTypeError(f"{text!r} names no variant after ':'; expected {TARGET_HELP}")
    if device == "cpu":
        if not variant:
            return Target("cpu", None, None, "cpu")
        level = CPU_LEVELS.get(variant, variant)
        if not _MARCH_RE.match(level):
            raise argparse.ArgumentTypeError(f"{text!r}: {variant!r} is not an instruction-set name; "
                                             f"expected {TARGET_HELP}")
        return Target("cpu", level, None, spec)
    if device == "cuda":
        if not variant:
            return Target("cuda", None, None, "cuda")
        m = _SM_RE.match(variant)
        if not m:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a GPU arch like cuda:sm_90")
        arch = f"sm_{m.group(1)}{m.group(2)}"
        return Target("cuda", None, arch, f"cuda:{arch}")
    raise argparse.ArgumentTypeError(f"unknown target {text!r}; expected {TARGET_HELP}")


# ── output on stderr: progress and -v ─────────────────────────────────────

#: Seconds a compile runs before progress shows: cache hits finish sooner and print nothing.
PROGRESS_DELAY = 0.5


def _err(text: str, stream: Any = None) -> None:
    """One line on stderr; a closed stderr is not worth failing a compile for."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr if stream is None else stream, flush=True)


@contextlib.contextmanager
def progress(label: str, stream: Any = None, *, delay: float | None = None, enabled: bool = True) -> Iterator[None]:
    """Progress for the body on stderr once it has run `delay` seconds.

    On a terminal: a spinner with the elapsed time, erased at the end. Elsewhere (a log, a pipe):
    "LABEL... " and, when the body ends, "done in 1.2 s" (or "failed after 1.2 s") on the same line.
    """
    stream = sys.stderr if stream is None else stream
    delay = PROGRESS_DELAY if delay is None else delay
    if not enabled:
        yield
        return
    tty = bool(getattr(stream, "isatty", None) and stream.isatty())
    done = threading.Event()
    lock = threading.Lock()
    shown = False
    start = time.monotonic()

    def write(text: str) -> None:
        nonlocal shown
        with contextlib.suppress(OSError, ValueError):
            stream.write(text)
            stream.flush()
            shown = True

    def show() -> None:
        if done.wait(delay):
            return
        if not tty:
            with lock:
                if not done.is_set():
                    write(f"{label}... ")
            return
        frames = "|/-\\"
        i = 0
        while not done.is_set():
            with lock:
                if done.is_set():
                    break
                write(f"\r{label} {frames[i % 4]} {time.monotonic() - start:5.1f}s")
            i += 1
            done.wait(0.1)

    thread = threading.Thread(target=show, daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        with lock:
            done.set()
        thread.join()
        if shown:
            elapsed = time.monotonic() - start
            with contextlib.suppress(OSError, ValueError):
                if tty:
                    stream.write("\r\033[K")
                else:
                    stream.write(f"done in {elapsed:.1f} s\n" if ok else f"failed after {elapsed:.1f} s\n")
                stream.flush()


def _verbose(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "verbose", False))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.1f} ms"


# ── loading things named on the command line ──────────────────────────────


def _is_artifact(path: Path) -> bool:
    return path.is_dir()


@dataclasses.dataclass
class Model:
    """A graph named on the command line and the params that came with it (ONNX initializers)."""

    graph: Any
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


def load_graph(path: Path) -> Any:
    """A graph from its JSON document (MIR or HIR)."""
    from rlx.ir import serialize

    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if path.is_dir():
        raise UsageError(f"{path} is a directory; expected a graph .json or .onnx file")
    return serialize.load(path)


def load_model(args: argparse.Namespace, path: Path) -> Model:
    """The graph (and ONNX weights) of a `.json` graph document or an `.onnx` model."""
    max_dims = _parse_max_dims(getattr(args, "max_dim", None) or [])
    fixed_dims = _parse_max_dims(getattr(args, "fix_dim", None) or [], "--fix-dim")
    if path.suffix.lower() == ".onnx":
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
        return _load_onnx(path, max_dims, fixed_dims)
    if max_dims:
        raise UsageError("--max-dim applies to .onnx models; a graph .json already fixes its dims' bounds")
    if fixed_dims:
        raise UsageError("--fix-dim applies to .onnx models; a graph .json already fixes its dims")
    return Model(load_graph(path))


def _parse_max_dims(items: Sequence[str], flag: str = "--max-dim") -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            n = int(value)
        except ValueError:
            n = 0
        if not sep or not name or n < 1:
            raise UsageError(f"{flag} takes NAME=N with N a positive integer, got {item!r}")
        if name in out:
            raise UsageError(f"{flag} {name} given twice")
        out[name] = n
    return out


def _load_onnx(path: Path, max_dims: dict[str, int], fixed_dims: dict[str, int] | None = None) -> Model:
    try:
        from rlx.frontends.onnx import from_onnx  # imported here: the onnx package is optional
    except ImportError as exc:
        if exc.name in ("rlx.frontends", "rlx.frontends.onnx"):
            raise RlxError(f"{path}: this build of RLX has no ONNX frontend (rlx.frontends.onnx)") from None
        raise RlxError(f"{path}: reading ONNX needs the {exc.name or 'onnx'!r} package (pip install onnx)") from None
    try:
        fixed = {"fixed_dims": fixed_dims} if fixed_dims else {}
        imported = from_onnx(path, max_dims=max_dims or None, **fixed)
    except UnboundedDimsError as exc:  # a usage error here: the command line gives the bounds
        named = ", ".join(f"{name!r} ({', '.join(where)})" for name, where in exc.dims.items())
        raise UsageError(f"{path}: dynamic axes need an upper bound: {named}; pass "
                         + " ".join(f"--max-dim {shlex.quote(f'{name}=N')}" for name in exc.dims)
                         + " (or a size: --fix-dim NAME=N)") from None
    return Model(imported.graph, dict(imported.params or {}))


def _config(args: argparse.Namespace) -> Any:
    from rlx.config import Config

    config = Config.from_env()
    changes: dict[str, Any] = {}
    if getattr(args, "opt_level", None) is not None:
        changes["opt_level"] = args.opt_level
    if getattr(args, "num_threads", None) is not None:
        changes["num_threads"] = args.num_threads
    target = getattr(args, "target", None)
    if target is not None and target.cpu_target:
        changes["cpu_target"] = target.cpu_target
    if getattr(args, "profile", False):
        changes["profile"] = True
    return dataclasses.replace(config, **changes) if changes else config


def _target(args: argparse.Namespace) -> Target:
    return getattr(args, "target", None) or Target()


def _session(args: argparse.Namespace) -> Any:
    import rlx

    target = _target(args)
    precision = getattr(args, "precision", None) or "f32"
    if target.device == "cuda":
        return rlx.Session(rlx.Device.CUDA, config=_config(args), target=target.arch, precision=precision)
    if target.device == "metal":
        if precision != "f32":
            raise UsageError("--precision applies to the cpu and cuda targets (Metal programs compute in f32)")
        return rlx.Session(rlx.Device.METAL, config=_config(args))
    return rlx.Session(rlx.Device.CPU, config=_config(args), precision=precision)


def compile_graph(args: argparse.Namespace, graph: Any) -> Any:
    session = _session(args)
    if _verbose(args):
        return _compile_verbose(args, session, graph)
    with progress(f"compiling {getattr(graph, 'name', 'graph')}", enabled=not getattr(args, "quiet", False)):
        return session.compile(graph)


def _compile_verbose(args: argparse.Namespace, session: Any, graph: Any) -> Any:
    """Compile stage by stage, printing each stage's time and the exact compiler command lines.

    The stages run one by one here (a plain compile may skip them through the compile index), with the
    session's own pipeline; the decided LIR is then built as is, so the library is the one a plain
    compile loads.
    """
    from rlx.toolchain.compiler import observe_commands

    config = session.config
    cache = "cache disabled" if not config.cache_enabled else f"cache {config.cache_root}"
    _err(f"rlxc: compiling {graph.name} for {_target(args)} at -O{config.opt_level} ({cache})")
    t0 = time.perf_counter()
    lir = _run_stages(session, graph, verbose=True)["lir"]
    commands: list[tuple[float, float]] = []

    def observe(cmd: list[str], started: float, seconds: float | None) -> None:
        if seconds is None:
            _err(f"rlxc: $ {shlex.join(cmd)}")
        else:
            commands.append((started, seconds))

    if session.device.value == "cpu":
        # Probed once per process (and memoized in the cache): time it apart from rendering.
        from rlx.toolchain.compiler import detect_toolchain

        t1 = time.perf_counter()
        detect_toolchain(config)
        _err(f"rlxc:   toolchain{_ms(time.perf_counter() - t1)}")
    start = time.perf_counter()
    with observe_commands(observe):
        compiled = session.compile(lir)
    end = time.perf_counter()
    if commands:
        first = min(s for s, _ in commands)
        last = max(s + d for s, d in commands)
        tool = "nvcc" if session.device.value == "cuda" else "cc"
        _err(f"rlxc:   render   {_ms(first - start)}")
        _err(f"rlxc:   build    {_ms(sum(d for _, d in commands))}  ({tool})")
        _err(f"rlxc:   load     {_ms(end - last)}  (publish in the cache, dlopen)")
    else:
        _err(f"rlxc:   render   {'-':>9}     (cache hit: nothing to render)")
        _err(f"rlxc:   build    {'-':>9}     (cache hit {compiled.key[:16]}: nothing to build)")
        _err(f"rlxc:   load     {_ms(end - start)}  (cache lookup, checksum, dlopen)")
    _err(f"rlxc:   total    {_ms(end - t0)}")
    return compiled


def _run_stages(session: Any, graph: Any, *, verbose: bool = False, opt_level: int | None = None) -> dict[str, Any]:
    """The session's pipeline up to `decide`, stage by stage (the optimizer with its per-pass report):
    the decided LIR `Session.compile` renders, for the session's target."""
    from rlx.driver import to_mir
    from rlx.opt.pipeline import optimize_with_report

    config = session.config
    pipe = session.pipeline(opt_level)
    times: list[tuple[str, float]] = []

    def timed(stage: str, run: Any, value: Any) -> Any:
        t = time.perf_counter()
        out = run(value)
        times.append((stage, time.perf_counter() - t))
        return out

    mir = timed("lower", to_mir, graph)
    optimized, report = timed("optimize", lambda g: optimize_with_report(g, pipe.level, debug=config.debug), mir)
    # as the target's build sees it: f16/bf16 ops it lacks run in f32 between casts (named "legalize ...")
    for stage in ("precision", "legalize", "decompose"):
        optimized = timed(stage, getattr(pipe, stage), optimized)
    planned = timed("plan", pipe.plan, optimized)
    decided = timed("decide", pipe.decide, planned)
    if verbose:
        for stage, seconds in times:
            _err(f"rlxc:   {stage:<8} {_ms(seconds)}")
    return {"mir": optimized, "lir": decided, "report": report.summary(), "pipeline": pipe}


def _load_weights(path: Path) -> dict[str, Any]:
    from rlx.models.weights import load_safetensors

    if not path.is_file():
        raise UsageError(f"{path}: no such weights file")
    return load_safetensors(path)


def _set_weights(compiled: Any, weights: dict[str, Any], source: str = "the weights file") -> None:
    names = compiled.param_names
    unused = sorted(set(weights) - set(names))
    missing = [n for n in names if n not in weights]
    if unused:
        _err(f"note: {len(unused)} tensor(s) in {source} are not params of the graph (e.g. {unused[0]!r})")
    if missing:
        _err(f"note: {len(missing)} param(s) are not in {source} (e.g. {missing[0]!r})")
    for name in names:
        if name in weights:
            compiled.set_param(name, weights[name])


def _reject_for_artifact(args: argparse.Namespace, path: Path) -> None:
    """Options that only shape a compile: refused for an artifact, which is already built."""
    given = [flag for flag, value in (("-O/--opt-level", getattr(args, "opt_level", None)),
                                      ("--target", getattr(args, "target", None)),
                                      ("--max-dim", getattr(args, "max_dim", None) or None),
                                      ("--fix-dim", getattr(args, "fix_dim", None) or None))
             if value is not None]
    if given:
        raise UsageError(f"{path} is a built artifact; {', '.join(given)} only apply when compiling a graph "
                         ".json or .onnx file")


def open_target(args: argparse.Namespace, path: Path) -> Any:
    """A CompiledGraph for an artifact directory or a graph file (compiled through the cache)."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    params: dict[str, Any] = {}
    if _is_artifact(path):
        _reject_for_artifact(args, path)
        from rlx.runtime.artifact_load import load

        t0 = time.perf_counter()
        compiled = load(path, num_threads=getattr(args, "num_threads", None))
        if _verbose(args):
            _err(f"rlxc: loaded artifact {path} (key {compiled.key[:16]}) in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    else:
        model = load_model(args, path)
        compiled = compile_graph(args, model.graph)
        params = model.params
    if params:
        _set_weights(compiled, params, f"{path.name}'s initializers")
    if getattr(args, "weights", None):
        _set_weights(compiled, _load_weights(Path(args.weights)))
    return compiled


def _parse_inputs(items: Sequence[str]) -> dict[str, Any]:
    import numpy as np

    out = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise UsageError(f"--input takes NAME=FILE.npy, got {item!r}")
        if name in out:
            raise UsageError(f"--input {name} given twice")
        try:
            out[name] = np.load(file, allow_pickle=False)
        except FileNotFoundError:
            raise UsageError(f"--input {name}: {file}: no such file") from None
        except (OSError, ValueError) as exc:
            raise RlxError(f"--input {name}: cannot read {file} as .npy: {exc}") from None
    return out


def _dims(spec: dict, symbols: dict[str, int]) -> list[int]:
    from rlx.runtime.loader import parse_dim

    dims = []
    for text in spec["shape"]:
        coeff, names = parse_dim(text)
        for name in names:
            if name not in symbols:
                raise RlxError(f"cannot size dimension {text!r} of {spec['name']!r}: unknown symbol {name!r}")
            coeff *= symbols[name]
        dims.append(coeff)
    return dims


def synthetic_inputs(manifest: dict, symbols: dict[str, int] | None = None, seed: int = 0) -> dict[str, Any]:
    """Random inputs for a manifest, dynamic dims at their upper bound unless `symbols` says otherwise.

    Integer inputs are 0 or 1, valid as token ids, masks and positions for any model.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    values = {s["name"]: s["max"] for s in manifest.get("symbols", [])}
    values.update(symbols or {})
    out = {}
    for spec in manifest["inputs"]:
        shape = _dims(spec, values)
        dtype = spec["dtype"]
        if dtype in ("i8", "i32", "i64", "u8"):
            arr = rng.integers(0, 2, size=shape).astype({"i8": np.int8, "i32": np.int32, "i64": np.int64,
                                                        "u8": np.uint8}[dtype])
        elif dtype == "bool":
            arr = rng.integers(0, 2, size=shape).astype(bool)
        else:
            arr = rng.standard_normal(shape).astype(np.float32 if dtype in ("bf16",) else dtype_np(dtype))
        out[spec["name"]] = arr
    return out


def dtype_np(name: str) -> Any:
    from rlx.ir.dtype import DType

    return DType(name).np


def synthetic_params(manifest: dict, seed: int = 1) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for spec in manifest["params"]:
        shape = [int(d) for d in spec["shape"]]
        dtype = spec["dtype"]
        if dtype in ("i8", "i32", "i64", "u8", "bool"):
            out[spec["name"]] = np.zeros(shape, dtype=dtype_np(dtype))
        else:
            # Small values keep deep random models finite (no overflow through layer stacks).
            arr = 0.02 * rng.standard_normal(shape)
            out[spec["name"]] = arr.astype(np.float32 if dtype == "bf16" else dtype_np(dtype))
    return out


# ── subcommands ───────────────────────────────────────────────────────────


def cmd_compile(args: argparse.Namespace) -> int:
    path = Path(args.graph)
    if path.is_dir():
        raise UsageError(f"{path} is a directory (an artifact is already compiled); expected a graph .json or .onnx")
    if args.weights and not args.output:
        raise UsageError("--weights needs -o DIR: the weights are saved into the artifact "
                         "(to run a graph with weights: rlxc run GRAPH --weights W.safetensors)")
    model = load_model(args, path)
    if _target(args).device == "metal":
        return _compile_metal(args, model)
    t0 = time.perf_counter()
    compiled = compile_graph(args, model.graph)
    elapsed = time.perf_counter() - t0
    weights = dict(model.params)
    if model.params:
        _set_weights(compiled, model.params, f"{path.name}'s initializers")
    if args.weights:
        file_weights = _load_weights(Path(args.weights))
        _set_weights(compiled, file_weights)
        weights.update(file_weights)
    info = sys.stderr if args.emit_source and not args.output else sys.stdout
    how = "cache hit" if compiled.cache_hit else "built"
    print(f"{model.graph.name}: key {compiled.key} ({how}, {elapsed * 1000:.0f} ms)", file=info)
    print(f"source digest {compiled.source_digest}", file=info)
    if args.output:
        from rlx.runtime.artifact import save

        out = save(compiled, Path(args.output), weights=bool(weights))
        print(f"artifact written to {out}" + (f" (with {len(weights)} weight tensor(s))" if weights else ""),
              file=info)
        if args.emit_source:
            print(f"source: {out / Path(compiled.source_path).name}", file=info)
    elif args.emit_source:
        sys.stdout.write(Path(compiled.source_path).read_text())
    else:
        print(f"library: {compiled.library_path}", file=info)
    return EXIT_OK


def _compile_metal(args: argparse.Namespace, model: Any) -> int:
    """`compile --target metal`: the .metal source and its manifest (+ the .metallib where xcrun has Metal),
    through the Metal session's pipeline (what `Session(Device.METAL).compile` builds)."""
    from rlx.toolchain.metal import write_metal

    if args.weights or model.params:
        raise UsageError("--target metal writes the program only (model.metal, manifest.json); weights are set "
                         "at run time with MetalGraph.set_param")
    session = _session(args)
    pipe = session.pipeline()
    rendered = pipe.rendered(session.lower(model.graph))
    if args.output:
        manifest, msl = rendered.extra
        built = write_metal(Path(args.output), rendered.text, manifest, rendered.components, msl,
                            toolchain=pipe.stages.toolchain)
        metallib = built.metallib
    else:
        built = pipe.build(rendered)
        metallib = built.library / "model.metallib" if (built.library / "model.metallib").is_file() else None
    info = sys.stderr if args.emit_source and not args.output else sys.stdout
    print(f"{model.graph.name}: key {built.key} (metal)", file=info)
    print(f"source digest {rendered.digest}", file=info)
    if args.emit_source and not args.output:
        sys.stdout.write(rendered.text)
    else:
        out = Path(args.output) if args.output else built.library
        print(f"source: {out / 'model.metal'}\nmanifest: {out / 'manifest.json'}", file=info)
        print(f"metallib: {metallib}" if metallib is not None else
              "metallib: not built (no Metal toolchain here: xcrun metal is macOS only)", file=info)
    return EXIT_OK


ARTIFACT_STAGES = ("manifest", "source")


def _print_support(args: argparse.Namespace) -> int:
    """`inspect --support`: which backend has a rule for each op kind (and, with a graph, what blocks it)."""
    from rlx.pipeline import first_unsupported_op, support_table

    if args.path is None:
        rows = support_table()
        backends = sorted(next(iter(rows.values())))
        print(f"{'op':<28}" + "".join(f"{b:>6}" for b in backends))
        for kind, has in rows.items():
            print(f"{kind:<28}" + "".join(f"{'yes' if has[b] else '-':>6}" for b in backends))
        return EXIT_OK
    graph = load_graph(Path(args.path))
    for backend in ("cpu", "cuda", "metal"):
        found = first_unsupported_op(graph, backend)
        print(f"{backend}: " + ("every op supported" if found is None else f"{found[1]} (node {found[0].label})"))
    return EXIT_OK


def _print_memory(args: argparse.Namespace, path: Path) -> int:
    """`inspect --memory`: `Session.estimate` of a graph (nothing is compiled)."""

    if _is_artifact(path):
        raise UsageError(f"{path} is a built artifact; --memory estimates a graph .json or .onnx before the build")
    if args.stage is not None or args.passes:
        raise UsageError("--memory prints the estimate alone; drop --stage / --passes")
    graph = load_model(args, path).graph
    est = _session(args).estimate(graph, num_threads=args.num_threads)
    bounds = ", ".join(f"{n}<={m}" for n, m in to_symbols(graph)) or "none"
    print(f"{graph.name}: memory of one execution context (dynamic dims at their bounds: {bounds})")
    print(est.format())
    return EXIT_OK


def to_symbols(graph: Any) -> list[tuple[str, int]]:
    from rlx.driver import to_mir

    return list(to_mir(graph).symbols().items())


def _print_pretrained(args: argparse.Namespace) -> int:
    """`inspect --model DIR`: what `CausalLM.from_pretrained` reads from a checkpoint, checked, not compiled."""
    if args.path is not None or args.stage or args.memory or args.support or args.passes:
        raise UsageError("inspect --model DIR takes no GRAPH and no --stage/--memory/--support/--passes")
    from rlx.models.hf_checkpoint import load_checkpoint

    loaded = load_checkpoint(args.model)
    print(format_pretrained(loaded))
    return EXIT_OK


def format_pretrained(loaded: Any) -> str:
    """The `inspect --model` report of a `rlx.models.hf_load.Pretrained`."""
    c = loaded.config
    lines = [f"model_type: {c.arch}"]
    lines += [f"  {f.name}: {getattr(c, f.name)!r}" for f in dataclasses.fields(c) if f.name not in ("arch", "name")]
    by_dtype: dict[str, list[int]] = {}
    for spec, data in loaded.tensors.values():
        entry = by_dtype.setdefault(spec.ggml_type, [0, 0])
        entry[0] += 1
        entry[1] += int(data.nbytes)
    lines.append(f"tensors: {len(loaded.tensors)} ("
                 + ", ".join(f"{n} {dt}, {b / 2**20:.1f} MiB" for dt, (n, b) in sorted(by_dtype.items())) + ")")
    lines.append(f"tokenizer: {loaded.tokenizer!r}; chat template: "
                 f"{'yes' if loaded.tokenizer is not None and loaded.tokenizer.chat_template else 'no'}; "
                 f"stop ids: {sorted(loaded.stop_ids)}")
    return "\n".join(lines)


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.model is not None:
        return _print_pretrained(args)
    if args.support:
        return _print_support(args)
    if args.memory:
        if args.path is None:
            raise UsageError("inspect --memory needs a GRAPH.json or MODEL.onnx")
        return _print_memory(args, Path(args.path))
    if args.num_threads is not None:
        raise UsageError("--num-threads applies to inspect --memory only")
    if args.path is None:
        raise UsageError("inspect needs a GRAPH.json, MODEL.onnx or artifact DIR (or --support alone)")
    path = Path(args.path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if _is_artifact(path):
        _reject_for_artifact(args, path)
        if args.passes or args.verbose:
            raise UsageError(f"{path} is a built artifact; {'--passes' if args.passes else '-v'} needs the graph "
                             ".json it was compiled from (an artifact has no pipeline stages to show)")
        stage = args.stage or "manifest"
        if stage not in ARTIFACT_STAGES:
            raise UsageError(f"an artifact holds the built program only (--stage manifest or source); "
                             f"--stage {stage} needs the graph .json")
        from rlx.runtime.artifact import read_manifest

        manifest = read_manifest(path)
        if stage == "source":
            source = next((path / n for n in ("model.c", "model.cu") if (path / n).is_file()), None)
            if source is None:
                raise RlxError(f"{path} holds no generated source (model.c)")
            sys.stdout.write(source.read_text())
        else:
            print(format_manifest(manifest))
        return EXIT_OK
    stage = args.stage or "mir"
    if stage == "manifest":
        raise UsageError("--stage manifest is for an artifact directory; for a graph use --stage lir")
    target = _target(args)
    if args.target is not None and stage not in ("source", "lir"):
        raise UsageError(f"--target changes only --stage source and --stage lir (the target's decisions); the "
                         f"{stage.upper()} before them is the same for every target")
    if target.device == "cuda" and stage == "source":
        raise UsageError(f"--stage source renders C or Metal (--target metal); for {target} use "
                         f"`rlxc compile GRAPH --target {target} --emit-source` (or --stage lir for its digest)")
    model = load_model(args, path)
    graph = model.graph
    if stage == "hir" and getattr(graph, "stage", "mir") != "hir":
        raise UsageError(f"{path} holds a MIR graph; it has no HIR stage")
    if stage == "hir" and args.opt_level is not None and not args.passes:
        raise UsageError("-O changes the optimized stages (mir, lir, source); the HIR comes before the optimizer")
    config = _config(args)
    if _verbose(args):
        _err(f"rlxc: {graph.name} at -O{config.opt_level}")
    if args.passes or stage in ("mir", "lir", "source"):
        result = _run_stages(_session(args), graph, verbose=_verbose(args))
    if args.passes:
        print(result["report"])
    if stage == "hir":
        print(graph)
    elif stage == "mir":
        print(result["mir"])
    else:
        t0 = time.perf_counter()
        rendered = result["pipeline"].render(result["lir"])
        if _verbose(args):
            _err(f"rlxc:   render   {_ms(time.perf_counter() - t0)}")
        if stage == "lir":
            # the decided LIR of the target, every decision, and the digest of the source it renders to
            print(result["lir"].inspect())
            print(f"source digest {rendered.digest}")
        else:
            from rlx.toolchain.cache import cache_key

            print(rendered.with_key(cache_key(rendered.components)))  # as built: its key in the manifest
    return EXIT_OK


def format_manifest(m: dict) -> str:
    lines = [f"artifact {m.get('name', '?')}  key {m.get('key', '?')}",
             f"  target {m.get('target')}  isa {m.get('isa', {}).get('cpu_target')}  abi {m.get('abi_version')}"]
    for kind in ("inputs", "outputs", "params"):
        for s in m.get(kind, []):
            lines.append(f"  {kind[:-1]:<6} {s['name']:<40} {s['dtype']}[{','.join(s['shape'])}]")
    syms = ", ".join(f"{s['name']}<={s['max']}" for s in m.get("symbols", [])) or "none"
    lines.append(f"  dynamic dims: {syms}; weights {'included' if m.get('weights') else 'not included'}")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    inputs = _parse_inputs(args.input)
    path = Path(args.path)
    compiled = open_target(args, path)
    t0 = time.perf_counter()
    try:
        outputs = compiled.run(inputs)
    except ExecutionError as exc:
        if "never set" not in str(exc):
            raise
        # The runtime names the unset params; say how to set them from the command line.
        how = ("pass --weights W.safetensors, or save weights into the artifact "
               "(rlxc compile GRAPH -o DIR --weights W.safetensors)") if _is_artifact(path) \
            else "pass --weights W.safetensors"
        raise ExecutionError(f"{_one_line(exc)}; {how}") from None
    if _verbose(args):
        _err(f"rlxc: run {(time.perf_counter() - t0) * 1e3:.2f} ms")
    names = [s["name"] for s in compiled.manifest["outputs"]]
    if args.output:
        np.savez(args.output, **dict(zip(names, outputs)))
        print(f"wrote {len(outputs)} output(s) to {args.output}")
        return EXIT_OK
    with np.printoptions(precision=5, threshold=12, edgeitems=3, linewidth=110):
        for name, arr in zip(names, outputs):
            print(f"{name}: {arr.dtype}{list(arr.shape)}\n{arr}")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    if args.reps < 1:
        raise UsageError(f"--reps must be >= 1, got {args.reps}")
    if args.trace and not args.profile:
        raise UsageError("--trace writes the spans of a profiled run: add --profile")
    compiled = open_target(args, Path(args.path))
    if args.profile and not compiled.profiled:
        raise UsageError(f"{args.path} was not built profiled; rebuild the artifact with RLX_PROFILE=1 "
                         "(rlxc compile GRAPH -o DIR), or bench the graph .json with --profile")
    manifest = compiled.manifest
    already = compiled.param_arrays()
    for name, arr in synthetic_params(manifest).items():
        if name not in already:
            compiled.set_param(name, arr)
    inputs = _parse_inputs(args.input) or synthetic_inputs(manifest)
    compiled.run(inputs)  # warm-up: page in the arena and code, spin up threads
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        compiled.run(inputs)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"{manifest.get('name', Path(args.path).stem)}: {args.reps} calls, per call: median {med * 1e3:.3f} ms, "
          f"min {min(times) * 1e3:.3f} ms, max {max(times) * 1e3:.3f} ms")
    if args.profile:
        from rlx.runtime.profile import format_top_ops, top_ops

        runs = compiled.trace()
        last = max((s.run for s in runs), default=0)
        timed = [s for s in runs if s.run > last - args.reps]  # the timed calls, not the warm-up
        print(f"\ntop ops over the {args.reps} timed calls (kernel time; share of all kernel time):")
        print(format_top_ops(top_ops(timed), limit=args.top))
        if args.trace:
            from rlx.runtime.profile import save_chrome_trace

            save_chrome_trace(timed, args.trace, name=str(manifest.get("name", "rlx")))
            print(f"trace written to {args.trace} (open it in ui.perfetto.dev or chrome://tracing)")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from rlx.report import write_report

    path = Path(args.graph)
    if _is_artifact(path):
        raise UsageError(f"{path} is a built artifact; the report needs the graph .json or .onnx it came from")
    if args.trace and not Path(args.trace).is_file():
        raise UsageError(f"{args.trace}: no such trace file")
    graph = load_model(args, path).graph
    out = write_report(graph, args.output, config=_config(args), trace=args.trace)
    print(f"report written to {out}")
    return EXIT_OK


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"


def _entry_target(components: dict) -> str:
    """'cpu native:znver4' or 'cuda sm_90 f16' from an entry's key components."""
    options = dict(part.split("=", 1) for part in str(components.get("target_options", "")).split() if "=" in part)
    target = str(components.get("target", "?"))
    if target == "cpu" and "isa" in options:
        return f"cpu {options['isa']}"
    if target == "cuda" and "arch" in options:
        return f"cuda {options['arch']} {options.get('precision', '')}".strip()
    return target


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else "?"


def cmd_cache(args: argparse.Namespace) -> int:
    from rlx.toolchain.cache import AotCache

    action = args.action
    _check_cache_flags(args)
    cache = AotCache(_config(args))
    if action == "ls":
        rows = sorted(cache.entries(), key=lambda e: -e.last_use)
        if rows:
            print(f"{'KEY':<12}  {'GRAPH':<24}  {'TARGET':<22}  {'SIZE':>10}  LAST USE")
        for e in rows:
            where = "" if e.layer == "root" else f"  [read-only layer {e.layer}]"
            print(f"{e.key[:12]}  {e.name or '-':<24}  {_entry_target(e.components):<22}  {_size(e.bytes):>10}  "
                  f"{_when(e.last_use)}{where}")
        total = sum(e.bytes for e in rows)
        _err(f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'}, {_size(total)}, in {cache.root}")
    elif action == "stat":
        for k, v in cache.stat().items():
            if k == "since":
                v = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v)) if v else "never"
            print(f"{k}: {v}")
    elif action == "verify":
        problems = cache.verify(repair=not args.no_repair)
        for key, problem in problems:
            print(f"{key[:16]}: {problem}")
        n = len(cache.entries(layers=False))
        _err(f"{len(problems)} problem(s) in {n + len(problems)} entr{'y' if n == 1 else 'ies'}")
        return EXIT_FAIL if problems else EXIT_OK
    elif action == "gc":
        done = cache.gc(stale_seconds=args.stale_seconds)
        print(f"removed {done['tmp']} stale build dir(s), {done['quarantine']} quarantined entr(ies), "
              f"evicted {done['evicted']} entr(ies); {cache.total_bytes()} bytes in use")
    elif action == "clear":
        print(f"removed {cache.clear()} entr(ies) from {cache.root}")
    elif action == "explain":
        target = Path(args.what)
        if target.suffix in (".json", ".onnx") or target.is_file():
            what: Any = _cache_components(args, load_model(args, target).graph)
        else:
            if args.opt_level is not None or args.target is not None or args.max_dim or args.fix_dim:
                raise UsageError("-O, --target and --max-dim apply to `cache explain GRAPH`; a key already "
                                 "names one build")
            what = args.what
        ex = cache.explain(what)
        print(ex)
        return EXIT_OK if ex.hit else EXIT_FAIL
    return EXIT_OK


def _check_cache_flags(args: argparse.Namespace) -> None:
    """Each `cache` option belongs to one action: anything else is refused, not ignored."""
    action = args.action
    if args.what is not None and action != "explain":
        raise UsageError(f"cache {action} takes no argument (got {args.what!r}); only `cache explain` does")
    if action == "explain" and not args.what:
        raise UsageError("cache explain needs a KEY (or prefix) or a GRAPH.json")
    if args.no_repair and action != "verify":
        raise UsageError("--no-repair applies to `cache verify`")
    if args.stale_seconds is not None and action != "gc":
        raise UsageError("--stale-seconds applies to `cache gc`")
    if action != "explain":
        given = [f for f, v in (("-O/--opt-level", args.opt_level), ("--target", args.target),
                                ("--max-dim", args.max_dim or None), ("--fix-dim", args.fix_dim or None))
                 if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} apply to `cache explain GRAPH` only")


def _cache_components(args: argparse.Namespace, graph: Any) -> dict:
    session = _session(args)
    if session.device.value != "cpu":
        raise UsageError(f"cache explain for the {session.device.value} target is not supported")
    return session.render(graph).components


def cmd_doctor(args: argparse.Namespace) -> int:
    from rlx.toolchain.cache import AotCache, check_private

    config = _config(args)
    ok = True

    def line(label: str, text: str) -> None:
        print(f"{label:<12} {text}")

    try:
        from rlx.toolchain.compiler import detect_toolchain

        tc = detect_toolchain(config)
        line("compiler", f"{tc.cc} ({tc.cc_version})")
        line("isa", f"{tc.isa} ({' '.join(tc.isa_flags)})")
        from rlx.toolchain.isa import cpu_flags
        from rlx.toolchain.tile_unit import tile_unit_report

        line("tile unit", tile_unit_report(cpu_flags(), tc.isa))
        line("openmp", " ".join(tc.openmp_flags) if tc.openmp else "not available (single-threaded builds)")
        blas = tc.blas
        line("blas", f"{blas.provider} {blas.version} {blas.library}".strip() if blas.enabled
             else "none (built-in C GEMM)")
    except RlxError as exc:
        ok = False
        line("compiler", f"PROBLEM: {exc}")
    nvcc = shutil.which(config.nvcc)
    if nvcc:
        line("nvcc", f"{nvcc} ({_first_line([nvcc, '--version'], last=True)})")
        from rlx.toolchain.cuda_units import cutlass_for

        cutlass = cutlass_for()
        line("cutlass", f"{cutlass.include_dir} ({cutlass.version}): sm_90 GEMMs with a fused erf GELU / SiLU"
             if cutlass.found else f"none: {cutlass.reason}")
    else:
        line("nvcc", "not found (CUDA target unavailable)")
    from rlx.toolchain.metal import metal_toolchain_report

    line("metal", metal_toolchain_report().removeprefix("metal: "))
    smi = shutil.which("nvidia-smi")
    gpus = _first_line([smi, "-L"], all_lines=True) if smi else ""
    line("gpus", gpus.replace("\n", "; ") if gpus else "none found")
    line("cuda extra", cuda_extra_report())
    _doctor_threads(config, line)
    if args.peak_seconds > 0:
        ok = _doctor_peak(config, args.peak_seconds, line) and ok
    cache = AotCache(config)
    if not config.cache_enabled:
        line("cache", "disabled (RLX_CACHE=0)")
    else:
        root = cache.root
        try:
            if root.exists():
                check_private(root, "cache root")
            st = cache.stat()
            line("cache", f"{root}: {st['entries']} entries, {st['bytes'] / 1e6:.1f} MB of "
                 f"{st['max_bytes'] / 1e6:.0f} MB; {st['quarantined_on_disk']} quarantined, "
                 f"{st['tmp_dirs']} temp dir(s)" + ("" if root.exists() else " (not created yet)"))
            for layer in cache.layers:
                line("cache layer", f"{layer}{'' if layer.is_dir() else ' (missing)'}")
        except RlxError as exc:
            ok = False
            line("cache", f"PROBLEM: {exc}")
    return EXIT_OK if ok else EXIT_FAIL


def _doctor_peak(config: Any, seconds: float, line: Callable[[str, str], None]) -> bool:
    """The `sgemm peak` line of `rlxc doctor`: the ceiling of compute-bound work here (the BLAS's best sgemm
    rate on a run's thread count, a quick probe of MiniLM's FFN shapes); False when the probe failed."""
    from rlx.runtime.team import cpus_available
    from rlx.toolchain.compiler import detect_toolchain
    from rlx.toolchain.peak import QUICK_SHAPES, sgemm_peak

    try:
        peak = sgemm_peak(detect_toolchain(config).blas, config.num_threads or cpus_available(), seconds,
                          QUICK_SHAPES)
    except (RlxError, OSError) as exc:
        line("sgemm peak", f"PROBLEM: {exc}")
        return False
    line("sgemm peak", peak.describe() + f", a {seconds:g} s probe" if peak else "no BLAS to measure")
    return True


def _doctor_threads(config: Any, line: Callable[[str, str], None]) -> None:
    """The `threads`, `omp wait` and `load` lines of `rlxc doctor`: what a run here would use, and how busy
    the cores are now (a spinning team on busy cores is what RLX_OMP_WAIT=adaptive guards against)."""
    from rlx.runtime.loader import openmp_policy
    from rlx.runtime.team import LoadAverage, cpus_available

    cpus = cpus_available()
    threads = config.num_threads or cpus
    line("threads", f"{threads} per run (RLX_NUM_THREADS={config.num_threads or 'unset: every core'}), "
         f"{cpus} core(s) available to this process")
    line("omp wait", openmp_policy().source)
    try:
        with open("/proc/loadavg") as f:
            load1 = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        line("load", "unknown (no /proc/loadavg)")
        return
    running = LoadAverage()()
    others = max(0, (running or 1) - 1)  # this process's own thread is one of the runnable tasks
    busy = "busy: other processes want the cores" if others >= cpus or load1 >= cpus else "quiet"
    line("load", f"{load1:.2f} over the last minute, {others} other runnable task(s) now on {cpus} core(s): {busy}")


#: The wheels of the `cuda` extra and nvidia-cutlass, which `make install` adds beside it (--no-deps).
CUDA_WHEELS = ("nvidia-cublas", "nvidia-nccl-cu12", "nvidia-cutlass")
CUDA_EXTRA_HOW = ("in a checkout: make install CUDA=1; else: pip install 'rlx[cuda]' && "
                  "pip install --no-deps 'nvidia-cutlass>=4.2'")


def _wheel_version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_extra_report(version: Callable[[str], str | None] = _wheel_version) -> str:
    """`rlxc doctor`'s line on the CUDA wheels (cuBLASLt, NCCL, CUTLASS headers): their versions, or
    which are missing and how to add them (`make install` adds them only where a GPU is visible).

    >>> cuda_extra_report({"nvidia-cublas": "13.1", "nvidia-nccl-cu12": "2.2", "nvidia-cutlass": "4.2"}.get)
    'installed: nvidia-cublas 13.1, nvidia-nccl-cu12 2.2, nvidia-cutlass 4.2'
    >>> report = cuda_extra_report({"nvidia-cublas": "13.1"}.get)
    >>> report.split(";")[0]
    'missing nvidia-nccl-cu12, nvidia-cutlass (the CUDA target needs them for NCCL, CUTLASS GEMMs)'
    >>> "make install CUDA=1" in report
    True
    """
    found = {dist: version(dist) for dist in CUDA_WHEELS}
    missing = [dist for dist, v in found.items() if v is None]
    if not missing:
        return "installed: " + ", ".join(f"{dist} {v}" for dist, v in found.items())
    uses = {"nvidia-cublas": "cuBLASLt", "nvidia-nccl-cu12": "NCCL", "nvidia-cutlass": "CUTLASS GEMMs"}
    return (f"missing {', '.join(missing)} (the CUDA target needs them for "
            f"{', '.join(uses[d] for d in missing)}); add them {CUDA_EXTRA_HOW}")


def _first_line(cmd: list[str], *, last: bool = False, all_lines: bool = False) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        return ""
    if all_lines:
        return "\n".join(lines)
    return lines[-1] if last else lines[0]


def cmd_devices(args: argparse.Namespace) -> int:
    import json

    import rlx

    found = rlx.devices()
    if args.json:
        print(json.dumps(dataclasses.asdict(found) | {"targets": found.targets()}, indent=1))
    else:
        print(found)
    return EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    import runpy

    from rlx.runtime.record import recordings, replay

    for script in args.setup:  # registers what the recorded graphs need beyond RLX (rlx.custom_op)
        runpy.run_path(script, run_name="rlx_replay_setup")
    session = _session(args)
    session.config = dataclasses.replace(session.config, record_dir=None)  # a replay records nothing itself
    ok = True
    for directory in recordings(args.path):
        result = replay(directory, lambda graph: session.compile(graph, opt_level=args.opt_level),
                        rtol=args.rtol, atol=args.atol)
        if result.mismatch is not None:
            ok = False
            print(f"{directory}: MISMATCH on {_target(args)}: {result.mismatch}")
        else:
            print(f"{directory}: {result.calls} call(s) replayed on {_target(args)}: every output matches")
    return EXIT_OK if ok else EXIT_FAIL


def cmd_embed(argv: list[str]) -> int:
    from rlx.examples import embed

    try:
        return int(embed.main(argv) or 0)
    except SystemExit as exc:  # its argparse: --help or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def cmd_train(argv: list[str]) -> int:
    from rlx.examples import train

    try:
        train.main(argv)
        return 0
    except SystemExit as exc:  # its argparse: --help or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def cmd_serve(argv: list[str]) -> int:
    from rlx.serving import cli as serve_cli

    try:
        return int(serve_cli.main(argv) or 0)
    except SystemExit as exc:  # its argparse: --help or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def cmd_generate(argv: list[str]) -> int:
    from rlx.examples import generate

    try:
        return int(generate.main(argv) or 0)
    except SystemExit as exc:  # its argparse: --help or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def version_text() -> str:
    """`rlxc --version`: the rlx version, the Python running it and the compilers builds would use."""
    import platform

    from rlx import __version__

    lines = [f"rlxc (rlx) {__version__}",
             f"python   {platform.python_version()} ({platform.python_implementation()}, {sys.executable})"]
    try:
        from rlx.config import Config
        from rlx.toolchain.compiler import find_compiler

        config = Config.from_env()
        cc, text = find_compiler(config.cc)
        lines.append(f"cc       {cc} ({text.splitlines()[0] if text else '?'})")
    except RlxError as exc:
        lines.append(f"cc       not usable: {_one_line(exc)}")
        config = None
    nvcc = shutil.which(config.nvcc if config is not None else "nvcc")
    lines.append(f"nvcc     {nvcc} ({_first_line([nvcc, '--version'], last=True)})" if nvcc else "nvcc     not found")
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    """--version: computed only when asked (it runs the compiler), then exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit(0)


# ── argument parsing ──────────────────────────────────────────────────────


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlxc", description="RLX: compile tensor graphs to one C/CUDA file, cached.")
    p.add_argument("--version", action=_VersionAction, help="print the rlx, python and compiler versions")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(q: argparse.ArgumentParser, *, compiles: bool) -> None:
        # SUPPRESS: a subcommand's default must not overwrite `rlxc --debug COMMAND`'s value.
        q.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
        if compiles:
            talk = q.add_mutually_exclusive_group()
            talk.add_argument("-v", "--verbose", action="store_true",
                              help="print the cc/nvcc command lines and per-stage timings on stderr")
            talk.add_argument("-q", "--quiet", action="store_true", help="no progress output on stderr")

    def threads(q: argparse.ArgumentParser) -> None:
        q.add_argument("--num-threads", type=int, metavar="N", help="threads for OpenMP and BLAS (default: all)")

    def opt(q: argparse.ArgumentParser) -> None:
        q.add_argument("-O", "--opt-level", dest="opt_level", type=int, choices=range(4), metavar="{0-3}",
                       help="optimizer level: -O0 .. -O3 (default 2, or RLX_OPT_LEVEL)")

    def target(q: argparse.ArgumentParser) -> None:
        q.add_argument("--target", type=parse_target, default=None, metavar="TARGET",
                       help=f"what to build for: {TARGET_HELP}")
        q.add_argument("--precision", choices=("f32", "f16", "bf16"), default=None,
                       help="Session(precision=...): CUDA stores and computes f32 tensors in it (f32 sums); the "
                            "CPU stores f32 weights in it (default f32)")

    def max_dim(q: argparse.ArgumentParser) -> None:
        q.add_argument("--max-dim", action="append", default=[], metavar="NAME=N",
                       help="ONNX models: upper bound of the dynamic dim NAME (repeatable)")
        q.add_argument("--fix-dim", action="append", default=[], metavar="NAME=N",
                       help="ONNX models: fix the dynamic dim NAME to N, folding the shape arithmetic that "
                            "depends on it (torch exports' masks and positions; repeatable)")

    q = sub.add_parser("compile", help="compile a graph .json or .onnx model (into an artifact dir with -o)",
                       description="Compile GRAPH.json or MODEL.onnx through the AOT cache; -o writes a relocatable "
                                   "artifact (an ONNX model's weights go into it).")
    q.add_argument("graph", metavar="GRAPH.json|MODEL.onnx")
    q.add_argument("-o", "--output", metavar="DIR", help="write the artifact (model.so, manifest.json, rlx.h) here")
    target(q)
    opt(q)
    max_dim(q)
    q.add_argument("--emit-source", action="store_true",
                   help="print the generated source (its path with -o)")
    q.add_argument("--weights", metavar="W.safetensors", help="parameters to save into the artifact (needs -o)")
    common(q, compiles=True)
    q.set_defaults(func=cmd_compile)

    q = sub.add_parser("inspect", help="show a stage of the pipeline for a graph or artifact",
                       description="Print the HIR, optimized MIR, LIR (buffer plan) or generated source of a graph; "
                                   "the manifest or source of an artifact.")
    q.add_argument("path", metavar="GRAPH.json|MODEL.onnx|DIR", nargs="?")
    q.add_argument("--support", action="store_true",
                   help="print the op x backend support table (with a graph: its first unsupported op per backend)")
    q.add_argument("--stage", choices=("hir", "mir", "lir", "source", "manifest"),
                   help="stage to print (default: mir for a graph, manifest for an artifact)")
    q.add_argument("--passes", action="store_true", help="print the optimizer's per-pass report (graphs only)")
    q.add_argument("--memory", action="store_true",
                   help="estimate the bytes one execution context allocates (arena, params, scratch, state), "
                        "at the dynamic dims' bounds, without compiling")
    q.add_argument("--num-threads", type=int, metavar="N", help="with --memory: threads to size scratch for")
    q.add_argument("--model", metavar="DIR", help="a Hugging Face checkpoint directory: print its family, the "
                   "decoder config it maps to and its tensors, checked against the config (nothing is compiled)")
    target(q)
    opt(q)
    max_dim(q)
    q.add_argument("-v", "--verbose", action="store_true", help="per-stage timings on stderr")
    q.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
    q.set_defaults(func=cmd_inspect)

    q = sub.add_parser("run", help="run an artifact or graph on .npy inputs",
                       description="Run once; print the outputs or save them with --output.")
    q.add_argument("path", metavar="DIR|GRAPH.json|MODEL.onnx")
    q.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input (repeatable)")
    q.add_argument("--output", metavar="OUT.npz", help="save the outputs here")
    q.add_argument("--weights", metavar="W.safetensors", help="parameters to set before running")
    target(q)
    opt(q)
    max_dim(q)
    threads(q)
    common(q, compiles=True)
    q.set_defaults(func=cmd_run)

    q = sub.add_parser("bench", help="time calls of an artifact or graph",
                       description="Time REPS calls (random inputs at the dynamic dims' bounds unless --input).")
    q.add_argument("path", metavar="DIR|GRAPH.json|MODEL.onnx")
    q.add_argument("--reps", type=int, default=20, help="timed calls (default 20)")
    q.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input (repeatable)")
    q.add_argument("--weights", metavar="W.safetensors", help="parameters (default: small random values)")
    q.add_argument("--profile", action="store_true",
                   help="build the profiled variant and print the top ops by time (share, FLOP/s, bytes/s)")
    q.add_argument("--top", type=int, default=15, metavar="N", help="with --profile: ops to list (default 15)")
    q.add_argument("--trace", metavar="TRACE.json", help="with --profile: write the chrome-trace JSON (Perfetto)")
    target(q)
    opt(q)
    max_dim(q)
    threads(q)
    common(q, compiles=True)
    q.set_defaults(func=cmd_bench)

    q = sub.add_parser("report", help="write a self-contained HTML report of what the compiler did to a graph",
                       description="One HTML page (no network): the graph at HIR, MIR and LIR with fusion groups "
                                   "outlined, each node linked to its generated C, the memory plan as buffer "
                                   "lifetimes, and per-op kernel time with --trace (from bench --profile --trace).")
    q.add_argument("graph", metavar="GRAPH.json|MODEL.onnx")
    q.add_argument("-o", "--output", metavar="REPORT.html", required=True, help="where to write the page")
    q.add_argument("--trace", metavar="TRACE.json", help="a chrome trace of this graph (rlxc bench --profile --trace)")
    opt(q)
    max_dim(q)
    q.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
    q.set_defaults(func=cmd_report)

    q = sub.add_parser("cache", help="list, check and clean the AOT cache",
                       description="ls | stat | verify | gc | clear | explain KEY-or-GRAPH.json")
    q.add_argument("action", choices=("ls", "stat", "verify", "gc", "clear", "explain"))
    q.add_argument("what", nargs="?", metavar="KEY-or-GRAPH", help="for explain: a key (prefix) or graph .json")
    q.add_argument("--no-repair", action="store_true", help="verify: report corrupt entries, do not quarantine")
    q.add_argument("--stale-seconds", type=float, default=None,
                   help="gc: age after which a dead build's temp dir is removed (default 600)")
    target(q)
    opt(q)
    max_dim(q)
    common(q, compiles=False)
    q.set_defaults(func=cmd_cache)

    q = sub.add_parser("doctor", help="report compiler, OpenMP, BLAS, nvcc, GPUs and cache health",
                       description="Check what this machine offers RLX.")
    q.add_argument("--peak-seconds", type=float, default=0.3, metavar="S",
                   help="time the sgemm peak probe for S seconds (default 0.3; benchmarks/minilm.py probes "
                        "longer and on bigger shapes; 0 skips it)")
    common(q, compiles=False)
    q.set_defaults(func=cmd_doctor)

    q = sub.add_parser("devices", help="what this machine can run on: CPU ISA, NVIDIA GPUs (arch, memory), Metal",
                       description="List the devices RLX programs can run on here (rlx.devices()).")
    q.add_argument("--json", action="store_true", help="print them as JSON")
    common(q, compiles=False)
    q.set_defaults(func=cmd_devices)

    q = sub.add_parser("replay", help="rerun the calls RLX_RECORD recorded on a target; report the first mismatch",
                       description="Recompile each recorded graph for --target, set its recorded params, rerun "
                                   "every recorded call and compare the outputs (exit 1 at a mismatch).")
    q.add_argument("path", metavar="DIR", help="the RLX_RECORD directory, or one program's recording in it")
    q.add_argument("--rtol", type=float, default=None, help="relative tolerance of float outputs (default by dtype)")
    q.add_argument("--atol", type=float, default=None, help="absolute tolerance of float outputs (default by dtype)")
    q.add_argument("--setup", action="append", default=[], metavar="FILE.py",
                   help="a Python file run first, e.g. registering the custom ops (rlx.custom_op) the graphs use "
                        "(repeatable)")
    common(q, compiles=True)
    opt(q)
    target(q)
    q.set_defaults(func=cmd_replay)

    sub.add_parser("embed", help="sentence embeddings example (rlxc embed --help)", add_help=False)
    sub.add_parser("generate", help="generate text with a GGUF decoder LLM (rlxc generate --help)", add_help=False)
    sub.add_parser("train", help="train a small model, one compiled step graph (rlxc train --help)", add_help=False)
    sub.add_parser("serve", help="OpenAI-compatible server for a GGUF LLM (rlxc serve --help; the serve extra)",
                   add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `rlxc`; returns the exit status."""
    try:
        status = _main(list(sys.argv[1:] if argv is None else argv))
        # Flush here, not at interpreter exit, so a reader that closed the pipe is handled below.
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # `rlxc ... | head -1`: the reader has what it wanted. Point stdout at /dev/null so the
        # interpreter's final flush does not report the pipe again, and exit quietly with success.
        _silence_stdout()
        return EXIT_OK


def _silence_stdout() -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


_EXAMPLES = {"embed": cmd_embed, "generate": cmd_generate, "train": cmd_train, "serve": cmd_serve}


def _main(argv: list[str]) -> int:
    # embed and generate parse their own arguments; --debug before the command still applies
    command = next((a for a in argv if a in _EXAMPLES), None)
    debug = "--debug" in argv[: argv.index(command)] if command else "--debug" in argv
    words = [a for a in argv if a != "--debug"]
    if words and words[0] in _EXAMPLES:
        return _guard(lambda: _EXAMPLES[words[0]](words[1:]), debug, words[0])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help/--version (0) or a usage error (2): return the status instead of exiting
        return int(exc.code or 0)
    return _guard(lambda: args.func(args), args.debug, args.command)


def _guard(fn: Callable[[], Any], debug: bool, command: str) -> int:
    try:
        return int(fn() or 0)
    except BrokenPipeError:
        raise  # not a failure of the command: main() ends quietly
    except UsageError as exc:
        if debug:
            raise
        _err(f"rlxc {command}: error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("rlxc: interrupted")
        return 130
    except (RlxError, OSError, ValueError) as exc:
        if debug:
            raise
        _err(f"rlxc {command}: error: {_one_line(exc)}")
        return EXIT_FAIL


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename:
        text = f"{exc.filename}: {exc.strerror}"
    first, _, rest = text.partition("\n")
    return first + (" (more with --debug)" if rest.strip() else "")


if __name__ == "__main__":
    sys.exit(main())

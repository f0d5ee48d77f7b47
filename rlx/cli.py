"""`rlxc`: the RLX command-line compiler.

    rlxc compile GRAPH.json -o DIR          build a graph into a relocatable artifact
    rlxc inspect GRAPH.json|DIR --stage lir show a stage of the pipeline
    rlxc run DIR --input x=x.npy            run an artifact or graph on .npy inputs
    rlxc bench DIR --reps 50                time calls (median, min, max)
    rlxc cache ls|stat|verify|gc|clear|explain
    rlxc doctor                             what this machine has: compiler, OpenMP, BLAS, GPUs, cache
    rlxc embed "a sentence" "another"       the sentence-embedding example

Exit status: 0 success, 1 a build or runtime failure, 2 a usage error.
Errors are one line on stderr; `--debug` shows the traceback.

>>> import contextlib, io
>>> with contextlib.redirect_stderr(io.StringIO()):
...     main(["run", "no-such-artifact", "--input", "x"])
2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlx.errors import RlxError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A command line that names nothing valid: exit status 2."""


# ── progress on a terminal ────────────────────────────────────────────────


@contextlib.contextmanager
def progress(label: str, stream: Any = None) -> Iterator[None]:
    """Show `label` with a spinner and the elapsed time on stderr while the body runs (TTY only)."""
    stream = sys.stderr if stream is None else stream
    if not (hasattr(stream, "isatty") and stream.isatty()):
        yield
        return
    done = threading.Event()
    start = time.monotonic()

    def spin() -> None:
        frames = "|/-\\"
        i = 0
        # Only after a short delay: fast (cached) compiles should not flicker.
        if done.wait(0.3):
            return
        while not done.wait(0.1):
            stream.write(f"\r{label} {frames[i % 4]} {time.monotonic() - start:5.1f}s")
            stream.flush()
            i += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if time.monotonic() - start >= 0.3:
            stream.write("\r\033[K")
            stream.flush()


# ── loading things named on the command line ──────────────────────────────


def _is_artifact(path: Path) -> bool:
    return path.is_dir()


def load_graph(path: Path) -> Any:
    """A graph from its JSON document (MIR or HIR)."""
    from rlx.ir import serialize

    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if path.is_dir():
        raise UsageError(f"{path} is a directory; expected a graph .json file")
    return serialize.load(path)


def _config(args: argparse.Namespace) -> Any:
    from rlx.config import Config

    config = Config.from_env()
    changes: dict[str, Any] = {}
    if getattr(args, "opt_level", None) is not None:
        changes["opt_level"] = args.opt_level
    if getattr(args, "num_threads", None) is not None:
        changes["num_threads"] = args.num_threads
    return dataclasses.replace(config, **changes) if changes else config


def _session(args: argparse.Namespace) -> Any:
    from rlx.driver import Device, Session

    target = getattr(args, "target", "cpu") or "cpu"
    if target not in {d.value for d in Device}:
        raise RlxError(f"target {target!r} is not available in this build of RLX")
    return Session(Device.parse(target), config=_config(args))


def compile_graph(args: argparse.Namespace, graph: Any) -> Any:
    session = _session(args)
    with progress(f"compiling {graph.name}"):
        return session.compile(graph)


def _load_weights(path: Path) -> dict[str, Any]:
    from rlx.models.weights import load_safetensors

    if not path.is_file():
        raise UsageError(f"{path}: no such weights file")
    return load_safetensors(path)


def _set_weights(compiled: Any, weights: dict[str, Any]) -> None:
    names = compiled.param_names
    unused = sorted(set(weights) - set(names))
    missing = [n for n in names if n not in weights]
    if unused:
        print(f"note: {len(unused)} tensor(s) in the weights file are not params of the graph "
              f"(e.g. {unused[0]!r})", file=sys.stderr)
    if missing:
        print(f"note: {len(missing)} param(s) are not in the weights file (e.g. {missing[0]!r})", file=sys.stderr)
    for name in names:
        if name in weights:
            compiled.set_param(name, weights[name])


def open_target(args: argparse.Namespace, path: Path) -> Any:
    """A CompiledGraph for an artifact directory or a graph file (compiled through the cache)."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if _is_artifact(path):
        from rlx.toolchain.artifact import load

        compiled = load(path, num_threads=getattr(args, "num_threads", None))
    else:
        compiled = compile_graph(args, load_graph(path))
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
    graph = load_graph(Path(args.graph))
    t0 = time.perf_counter()
    compiled = compile_graph(args, graph)
    elapsed = time.perf_counter() - t0
    weights = False
    if args.weights:
        _set_weights(compiled, _load_weights(Path(args.weights)))
        weights = True
    info = sys.stderr if args.emit_source and not args.output else sys.stdout
    how = "cache hit" if compiled.cache_hit else "built"
    print(f"{graph.name}: key {compiled.key} ({how}, {elapsed * 1000:.0f} ms)", file=info)
    if args.output:
        from rlx.toolchain.artifact import save

        out = save(compiled, Path(args.output), weights=weights)
        print(f"artifact written to {out}", file=info)
        if args.emit_source:
            print(f"source: {out / 'model.c'}", file=info)
    elif args.emit_source:
        sys.stdout.write(Path(compiled.source_path).read_text())
    else:
        print(f"library: {compiled.library_path}", file=info)
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if _is_artifact(path):
        from rlx.toolchain.artifact import read_manifest

        manifest = read_manifest(path)
        if args.stage == "source":
            sys.stdout.write((path / "model.c").read_text())
        elif args.stage in (None, "lir"):
            print(format_manifest(manifest))
        else:
            raise UsageError(f"an artifact holds the built program only; --stage {args.stage} needs the graph .json")
        return EXIT_OK
    graph = load_graph(path)
    stage = args.stage or "mir"
    if args.passes or stage in ("mir", "lir", "source"):
        result = _optimize(graph, _config(args))
    if args.passes:
        print(result["report"])
    if stage == "hir":
        if getattr(graph, "stage", "mir") != "hir":
            raise UsageError(f"{path} holds a MIR graph; it has no HIR stage")
        print(graph)
    elif stage == "mir":
        print(result["mir"])
    elif stage == "lir":
        print(result["lir"].inspect())
    else:
        print(_render_source(args, result["lir"]))
    return EXIT_OK


def _optimize(graph: Any, config: Any) -> dict[str, Any]:
    """Lower, optimize (with the pipeline's per-pass report) and plan: what `compile` builds."""
    from rlx.driver import to_mir
    from rlx.opt.memplan import plan
    from rlx.opt.pipeline import optimize_with_report

    mir, report = optimize_with_report(to_mir(graph), config.opt_level, debug=config.debug)
    return {"mir": mir, "lir": plan(mir), "report": report.summary()}


def _render_source(args: argparse.Namespace, lir: Any) -> str:
    from rlx.toolchain.cpu import render_source

    if getattr(args, "target", "cpu") != "cpu":
        raise RlxError(f"--stage source is available for the cpu target only, not {args.target!r}")
    return render_source(lir, _config(args))


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
    compiled = open_target(args, Path(args.path))
    outputs = compiled.run(inputs)
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
    compiled = open_target(args, Path(args.path))
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
    return EXIT_OK


def cmd_cache(args: argparse.Namespace) -> int:
    from rlx.toolchain.cache import AotCache

    cache = AotCache(_config(args))
    action = args.action
    if action == "ls":
        rows = cache.entries()
        for e in sorted(rows, key=lambda e: -e.last_use):
            comps = e.components
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_use)) if e.last_use else "?"
            where = "" if e.layer == "root" else f"  [layer {e.layer}]"
            label = comps.get("name") or comps.get("graph") or str(comps.get("lir", ""))[:12]
            print(f"{e.key[:16]}  {e.bytes / 1024:9.1f} KiB  {when}  {comps.get('target', '')}  {label}{where}")
        print(f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'} in {cache.root}", file=sys.stderr)
    elif action == "stat":
        for k, v in cache.stat().items():
            print(f"{k}: {v}")
    elif action == "verify":
        problems = cache.verify(repair=not args.no_repair)
        for key, problem in problems:
            print(f"{key[:16]}: {problem}")
        n = len(cache.entries(layers=False))
        print(f"{len(problems)} problem(s) in {n + len(problems)} entr{'y' if n == 1 else 'ies'}", file=sys.stderr)
        return EXIT_FAIL if problems else EXIT_OK
    elif action == "gc":
        done = cache.gc(stale_seconds=args.stale_seconds)
        print(f"removed {done['tmp']} stale build dir(s), {done['quarantine']} quarantined entr(ies), "
              f"evicted {done['evicted']} entr(ies); {cache.total_bytes()} bytes in use")
    elif action == "clear":
        print(f"removed {cache.clear()} entr(ies) from {cache.root}")
    elif action == "explain":
        if not args.what:
            raise UsageError("cache explain needs a KEY (or prefix) or a GRAPH.json")
        target = Path(args.what)
        if target.suffix == ".json" or target.is_file():
            what = _cache_components(args, load_graph(target))
        else:
            what = args.what
        ex = cache.explain(what)
        print(ex)
        return EXIT_OK if ex.hit else EXIT_FAIL
    return EXIT_OK


def _cache_components(args: argparse.Namespace, graph: Any) -> dict:
    from rlx.toolchain.compiler import detect_toolchain
    from rlx.toolchain.cpu import cpu_key_components

    session = _session(args)
    if session.device.value != "cpu":
        raise RlxError(f"cache explain for the {session.device.value} target is not supported")
    return cpu_key_components(session.lower(graph), detect_toolchain(session.config))


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
    else:
        line("nvcc", "not found (CUDA target unavailable)")
    smi = shutil.which("nvidia-smi")
    gpus = _first_line([smi, "-L"], all_lines=True) if smi else ""
    line("gpus", gpus.replace("\n", "; ") if gpus else "none found")
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


def cmd_embed(argv: list[str]) -> int:
    from rlx.examples import embed

    try:
        return int(embed.main(argv) or 0)
    except SystemExit as exc:  # its argparse: --help or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


# ── argument parsing ──────────────────────────────────────────────────────


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlxc", description="RLX: compile tensor graphs to one C/CUDA file, cached.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def threads(q: argparse.ArgumentParser) -> None:
        q.add_argument("--num-threads", type=int, metavar="N", help="threads for OpenMP and BLAS (default: all)")

    def opt(q: argparse.ArgumentParser) -> None:
        q.add_argument("--opt-level", type=int, choices=range(4), metavar="{0-3}", help="optimizer level (default 2)")

    def target(q: argparse.ArgumentParser) -> None:
        q.add_argument("--target", choices=("cpu", "cuda", "metal"), default="cpu", help="backend (default cpu)")

    q = sub.add_parser("compile", help="compile a graph .json (into an artifact dir with -o)",
                       description="Compile GRAPH.json through the AOT cache; -o writes a relocatable artifact.")
    q.add_argument("graph", metavar="GRAPH.json")
    q.add_argument("-o", "--output", metavar="DIR", help="write the artifact (model.so, manifest.json, rlx.h) here")
    target(q)
    opt(q)
    q.add_argument("--emit-source", action="store_true",
                   help="print the generated source (its path with -o)")
    q.add_argument("--weights", metavar="W.safetensors", help="parameters to set (and save with -o)")
    threads(q)
    q.set_defaults(func=cmd_compile)

    q = sub.add_parser("inspect", help="show a stage of the pipeline for a graph or artifact",
                       description="Print the HIR, optimized MIR, LIR (buffer plan) or generated source.")
    q.add_argument("path", metavar="GRAPH.json|DIR")
    q.add_argument("--stage", choices=("hir", "mir", "lir", "source"), help="stage to print (default mir)")
    q.add_argument("--passes", action="store_true", help="print the optimizer's per-pass report")
    target(q)
    opt(q)
    q.set_defaults(func=cmd_inspect)

    q = sub.add_parser("run", help="run an artifact or graph on .npy inputs",
                       description="Run once; print the outputs or save them with --output.")
    q.add_argument("path", metavar="DIR|GRAPH.json")
    q.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input (repeatable)")
    q.add_argument("--output", metavar="OUT.npz", help="save the outputs here")
    q.add_argument("--weights", metavar="W.safetensors", help="parameters to set before running")
    target(q)
    threads(q)
    q.set_defaults(func=cmd_run)

    q = sub.add_parser("bench", help="time calls of an artifact or graph",
                       description="Time REPS calls (random inputs at the dynamic dims' bounds unless --input).")
    q.add_argument("path", metavar="DIR|GRAPH.json")
    q.add_argument("--reps", type=int, default=20, help="timed calls (default 20)")
    q.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input (repeatable)")
    q.add_argument("--weights", metavar="W.safetensors", help="parameters (default: small random values)")
    target(q)
    threads(q)
    q.set_defaults(func=cmd_bench)

    q = sub.add_parser("cache", help="list, check and clean the AOT cache",
                       description="ls | stat | verify | gc | clear | explain KEY-or-GRAPH.json")
    q.add_argument("action", choices=("ls", "stat", "verify", "gc", "clear", "explain"))
    q.add_argument("what", nargs="?", metavar="KEY-or-GRAPH", help="for explain: a key (prefix) or graph .json")
    q.add_argument("--no-repair", action="store_true", help="verify: report corrupt entries, do not quarantine")
    q.add_argument("--stale-seconds", type=float, default=None,
                   help="gc: age after which a dead build's temp dir is removed (default 600)")
    target(q)
    opt(q)
    q.set_defaults(func=cmd_cache)

    q = sub.add_parser("doctor", help="report compiler, OpenMP, BLAS, nvcc, GPUs and cache health",
                       description="Check what this machine offers RLX.")
    q.set_defaults(func=cmd_doctor)

    sub.add_parser("embed", help="sentence embeddings example (rlxc embed --help)", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `rlxc`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv[: argv.index("embed")] if "embed" in argv else "--debug" in argv
    words = [a for a in argv if a != "--debug"]
    if words and words[0] == "embed":
        return _guard(lambda: cmd_embed(words[1:]), debug, "embed")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): return the status instead of exiting
        return int(exc.code or 0)
    return _guard(lambda: args.func(args), args.debug, args.command)


def _guard(fn: Any, debug: bool, command: str) -> int:
    try:
        return int(fn() or 0)
    except UsageError as exc:
        if debug:
            raise
        print(f"rlxc {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("rlxc: interrupted", file=sys.stderr)
        return 130
    except (RlxError, OSError, ValueError) as exc:
        if debug:
            raise
        print(f"rlxc {command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_FAIL


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename:
        text = f"{exc.filename}: {exc.strerror}"
    first, _, rest = text.partition("\n")
    return first + (" (more with --debug)" if rest.strip() else "")


if __name__ == "__main__":
    sys.exit(main())

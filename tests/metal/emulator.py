"""The Metal emulator: a rendered .metal program compiled as C++ (g++) and run on the CPU.

`emulate(graph)` renders the graph with the Metal backend, compiles the
generated source against `include/metal_stdlib` (the MSL shim: address
spaces, attributes, vector types, simd functions, barriers, simdgroup
matrices) plus a small generated harness exporting one `rlx_emu_dispatch`,
and returns a `rlx.runtime.metal_host.MetalGraph` whose runner executes each
dispatch over its grid, threadgroup by threadgroup. The host logic (buffer
layout, params, symbol binding, grids, error flag) is the same code that
drives a real GPU; only the runner differs.

Builds are cached by the sha256 of the source and shim under RLX_CACHE_DIR.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import rlx
from rlx.codegen.metal import MetalProgram, MetalTarget
from rlx.driver import lower_to_lir, to_mir
from rlx.pipeline.metal import render_metal
from rlx.runtime.metal_host import Launch, MetalGraph

HERE = Path(__file__).resolve().parent
SHIM = HERE / "include" / "metal_stdlib"
CXX = os.environ.get("CXX", "g++")
FLAGS = ("-std=c++14", "-pedantic-errors", "-O1", "-shared", "-fPIC", "-Wno-attributes", "-Wno-unused-parameter",
         "-fno-strict-aliasing")


def have_compiler() -> bool:
    return shutil.which(CXX) is not None


def harness(names: Sequence[str]) -> str:
    """C++ that includes model.metal and exports a dispatcher over the kernels `names` (by index)."""
    lines = ['#include "model.metal"', ""]
    for i, name in enumerate(names):
        lines.append(f"static void rlx_emu_body{i}(unsigned char *mem, const long *sym, const rlx_emu::Position &p)"
                     f" {{ {name}(mem, sym, p.tg_pos, p.t_pos, p.tg_size, p.lane, p.sg); }}")
    table = ", ".join(f"rlx_emu_body{i}" for i in range(len(names))) or "nullptr"
    lines += [
        f"static const rlx_emu::Body rlx_emu_bodies[] = {{ {table} }};",
        'extern "C" int rlx_emu_dispatch(int k, unsigned char *mem, const long *sym, const unsigned *grid,',
        "                                const unsigned *threads, int sync) {",
        "    return rlx_emu::dispatch(rlx_emu_bodies[k], mem, sym, grid, threads, sync);",
        "}",
        'extern "C" const char *rlx_emu_error(void) { return rlx_emu::g_error; }',
        'extern "C" void rlx_emu_clear_error(void) { rlx_emu::g_error[0] = 0; }',
        "",
    ]
    return "\n".join(lines)


def build(program: MetalProgram) -> Path:
    """The emulator library of `program` (compiled once per source)."""
    return build_source(program.source, [d["kernel"] for d in program.manifest["dispatches"]])


def build_source(source: str, names: Sequence[str]) -> Path:
    """The emulator library of a .metal `source` whose kernels `names` are dispatched by index."""
    glue = harness(names)
    key = hashlib.sha256((source + SHIM.read_text() + glue + " ".join(FLAGS)).encode())
    # (an empty RLX_CACHE_DIR is unset, as rlx.config reads it: not the working directory)
    cache = os.environ.get("RLX_CACHE_DIR", "").strip() or Path.home() / ".cache" / "rlx"
    root = Path(cache) / "metal-emu" / key.hexdigest()[:32]
    lib = root / "model.so"
    if lib.exists():
        return lib
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.metal").write_text(source)
    (root / "harness.cpp").write_text(glue)
    tmp = root / f"model.{os.getpid()}.so"
    cmd = [CXX, *FLAGS, "-I", str(SHIM.parent), "-I", str(root), str(root / "harness.cpp"), "-o", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise rlx.BuildError(f"the emulator build failed:\n{proc.stderr[-6000:]}")
    tmp.replace(lib)
    return lib


class EmulatorRunner:
    """Runs dispatches with the compiled emulator, on a host buffer of the program's size."""

    def __init__(self, library: Path, total: int) -> None:
        self._lib = ctypes.CDLL(str(library))
        self._lib.rlx_emu_dispatch.restype = ctypes.c_int
        self._lib.rlx_emu_error.restype = ctypes.c_char_p
        self.memory = np.zeros(max(total, 16), dtype=np.uint8)
        self.launched: list[Launch] = []

    def run(self, launches: Sequence[Launch], symbols: np.ndarray) -> None:
        sym = np.ascontiguousarray(symbols, dtype=np.int64)
        for launch in launches:
            grid = (ctypes.c_uint * 3)(*launch.grid)
            threads = (ctypes.c_uint * 3)(*launch.threads)
            rc = self._lib.rlx_emu_dispatch(launch.kernel, self.memory.ctypes.data_as(ctypes.c_void_p),
                                            sym.ctypes.data_as(ctypes.c_void_p), grid, threads, int(launch.sync))
            self.launched.append(launch)
            if rc:
                message = self._lib.rlx_emu_error().decode()
                self.clear_error()
                raise rlx.ExecutionError(f"emulated kernel {launch.name} failed: {message}")

    def clear_error(self) -> None:
        self._lib.rlx_emu_clear_error()


def reset_error(runner: EmulatorRunner) -> None:
    """Clear the emulator's sticky error (after a test provoked one on purpose)."""
    runner.clear_error()


def render(graph: object, opt_level: int = 0, target: MetalTarget | None = None) -> MetalProgram:
    """The Metal program of `graph` as `rlxc compile --target metal` renders it."""
    mir = to_mir(graph)
    lir = lower_to_lir(mir, opt_level, backend="metal")
    return render_metal(lir, target or MetalTarget(), lir.manifest())


def emulate(graph: object, opt_level: int = 0, target: MetalTarget | None = None) -> MetalGraph:
    """`graph` rendered for Metal, compiled for the emulator and loaded as a `MetalGraph`."""
    program = render(graph, opt_level, target)
    runner = EmulatorRunner(build(program), program.manifest["layout"]["total"])
    return MetalGraph(program.manifest, runner, source=program.source)

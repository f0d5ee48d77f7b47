"""Cache test helper: a build function that compiles trivial.c, and a worker process entry point.

Run as a script it does one `get_or_build` against `--root` and prints a JSON
line {"hit", "key", "value"} where value comes from calling into the loaded
library. `--kill` makes the build SIGKILL its own process half-way through.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlx.config import Config
from rlx.errors import BuildError
from rlx.toolchain.cache import AotCache

DATA = Path(__file__).resolve().parent
C_FILE = DATA / "trivial.c"


def compiler() -> str:
    cc = os.environ.get("CC") or "cc"
    path = shutil.which(cc)
    if path is None:
        raise BuildError(f"C compiler {cc!r} not found")
    return path


def components(value: int, **overrides: str) -> dict[str, str]:
    base = {
        "lir": f"trivial-{value}",
        "target": "cpu:x86-64",
        "compiler": compiler() + " | cc (test) 1.0",
        "flags": f"-O1 -shared -fPIC -DRLX_TEST_VALUE={value}",
        "templates": "digest-1",
        "blas": "none",
        "codegen": "1",
    }
    base.update(overrides)
    return base


def make_build(value: int, counter: Path | None = None, sleep: float = 0.0, kill: bool = False):
    """A build function for AotCache.get_or_build that compiles trivial.c returning `value`."""

    def build(workdir: Path) -> None:
        if counter is not None:
            with open(counter, "a") as f:
                f.write(f"{os.getpid()}\n")
        shutil.copyfile(C_FILE, workdir / "model.c")
        cmd = [compiler(), "-O1", "-shared", "-fPIC", f"-DRLX_TEST_VALUE={value}", str(C_FILE),
               "-o", str(workdir / "model.so")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(proc.stderr.strip())
        if kill:
            with open(workdir / "model.so", "r+b") as f:
                f.truncate(100)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(sleep)

    return build


def call_value(library: Path) -> int:
    lib = ctypes.CDLL(str(library))
    lib.rlx_test_value.restype = ctypes.c_int
    return int(lib.rlx_test_value())


def graph_inputs() -> dict:
    """Fixed params and inputs for the graph `run_graph` compiles (see tests/toolchain/test_cache.py)."""
    import numpy as np

    return {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3),
            "x": np.linspace(-2, 2, 20, dtype=np.float32).reshape(5, 4)}


def run_graph(graph_path: Path, root: Path) -> dict:
    import rlx
    from rlx.ir import serialize

    compiled = rlx.Session(config=Config(cache_dir=root, cache_lock_timeout=120)).compile(serialize.load(graph_path))
    data = graph_inputs()
    compiled.set_param("w", data["w"])
    return {"hit": compiled.cache_hit, "key": compiled.key, "value": compiled.run(x=data["x"])[0].tolist()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--value", type=int, default=7)
    p.add_argument("--counter")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--kill", action="store_true")
    p.add_argument("--ready", help="directory in which to announce readiness")
    p.add_argument("--go", help="file whose appearance starts the work")
    p.add_argument("--graph", help="compile this graph .json with the CPU backend instead of trivial.c")
    a = p.parse_args()
    if a.ready:
        (Path(a.ready) / str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while not Path(a.go).exists():
            if time.monotonic() > deadline:
                print("never got the go signal", file=sys.stderr)
                return 3
            time.sleep(0.005)
    if a.graph:
        print(json.dumps(run_graph(Path(a.graph), Path(a.root))))
        return 0
    cache = AotCache(Config(cache_dir=Path(a.root), cache_lock_timeout=120))
    build = make_build(a.value, Path(a.counter) if a.counter else None, a.sleep, a.kill)
    entry = cache.get_or_build(components(a.value), build)
    print(json.dumps({"hit": entry.hit, "key": entry.key, "value": call_value(entry.library)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

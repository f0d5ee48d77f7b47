"""The ahead-of-time cache of built libraries, shared between processes.

An entry is a directory `<root>/<key[:2]>/<key>/` holding `model.c`,
`model.so`, `meta.json` (the key components, sha256 and size of every file,
timestamps) and a `last_use` stamp whose mtime orders LRU eviction; later, `packed/`: params kept in
the library's stored layout (`rlx.toolchain.param_store`), counted in the entry's size and evicted with it. The key
is the sha256 of the canonical JSON of the components the caller supplies
(LIR hash, target, compiler identity, flags, template digest, BLAS, codegen
version), so anything that changes the generated code changes the key.

How it stays correct with many processes and crashes:

- builds happen in a private directory under `<root>/tmp/` and are published
  by one atomic `rename`, so an entry is either complete or absent;
- a per-key file lock (`<root>/locks/<key>.lock`) makes concurrent processes
  build once: the others wait (at most `Config.cache_lock_timeout` seconds)
  and then find the published entry;
- the `.so`'s sha256 is checked against `meta.json` before an entry is
  returned; a corrupt entry is moved to `<root>/quarantine/` and rebuilt;
- directories and files writable by other users are refused, never loaded;
- temp directories of crashed builds are removed by later builds once their
  key lock is free (the OS drops a dead process's lock).

The root also holds what every build shares: `units/` (compiled kernel units,
`rlx.toolchain.units`), `templates/` (compiled Jinja templates) and `memo/`
(toolchain probes, the compile index). They are small and not evicted;
`clear()` removes them too.

Read-only layers (`RLX_CACHE_PATH`) are searched before the writable root.
With `RLX_CACHE=0` every request builds into a fresh temp directory.

>>> import tempfile
>>> from rlx.config import Config
>>> tmp = tempfile.TemporaryDirectory()
>>> cache = AotCache(Config(cache_dir=Path(tmp.name) / "cache"))
>>> def build(workdir):
...     (workdir / "model.c").write_text("/* source */")
...     (workdir / "model.so").write_bytes(b"not really a library")
>>> first = cache.get_or_build({"lir": "abc", "flags": "-O2"}, build)
>>> again = cache.get_or_build({"lir": "abc", "flags": "-O2"}, build)
>>> (first.hit, again.hit, first.key == again.key)
(False, True, True)
>>> cache.get_or_build({"lir": "abc", "flags": "-O3"}, build).hit
False
>>> cache.explain({"lir": "abc", "flags": "-O1"}).differences[0].component
'flags'
>>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx.config import Config
from rlx.errors import BuildError, CacheError
from rlx.toolchain import stored_file

if TYPE_CHECKING:  # the listing's and explain's values (rlx.toolchain.cache_report): a hit needs none
    from rlx.toolchain.cache_report import Difference, EntryInfo, Explanation

#: Public names of rlx.toolchain.cache_report, read through this module too (loaded on first use; not cached
#: in this module's globals, which rlx.pristine watches).
_REPORT_NAMES = ("Difference", "EntryInfo", "Explanation")


def __getattr__(name: str) -> Any:
    if name not in _REPORT_NAMES:
        raise AttributeError(f"module 'rlx.toolchain.cache' has no attribute {name!r}")
    from rlx.toolchain import cache_report

    return getattr(cache_report, name)


def _debug(message: str, *args: object) -> None:
    """`logging.getLogger("rlx.cache").debug(...)`, without importing logging: a process that has not
    imported it has configured no handler to receive the record (a warm start need not load it)."""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger("rlx.cache").debug(message, *args)


#: Version of the entry layout and meta.json schema.
CACHE_FORMAT = 1
LIBRARY = "model.so"
SOURCE = "model.c"
#: The generated source an entry keeps: C for the CPU backend, CUDA C++ for the CUDA one.
SOURCES = (SOURCE, "model.cu")


def source_in(d: Path) -> Path | None:
    """The generated source kept in entry directory `d`, or None."""
    return next((d / name for name in SOURCES if (d / name).is_file()), None)
META = "meta.json"
LAST_USE = "last_use"

_KEY_CHARS = frozenset("0123456789abcdef")

# Counters for `stats()`: observability only, they never change behaviour. `_COUNTERS` counts this
# process; `<root>/stats.json` (STATS) accumulates every process's counts for that root, so `rlxc cache stat`
# reports what the cache has done, not what the rlxc process itself did (nothing).
_COUNTERS: dict[str, float] = {
    "hits": 0, "layer_hits": 0, "misses": 0, "builds": 0, "build_seconds": 0.0,
    "lock_waits": 0, "quarantined": 0, "evicted": 0,
}
STATS = "stats.json"
#: The names of temp files of a stats.json update (gc removes one a crash left behind).
STATS_TEMP_PREFIX = ".stats."
#: Seconds to wait for another process's update of stats.json before dropping this update (counts are advisory).
_STATS_LOCK_TIMEOUT = 2.0
_TEMP_BUILDS: list[Path] = []


class CacheWarning(RuntimeWarning):
    """A cache entry was found corrupt and quarantined, or a read-only layer entry was skipped."""


# ── keys ─────────────────────────────────────────────────────────────────


def canonical_components(components: Mapping[str, Any]) -> str:
    """The canonical JSON text of key components: sorted keys, no whitespace, ASCII only.

    >>> canonical_components({"b": "2", "a": "1"})
    '{"a":"1","b":"2"}'
    """
    if not isinstance(components, Mapping) or not components:
        raise CacheError(f"cache key components must be a non-empty dict, got {components!r}")
    for name in components:
        if not isinstance(name, str):
            raise CacheError(f"cache key component names must be strings, got {name!r}")
    try:
        return json.dumps(dict(components), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CacheError(f"cache key components must be JSON values: {exc}") from None


def cache_key(components: Mapping[str, Any]) -> str:
    """sha256 (hex) of `canonical_components(components)`: the entry's key.

    >>> cache_key({"lir": "abc"}) == cache_key({"lir": "abc"}) != cache_key({"lir": "abd"})
    True
    """
    return hashlib.sha256(canonical_components(components).encode("ascii")).hexdigest()


def is_key(text: str) -> bool:
    """True when `text` looks like a full cache key (64 lowercase hex digits)."""
    return len(text) == 64 and set(text) <= _KEY_CHARS


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# ── entries ──────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class CacheEntry:
    """A verified cache entry: a directory holding `model.c`, `model.so` and `meta.json`.

    `hit` is False when this call built the entry. `layer` says where it was
    found: "root" (the writable cache), a read-only layer's path, or "temp"
    (the cache is disabled and the build lives in a temp dir until exit).
    """

    key: str
    dir: Path
    hit: bool
    meta: dict = field(compare=False, repr=False)
    layer: str = "root"

    @property
    def library(self) -> Path:
        return self.dir / LIBRARY

    @property
    def source(self) -> Path:
        return source_in(self.dir) or self.dir / SOURCE

    @property
    def components(self) -> dict:
        return dict(self.meta.get("components", {}))


class _Corrupt(Exception):
    """Internal: an entry failed verification (the message says how)."""


# ── permissions ──────────────────────────────────────────────────────────


def _trusted_uids() -> tuple[int, ...]:
    uid = os.getuid() if hasattr(os, "getuid") else -1
    return (uid, 0)


def check_private(path: Path, what: str = "cache path") -> os.stat_result:
    """Raise CacheError unless `path` is owned by this user (or root) and not writable by group or others.

    Code loaded from the cache runs in this process, so a directory another
    user can write is a way to inject code: it is refused, never repaired.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise CacheError(f"cannot read {what} {path}: {exc.strerror}") from None
    uids = _trusted_uids()
    if hasattr(os, "getuid") and st.st_uid not in uids:
        raise CacheError(
            f"refusing {what} {path}: it is owned by uid {st.st_uid}, not by you (uid {uids[0]}); "
            "code in a cache another user controls is never loaded")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(
            f"refusing {what} {path}: it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"code from it is never loaded. Fix with: chmod go-w {path}")
    return st


def _mkdir_private(path: Path) -> None:
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        # mkdir's mode is filtered by the umask; make the intent exact.
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)


# ── the cache ────────────────────────────────────────────────────────────


class AotCache:
    """The AOT cache described in the module docstring.

    `get_or_build(components, build)` returns a verified `CacheEntry`:
    from a read-only layer, the writable root, or by calling `build(workdir)`
    once across all processes sharing the root. `build` must write
    `model.c` and `model.so` into `workdir` and raise `BuildError` on failure.
    """

    #: Temp dirs of builds older than this (seconds) whose key lock is free are removed.
    stale_seconds: float = 600.0
    #: Entries used less than this many seconds ago are never evicted (a reader may be loading them).
    evict_grace_seconds: float = 5.0

    def __init__(self, config: Config | None = None) -> None:
        self.config = Config.from_env() if config is None else config
        self.enabled = self.config.cache_enabled
        self._root: Path | None = None

    # ── layout ──

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = Path(self.config.cache_root).expanduser().absolute()
        return self._root

    @property
    def layers(self) -> tuple[Path, ...]:
        return tuple(Path(p).expanduser().absolute() for p in self.config.cache_path)

    def entry_dir(self, key: str, base: Path | None = None) -> Path:
        return (self.root if base is None else base) / key[:2] / key

    def _lock_path(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.lock"

    def _ensure_root(self) -> None:
        root = self.root
        _mkdir_private(root)
        check_private(root, "cache root")
        for sub in ("tmp", "locks"):
            _mkdir_private(root / sub)

    # ── lookup and build ──

    def lookup(self, key: str) -> CacheEntry | None:
        """The verified entry for `key` from a read-only layer or the root, or None.

        A corrupt root entry is not quarantined here (that happens under the
        key lock in `get_or_build`); it is simply not returned.
        """
        for layer in self.layers:
            entry = self._try_layer(layer, key)
            if entry is not None:
                self._count(hits=1, layer_hits=1)
                return entry
        try:
            entry = self._verified(key, self.root, layer="root", hit=True)
        except _Corrupt:
            return None
        if entry is not None:
            # The compile index finds entries through lookup(): count those hits too (a miss is
            # counted by the get_or_build that follows it).
            self._count(hits=1)
        return entry

    def get_or_build(self, components: Mapping[str, Any], build: Callable[[Path], None], *,
                     info: Mapping[str, Any] | None = None) -> CacheEntry:
        """Return the entry for `components`, building it with `build(workdir)` if no process has yet.

        `info` (e.g. {"name": graph name}) is recorded in a new entry's meta.json for `rlxc cache ls`;
        it is not part of the key.
        """
        key = cache_key(components)
        if not self.enabled:
            return self._build_uncached(key, components, build, info)
        for layer in self.layers:
            entry = self._try_layer(layer, key)
            if entry is not None:
                self._count(hits=1, layer_hits=1)
                _debug("cache hit %s in read-only layer %s", key, layer)
                return entry
        try:
            entry = self._verified(key, self.root, layer="root", hit=True)
        except _Corrupt:
            entry = None
        if entry is not None:
            self._count(hits=1)
            _debug("cache hit %s", key)
            return entry
        return self._locked_build(key, components, build, info)

    def _try_layer(self, layer: Path, key: str) -> CacheEntry | None:
        try:
            return self._verified(key, layer, layer=str(layer), hit=True)
        except _Corrupt as exc:
            warnings.warn(f"RLX cache: skipping corrupt entry {key} in read-only layer {layer}: {exc}",
                          CacheWarning, stacklevel=4)
            return None

    def _verified(self, key: str, base: Path, *, layer: str, hit: bool) -> CacheEntry | None:
        """The entry under `base` if it exists and verifies; None if absent; _Corrupt if broken.

        Refusals for unsafe permissions propagate as CacheError.
        """
        d = self.entry_dir(key, base)
        if not d.is_dir():
            return None
        check_private(base, "cache root" if layer == "root" else "read-only cache layer")
        check_private(d.parent, "cache directory")
        check_private(d, "cache entry")
        meta = _read_meta(d, key)
        so = d / LIBRARY
        if not so.is_file():
            raise _Corrupt(f"{LIBRARY} is missing")
        check_private(so, "cached library")
        check_private(d / META, "cache metadata")
        want = meta["files"][LIBRARY]
        try:
            size = so.stat().st_size
            if size != want["size"]:
                raise _Corrupt(f"{LIBRARY} is {size} bytes, meta.json says {want['size']}")
            if file_sha256(so) != want["sha256"]:
                raise _Corrupt(f"{LIBRARY} sha256 does not match meta.json")
        except OSError as exc:
            raise _Corrupt(f"cannot read {LIBRARY}: {exc.strerror}") from None
        if source_in(d) is None:
            raise _Corrupt(f"the generated source ({' or '.join(SOURCES)}) is missing")
        if layer == "root":
            # LRU stamp: one utime per hit, no directory scan.
            with contextlib.suppress(OSError):
                os.utime(d / LAST_USE)
        return CacheEntry(key=key, dir=d, hit=hit, meta=meta, layer=layer)

    def _locked_build(self, key: str, components: Mapping[str, Any], build: Callable[[Path], None],
                      info: Mapping[str, Any] | None = None) -> CacheEntry:
        self._ensure_root()
        try:
            release = acquire_file_lock(self._lock_path(key), 0.0)
        except _LockTimeout:
            self._count(lock_waits=1)
            _debug("cache entry %s is being built by another process; waiting", key)
            timeout = max(self.config.cache_lock_timeout, 0.0)
            try:
                release = acquire_file_lock(self._lock_path(key), timeout)
            except _LockTimeout:
                raise CacheError(
                    f"timed out after {timeout:.0f} s waiting for another process to build cache entry {key} "
                    f"(lock {self._lock_path(key)}); raise RLX_CACHE_LOCK_TIMEOUT or look for a stuck rlx process"
                ) from None
        try:
            return self._build_holding_lock(key, components, build, info)
        finally:
            release()

    def _build_holding_lock(self, key: str, components: Mapping[str, Any],
                            build: Callable[[Path], None], info: Mapping[str, Any] | None = None) -> CacheEntry:
        import shutil
        import tempfile

        final = self.entry_dir(key)
        try:
            entry = self._verified(key, self.root, layer="root", hit=True)
        except _Corrupt as exc:
            self._quarantine(final, str(exc))
            entry = None
        if entry is not None:  # built by the process we waited for
            self._count(hits=1)
            _debug("cache hit %s (built by another process)", key)
            return entry
        self._count(misses=1)
        self._clean_stale_tmp()
        work = Path(tempfile.mkdtemp(prefix=f"{key}.{os.getpid()}.", dir=self.root / "tmp"))
        try:
            meta = _run_build(key, components, build, work, info)
            self._count(builds=1, build_seconds=meta["build_seconds"])
            (work / LAST_USE).touch()
            publish_dir(work, final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        _debug("cache build %s published in %.2f s", key, meta["build_seconds"])
        entry = CacheEntry(key=key, dir=final, hit=False, meta=meta, layer="root")
        self.evict(protect=(key,))
        return entry

    def _build_uncached(self, key: str, components: Mapping[str, Any], build: Callable[[Path], None],
                        info: Mapping[str, Any] | None = None) -> CacheEntry:
        import atexit
        import shutil
        import tempfile

        self._count(misses=1)
        work = Path(tempfile.mkdtemp(prefix="rlx-build-"))
        if not _TEMP_BUILDS:
            atexit.register(_remove_temp_builds)
        _TEMP_BUILDS.append(work)
        try:
            meta = _run_build(key, components, build, work, info)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        self._count(builds=1, build_seconds=meta["build_seconds"])
        return CacheEntry(key=key, dir=work, hit=False, meta=meta, layer="temp")

    # ── counters ──

    def _count(self, **deltas: float) -> None:
        """Add to this process's counters and to the root's persisted ones (`<root>/stats.json`).

        The file is tiny (a dozen numbers) and rewritten atomically under a file lock, so concurrent
        processes never lose an update or leave half a file. Counting must never break a compile: a lock
        held too long or an unwritable root drops the persisted update (the process counters still count).
        """
        for k, v in deltas.items():
            _COUNTERS[k] += v
        if not self.enabled:
            return
        path = self.root / STATS
        try:
            if not self.root.is_dir():
                return
            _mkdir_private(self.root / "locks")
            with _brief_lock(self.root / "locks" / "stats.lock", _STATS_LOCK_TIMEOUT):
                totals = self.persisted_counters()
                for k, v in deltas.items():
                    totals[k] = totals.get(k, 0) + v
                totals["build_seconds"] = round(float(totals.get("build_seconds", 0.0)), 4)
                totals["since"] = totals.get("since") or time.time()
                # One name will do while the stats lock is held (no other writer), so no tempfile (an import
                # a warm hit, which counts itself here, need not pay); `gc` removes one a crash left.
                tmp = self.root / f"{STATS_TEMP_PREFIX}tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as f:
                        json.dump(totals, f, sort_keys=True)
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
        except (OSError, _LockTimeout) as exc:
            _debug("cache counters not persisted: %s", exc)

    def persisted_counters(self) -> dict[str, float]:
        """Counters summed over every process that used this root (zeros when none has yet).

        `since` is when counting started (0 when never).
        """
        out: dict[str, float] = {k: (0.0 if isinstance(v, float) else 0) for k, v in _COUNTERS.items()}
        out["since"] = 0.0
        try:
            doc = json.loads((self.root / STATS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return out
        if isinstance(doc, dict):
            for k, v in doc.items():
                if k in out and isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[k] = v
        return out

    # ── small memos ──

    def memo(self, namespace: str, fingerprint: Mapping[str, Any], compute: Callable[[], Any]) -> Any:
        """A JSON value computed once per `fingerprint` and kept under `<root>/memo/<namespace>/`.

        For expensive probes whose result is a pure function of cheap facts
        (e.g. compiler path, size and mtime -> its `--version` text and flags),
        so a fresh process can skip them. A missing, unreadable or foreign memo
        is recomputed; with the cache disabled `compute()` runs every time.
        """
        if not namespace.isidentifier():
            raise CacheError(f"memo namespace must be an identifier, got {namespace!r}")
        if not self.enabled:
            return compute()
        digest = cache_key(fingerprint)
        path = self.root / "memo" / namespace / f"{digest}.json"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(doc, dict) and doc.get("fingerprint") == digest and "value" in doc:
                check_private(path, "cache memo")
                return doc["value"]
        except (OSError, ValueError):
            pass
        value = compute()
        try:
            text = json.dumps({"fingerprint": digest, "value": value}, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CacheError(f"memo {namespace!r}: value is not JSON: {exc}") from None
        self._ensure_root()
        _mkdir_private(path.parent.parent)
        _mkdir_private(path.parent)
        import tempfile  # a miss's write only: a warm hit reads

        fd, tmp = tempfile.mkstemp(prefix=".memo.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return value

    # ── maintenance ──

    def _quarantine(self, d: Path, reason: str) -> Path | None:
        qdir = self.root / "quarantine"
        _mkdir_private(qdir)
        dest = qdir / f"{d.name}.{int(time.time())}.{os.getpid()}"
        try:
            os.rename(d, dest)
        except OSError as exc:
            raise CacheError(f"cannot quarantine corrupt cache entry {d}: {exc.strerror}") from None
        self._count(quarantined=1)
        warnings.warn(f"RLX cache: entry {d.name} is corrupt ({reason}); moved to {dest} and rebuilding",
                      CacheWarning, stacklevel=5)
        return dest

    def _clean_stale_tmp(self, stale_seconds: float | None = None) -> int:
        """Remove temp dirs of builds whose process died (key lock free) and that are old enough."""
        import shutil

        age = self.stale_seconds if stale_seconds is None else stale_seconds
        tmp = self.root / "tmp"
        removed = 0
        now = time.time()
        try:
            children = list(tmp.iterdir())
        except OSError:
            return 0
        for child in children:
            key = child.name.split(".", 1)[0]
            try:
                if now - child.lstat().st_mtime < age:
                    continue
            except OSError:
                continue
            if not is_key(key):
                shutil.rmtree(child, ignore_errors=True)
                removed += 1
                continue
            try:
                with _brief_lock(self._lock_path(key), 0.0):
                    shutil.rmtree(child, ignore_errors=True)
                    removed += 1
            except (_LockTimeout, OSError):
                continue  # its build is still running
        return removed

    def entries(self, *, layers: bool = True) -> list[EntryInfo]:
        """Every entry of the root (and, with `layers`, of the read-only layers), unverified."""
        out = []
        bases = [(self.root, "root")] + ([(p, str(p)) for p in self.layers] if layers else [])
        for base, name in bases:
            for d in _entry_dirs(base):
                out.append(_info(d, name))
        return out

    def total_bytes(self) -> int:
        return sum(e.bytes for e in self.entries(layers=False))

    def evict(self, max_bytes: int | None = None, protect: tuple[str, ...] = ()) -> list[str]:
        """Delete least recently used root entries until the root holds at most `max_bytes` (LRU).

        Entries in `protect`, entries used in the last `evict_grace_seconds`
        and entries whose key lock is held are kept. Returns the evicted keys.
        """
        import shutil
        import tempfile

        bound = self.config.cache_max_bytes if max_bytes is None else max_bytes
        infos = self.entries(layers=False)
        total = sum(e.bytes for e in infos)
        if total <= bound:
            return []
        import filelock
        now = time.time()
        evicted = []
        for info in sorted(infos, key=lambda e: e.last_use):
            if total <= bound:
                break
            if info.key in protect or now - info.last_use < self.evict_grace_seconds:
                continue
            try:
                with filelock.FileLock(self._lock_path(info.key)).acquire(timeout=0):
                    # Rename first so no reader ever sees a half-deleted entry.
                    trash = Path(tempfile.mkdtemp(prefix="evict.", dir=self.root / "tmp"))
                    os.rename(info.dir, trash / info.key)
                    shutil.rmtree(trash, ignore_errors=True)
            except (filelock.Timeout, OSError):
                continue
            total -= info.bytes
            evicted.append(info.key)
            self._count(evicted=1)
            _debug("cache evicted %s (%d bytes)", info.key, info.bytes)
        return evicted

    def verify(self, *, repair: bool = True) -> list[tuple[str, str]]:
        """Check every root entry's files against meta.json; returns (key, problem) pairs.

        With `repair`, corrupt entries are quarantined (they rebuild on next use).
        Permission problems are reported, never repaired.
        """
        import filelock

        problems = []
        for d in _entry_dirs(self.root):
            key = d.name
            try:
                check_private(d.parent, "cache directory")
                check_private(d, "cache entry")
                meta = _read_meta(d, key)
                for name, want in meta["files"].items():
                    path = d / name
                    if not path.is_file():
                        raise _Corrupt(f"{name} is missing")
                    if path.stat().st_size != want["size"] or file_sha256(path) != want["sha256"]:
                        raise _Corrupt(f"{name} does not match its checksum")
                    check_private(path, "cached file")
                problems += _verify_stored(d, repair=repair)
            except CacheError as exc:
                problems.append((key, str(exc)))
            except (_Corrupt, OSError) as exc:
                problems.append((key, str(exc)))
                if repair:
                    with contextlib.suppress(filelock.Timeout), \
                            filelock.FileLock(self._lock_path(key)).acquire(timeout=0):
                        self._quarantine(d, str(exc))
        return problems

    def gc(self, *, stale_seconds: float | None = None, quarantine_days: float = 7.0) -> dict[str, int]:
        """Remove crashed builds' temp dirs, old quarantined entries, and evict to the size bound."""
        import shutil

        if not self.root.is_dir():
            return {"tmp": 0, "quarantine": 0, "evicted": 0}
        check_private(self.root, "cache root")
        removed_tmp = self._clean_stale_tmp(stale_seconds)
        # Temp files of a stats.json update whose process died between writing and renaming.
        for tmp in self.root.glob(f"{STATS_TEMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                if time.time() - tmp.lstat().st_mtime >= self.stale_seconds:
                    tmp.unlink()
        # Temp files of stored params (param_store) whose writer died before renaming them.
        for d in _entry_dirs(self.root):
            for path, _ in _stored_files(d):
                with contextlib.suppress(OSError):
                    if path.name.startswith(".") and time.time() - path.lstat().st_mtime >= self.stale_seconds:
                        path.unlink()
        removed_q = 0
        qdir = self.root / "quarantine"
        if qdir.is_dir():
            for child in qdir.iterdir():
                try:
                    old = time.time() - child.lstat().st_mtime >= quarantine_days * 86400
                except OSError:
                    continue
                if old:
                    shutil.rmtree(child, ignore_errors=True)
                    removed_q += 1
        evicted = self.evict()
        return {"tmp": removed_tmp, "quarantine": removed_q, "evicted": len(evicted)}

    def clear(self) -> int:
        """Delete every entry of the writable root (and the quarantine, the compiled kernel units and
        templates); returns the number of entries."""
        import shutil
        import tempfile

        if not self.root.is_dir():
            return 0
        check_private(self.root, "cache root")
        n = 0
        for d in _entry_dirs(self.root):
            _mkdir_private(self.root / "tmp")
            trash = Path(tempfile.mkdtemp(prefix="clear.", dir=self.root / "tmp"))
            with contextlib.suppress(OSError):
                os.rename(d, trash / d.name)
                n += 1
            shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(self.root / "quarantine", ignore_errors=True)
        for shared in ("units", "templates"):  # renamed away first: a reader never sees half a directory
            if (self.root / shared).is_dir():
                _mkdir_private(self.root / "tmp")
                trash = Path(tempfile.mkdtemp(prefix="clear.", dir=self.root / "tmp"))
                with contextlib.suppress(OSError):
                    os.rename(self.root / shared, trash / shared)
                shutil.rmtree(trash, ignore_errors=True)
        return n

    def resolve(self, key_prefix: str) -> list[EntryInfo]:
        """Entries (root and layers) whose key starts with `key_prefix`."""
        return [e for e in self.entries() if e.key.startswith(key_prefix.lower())]

    def explain(self, key_or_components: str | Mapping[str, Any]) -> Explanation:
        """Why a key misses: the nearest cached entry and which components differ from it.

        Pass the components the compiler would use (a key alone can only say
        whether it is cached, since a hash cannot be compared component-wise).
        """
        from rlx.toolchain.cache_report import Difference, Explanation

        if isinstance(key_or_components, str):
            matches = self.resolve(key_or_components) if key_or_components else []
            if len(matches) == 1:
                return Explanation(key=matches[0].key, hit=True, where=matches[0].dir)
            note = ("no cached entry has this key; pass the graph or components to see which component differs"
                    if not matches else f"{len(matches)} entries start with this prefix; give more digits")
            return Explanation(key=key_or_components, hit=False, note=note)
        key = cache_key(key_or_components)
        wanted = json.loads(canonical_components(key_or_components))
        best: tuple[int, float, EntryInfo, list[Difference]] | None = None
        for info in self.entries():
            if info.key == key:
                return Explanation(key=key, hit=True, where=info.dir)
            diffs = [Difference(name, wanted.get(name), info.components.get(name))
                     for name in sorted(set(wanted) | set(info.components))
                     if wanted.get(name) != info.components.get(name)]
            rank = (len(diffs), -info.last_use)
            if best is None or rank < best[:2]:
                best = (rank[0], rank[1], info, diffs)
        if best is None:
            return Explanation(key=key, hit=False, note="the cache is empty")
        return Explanation(key=key, hit=False, nearest=best[2].key, differences=tuple(best[3]))

    def stat(self) -> dict[str, Any]:
        """On-disk summary of the root and layers, plus the counters of every process that used the root.

        With the cache disabled there is no root to keep counts in: the counters are this process's.
        """
        infos = self.entries(layers=False)
        qdir = self.root / "quarantine"
        tmp = self.root / "tmp"
        return {
            "enabled": self.enabled,
            "root": str(self.root),
            "layers": [str(p) for p in self.layers],
            "entries": len(infos),
            "bytes": sum(e.bytes for e in infos),
            "max_bytes": self.config.cache_max_bytes,
            "layer_entries": sum(len(list(_entry_dirs(p))) for p in self.layers),
            "quarantined_on_disk": len(list(qdir.iterdir())) if qdir.is_dir() else 0,
            "tmp_dirs": len(list(tmp.iterdir())) if tmp.is_dir() else 0,
            **{k: (round(v, 3) if isinstance(v, float) else v)
               for k, v in (self.persisted_counters() if self.enabled else {**_COUNTERS, "since": 0.0}).items()},
        }


# ── helpers ──────────────────────────────────────────────────────────────


class _LockTimeout(Exception):
    """Internal: `acquire_file_lock` did not get the lock in time."""


def acquire_file_lock(path: Path, timeout: float) -> Callable[[], None]:
    """Lock `path` exclusively, waiting at most `timeout` seconds (0: one try); returns the release.

    `fcntl.flock` on the lock file, as filelock does on POSIX (so the two exclude each other), without
    importing filelock, which a build or a warm hit would otherwise pay for (~15-25 ms). The OS drops
    the lock of a process that dies. Raises `_LockTimeout`. Elsewhere than POSIX: filelock.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX
        import filelock

        lock = filelock.FileLock(path)
        try:
            lock.acquire(timeout=timeout)
        except filelock.Timeout:
            raise _LockTimeout(f"{path} held for more than {timeout} s") from None
        return lock.release
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        pause = 0.002
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _LockTimeout(f"{path} held for more than {timeout} s") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
    except BaseException:
        os.close(fd)
        raise

    def release() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    return release


@contextlib.contextmanager
def _brief_lock(path: Path, timeout: float) -> Iterator[None]:
    """`acquire_file_lock` for a few file operations (the stats update every hit makes)."""
    release = acquire_file_lock(path, timeout)
    try:
        yield
    finally:
        release()


def _run_build(key: str, components: Mapping[str, Any], build: Callable[[Path], None], work: Path,
               info: Mapping[str, Any] | None = None) -> dict:
    t0 = time.time()
    build(work)
    elapsed = time.time() - t0
    if source_in(work) is None:
        raise BuildError(f"the build for cache entry {key} did not produce {' or '.join(SOURCES)} in {work}")
    if not (work / LIBRARY).is_file():
        raise BuildError(f"the build for cache entry {key} did not produce {LIBRARY} in {work}")
    files = {}
    for path in sorted(p for p in work.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(work).as_posix()
        # Drop group/other write bits a permissive umask may have left: such entries would be refused.
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o022:
            os.chmod(path, mode & ~0o022)
        files[rel] = {"sha256": file_sha256(path), "size": path.stat().st_size}
    for sub in (p for p in work.rglob("*") if p.is_dir()):
        os.chmod(sub, stat.S_IMODE(sub.stat().st_mode) & ~0o022)
    _COUNTERS["builds"] += 1
    _COUNTERS["build_seconds"] += elapsed
    from rlx.version import __version__

    meta = {
        "format": CACHE_FORMAT,
        "key": key,
        "components": json.loads(canonical_components(components)),
        "files": files,
        "bytes": sum(f["size"] for f in files.values()),
        "created": t0 + elapsed,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0 + elapsed)),
        "build_seconds": round(elapsed, 4),
        "rlx_version": __version__,
    }
    if info:
        meta["info"] = {str(k): v for k, v in info.items() if isinstance(v, (str, int, float, bool))}
    text = json.dumps(meta, indent=1, sort_keys=True)
    (work / META).write_text(text + "\n", encoding="utf-8")
    os.chmod(work / META, 0o644)
    return meta


def _read_meta(d: Path, key: str) -> dict:
    try:
        meta = json.loads((d / META).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _Corrupt(f"{META} is missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _Corrupt(f"{META} is unreadable: {exc}") from None
    try:
        ok = (meta["format"] == CACHE_FORMAT and meta["key"] == key and isinstance(meta["components"], dict)
              and isinstance(meta["files"][LIBRARY]["sha256"], str) and isinstance(meta["files"][LIBRARY]["size"], int))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise _Corrupt(f"{META} does not describe entry {key}")
    return meta


def _entry_dirs(base: Path) -> Iterator[Path]:
    try:
        shards = sorted(base.iterdir())
    except OSError:
        return
    for shard in shards:
        if len(shard.name) != 2 or not set(shard.name) <= _KEY_CHARS or not shard.is_dir():
            continue
        try:
            children = sorted(shard.iterdir())
        except OSError:
            continue
        for d in children:
            if is_key(d.name) and d.name.startswith(shard.name) and d.is_dir():
                yield d


def _info(d: Path, layer: str) -> EntryInfo:
    from rlx.toolchain.cache_report import EntryInfo

    name = ""
    try:
        meta = json.loads((d / META).read_text(encoding="utf-8"))
        components = meta.get("components", {}) if isinstance(meta, dict) else {}
        created = float(meta.get("created", 0.0))
        nbytes = int(meta.get("bytes", 0))
        info = meta.get("info")
        if isinstance(info, dict) and isinstance(info.get("name"), str):
            name = info["name"]
    except (OSError, ValueError, TypeError, AttributeError):
        components, created, nbytes = {}, 0.0, 0
    if not nbytes:
        nbytes = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    else:  # meta.json counts the build's files; the params kept beside them since (param_store) count too
        nbytes += sum(size for _, size in _stored_files(d))
    try:
        last_use = (d / LAST_USE).stat().st_mtime
    except OSError:
        last_use = created
    return EntryInfo(key=d.name, dir=d, layer=layer, bytes=nbytes, created=created, last_use=last_use,
                     components=components if isinstance(components, dict) else {}, name=name or _source_name(d))


def _stored_files(d: Path) -> list[tuple[Path, int]]:
    """The files of entry `d`'s stored params (`rlx.toolchain.param_store`), with their sizes."""
    out = []
    with contextlib.suppress(OSError):
        for child in os.scandir(d / stored_file.PACKED_DIR):
            with contextlib.suppress(OSError):
                if child.is_file(follow_symlinks=False):
                    out.append((Path(child.path), child.stat(follow_symlinks=False).st_size))
    return out


def _verify_stored(d: Path, *, repair: bool) -> list[tuple[str, str]]:
    """Problems of entry `d`'s stored params (header, size, payload sha256); with `repair` a broken one is
    removed (the next process to set that param converts it again and keeps it anew)."""
    problems = []
    for path, _ in _stored_files(d):
        if path.name.startswith("."):  # a write in progress, or one a crash left (gc removes it)
            continue
        problem = stored_file.verify(path)
        if problem is not None:
            problems.append((d.name, f"stored param {path.name}: {problem}"))
            if repair:
                with contextlib.suppress(OSError):
                    path.unlink()
    return problems


# The generated sources name their graph in the header comment: "* graph  : NAME" (C) and
# 'for graph "NAME"' (CUDA). Entries built before meta.json recorded "info" are named from there.
_SOURCE_NAME_RE = re.compile(rb'^\s*\*\s*graph\s*:\s*(\S+)|for graph "([^"\n]{1,200})"', re.MULTILINE)


def _source_name(d: Path) -> str:
    source = source_in(d)
    if source is None:
        return ""
    try:
        with open(source, "rb") as f:
            head = f.read(4096)
    except OSError:
        return ""
    m = _SOURCE_NAME_RE.search(head)
    return (m.group(1) or m.group(2)).decode("utf-8", "replace") if m else ""


def _fsync_path(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir_tree(work: Path) -> None:
    # The rename publishes the entry; make its contents durable first so a power loss cannot leave
    # a published entry with empty files (verification would catch it, but a rebuild is wasted).
    for path in work.rglob("*"):
        if path.is_file():
            _fsync_path(path)
    _fsync_path(work)


def publish_dir(work: Path, final: Path) -> None:
    """Publish the finished build directory `work` as `final` (atomic rename into a private parent):
    its contents made durable first, readable by others, the parent's entry synced after."""
    _mkdir_private(final.parent)
    check_private(final.parent, "cache directory")
    _fsync_dir_tree(work)
    os.chmod(work, 0o755)
    os.rename(work, final)
    _fsync_path(final.parent)


def _remove_temp_builds() -> None:
    import shutil

    for d in _TEMP_BUILDS:
        shutil.rmtree(d, ignore_errors=True)


# ── module-level conveniences (the `rlx.cache` facade re-exports these) ──


def stats(config: Config | None = None) -> dict[str, Any]:
    """Counters (hits, misses, builds, ...) of every process that used the cache root, and its size on disk.

    >>> sorted(k for k in stats() if k in ("hits", "misses", "builds", "bytes"))
    ['builds', 'bytes', 'hits', 'misses']
    """
    return AotCache(config).stat()


def explain(key_or_components: str | Mapping[str, Any], config: Config | None = None) -> Explanation:
    """`AotCache(config).explain(...)`: which key component differs from the nearest cached entry."""
    return AotCache(config).explain(key_or_components)

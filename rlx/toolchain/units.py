"""Kernel units: fixed kernel code compiled once per toolchain and linked into every program using it.

A fixed kernel header `templates/cpu/kernels/NAME.h` may come with a translation unit
`kernels/NAME.c` that defines the functions the header declares (e.g. `packed_core.c`, the packed
GEMM's unrolled AVX-512 / AVX2 micro-kernel; `quant.c`, the quantized matmuls' kernels, one entry
point per block format). Such code does not depend on the graph, so it is not
compiled again into every program: the first build that needs it compiles it with the program's
own flags into an object kept in the AOT cache root, and every program whose source includes the
header (directly or through another kernel header) links that object. A small graph's own file
then no longer parses `<immintrin.h>` nor optimizes the unrolled tiles, which was most of its
C compiler time.

Never stale: a unit's key is the sha256 of the compiler's identity, the flags, the target
options (ISA, OpenMP, sanitizer) and the text of the unit and of every file it includes from the
templates directory (followed transitively). A changed header, flag, compiler or CPU is another
key; a header the unit does not include never rebuilds it, so new kernel headers cost nothing.

An object lives in `<root>/units/<key[:2]>/<key>/` (`unit.o`, `unit.c` as compiled, `meta.json`
with the object's sha256 and size). It is built in a private directory under `<root>/tmp/` while
holding `<root>/locks/<key>.lock` (concurrent builders compile it once; the others wait and use
it) and published by one atomic rename. Every use checks the object against meta.json: a
corrupt or truncated object is moved to `<root>/quarantine/` with a `CacheWarning` naming the
problem, and built again. With the cache disabled a unit is compiled into the build's own
directory each time.

>>> from pathlib import Path
>>> [p.name for p in units_for('#include "kernels/packed_gemm.h"\\n')]
['packed_core.c']
>>> [p.name for p in units_for('#include "kernels/quant.h"\\n')]
['packed_core.c', 'quant.c']
>>> units_for('#include "kernels/scalar.h"\\n')
()
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

from rlx.config import Config
from rlx.errors import BuildError, CacheError
from rlx.templates_path import templates_dir
from rlx.toolchain.cache import (
    AotCache,
    CacheWarning,
    _LockTimeout,
    _mkdir_private,
    acquire_file_lock,
    cache_key,
    check_private,
    file_sha256,
    publish_dir,
)
from rlx.toolchain.compiler import Toolchain

#: Version of a unit entry's layout; part of every unit key.
UNIT_FORMAT = 1
OBJECT = "unit.o"
SOURCE = "unit.c"
META = "meta.json"

_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)


def _root() -> Path:
    return templates_dir() / "cpu"


def _resolve(name: str, including: Path, root: Path) -> Path | None:
    """Where `#include "name"` in `including` finds a file of the templates directory (None: elsewhere)."""
    for base in (including.parent, root):
        path = base / name
        if path.is_file():
            return path
    return None


def _closure(text: str, origin: Path, root: Path) -> list[Path]:
    """Every templates file `text` (the content of `origin`) includes, transitively, in include order."""
    seen: dict[Path, None] = {}
    stack = [(text, origin)]
    while stack:
        body, where = stack.pop()
        for name in _INCLUDE_RE.findall(body):
            path = _resolve(name, where, root)
            if path is None or path in seen:
                continue
            seen[path] = None
            stack.append((path.read_text(encoding="utf-8"), path))
    return list(seen)


def units_for(source: str) -> tuple[Path, ...]:
    """The kernel units a rendered program needs: `kernels/NAME.c` for every `kernels/NAME.h` it includes
    (directly or through another kernel header), in a stable order."""
    root = _root()
    headers = _closure(source, root / "model.c", root)
    return tuple(sorted({h.with_suffix(".c") for h in headers
                         if h.suffix == ".h" and h.with_suffix(".c").is_file()}))


def unit_components(unit: Path, toolchain: Toolchain) -> dict[str, str]:
    """What a unit's object depends on (its cache key is the digest of these)."""
    root = _root()
    h = hashlib.sha256()
    text = unit.read_text(encoding="utf-8")
    for path in [unit, *_closure(text, unit, root)]:
        with contextlib.suppress(ValueError):
            h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return {
        "kind": f"kernel-unit/{UNIT_FORMAT}",
        "unit": unit.stem,
        "unit_sources": h.hexdigest(),
        "compiler": toolchain.compiler_identity(),
        "flags": " ".join(toolchain.object_flags),
        "target_options": f"isa={toolchain.isa} isa_digest={toolchain.isa_identity} "
                          f"openmp={toolchain.openmp} sanitize={toolchain.sanitize or 'none'}",
    }


class _Corrupt(Exception):
    """Internal: a unit entry failed verification (the message says how)."""


class UnitStore:
    """Compiled kernel units under `<root>/units/` (see the module docstring)."""

    def __init__(self, config: Config | None = None) -> None:
        self.cache = AotCache(config)

    @property
    def enabled(self) -> bool:
        return self.cache.enabled

    def entry_dir(self, key: str) -> Path:
        return self.cache.root / "units" / key[:2] / key

    def cached(self, unit: Path, toolchain: Toolchain) -> Path | None:
        """The verified object of `unit` for `toolchain`, or None when it must be built (absent or corrupt)."""
        if not self.enabled:
            return None
        key = cache_key(unit_components(unit, toolchain))
        try:
            return self._verified(key)
        except _Corrupt:
            return None

    def get(self, unit: Path, toolchain: Toolchain, workdir: Path) -> Path:
        """The object of `unit`: from the store, else compiled once (across processes) into it.

        With the cache disabled, compiled into `workdir`.
        """
        if not self.enabled:
            out = workdir / f"{unit.stem}.unit.o"
            toolchain.compile_object(unit, out)
            return out
        components = unit_components(unit, toolchain)
        key = cache_key(components)
        try:
            found = self._verified(key)
        except _Corrupt:
            found = None  # quarantined under the lock below
        if found is not None:
            return found
        return self._locked_build(key, components, unit, toolchain)

    def _verified(self, key: str) -> Path | None:
        d = self.entry_dir(key)
        if not d.is_dir():
            return None
        check_private(d.parent, "cache directory")
        check_private(d, "kernel unit entry")
        obj = d / OBJECT
        try:
            meta = json.loads((d / META).read_text(encoding="utf-8"))
            want = meta["object"]
            if meta.get("key") != key or not isinstance(want, dict):
                raise _Corrupt(f"{META} does not describe unit entry {key}")
        except FileNotFoundError:
            raise _Corrupt(f"{META} is missing") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _Corrupt(f"{META} is unreadable: {exc}") from None
        if not obj.is_file():
            raise _Corrupt(f"{OBJECT} is missing")
        check_private(obj, "cached kernel unit object")  # another user's file is refused, never repaired
        size = obj.stat().st_size
        if size != want.get("size"):
            raise _Corrupt(f"{OBJECT} is {size} bytes, {META} says {want.get('size')}")
        if file_sha256(obj) != want.get("sha256"):
            raise _Corrupt(f"{OBJECT} sha256 does not match {META}")
        return obj

    def _locked_build(self, key: str, components: dict[str, str], unit: Path, toolchain: Toolchain) -> Path:
        cache = self.cache
        cache._ensure_root()
        timeout = max(cache.config.cache_lock_timeout, 0.0)
        try:
            release = acquire_file_lock(cache._lock_path(key), timeout)
        except _LockTimeout:
            raise CacheError(f"timed out after {timeout:.0f} s waiting for another process to compile kernel "
                             f"unit {unit.name} (lock {cache._lock_path(key)}); raise RLX_CACHE_LOCK_TIMEOUT "
                             "or look for a stuck rlx process") from None
        try:
            try:
                found = self._verified(key)
            except _Corrupt as exc:
                self._quarantine(key, unit, str(exc))
                found = None
            if found is not None:  # compiled by the process we waited for
                return found
            return self._build(key, components, unit, toolchain)
        finally:
            release()

    def _build(self, key: str, components: dict[str, str], unit: Path, toolchain: Toolchain) -> Path:
        cache = self.cache
        work = Path(tempfile.mkdtemp(prefix=f"{key}.{os.getpid()}.", dir=cache.root / "tmp"))
        final = self.entry_dir(key)
        try:
            t0 = time.time()
            shutil.copyfile(unit, work / SOURCE)  # what was compiled, for the curious; never read back
            toolchain.compile_object(unit, work / OBJECT)
            meta = {
                "format": UNIT_FORMAT, "key": key, "components": components,
                "object": {"sha256": file_sha256(work / OBJECT), "size": (work / OBJECT).stat().st_size},
                "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(time.time() - t0, 4),
            }
            (work / META).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            for path in work.iterdir():
                os.chmod(path, 0o644)
            _mkdir_private(final.parent.parent)
            publish_dir(work, final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return final / OBJECT

    def _quarantine(self, key: str, unit: Path, reason: str) -> None:
        d = self.entry_dir(key)
        qdir = self.cache.root / "quarantine"
        _mkdir_private(qdir)
        # a fresh directory per quarantine: the same unit may be quarantined twice within a second
        dest = Path(tempfile.mkdtemp(prefix=f"unit-{key}.{int(time.time())}.", dir=qdir)) / "entry"
        try:
            os.rename(d, dest)
        except OSError as exc:
            raise CacheError(f"cannot quarantine corrupt kernel unit entry {d}: {exc.strerror}") from None
        warnings.warn(f"RLX cache: the compiled kernel unit {unit.name} ({key[:12]}) is corrupt ({reason}); "
                      f"moved to {dest} and compiling it again", CacheWarning, stacklevel=2)


def compile_program(toolchain: Toolchain, source: Path, output: Path, config: Config | None = None,
                    units: Iterable[Path] | None = None) -> tuple[Path, ...]:
    """Build the program `source` into the shared object `output`, linked with its kernel units.

    `units` defaults to `units_for(source's text)`. When every unit's object is cached this is one
    compiler command, as without units; otherwise the missing units compile in threads while the
    program's file compiles, and the objects are linked after. Returns the unit objects linked.
    """
    units = tuple(units_for(source.read_text(encoding="utf-8")) if units is None else units)
    if not units:
        toolchain.compile(source, output)
        return ()
    store = UnitStore(config)
    workdir = output.parent
    objects: dict[Path, Path | None] = {u: store.cached(u, toolchain) for u in units}
    missing = [u for u, obj in objects.items() if obj is None]
    if not missing:
        linked = tuple(obj for obj in objects.values() if obj is not None)
        toolchain.compile(source, output, objects=linked)
        return linked
    errors: list[BaseException] = []

    def build(unit: Path) -> None:
        try:
            objects[unit] = store.get(unit, toolchain, workdir)
        except BaseException as exc:  # re-raised on the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(u,), name=f"rlx-unit-{u.stem}") for u in missing]
    for t in threads:
        t.start()
    program = output.with_name(output.stem + ".program.o")
    try:
        toolchain.compile_object(source, program)
    finally:
        for t in threads:
            t.join()
    if errors:
        program.unlink(missing_ok=True)
        exc = errors[0]
        if isinstance(exc, BuildError):
            raise BuildError(f"compiling a kernel unit failed: {exc}") from None
        raise exc
    linked = tuple(obj for obj in objects.values() if obj is not None)
    try:
        toolchain.link((program, *linked), output)
    finally:
        program.unlink(missing_ok=True)
        if not store.enabled:
            for obj in linked:
                obj.unlink(missing_ok=True)
    return linked

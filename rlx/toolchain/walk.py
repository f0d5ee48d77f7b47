"""Listing the files under a folder quickly, and digesting them by their stat signature: the compile index and
the template digests list them on every warm start, where `Path.rglob` and Path objects cost several times more
than `os.scandir`, and reading them all would cost more still."""

from __future__ import annotations

import hashlib
import os
from typing import Any


def entries_under(top: str) -> list[tuple[str, os.DirEntry]]:
    """(path relative to `top` in posix form, its `os.DirEntry`) of everything under `top` that is not a
    folder, outside `__pycache__` folders, unsorted; a missing folder lists nothing.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     (pathlib.Path(d) / "a" / "__pycache__").mkdir(parents=True)
    ...     for name in ("a/x.txt", "a/__pycache__/y.pyc", "z.txt"):
    ...         _ = (pathlib.Path(d) / name).write_text("")
    ...     sorted(rel for rel, _ in entries_under(d))
    ['a/x.txt', 'z.txt']
    """
    found: list[tuple[str, os.DirEntry]] = []
    stack = [("", top)]
    while stack:
        prefix, folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_dir():
                if entry.name != "__pycache__":
                    stack.append((prefix + entry.name + "/", entry.path))
            else:
                found.append((prefix + entry.name, entry))
    return found


def files_with_stats(top: str, suffix: str = "") -> list[tuple[str, str, os.stat_result]]:
    """(path relative to `top` in posix form, path, stat) of the files under `top` whose names end with
    `suffix`, outside __pycache__, in the order of their relative paths' parts (the scandir entries carry
    their stat: listing them costs no extra system call per file on Linux)."""
    return sorted(((rel, e.path, e.stat()) for rel, e in entries_under(top) if e.name.endswith(suffix)),
                  key=lambda f: f[0].split("/"))


#: stat_digest's latest (signature, digest) in this process, by slot.
_latest: dict[str, tuple[tuple, str]] = {}


def stat_digest(name: str, files: list[tuple[str, str, os.stat_result]], cache: Any = None,
                slot: str | None = None) -> str:
    """sha256 over `files` (label, path, stat), each its label, NUL, its content, NUL, in the order given.

    The files are read only when their signature changed: each one's label, size, mtime, ctime and inode.
    An edit changes the mtime and the ctime (which no tool sets back), a replaced file (a checkout, a
    reinstall) its inode or ctime. The digest of the current signature is kept in this process (one per
    `slot`, default `name`) and, given an enabled `AotCache`, in its memo `name`, so a fresh process whose
    files did not change stats them and reads none.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (pathlib.Path(d) / "a.txt").write_text("x")
    ...     files = files_with_stats(d)
    ...     stat_digest("doctest", files) == stat_digest("doctest", files_with_stats(d))
    True
    """
    signature = tuple((label, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) for label, _, st in files)
    key = slot or name
    held = _latest.get(key)
    if held is not None and held[0] == signature:
        return held[1]

    def digest() -> str:
        h = hashlib.sha256()
        for label, path, _ in files:
            with open(path, "rb") as fh:
                h.update(label.encode() + b"\0" + fh.read() + b"\0")
        return h.hexdigest()

    if cache is not None and cache.enabled:
        value = cache.memo(name, {"files": hashlib.sha256(repr(signature).encode()).hexdigest()}, digest)
    else:
        value = digest()
    _latest[key] = (signature, value)
    return value

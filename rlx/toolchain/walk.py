"""Listing the files under a folder quickly: the compile index and the template digests list them on every
warm start, where `Path.rglob` and Path objects cost several times more than `os.scandir`."""

from __future__ import annotations

import os


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

"""Jinja environments for the code generators, and their compiled templates kept between processes.

Compiling the Jinja templates (template text → Python code → bytecode) took about a third of a
small graph's cold build. `environment(subdir, bytecode_dir)` returns one environment per templates
directory and process, so a process compiles each template once (Jinja still reloads a template
whose file changed); with `bytecode_dir` (the toolchain passes a private directory of the AOT cache
root), the compiled templates are also written there and the next process loads them instead of
compiling.

A stored template is used only when it is certainly the one its source compiles to: the file
name is Jinja's bucket key (template name and path), the directory name holds the Jinja version,
the Python bytecode tag and a digest of the environment's options, Jinja itself compares a
checksum of the template's current source, and RLX prefixes the file with the sha256 of the rest,
so a torn or corrupt file is compiled again (and rewritten), never loaded. Files not owned by
this user (or root), or writable by others, are ignored.

>>> env = environment("cpu")
>>> env is environment("cpu")
True
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

import jinja2
import jinja2.bccache

from rlx.codegen.activations import install
from rlx.templates_path import templates_dir

log = logging.getLogger("rlx.codegen")

#: The options of every code generator's environment (part of the stored templates' directory name).
OPTIONS: dict[str, Any] = {
    "undefined": jinja2.StrictUndefined,
    "trim_blocks": True,
    "lstrip_blocks": True,
    "keep_trailing_newline": True,
    "autoescape": False,
}
_DIGEST_BYTES = 32


def bytecode_tag() -> str:
    """The subdirectory name of stored templates: what else decides the compiled code.

    >>> bytecode_tag().startswith("jinja-")
    True
    """
    options = json.dumps({k: (v.__name__ if isinstance(v, type) else v) for k, v in OPTIONS.items()},
                         sort_keys=True)
    digest = hashlib.sha256(options.encode()).hexdigest()[:16]
    return f"jinja-{jinja2.__version__}-{sys.implementation.cache_tag}-{digest}"


class VerifiedBytecodeCache(jinja2.BytecodeCache):
    """Jinja's compiled templates in `directory`, each file prefixed with the sha256 of its payload."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _path(self, bucket: jinja2.bccache.Bucket) -> Path:
        return self.directory / f"{bucket.key}.bc"

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        path = self._path(bucket)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
        except OSError:
            return
        if not _trusted(st):
            log.debug("ignoring compiled template %s: not private to this user", path)
            return
        digest, payload = data[:_DIGEST_BYTES], data[_DIGEST_BYTES:]
        if len(digest) != _DIGEST_BYTES or hashlib.sha256(payload).digest() != digest:
            log.warning("RLX: compiled template %s is corrupt (checksum mismatch); compiling it again", path)
            return
        # Jinja checks its magic (version) and the template source's checksum, and resets on a mismatch.
        bucket.bytecode_from_string(payload)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        payload = bucket.bytecode_to_string()
        path = self._path(bucket)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{bucket.key}.", dir=self.directory)
        except OSError as exc:
            log.debug("compiled template not stored: %s", exc)
            return
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
        except OSError as exc:
            log.debug("compiled template not stored: %s", exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _trusted(st: os.stat_result) -> bool:
    if hasattr(os, "getuid") and st.st_uid not in (os.getuid(), 0):
        return False
    return not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@functools.lru_cache(maxsize=16)
def _environment(root: str, bytecode_dir: str) -> jinja2.Environment:
    cache = VerifiedBytecodeCache(Path(bytecode_dir)) if bytecode_dir else None
    return install(jinja2.Environment(loader=jinja2.FileSystemLoader(root), bytecode_cache=cache, **OPTIONS))


def environment(subdir: str = "", bytecode_dir: Path | None = None) -> jinja2.Environment:
    """The process's Jinja environment over `templates/<subdir>` (compiled templates kept in
    `bytecode_dir`, which the caller has checked is private, when given)."""
    root = templates_dir() / subdir if subdir else templates_dir()
    return _environment(str(root), str(bytecode_dir) if bytecode_dir is not None else "")


def header_text(name: str) -> str:
    """The text of the fixed kernel header `name` (a path under the templates directory), inserted verbatim into a
    rendered source (never parsed as a template: inline asm braces would read as Jinja). Read once per templates
    directory: `RLX_TEMPLATES_DIR` changed inside a process renders the other directory's headers too.

    >>> "rlx_gemm_small" in header_text("cuda/kernels/gemm_small.cuh")
    True
    """
    return _header_in(str(templates_dir()), name)


@functools.cache
def _header_in(root: str, name: str) -> str:
    return (Path(root) / name).read_text()

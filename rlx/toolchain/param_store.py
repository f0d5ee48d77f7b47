"""Params kept in the layout a library stores them, next to the library in the AOT cache.

`CompiledGraph.set_param` packs a GEMM weight into panels for the library's kernel (or permutes,
quantizes or widens it) every time a process sets it: for MiniLM 42 MB, ~20-80 ms of a warm start
(the packing and the page faults of a fresh param storage). When the weight is a read-only view of a
file mapped by `map_file` (what `rlx.models.weights.load_safetensors(mapped=True)` gives), the stored
bytes (`rlx_param_stored`) are written once to `<entry>/packed/<key>.bin` beside the entry's
`model.so`, and a later process maps that file and binds it (`rlx_bind_stored`): no packing, and only
the pages a run reads are faulted in, from the page cache.

What keeps a stored param from ever being stale:

- it lives in the directory of the very library whose layout it holds (the entry's key covers the
  generated code, the compiler, flags and ISA; evicting or clearing the entry removes it too);
- its key (the file name, repeated in the header) is the digest of the param (index, name, stored
  size) and of its source: the weights file's path and stat signature (device, inode, size, mtime
  and ctime in ns), taken by `map_file` with `fstat` on the descriptor it maps (so of the very file
  mapped, not of whatever a rename put at the path since), and the array's offset, dtype, shape and
  strides in it. Rewriting the file changes its mtime and ctime (nothing sets a ctime back); replacing
  it gives another inode. The signature is checked again against the path when the param is set
  (a changed file is packed as usual, never looked up nor kept);
- a param is kept only when its file has been unchanged for `SETTLE_SECONDS` (its ctime is older),
  and the signature is the same after packing as before: two versions of a file written within one
  tick of a coarse file-system clock would share a signature, and a file rewritten while it was being
  packed would be kept under the old one;
- the file is written under a temp name, made durable, then renamed: it is complete or absent. A
  load checks its owner and mode (as the cache's `check_private`), magic, format, key and size; the
  payload's sha256, recorded in the header, is checked by `rlxc cache verify` (`stored_file.verify`), not by
  each load (hashing 42 MB costs what packing does).

Only the writable cache root's entries are written; read-only layers' are read. With the cache
disabled, or a library not in the cache, `for_library` gives None and every param is packed as before.

>>> import tempfile, numpy as np
>>> tmp = tempfile.TemporaryDirectory()
>>> path = Path(tmp.name) / "w.bin"
>>> _ = path.write_bytes(np.arange(8, dtype=np.float32).tobytes())
>>> view = map_file(path, 0, 32).view(np.float32)[2:6]
>>> src = mapped_source(view)
>>> (src.offset, src.nbytes, src.settled(now=src.signature[4] / 1e9 + SETTLE_SECONDS))
(8, 16, True)
>>> mapped_source(np.arange(3.0)) is None
True
>>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import stat
import time
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from rlx.config import Config
from rlx.errors import CacheError
from rlx.toolchain.cache import _mkdir_private, cache_key, check_private, is_key
from rlx.toolchain.stored_file import FORMAT, HEADER_BYTES, PACKED_DIR, header, parse_header

#: A weights file changed less than this many seconds ago is not trusted to have a unique signature (see above).
SETTLE_SECONDS = 2.0
#: The attribute `map_file` sets on the `numpy.memmap` it returns: the mapped file's stat signature.
_SIGNATURE_ATTR = "_rlx_file_signature"


def _signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def map_file(file: str | Path | BinaryIO, offset: int, size: int) -> np.memmap:
    """Bytes `[offset, offset + size)` of `file` (a path, or a file open for reading, whose name is its path),
    mapped read-only (`numpy.memmap`, uint8), recording the stat signature of the file mapped (`fstat` of
    the descriptor mapped), so params set from views of it can be kept in their stored layout
    (`mapped_source`)."""
    if isinstance(file, (str, Path)):
        with open(file, "rb") as fh:
            return map_file(fh, offset, size)
    st = os.fstat(file.fileno())
    data = np.memmap(file, np.uint8, mode="r", offset=offset, shape=(size,))
    setattr(data, _SIGNATURE_ATTR, _signature(st))
    return data


class Source:
    """Where a param's values are: a read-only view of a file `map_file` mapped."""

    __slots__ = ("dtype", "nbytes", "offset", "path", "shape", "signature", "strides")

    def __init__(self, path: str, signature: tuple[int, ...], offset: int, arr: np.ndarray) -> None:
        self.path = path
        self.signature = signature
        self.offset = offset
        self.nbytes = int(arr.nbytes)
        self.dtype = arr.dtype.str
        self.shape = list(arr.shape)
        self.strides = list(arr.strides)

    def unchanged(self) -> bool:
        """The file at `path` is still the one mapped, as it was then."""
        try:
            return _signature(os.stat(self.path)) == self.signature
        except OSError:
            return False

    def settled(self, now: float | None = None) -> bool:
        """The file had not changed for `SETTLE_SECONDS` (its ctime is that old)."""
        now = time.time() if now is None else now
        return now - self.signature[4] / 1e9 >= SETTLE_SECONDS

    def components(self) -> dict[str, Any]:
        return {"path": self.path, "signature": list(self.signature), "offset": self.offset, "nbytes": self.nbytes,
                "dtype": self.dtype, "shape": self.shape, "strides": self.strides}


def mapped_source(arr: np.ndarray) -> Source | None:
    """The `Source` of `arr` when it is a view of a `map_file` mapping (read-only), else None."""
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    signature = getattr(root, _SIGNATURE_ATTR, None) if isinstance(root, np.memmap) else None
    if signature is None or root.mode != "r" or not isinstance(root.base, mmap.mmap):
        return None
    offset = int(root.offset) + (arr.__array_interface__["data"][0] - root.__array_interface__["data"][0])
    return Source(str(root.filename), signature, offset, arr)


class ParamStore:
    """The stored params of one cached library: `<entry>/packed/`. `writable` is False for an entry of a
    read-only cache layer (loads only)."""

    def __init__(self, directory: Path, library_key: str, *, writable: bool = True) -> None:
        self.directory = directory
        self.library_key = library_key
        self.writable = writable

    @staticmethod
    def for_library(library: Path, config: Config) -> ParamStore | None:
        """The store of a library that lives in a cache entry (`<base>/<key[:2]>/<key>/model.so`), writable
        for one of the writable root; None with the cache disabled or for a library elsewhere."""
        entry = library.parent
        if not config.cache_enabled or not is_key(entry.name) or entry.parent.name != entry.name[:2]:
            return None
        root = Path(config.cache_root).expanduser().absolute()
        return ParamStore(entry / PACKED_DIR, entry.name, writable=entry.parent.parent == root)

    def key(self, index: int, name: str, source: Source) -> str:
        return cache_key({"format": FORMAT, "library": self.library_key, "index": index, "name": name,
                          "source": source.components()})

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.bin"

    def load(self, key: str) -> np.ndarray | None:
        """The payload of stored param `key` (a read-only mapping), or None when it is absent or not sound."""
        try:
            fd = os.open(self.path(key), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not _private(st) or st.st_size <= HEADER_BYTES:
                return None
            head = os.read(fd, HEADER_BYTES)  # at offset 0: just opened
            size = parse_header(head, key)
            if size is None or st.st_size != HEADER_BYTES + size:
                return None
            mapped = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        return np.frombuffer(mapped, np.uint8, count=size, offset=HEADER_BYTES)

    def keep(self, key: str, payload: memoryview) -> None:
        """Write stored param `key` (its bytes `payload`) atomically; any failure only skips keeping it."""
        if not self.writable:
            return
        tmp = None
        try:
            _mkdir_private(self.directory)
            check_private(self.directory, "stored params directory")
            digest = hashlib.sha256(payload).digest()
            # a name of this write's own (another process or thread may keep the same param meanwhile)
            tmp = self.directory / f".{key}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(header(key, len(payload), digest))
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(key))
            tmp = None
        except (OSError, CacheError):
            pass
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _private(st: os.stat_result) -> bool:
    """Owned by this user (or root), not writable by group or others, a regular file."""
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    return (stat.S_ISREG(st.st_mode) and st.st_uid in (uid, 0)
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


__all__ = ["SETTLE_SECONDS", "ParamStore", "Source", "map_file", "mapped_source"]

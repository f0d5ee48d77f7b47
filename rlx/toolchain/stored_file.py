"""The file format of a param kept in its stored layout beside a cached library (`rlx.toolchain.param_store`):
`<entry>/packed/<key>.bin`, a fixed header then the payload (the bytes `rlx_param_stored` gave).

>>> key = "ab" * 32
>>> parse_header(header(key, 256, bytes(32)), key), parse_header(header(key, 256, bytes(32)), "cd" * 32)
(256, None)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: The first bytes of a stored param file, and the version of its layout.
MAGIC = b"RLXPARAM"
FORMAT = 1
#: Bytes before the payload: magic, format, payload size, key (32 bytes), payload sha256 (32 bytes), zero
#: padding. A multiple of 64, so the payload of a page-aligned mapping is 64-byte aligned (the packed kernels'
#: aligned loads).
HEADER_BYTES = 128
#: The subdirectory of a cache entry holding its stored params.
PACKED_DIR = "packed"
_HEX = frozenset("0123456789abcdef")


def header(key: str, size: int, digest: bytes) -> bytes:
    """The header of stored param `key`: a payload of `size` bytes whose sha256 is `digest`."""
    head = MAGIC + FORMAT.to_bytes(8, "little") + size.to_bytes(8, "little") + bytes.fromhex(key) + digest
    return head + bytes(HEADER_BYTES - len(head))


def parse_header(head: bytes, key: str) -> int | None:
    """The payload size a header records, if it is a stored param header for `key`; else None."""
    if (len(head) != HEADER_BYTES or head[:8] != MAGIC or int.from_bytes(head[8:16], "little") != FORMAT
            or head[24:56] != bytes.fromhex(key)):
        return None
    return int.from_bytes(head[16:24], "little")


def verify(path: Path) -> str | None:
    """None when stored param file `path` is sound (header, size and payload sha256), else the problem."""
    key = path.name.removesuffix(".bin")
    if len(key) != 64 or not set(key) <= _HEX:
        return "not a stored param file name"
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            size = parse_header(head, key)
            if size is None:
                return "its header does not describe this stored param"
            h = hashlib.sha256()
            got = 0
            while chunk := f.read(1 << 20):
                h.update(chunk)
                got += len(chunk)
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    if got != size:
        return f"its payload is {got} bytes, its header says {size}"
    if h.digest() != head[56:88]:
        return "its payload does not match its sha256"
    return None


__all__ = ["FORMAT", "HEADER_BYTES", "MAGIC", "PACKED_DIR", "header", "parse_header", "verify"]

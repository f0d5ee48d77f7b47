"""Transports for compiled graphs with collective ops: shared memory for the ranks of one machine.

A compiled graph with `all_reduce` / `all_gather` / `reduce_scatter` calls the
transport attached to its context (`CompiledGraph.set_transport`; the C function
table is `RlxTransport` in `templates/cpu/kernels/transport.h`). `ShmRegion` is
the memory the ranks share — a POSIX shared-memory segment for ranks that are
processes (`ShmRegion.create` in the launcher, `ShmRegion.attach` by name in each
rank), or private memory for ranks that are threads (`ShmRegion.local`).
`ShmTransport.open(graph, region, rank)` makes one rank's transport from the
shared-memory implementation every such library exports (`rlx_shm_transport_open`).

>>> import numpy as np, threading, rlx
>>> from rlx.ir.ops import AllReduce
>>> g = rlx.Graph("sum2")
>>> g.set_outputs([g.add(AllReduce(world=2), [g.input("x", [3])])])
>>> cg = [rlx.Session().compile(g, num_threads=1) for _ in range(2)]
>>> region = ShmRegion.local(2)
>>> for r in range(2):
...     cg[r].set_transport(ShmTransport.open(cg[r], region, r))
>>> out = [None, None]
>>> def rank(r):
...     out[r] = cg[r].run(x=np.full(3, r + 1, np.float32))[0]
>>> ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
>>> for t in ts: t.start()
>>> for t in ts: t.join()
>>> out[0].tolist(), out[1].tolist()
([3.0, 3.0, 3.0], [3.0, 3.0, 3.0])
"""

from __future__ import annotations

import mmap
import os
import struct
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from rlx.abi_version import TRANSPORT_VERSION
from rlx.errors import ExecutionError
from rlx.runtime.abi import ffi

#: Region layout of kernels/transport_shm.h: a 128-byte header (abort flag at byte 8), then two sets of slots.
HEADER_BYTES = 128
ABORT_OFFSET = 8
#: Bytes per rank's slot: a collective larger than this goes in chunks.
DEFAULT_SLOT_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 120.0


def region_bytes(world: int, slot_bytes: int = DEFAULT_SLOT_BYTES) -> int:
    """Bytes of a region for `world` ranks: the header, then two sets (alternate collective steps) of
    one 64-byte-rounded slot per rank (as `rlx_shm_region_bytes`)."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ExecutionError(f"world size must be a positive int, got {world!r}")
    if slot_bytes < 64 * world:
        raise ExecutionError(f"slot_bytes {slot_bytes} is below the minimum {64 * world} for world {world}")
    return HEADER_BYTES + 2 * world * (-(-slot_bytes // 64) * 64)


class ShmRegion:
    """The zero-filled memory `world` ranks share (header + one slot per rank)."""

    def __init__(self, buf: memoryview, world: int, shm: shared_memory.SharedMemory | None, keep: Any = None,
                 owner: bool = False) -> None:
        self.buf = buf
        self.world = world
        self._shm = shm
        self._keep = keep
        self._owner = owner

    @classmethod
    def local(cls, world: int, slot_bytes: int = DEFAULT_SLOT_BYTES) -> ShmRegion:
        """A region for ranks that are threads of this process (64-byte aligned private memory)."""
        n = region_bytes(world, slot_bytes)
        raw = np.zeros(n + 64, np.uint8)
        start = (-raw.ctypes.data) % 64
        return cls(memoryview(raw[start:start + n]), world, None, keep=raw)

    @classmethod
    def create(cls, world: int, slot_bytes: int = DEFAULT_SLOT_BYTES) -> ShmRegion:
        """A new POSIX shared-memory segment (zero-filled) for ranks that are processes; `name` attaches."""
        n = region_bytes(world, slot_bytes)
        shm = shared_memory.SharedMemory(create=True, size=n)
        return cls(shm.buf[:n], world, shm, owner=True)

    @classmethod
    def attach(cls, name: str, world: int, nbytes: int) -> ShmRegion:
        """The segment `name` made by `create` in another process (a rank maps it; the creator unlinks it).

        On Linux the segment is mapped straight from /dev/shm: `SharedMemory(name=...)` would register
        it with the resource tracker the ranks share with the launcher (3.11 has no `track=False`), and
        complain at exit about the buffer the transport still exports.
        """
        path = Path("/dev/shm") / name.lstrip("/")
        if path.exists():
            fd = os.open(path, os.O_RDWR)
            try:
                mapped = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
            return cls(memoryview(mapped), world, None, keep=mapped)
        shm = shared_memory.SharedMemory(name=name)  # pragma: no cover - other POSIX systems
        return cls(shm.buf[:nbytes], world, shm)

    @property
    def name(self) -> str | None:
        return self._shm.name if self._shm is not None else None

    @property
    def nbytes(self) -> int:
        return len(self.buf)

    @property
    def aborted(self) -> bool:
        return struct.unpack_from("<i", self.buf, ABORT_OFFSET)[0] != 0

    def abort(self) -> None:
        """Raise the abort flag: every rank waiting at (or reaching) a collective fails at once."""
        struct.pack_into("<i", self.buf, ABORT_OFFSET, 1)

    def close(self) -> None:
        """Drop this process's mapping (and unlink the segment if this process created it)."""
        if self._shm is not None:
            self.buf.release()
            self._shm.close()
            if self._owner:
                self._shm.unlink()
            self._shm = None


class ShmTransport:
    """One rank's shared-memory transport, made by a graph's library; keeps library and region alive."""

    def __init__(self, ptr: Any, graph: Any, region: ShmRegion, rank: int) -> None:
        self.ptr = ptr
        self.rank = rank
        self.world = region.world
        self._graph = graph
        self._region = region

    @classmethod
    def open(cls, graph: Any, region: ShmRegion, rank: int, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> ShmTransport:
        """Rank `rank`'s transport over `region`, from `graph`'s library (a graph with collectives)."""
        lib = graph._lib
        try:
            opener, closer = lib.rlx_shm_transport_open, lib.rlx_shm_transport_close
        except AttributeError:
            raise ExecutionError("this library has no collective ops, so no shared-memory transport") from None
        if not 0 <= rank < region.world:
            raise ExecutionError(f"rank {rank} is outside world {region.world}")
        ptr = opener(ffi.from_buffer(region.buf, require_writable=True), region.nbytes, rank, region.world,
                     max(1, int(timeout_s * 1000)))
        if ptr == ffi.NULL:
            raise ExecutionError(f"rlx_shm_transport_open failed for rank {rank} of {region.world} "
                                 f"({region.nbytes}-byte region: too small or misaligned?)")
        if ptr.version != TRANSPORT_VERSION:
            raise ExecutionError(f"transport version {ptr.version}, rlx expects {TRANSPORT_VERSION}")
        return cls(ffi.gc(ptr, closer), graph, region, rank)


def attach_shm(graph: Any, region: ShmRegion, rank: int, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> ShmTransport:
    """Give `graph` (a `CompiledGraph` with collectives) rank `rank`'s transport over `region`."""
    transport = ShmTransport.open(graph, region, rank, timeout_s=timeout_s)
    graph.set_transport(transport)
    return transport


__all__ = ["DEFAULT_SLOT_BYTES", "ShmRegion", "ShmTransport", "attach_shm", "region_bytes"]

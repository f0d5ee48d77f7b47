"""NCCL for CUDA graphs with collective ops: the unique id, the device of a rank, its communicator.

One process per GPU. The launcher calls `unique_id()` once (NCCL's `ncclGetUniqueId`, no GPU
needed) and hands the 128 bytes to every rank; rank r calls `select_device(r)` before it compiles
anything (the driver's primary context of GPU r becomes current, so the generated library's
context is made there), then `attach_nccl(graph, id, r, world)` on each graph with collectives:
its context joins the clique (`rlx_set_nccl`, which blocks until every rank has joined).

The NCCL library is the `nvidia-nccl-cu12` wheel's (the `cuda` extra) or a system one
(`rlx.toolchain.nccl.find_nccl`).

>>> len(unique_id()) if find_nccl_library() else 128
128
"""

from __future__ import annotations

import ctypes
from typing import Any

from rlx.errors import CudaError, ExecutionError
from rlx.runtime.abi import ffi
from rlx.toolchain.nccl import find_nccl_library

UNIQUE_ID_BYTES = 128


def _nccl() -> ctypes.CDLL:
    path = find_nccl_library()
    if not path:
        raise ExecutionError("NCCL is not installed: pip install nvidia-nccl-cu12 (the rlx[cuda] extra), or set "
                             "RLX_NCCL_HOME")
    return ctypes.CDLL(path)


def unique_id() -> bytes:
    """A new ncclUniqueId (128 bytes) for one clique: made once, by the launcher, for every rank."""
    buf = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
    rc = _nccl().ncclGetUniqueId(buf)
    if rc != 0:
        raise CudaError(f"ncclGetUniqueId failed with NCCL result {rc}")
    return buf.raw


def _driver() -> ctypes.CDLL:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise CudaError("no NVIDIA driver (libcuda.so.1) on this machine") from None
    if cuda.cuInit(0) != 0:
        raise CudaError("cuInit failed: no usable NVIDIA GPU")
    return cuda


def gpu_count() -> int:
    """Visible NVIDIA GPUs (0 without a driver)."""
    try:
        cuda = _driver()
    except CudaError:
        return 0
    n = ctypes.c_int(0)
    return n.value if cuda.cuDeviceGetCount(ctypes.byref(n)) == 0 else 0


def check_gpus(nprocs: int) -> None:
    """ExecutionError unless there is one GPU per rank."""
    n = gpu_count()
    if n < nprocs:
        raise ExecutionError(f"launch(device='cuda', nprocs={nprocs}) runs one process per GPU and needs {nprocs} "
                             f"GPUs; this machine has {n}")


def select_device(index: int) -> None:
    """Make GPU `index`'s primary context current on this thread (before a rank compiles its graphs)."""
    cuda = _driver()
    dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
    if cuda.cuDeviceGet(ctypes.byref(dev), index) != 0:
        raise CudaError(f"there is no GPU {index}")
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0 or cuda.cuCtxSetCurrent(ctx) != 0:
        raise CudaError(f"could not make GPU {index}'s context current")


def attach_nccl(graph: Any, nccl_id: bytes | None, rank: int, world: int) -> None:
    """Join `graph`'s context (a CUDA graph with collectives) to the clique of `nccl_id` as `rank`."""
    if nccl_id is None or len(nccl_id) != UNIQUE_ID_BYTES:
        raise ExecutionError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes (from the launcher)")
    try:
        set_nccl = graph._lib.rlx_set_nccl
    except AttributeError:
        raise ExecutionError("this library has no collective ops (or is not a CUDA library): no NCCL to join") from None
    graph._pool.limit = 1  # one run at a time: every rank's collectives meet in order
    with graph._pool.exclusive():
        graph._pool.drop_clones()
        idbuf = ffi.new("char[]", nccl_id)
        if set_nccl(graph._ctx, idbuf, rank, world) != 0:
            raise CudaError(graph._error("rlx_set_nccl"))


def all_reduce_path(graph: Any) -> str:
    """How `graph`'s small all-reduces run once it joined a clique: "p2p" (one-shot through the peers' memory, the
    `AllReduceP2P` decisions) or "nccl" (no such decision, or GPUs that cannot map each other's memory)."""
    try:
        p2p = graph._lib.rlx_nccl_p2p
    except AttributeError:
        raise ExecutionError("this library has no collective ops (or is not a CUDA library)") from None
    return "p2p" if p2p(graph._ctx) else "nccl"


__all__ = ["all_reduce_path", "attach_nccl", "check_gpus", "gpu_count", "select_device", "unique_id"]

"""rlx/runtime/cuda_device.py parts that need no GPU: `pinned_empty`'s arrays over an allocator's memory (here a
stand-in for the library's rlx_cuda_host_alloc / rlx_cuda_host_free, on the C heap) live exactly as long as the
array and every view of it. The pinned allocation itself runs in tests/gpu/test_cuda_pipeline.py."""

from __future__ import annotations

import gc

import cffi
import numpy as np
import pytest

from rlx.errors import CudaError
from rlx.runtime.cuda_device import cuda_ffi, pinned_empty

_C = cffi.FFI()
_C.cdef("void *malloc(size_t n); void free(void *p);")
_LIBC = _C.dlopen(None)


class _HeapLib:
    """rlx_cuda_host_alloc / rlx_cuda_host_free over malloc / free, counting what is live."""

    def __init__(self, fail: bool = False) -> None:
        self.live: set[int] = set()
        self.fail = fail

    def rlx_cuda_host_alloc(self, nbytes: int):
        if self.fail:
            return cuda_ffi.NULL
        p = int(_C.cast("uintptr_t", _LIBC.malloc(max(nbytes, 1))))
        self.live.add(p)
        return cuda_ffi.cast("void *", p)

    def rlx_cuda_host_free(self, p) -> None:
        addr = int(cuda_ffi.cast("uintptr_t", p))
        self.live.remove(addr)
        _LIBC.free(_C.cast("void *", addr))

    def rlx_last_error(self, ctx):
        return cuda_ffi.new("char[]", b"no pinned memory left")


def test_pinned_arrays_hold_their_memory_until_the_last_view_goes() -> None:
    lib = _HeapLib()
    a = pinned_empty(lib, (3, 5), np.float32)
    assert a.shape == (3, 5) and a.dtype == np.float32 and a.flags.writeable and a.flags.c_contiguous
    a[...] = np.arange(15, dtype=np.float32).reshape(3, 5)
    row = a[2]
    del a
    gc.collect()
    assert len(lib.live) == 1 and row.tolist() == [10.0, 11.0, 12.0, 13.0, 14.0]  # the view keeps it
    del row
    gc.collect()
    assert not lib.live
    empty = pinned_empty(lib, (0, 4), np.int64)
    assert empty.shape == (0, 4) and len(lib.live) == 1
    del empty
    gc.collect()
    assert not lib.live


def test_a_failed_pinned_allocation_raises_naming_it() -> None:
    with pytest.raises(CudaError, match="no pinned memory left"):
        pinned_empty(_HeapLib(fail=True), (4,), np.float32)


class _Interface:
    """A stand-in device array: only its `__cuda_array_interface__`."""

    def __init__(self, typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": (2, 8), "typestr": typestr, "data": (4096, False), "version": 3}


def test_a_float8_device_array_passes_as_its_bytes() -> None:
    """An f8e4m3fn state (an f8 KV cache) comes from a device array whose interface can only say "bytes" (an
    ml_dtypes array's '|V1', or unsigned bytes): accepted; a float array of another width is still refused."""
    from rlx.errors import ExecutionError
    from rlx.ir.dtype import DType
    from rlx.runtime.cuda_device import _DeviceView
    from rlx.runtime.loader import TensorInfo

    info = TensorInfo("k_cache", DType.F8E4M3FN, ((2, ()), (8, ())), state=True)
    for ts in ("|V1", "|u1"):
        assert _DeviceView("k_cache", _Interface(ts), info, writable=True).shape == (2, 8)
    with pytest.raises(ExecutionError, match="'k_cache' is float16 on the device but the graph takes f8e4m3fn"):
        _DeviceView("k_cache", _Interface("<f2"), info, writable=True)

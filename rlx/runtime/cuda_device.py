"""Running CUDA libraries from Python: `CudaGraph` and a minimal owned device buffer, `DeviceArray`.

`CudaGraph` is a `CompiledGraph` whose library is a generated `.cu`: `run` takes and returns host numpy
arrays (the library copies in and out), `run_device` takes any object exposing `__cuda_array_interface__`
(PyTorch, CuPy, Numba, `DeviceArray`) without a host round trip and returns `DeviceArray`s (or writes into
the device outputs given). CUDA failures (no device, out of memory, a failed launch, cuBLASLt) raise
`rlx.CudaError`; other mistakes raise `ExecutionError`.

The extra exports a CUDA library has beyond the common ABI are declared here (see templates/cuda/rlx_cuda.h):
`rlx_run_device`, `rlx_run_device_resident`, `rlx_run_host_step` (and its halves `rlx_host_step_launch` /
`rlx_host_step_finish`), `rlx_state_release`, `rlx_cuda_malloc`,
`rlx_cuda_free`, `rlx_cuda_memcpy`, `rlx_cuda_stream_sync`.

`CudaGraph.bind_host_step` binds the leanest loop for a step fed from host memory (a decoder's token step):
its small inputs go over in one pinned transfer, its state inputs stay resident on the device, and only the
outputs asked for come back (`HostStep`).

>>> typestr(np.dtype(np.float32)), typestr(np.dtype(np.int64))
('<f4', '<i8')
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import cffi
import numpy as np

from rlx.errors import CudaError, ExecutionError
from rlx.ir.dtype import DType
from rlx.runtime.abi import ffi
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.conversions import _to_input_dtype
from rlx.runtime.loader import Library, TensorInfo

CUDA_CDEF = """
int32_t     rlx_run_device(void *ctx, const int64_t *symbols, const void *const *inputs, void *const *outputs);
int32_t     rlx_run_device_resident(void *ctx, const int64_t *symbols, const void *const *inputs,
                                    void *const *outputs);
int32_t     rlx_run_host_step(void *ctx, const int64_t *symbols, const void *const *inputs,
                              void *const *outputs);
int32_t     rlx_host_step_launch(void *ctx, const int64_t *symbols, const void *const *inputs,
                                 void *const *outputs, int32_t *ticket);
int32_t     rlx_host_step_finish(void *ctx, int32_t ticket, void *const *outputs);
int32_t     rlx_state_release(void *ctx);
void       *rlx_cuda_malloc(int64_t nbytes);
void        rlx_cuda_free(void *p);
int32_t     rlx_cuda_graphs_captured(void *ctx);
void       *rlx_cuda_host_alloc(int64_t nbytes);
void        rlx_cuda_host_free(void *p);
int32_t     rlx_cuda_memcpy(void *dst, const void *src, int64_t nbytes, int32_t kind);
int32_t     rlx_cuda_stream_sync(uint64_t stream);
const char *rlx_last_error(void *ctx);
"""
cuda_ffi = cffi.FFI()
cuda_ffi.cdef(CUDA_CDEF)

#: Return code of a CUDA library when CUDA or cuBLASLt failed (as opposed to a bad argument).
RC_CUDA = -2
_H2D, _D2H, _D2D = 0, 1, 2
_LOCK = threading.Lock()
_TORCH_STREAM = "torch-current-stream"
_TORCH_NP: dict[Any, np.dtype] = {}
_LIBS: dict[str, Any] = {}


def typestr(dtype: np.dtype) -> str:
    """The `__array_interface__` type string of a numpy dtype (little-endian)."""
    return np.dtype(dtype).newbyteorder("<").str


def _cuda_lib(path: Path) -> Any:
    """The CUDA extras of the library at `path`, opened once per process through `cuda_ffi`."""
    key = str(Path(path).resolve())
    with _LOCK:
        if key not in _LIBS:
            _LIBS[key] = cuda_ffi.dlopen(key)
        return _LIBS[key]


def _global_error(lib: Any) -> str:
    return cuda_ffi.string(lib.rlx_last_error(cuda_ffi.NULL)).decode("utf-8", "replace")


class DeviceArray:
    """A dense device buffer owned by RLX (freed when collected), exposing `__cuda_array_interface__`.

    Made by `CudaGraph.run_device` for its outputs, or from host data with `CudaGraph.to_device`. bf16
    tensors are held as their uint16 bit patterns (numpy has no bf16).
    """

    def __init__(self, lib: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self._lib = lib
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        raw = lib.rlx_cuda_malloc(self.nbytes)
        if raw == cuda_ffi.NULL:
            raise CudaError(_global_error(lib) or f"cudaMalloc of {self.nbytes} bytes failed")
        self._ptr = cuda_ffi.gc(raw, lib.rlx_cuda_free)

    @property
    def ptr(self) -> int:
        return int(cuda_ffi.cast("uintptr_t", self._ptr))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": typestr(self.dtype), "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}

    def copy_from_host(self, array: np.ndarray) -> None:
        arr = np.ascontiguousarray(array, dtype=self.dtype)
        if arr.shape != self.shape:
            raise ExecutionError(f"copy_from_host: shape {arr.shape} differs from the device array's {self.shape}")
        if self._lib.rlx_cuda_memcpy(self._ptr, cuda_ffi.from_buffer(arr), self.nbytes, _H2D) != 0:
            raise CudaError(_global_error(self._lib))

    def numpy(self) -> np.ndarray:
        """A host copy."""
        out = np.empty(self.shape, self.dtype)
        if self._lib.rlx_cuda_memcpy(cuda_ffi.from_buffer(out, require_writable=True), self._ptr, self.nbytes,
                                     _D2H) != 0:
            raise CudaError(_global_error(self._lib))
        return out

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype})"


def pinned_empty(lib: Any, shape: Sequence[int], dtype: Any) -> np.ndarray:
    """A numpy array over `rlx_cuda_host_alloc`'d memory of library `lib`; the memory lives as long as the array
    (its base, a cffi buffer, holds the owning pointer, which `rlx_cuda_host_free`s it when collected)."""
    dt = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * dt.itemsize
    raw = lib.rlx_cuda_host_alloc(nbytes)
    if raw == cuda_ffi.NULL:
        raise CudaError(_global_error(lib) or f"pinned allocation of {nbytes} bytes failed")
    owner = cuda_ffi.gc(raw, lib.rlx_cuda_host_free)
    return np.frombuffer(cuda_ffi.buffer(owner, max(nbytes, 1)), np.uint8, nbytes).view(dt).reshape(shape)


class _DeviceView:
    """What `run_device` needs from a `__cuda_array_interface__` object: pointer, shape, dtype, stream."""

    def __init__(self, name: str, obj: Any, info: TensorInfo, writable: bool) -> None:
        if type(obj).__module__.startswith("torch") and self._from_torch(name, obj, info):
            return
        try:
            cai = obj.__cuda_array_interface__
        except AttributeError:
            raise ExecutionError(f"{name!r}: expected an object with __cuda_array_interface__ (a device array), "
                                 f"got {type(obj).__name__}") from None
        if not isinstance(cai, Mapping) or "shape" not in cai or "typestr" not in cai or "data" not in cai:
            raise ExecutionError(f"{name!r}: malformed __cuda_array_interface__")
        self.shape = tuple(int(s) for s in cai["shape"])
        self.ndim = len(self.shape)
        try:
            dtype = np.dtype(cai["typestr"])
        except TypeError:
            raise ExecutionError(f"{name!r}: unknown typestr {cai['typestr']!r}") from None
        # a storage format (float8 ...) has no type string of its own: its bytes come as raw or unsigned ones
        raw_bytes = info.dtype.is_narrow and dtype.kind in "uV" and dtype.itemsize == info.dtype.np.itemsize
        if dtype != info.dtype.np and not raw_bytes:
            raise ExecutionError(f"{name!r} is {dtype} on the device but the graph takes {info.dtype} "
                                 f"({info.dtype.np}); convert it on the device first")
        strides = cai.get("strides")
        if strides is not None:
            dense, acc = [], dtype.itemsize
            for s in reversed(self.shape):
                dense.append(acc)
                acc *= s
            if any(sz > 1 and st != want for sz, st, want in zip(self.shape, strides, reversed(dense))):
                raise ExecutionError(f"{name!r} is not C-contiguous on the device; make it contiguous first")
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise ExecutionError(f"{name!r} is read-only")
        if ptr == 0 and math.prod(self.shape) > 0:
            raise ExecutionError(f"{name!r} has a NULL device pointer")
        self.ptr = int(ptr)
        self.stream = cai.get("stream")
        self.obj = obj


    def _from_torch(self, name: str, t: Any, info: TensorInfo) -> bool:
        """Fast path for torch tensors (their `__cuda_array_interface__` costs ~10 us each): same checks."""
        try:
            if not t.is_cuda:
                return False
            dtype = _TORCH_NP.get(t.dtype)
            if dtype is None:
                dtype = _TORCH_NP[t.dtype] = np.dtype(str(t.dtype).removeprefix("torch."))
        except (AttributeError, TypeError):
            return False  # bf16 and friends: let the interface decide
        if dtype != info.dtype.np:
            raise ExecutionError(f"{name!r} is {dtype} on the device but the graph takes {info.dtype} "
                                 f"({info.dtype.np}); convert it on the device first")
        if not t.is_contiguous():
            raise ExecutionError(f"{name!r} is not C-contiguous on the device; make it contiguous first")
        self.shape = tuple(t.shape)
        self.ndim = len(self.shape)
        self.ptr = int(t.data_ptr())
        self.stream = _TORCH_STREAM  # torch's current stream, looked up once per run
        self.obj = t
        return True


class HostStep:
    """A step loop bound by `CudaGraph.bind_host_step`: write each step's values into `inputs` in place, call it,
    read `outputs`.

    `inputs` holds one host array per per-run (non-state) input, `outputs` one per output asked for; both are
    fixed (read-only mappings: the library holds their addresses). A call copies the inputs in with one
    transfer, runs the graph with the state inputs resident (see `CudaGraph.bind_device(resident_states=True)`),
    writes the wanted outputs and returns `outputs`. Arrays are reused by the next call: copy what you keep.

    `launch()` and `finish(ticket)` split a call: `launch` queues the step on the GPU (the inputs are read at
    once: write the next step's values right after) and returns a ticket; `finish(ticket)` waits for that step
    and returns `outputs` filled with its results (raising its errors, the device's error flag included). At most
    two steps of one library may be launched and not finished, of this binding or another.
    """

    def __init__(self, graph: CudaGraph, run: Any, args: tuple, inputs: dict[str, np.ndarray],
                 outputs: dict[str, np.ndarray], states: dict[int, Any], streams: set, keep: tuple) -> None:
        self._graph, self._run, self._args = graph, run, args
        self.inputs: Mapping[str, np.ndarray] = MappingProxyType(inputs)
        self.outputs: Mapping[str, np.ndarray] = MappingProxyType(outputs)
        self._states, self._streams, self._keep = states, streams, keep

    def __call__(self) -> Mapping[str, np.ndarray]:
        graph = self._graph
        for stream in self._streams:
            if graph._cuda.rlx_cuda_stream_sync(int(stream)) != 0:
                raise CudaError(_global_error(graph._cuda))
        rc = self._run(*self._args)
        graph._resident.update(self._states)  # (on failure too: a state may have become resident before it)
        if rc != 0:
            graph._raise(rc, "run_host_step")
        return self.outputs

    def launch(self) -> int:
        """Queue a step (see the class docstring); its ticket for `finish`."""
        graph = self._graph
        for stream in self._streams:
            if graph._cuda.rlx_cuda_stream_sync(int(stream)) != 0:
                raise CudaError(_global_error(graph._cuda))
        ctx, sym, ins, out_ptrs = self._args
        ticket = cuda_ffi.new("int32_t *")
        rc = graph._cuda.rlx_host_step_launch(ctx, sym, ins, out_ptrs, ticket)
        graph._resident.update(self._states)  # (on failure too: a state may have become resident before it)
        if rc != 0:
            graph._raise(rc, "host_step_launch")
        return int(ticket[0])

    def finish(self, ticket: int) -> Mapping[str, np.ndarray]:
        """Wait for the step `launch` gave `ticket` for; `outputs`, holding its results."""
        graph = self._graph
        rc = graph._cuda.rlx_host_step_finish(self._args[0], ticket, self._args[3])
        if rc != 0:
            graph._raise(rc, "host_step_finish")
        return self.outputs

    def __repr__(self) -> str:
        return f"HostStep(inputs={list(self.inputs)}, outputs={list(self.outputs)})"


def _producer_streams(views: Sequence[_DeviceView]) -> set:
    """The streams a run must wait for: those the device inputs were produced on (torch's current one)."""
    streams = {v.stream for v in views} - {None, 1}
    if _TORCH_STREAM in streams:
        streams.discard(_TORCH_STREAM)
        streams.add(sys.modules["torch"].cuda.current_stream().cuda_stream)
    streams.discard(0)  # torch's legacy default stream, which the library's stream already waits for
    return streams


class CudaGraph(CompiledGraph):
    """A compiled graph on an NVIDIA GPU (see the module docstring)."""

    def __init__(self, library: Library, *, build_seconds: float = 0.0, **kw: Any) -> None:
        self._cuda = _cuda_lib(library.path)
        raw = kw.pop("_ctx", None)
        if raw is None:
            raw = library.lib.rlx_create()
            if raw == ffi.NULL:
                msg = ffi.string(library.lib.rlx_last_error(ffi.NULL)).decode("utf-8", "replace")
                raise CudaError(f"cannot start {library.path.name}: {msg or 'rlx_create failed'}")
        super().__init__(library, _ctx=raw, **kw)
        self.build_seconds = build_seconds
        #: Owners of the state inputs resident in the context (kept alive until written back).
        self._resident: dict[int, Any] = {}
        self._dev_ctx = cuda_ffi.cast("void *", int(ffi.cast("uintptr_t", self._ctx)))

    @property
    def precision(self) -> str:
        return str(self._library.manifest.get("precision", "f32"))

    def _raise(self, rc: int, what: str) -> None:
        msg = self._error(what)
        raise CudaError(msg) if rc == RC_CUDA else ExecutionError(msg)

    def to_device(self, array: Any, dtype: DType | str | None = None) -> DeviceArray:
        """A `DeviceArray` holding a copy of host data (bf16 given as float32 is stored as bf16 bits)."""
        arr = np.asarray(array)
        if dtype is not None and DType.parse(dtype) is DType.BF16:
            from rlx.ir.dtype import f32_to_bf16

            arr = f32_to_bf16(arr.astype(np.float32))
        elif dtype is not None:
            arr = arr.astype(DType.parse(dtype).np)
        out = DeviceArray(self._cuda, arr.shape, arr.dtype)
        out.copy_from_host(arr)
        return out

    @property
    def captured_graphs(self) -> int:
        """How many CUDA graphs the primary context holds captured (one per set of dynamic-dim values run twice);
        0 once a capture failed, after which its runs are eager. Read it between runs."""
        return int(self._cuda.rlx_cuda_graphs_captured(self._dev_ctx))

    def host_empty(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """An uninitialized host array in pinned (page-locked) memory, freed with the array: the run copies it to
        and from the device by DMA, with no pass through the driver's pageable staging (`pipeline` slots use it)."""
        return pinned_empty(self._cuda, shape, dtype)

    def run_device(self, inputs: Mapping[str, Any] | None = None, outputs: Mapping[str, Any] | None = None,
                   **kw: Any) -> list[Any]:
        """Run on device-resident inputs (any `__cuda_array_interface__` object, used in place).

        Outputs are written into the device arrays given in `outputs` (by name), or into new
        `DeviceArray`s; the list of output objects is returned. Returns once the outputs are written.
        """
        call = self._prepare_device(inputs, outputs, kw)
        return call()

    def bind_device(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None, *,
                    resident_states: bool = False) -> Any:
        """Check device buffers once; return a function running the graph on them (a static-buffer loop).

        The returned callable takes no arguments, returns the output objects, and re-reads the buffers'
        current contents on each call (write new inputs into them in place between calls).

        `resident_states=True` keeps the graph's state inputs (a KV cache) inside the context between
        calls instead of copying them in and back on every run: a state buffer is read when a call
        passes it for the first time and written back only when a call passes another buffer for that
        state, or at `release_states()`. Until then its contents are stale: call `release_states()`
        before reading or changing it from outside (the context keeps it alive meanwhile).
        """
        return self._prepare_device(inputs, outputs, {}, resident=resident_states)

    def bind_host_step(self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None) -> HostStep:
        """Bind a loop of steps fed from host memory: one transfer in, the wanted outputs out, states resident.

        `inputs` names every input: state inputs as device buffers (kept resident in the context, exactly as
        `bind_device(..., resident_states=True)` does: call `release_states()` before reading one), the others
        as host data whose shapes (and so the dynamic dims) the binding keeps; their values are the first
        step's. `outputs` names the outputs each step returns (None: all). Returns a `HostStep`: write the next
        step's values into its `inputs` arrays in place, then call it.

        On a GPU (tests/gpu/test_cuda_ops.py runs this)::

            step = graph.bind_host_step({"x": np.zeros(4, np.float32), "acc": graph.to_device(acc)},
                                        outputs=["y"])
            step.inputs["x"][:] = next_x
            y = step()["y"].copy()
        """
        given: dict[str, Any] = dict(inputs)
        lib = self._library
        self._check_input_names(given)
        wanted = list(self.output_names) if outputs is None else list(outputs)
        bad = [k for k in wanted if k not in self._outputs]
        if bad or not wanted:
            raise ExecutionError(f"outputs to return must be some of {self.output_names}, got {wanted}")
        views: list[Any] = []
        host: dict[str, np.ndarray] = {}
        for t in lib.inputs:
            value = given[t.name]
            if t.state:
                views.append(_DeviceView(t.name, value, t, writable=False))
                continue
            if hasattr(value, "__cuda_array_interface__") or type(value).__module__.startswith("torch"):
                raise ExecutionError(f"{t.name!r}: a host-fed step takes host data for its per-run inputs, got a "
                                     f"{type(value).__name__} (only state inputs live on the device)")
            arr = np.array(_to_input_dtype(t.name, value, t.dtype), order="C", copy=True)  # owned and writeable
            host[t.name] = arr
            views.append(arr)
        symbols = self._bind_symbols(views)  # checks ranks, shapes and bounds like `run`
        unset = [t.name for t, ok in zip(lib.params, self._param_set) if not ok]
        if unset:
            raise ExecutionError(f"params never set: {unset}")
        outs = {t.name: np.empty(t.concrete(symbols), t.dtype.np) for t in lib.outputs if t.name in wanted}
        try:
            run = self._cuda.rlx_run_host_step
        except AttributeError:
            raise ExecutionError(f"{lib.path.name} predates host-fed steps; rebuild it with this rlx") from None

        def ptr(obj: Any) -> Any:
            return cuda_ffi.cast("void *", obj.ctypes.data if isinstance(obj, np.ndarray) else obj.ptr)

        sym = cuda_ffi.new("int64_t[]", [symbols[n] for n in self._sym_order] or [0])
        ins = cuda_ffi.new("void *[]", [ptr(v) for v in views] or [cuda_ffi.NULL])
        out_ptrs = cuda_ffi.new("void *[]", [ptr(outs[t.name]) if t.name in outs else cuda_ffi.NULL
                                             for t in lib.outputs])
        states = {i: v.obj for i, (t, v) in enumerate(zip(lib.inputs, views)) if t.state}
        streams = _producer_streams([v for v in views if isinstance(v, _DeviceView)])
        return HostStep(self, run, (self._dev_ctx, sym, ins, out_ptrs), host, outs, states, streams,
                        keep=(views, sym, ins, out_ptrs))

    def release_states(self) -> None:
        """Write every resident state input back to its buffer (see `bind_device(resident_states=True)`)."""
        if not self._resident:
            return
        rc = self._cuda.rlx_state_release(self._dev_ctx)
        if rc != 0:
            self._raise(rc, "release_states")
        self._resident.clear()

    def _check_input_names(self, given: Mapping[str, Any]) -> None:
        """Every graph input given, and nothing else."""
        unknown = [k for k in given if k not in self._inputs]
        if unknown:
            raise ExecutionError(f"unknown inputs {unknown}; the graph's inputs are {self.input_names}")
        missing = [t.name for t in self._library.inputs if t.name not in given]
        if missing:
            raise ExecutionError(f"missing inputs {missing}")

    def _prepare_device(self, inputs: Mapping[str, Any] | None, outputs: Mapping[str, Any] | None,
                        kw: Mapping[str, Any], *, resident: bool = False) -> Any:
        given: dict[str, Any] = dict(inputs or {})
        for k, v in kw.items():
            if k in given:
                raise ExecutionError(f"input {k!r} given both in the dict and as a keyword")
            given[k] = v
        lib = self._library
        self._check_input_names(given)
        views = [_DeviceView(t.name, given[t.name], t, writable=False) for t in lib.inputs]
        symbols = self._bind_symbols(views)  # checks ranks, shapes and bounds like `run`
        outs_given = dict(outputs or {})
        bad = [k for k in outs_given if k not in self._outputs]
        if bad:
            raise ExecutionError(f"unknown outputs {bad}; the graph's outputs are {self.output_names}")
        out_objs: list[Any] = []
        out_views: list[_DeviceView] = []
        for t in lib.outputs:
            obj = outs_given.get(t.name)
            if obj is None:
                obj = DeviceArray(self._cuda, t.concrete(symbols), t.dtype.np)
            view = _DeviceView(t.name, obj, t, writable=True)
            if view.shape != t.concrete(symbols):
                raise ExecutionError(f"output {t.name!r} must have shape {t.concrete(symbols)}, got {view.shape}")
            out_objs.append(obj)
            out_views.append(view)
        unset = [t.name for t, ok in zip(lib.params, self._param_set) if not ok]
        if unset:
            raise ExecutionError(f"params never set: {unset}")
        streams = _producer_streams(views)
        sym = cuda_ffi.new("int64_t[]", [symbols[n] for n in self._sym_order] or [0])
        ins = cuda_ffi.new("void *[]", [cuda_ffi.cast("void *", v.ptr) for v in views] or [cuda_ffi.NULL])
        outs = cuda_ffi.new("void *[]", [cuda_ffi.cast("void *", v.ptr) for v in out_views])
        keep = (views, out_views)
        cuda, ctx = self._cuda, self._dev_ctx
        try:
            run = cuda.rlx_run_device_resident if resident else cuda.rlx_run_device
        except AttributeError:
            raise ExecutionError(f"{lib.path.name} predates resident state inputs; rebuild it with this rlx") from None
        states = {i: v.obj for i, (t, v) in enumerate(zip(lib.inputs, views)) if t.state} if resident else {}
        resident_now = self._resident

        def call() -> list[Any]:
            for stream in streams:
                if cuda.rlx_cuda_stream_sync(int(stream)) != 0:
                    raise CudaError(_global_error(cuda))
            rc = run(ctx, sym, ins, outs)
            resident_now.update(states)  # (on failure too: a state may have become resident before it)
            if rc != 0:
                self._raise(rc, "run_device")
            return out_objs

        call.keep = keep  # type: ignore[attr-defined]  # the buffers' owners live as long as the callable
        return call

    def clone(self) -> CudaGraph:
        """A fresh context on the same library with the params copied on the device."""
        raw = self._lib.rlx_clone(self._ctx)
        if raw == ffi.NULL:
            raise CudaError(f"rlx_clone failed: {_global_error(self._cuda) or 'out of device memory?'}")
        twin = CudaGraph(self._library, source=self._source_path, key=self.key, cache_hit=self.cache_hit,
                         _ctx=raw, _param_set=self._param_set, build_seconds=self.build_seconds)
        twin.record_build(self.source_digest, self._decided)  # the same program: the same provenance
        return twin


__all__ = ["CUDA_CDEF", "CudaGraph", "DeviceArray", "HostStep", "cuda_ffi", "typestr"]

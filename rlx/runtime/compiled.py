"""`CompiledGraph`: a loaded library plus one execution context, driven from Python.

Everything a run needs is checked here before C is called (names, shapes,
dtypes, dynamic dims against their bounds, params set), so mistakes become
`ExecutionError`s naming the offending tensor; the library re-checks symbols,
pointers and params and reports run-time failures (e.g. a gather index out of
range) through `rlx_last_error`.

Input dtypes: an ndarray must have the declared dtype or one numpy casts to
it *safely* (lossless: int32 → int64 indices, float16 → float32, bool → any);
anything lossy (float64 → float32, int64 → int32) is refused — cast it
yourself. Plain Python lists and scalars carry no dtype and are converted to
the declared dtype. bf16 tensors are exchanged as float32 arrays (rounded to
bf16 on the way in), as in `rlx.reference`.

Params: `set_param` accepts any float array for a float param and converts
it once, to the declared dtype (this may round: it is a weight load, not a
run-time input); int params take integer arrays whose values fit.

A CompiledGraph is not thread-safe; give each thread its own `clone()`.

>>> import numpy as np, rlx
>>> g = rlx.Graph("axpy")
>>> x = g.input("x", [3])
>>> a = g.param("a", [3])
>>> g.set_outputs([g.add_(g.mul(a, x), x)])
>>> cg = rlx.Session().compile(g)
>>> cg.set_param("a", np.array([1, 2, 3], np.float32))
>>> cg.run(x=np.ones(3, np.float32))[0].tolist()
[2.0, 3.0, 4.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ExecutionError
from rlx.ir.dtype import DType, bf16_to_f32, f32_to_bf16
from rlx.runtime.abi import ffi
from rlx.runtime.loader import Library, TensorInfo


class CompiledGraph:
    """A compiled graph ready to run: params set once, then `run` many times."""

    def __init__(self, library: Library, *, source: Path | None = None, key: str = "", cache_hit: bool = False,
                 num_threads: int | None = None, _ctx: Any = None, _param_set: list[bool] | None = None) -> None:
        self._library = library
        self._lib = library.lib
        raw = _ctx if _ctx is not None else self._lib.rlx_create()
        if raw == ffi.NULL:
            raise ExecutionError(f"rlx_create failed for {library.path} (out of memory?)")
        self._ctx = ffi.gc(raw, self._lib.rlx_destroy)
        self._source_path = source
        self.key = key or str(library.manifest.get("key", ""))
        self.cache_hit = cache_hit
        self._inputs = {t.name: i for i, t in enumerate(library.inputs)}
        self._outputs = {t.name: i for i, t in enumerate(library.outputs)}
        self._params = {t.name: i for i, t in enumerate(library.params)}
        self._param_set = list(_param_set) if _param_set is not None else [False] * len(library.params)
        # The arrays handed to rlx_set_param (references, not copies), for save(weights=True).
        self._param_values: dict[str, np.ndarray] = {}
        self._handles: dict[str, np.ndarray] = {}
        self._bounds = dict(library.symbols)
        self._sym_order = [name for name, _ in library.symbols]
        self._sym = ffi.new("int64_t[]", max(len(library.symbols), 1))
        self._in = ffi.new("void *[]", max(len(library.inputs), 1))
        self._out = ffi.new("void *[]", max(len(library.outputs), 1))
        self._threads = 0
        self.num_threads = num_threads if num_threads is not None else 0

    # ── introspection ──────────────────────────────────────────────────

    @property
    def manifest(self) -> dict:
        """The library's manifest (inputs, outputs, params, symbols, key, ISA, ...)."""
        return dict(self._library.manifest)

    @property
    def source(self) -> str | None:
        """The generated C source, when the build kept it."""
        if self._source_path is None or not Path(self._source_path).exists():
            return None
        return Path(self._source_path).read_text()

    @property
    def source_path(self) -> Path | None:
        """Where the generated C source is kept (the cache entry's model.c)."""
        return self._source_path

    @property
    def library_path(self) -> Path:
        return self._library.path

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self._library.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self._library.outputs]

    @property
    def param_names(self) -> list[str]:
        return [t.name for t in self._library.params]

    @property
    def num_threads(self) -> int:
        """Threads used by OpenMP loops and BLAS together (set it to change; < 1 means the default)."""
        return self._threads

    @num_threads.setter
    def num_threads(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise ExecutionError(f"num_threads must be an int, got {n!r}")
        got = self._lib.rlx_set_num_threads(self._ctx, n)
        if got < 0:
            raise ExecutionError(self._error(f"set_num_threads({n})"))
        self._threads = int(got)

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}: {t.describe()}" for t in self._library.inputs)
        outs = ", ".join(f"{t.name}: {t.describe()}" for t in self._library.outputs)
        return f"CompiledGraph({self._library.manifest.get('name', '?')!r}, ({ins}) -> ({outs}))"

    # ── params ─────────────────────────────────────────────────────────

    def set_param(self, name: str, array: Any) -> None:
        """Copy a weight in (user layout); float params accept any float dtype, converted once."""
        idx, info = self._param(name)
        arr = np.asarray(array)
        want = info.concrete({})
        if arr.shape != want:
            raise ExecutionError(f"param {name!r} must have shape {want} ({info.describe()}), got {arr.shape}")
        self._set_param_raw(idx, info, _to_param_dtype(name, arr, info.dtype))

    def set_param_typed(self, name: str, data: Any, dtype: DType | str) -> None:
        """Set a param from raw bytes (or an array) holding values of `dtype` (bf16 as uint16 bits)."""
        idx, info = self._param(name)
        dt = DType.parse(dtype)
        want = info.concrete({})
        if isinstance(data, np.ndarray):
            arr = _contiguous(data)
            if arr.dtype != dt.np:
                raise ExecutionError(f"param {name!r}: array is {arr.dtype} but dtype={dt} was given")
        else:
            try:
                buf = memoryview(data).cast("B")
            except TypeError:
                raise ExecutionError(f"param {name!r}: set_param_typed needs bytes or an array, "
                                     f"got {type(data).__name__}") from None
            count = int(np.prod(want, dtype=np.int64))
            if buf.nbytes != count * dt.itemsize:
                raise ExecutionError(f"param {name!r} needs {count * dt.itemsize} bytes of {dt}, got {buf.nbytes}")
            arr = np.frombuffer(buf, dtype=dt.np)
        if arr.size != int(np.prod(want, dtype=np.int64)):
            raise ExecutionError(f"param {name!r} must have shape {want}, got {arr.shape}")
        arr = arr.reshape(want)
        if dt is info.dtype:
            self._set_param_raw(idx, info, arr)
            return
        if dt is DType.BF16:
            arr = bf16_to_f32(arr)
        self._set_param_raw(idx, info, _to_param_dtype(name, arr, info.dtype))

    def _param(self, name: str) -> tuple[int, TensorInfo]:
        if name not in self._params:
            raise ExecutionError(f"unknown param {name!r}; the graph's params are {self.param_names}")
        idx = self._params[name]
        return idx, self._library.params[idx]

    def _set_param_raw(self, idx: int, info: TensorInfo, arr: np.ndarray) -> None:
        arr = _contiguous(arr)
        rc = self._lib.rlx_set_param(self._ctx, idx, ffi.from_buffer(arr), arr.nbytes)
        if rc != 0:
            self._raise(rc, f"set_param({info.name!r})")
        self._param_set[idx] = True
        self._param_values[info.name] = arr

    # ── handles ────────────────────────────────────────────────────────

    def bind_handle(self, name: str, array: Any) -> None:
        """Bind a persistent buffer as input `name` for every later run that does not pass it.

        An array that already has the declared dtype and is C-contiguous is used in
        place (so writing into it, e.g. through `run_slots` outputs, updates the
        handle); anything else is converted once into a private copy.
        """
        if name not in self._inputs:
            raise ExecutionError(f"bind_handle: unknown input {name!r}; the graph's inputs are {self.input_names}")
        info = self._library.inputs[self._inputs[name]]
        arr = _to_input_dtype(name, array, info.dtype)
        self._check_rank(info, arr)
        self._handles[name] = arr

    def read_handle(self, name: str) -> np.ndarray:
        """A copy of the current contents of the bound handle `name`."""
        if name not in self._handles:
            raise ExecutionError(f"no handle is bound as {name!r} (bound: {sorted(self._handles)})")
        info = self._library.inputs[self._inputs[name]]
        value = self._handles[name]
        return bf16_to_f32(value) if info.dtype is DType.BF16 else value.copy()

    def unbind_handle(self, name: str) -> None:
        self._handles.pop(name, None)

    # ── running ────────────────────────────────────────────────────────

    def run(self, inputs: Mapping[str, Any] | None = None, **kw: Any) -> list[np.ndarray]:
        """Run with named inputs (a dict and/or keywords); returns the outputs as new arrays."""
        given: dict[str, Any] = dict(inputs or {})
        for k, v in kw.items():
            if k in given:
                raise ExecutionError(f"input {k!r} given both in the dict and as a keyword")
            given[k] = v
        unknown = [k for k in given if k not in self._inputs]
        if unknown:
            raise ExecutionError(f"unknown inputs {unknown}; the graph's inputs are {self.input_names}")
        arrays: list[np.ndarray] = []
        for info in self._library.inputs:
            if info.name in given:
                arrays.append(_to_input_dtype(info.name, given[info.name], info.dtype))
            elif info.name in self._handles:
                arrays.append(self._handles[info.name])
            else:
                missing = [t.name for t in self._library.inputs if t.name not in given and t.name not in self._handles]
                raise ExecutionError(f"missing inputs {missing}")
        symbols = self._bind_symbols(arrays)
        outs = [np.empty(t.concrete(symbols), dtype=t.dtype.np) for t in self._library.outputs]
        self._call(symbols, arrays, outs)
        return [bf16_to_f32(o) if t.dtype is DType.BF16 else o for o, t in zip(outs, self._library.outputs)]

    def run_slots(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run with positional inputs, writing into caller-provided output arrays (no allocation).

        Arrays must already have the storage dtype (`DType.np`; bf16 as uint16 bits), be
        C-contiguous, and outputs must be writable, correctly shaped and not overlap inputs.
        """
        lib = self._library
        if len(inputs) != len(lib.inputs) or len(outputs) != len(lib.outputs):
            raise ExecutionError(f"run_slots takes {len(lib.inputs)} inputs and {len(lib.outputs)} outputs, "
                                 f"got {len(inputs)} and {len(outputs)}")
        for arr, info in zip(inputs, lib.inputs):
            _check_exact(arr, info, "input")
        symbols = self._bind_symbols(inputs)
        for arr, info in zip(outputs, lib.outputs):
            _check_exact(arr, info, "output")
            want = info.concrete(symbols)
            if arr.shape != want:
                raise ExecutionError(f"output {info.name!r} must have shape {want}, got {arr.shape}")
            if not arr.flags.writeable:
                raise ExecutionError(f"output {info.name!r} is read-only")
            for src, sinfo in zip(inputs, lib.inputs):
                if np.may_share_memory(arr, src):
                    raise ExecutionError(f"output {info.name!r} overlaps input {sinfo.name!r}")
        self._call(symbols, inputs, outputs)

    def _check_rank(self, info: TensorInfo, arr: np.ndarray) -> None:
        if arr.ndim != len(info.dims):
            raise ExecutionError(f"input {info.name!r} must have rank {len(info.dims)} ({info.describe()}), "
                                 f"got shape {arr.shape}")

    def _bind_symbols(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        values: dict[str, int] = {}
        infos = self._library.inputs
        for arr, info in zip(arrays, infos):
            self._check_rank(info, arr)
            for axis, ((coeff, names), size) in enumerate(zip(info.dims, arr.shape)):
                if coeff == 1 and len(names) == 1:
                    name = names[0]
                    bound = self._bounds[name]
                    if size < 1 or size > bound:
                        raise ExecutionError(f"input {info.name!r} axis {axis}: {name}={size} is outside 1..{bound}")
                    if values.setdefault(name, size) != size:
                        raise ExecutionError(f"input {info.name!r} axis {axis}: {name} is {size} here but "
                                             f"{values[name]} in another input")
        missing = [n for n in self._sym_order if n not in values]
        if missing:
            raise ExecutionError(f"cannot deduce dynamic dims {missing} from the input shapes")
        for arr, info in zip(arrays, infos):
            want = info.concrete(values)
            if tuple(arr.shape) != want:
                raise ExecutionError(f"input {info.name!r} must have shape {want} ({info.describe()} with "
                                     f"{_fmt_syms(values)}), got {tuple(arr.shape)}")
        return values

    def _call(self, symbols: dict[str, int], inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        unset = [t.name for t, ok in zip(self._library.params, self._param_set) if not ok]
        if unset:
            raise ExecutionError(f"params never set: {unset}")
        for i, name in enumerate(self._sym_order):
            self._sym[i] = symbols[name]
        keep = []
        for i, arr in enumerate(inputs):
            buf = ffi.from_buffer(arr)
            keep.append(buf)
            self._in[i] = buf
        for i, arr in enumerate(outputs):
            buf = ffi.from_buffer(arr, require_writable=True)
            keep.append(buf)
            self._out[i] = buf
        rc = self._lib.rlx_run(self._ctx, self._sym, self._in, self._out)
        del keep
        if rc != 0:
            self._raise(rc, "run")

    def _raise(self, rc: int, what: str) -> None:
        """Turn a nonzero return code into an exception (backends map their own codes)."""
        raise ExecutionError(self._error(what))

    def _error(self, what: str) -> str:
        msg = ffi.string(self._lib.rlx_last_error(self._ctx)).decode("utf-8", "replace")
        return f"{what} failed in {self._library.manifest.get('name', '?')!r}: {msg or 'unknown error'}"

    # ── copies ─────────────────────────────────────────────────────────

    def clone(self) -> CompiledGraph:
        """A fresh context on the same library, with params and thread count copied (handles are not)."""
        raw = self._lib.rlx_clone(self._ctx)
        if raw == ffi.NULL:
            raise ExecutionError("rlx_clone failed (out of memory?)")
        twin = CompiledGraph(self._library, source=self._source_path, key=self.key, cache_hit=self.cache_hit,
                             num_threads=self._threads, _ctx=raw, _param_set=self._param_set)
        twin._param_values = dict(self._param_values)
        return twin

    # ── artifacts ──────────────────────────────────────────────────────

    def param_arrays(self) -> dict[str, np.ndarray]:
        """The params set so far, by name, as passed to the library (declared dtype, bf16 as uint16 bits)."""
        return dict(self._param_values)

    def save(self, directory: str | Path, *, weights: bool | Mapping[str, Any] = False) -> Path:
        """Write a relocatable artifact directory (model.so, manifest.json, rlx.h, source, optional weights).

        See `rlx.toolchain.artifact`; load it with `rlx.load(directory)`.
        """
        from rlx.toolchain.artifact import save

        return save(self, directory, weights=weights)


def _fmt_syms(values: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "no dynamic dims"


def _contiguous(arr: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """C-contiguous `arr` (converted to `dtype`), keeping 0-d arrays 0-d (np.ascontiguousarray does not)."""
    arr = np.asarray(arr, dtype=dtype)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _to_input_dtype(name: str, value: Any, dtype: DType) -> np.ndarray:
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        try:
            if dtype is DType.BF16:
                return f32_to_bf16(np.asarray(value, dtype=np.float32))
            return _contiguous(value, dtype.np)
        except (TypeError, ValueError) as exc:
            raise ExecutionError(f"input {name!r}: cannot convert {type(value).__name__} to {dtype}: {exc}") from None
    if dtype is DType.BF16:
        if value.dtype != np.float32:
            raise ExecutionError(f"input {name!r} is bf16: pass float32 values (got {value.dtype})")
        return f32_to_bf16(value)
    if value.dtype == dtype.np:
        return _contiguous(value)
    if np.can_cast(value.dtype, dtype.np, casting="safe"):
        return _contiguous(value, dtype.np)
    raise ExecutionError(f"input {name!r} is {value.dtype} but the graph takes {dtype}; converting would lose "
                         f"information, so cast it explicitly (e.g. .astype(np.{dtype.np}))")


def _to_param_dtype(name: str, arr: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype.is_float:
        if arr.dtype.kind not in "fiub":
            raise ExecutionError(f"param {name!r} is {dtype}; got a {arr.dtype} array")
        if dtype is DType.BF16:
            return f32_to_bf16(arr.astype(np.float32))
        return _contiguous(arr, dtype.np)
    if arr.dtype.kind not in "iub":
        raise ExecutionError(f"param {name!r} is {dtype}; got a {arr.dtype} array")
    out = _contiguous(arr, dtype.np)
    if not np.array_equal(out.astype(arr.dtype), arr):
        raise ExecutionError(f"param {name!r}: values do not fit in {dtype}")
    return out


def _check_exact(arr: Any, info: TensorInfo, what: str) -> None:
    if not isinstance(arr, np.ndarray):
        raise ExecutionError(f"run_slots: {what} {info.name!r} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype != info.dtype.np:
        raise ExecutionError(f"run_slots: {what} {info.name!r} must be {info.dtype.np} ({info.dtype}), got {arr.dtype}")
    if not arr.flags.c_contiguous:
        raise ExecutionError(f"run_slots: {what} {info.name!r} must be C-contiguous")

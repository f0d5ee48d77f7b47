"""`CompiledGraph`: a loaded library plus a pool of execution contexts, driven from Python.

Everything a run needs is checked here before C is called (names, shapes,
dtypes, dynamic dims against their bounds, params set), so mistakes become
`ExecutionError`s naming the offending tensor; the library re-checks symbols,
pointers and params and reports run-time failures (e.g. a gather index out of
range) through `rlx_last_error`.

Dtypes, for run inputs and params alike: an ndarray must have the declared
dtype or one numpy casts to it *safely* (lossless: int32 → int64 indices,
float16 → float32, bool → any); anything lossy (float64 → float32, int64 →
int32) is refused — cast it yourself, or pass ``cast=True`` to `set_param`,
which converts and refuses values that would overflow (or, for int params,
not fit). Plain Python lists and scalars carry no dtype and are converted to
the declared dtype (for params with the same overflow check). bf16 tensors
are exchanged as numpy bfloat16 arrays (`ml_dtypes`), bit for bit both ways;
bf16 inputs and params also take float32 values (rounded to bf16 on the way
in), as in `rlx.reference`.

Threads: `run` and `run_slots` may be called from any number of threads at
once. Each call checks an execution context (arena, scratch, error text) out
of a pool, runs with the GIL released, and returns it; contexts are cloned
from the first one when concurrent calls need them, at most `max_contexts`
(default: the CPU count) exist, and calls beyond that wait for a free one.
Each context holds its own copy of the params (`rlx_clone` copies them), so
the pool costs one param copy per context that concurrency ever needed; params
bound in place (read-only arrays, see `set_param`) are shared by all of them.
`set_param` and setting `num_threads` wait for the runs in flight, keep new
ones out while they work, and apply to every later run. Each run also uses
`num_threads` OpenMP threads: with many concurrent callers, lower it (e.g.
to 1) so callers × threads stays near the core count.

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

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.errors import ExecutionError
from rlx.ir.dtype import DType, bf16_to_f32, bits_to_bfloat16, is_bfloat16
from rlx.runtime.abi import ffi
from rlx.runtime.conversions import _contiguous, _to_input_dtype, _to_param_dtype, read_only_memory
from rlx.runtime.loader import Library, TensorInfo, openmp_policy
from rlx.runtime.provenance import Provenance
from rlx.runtime.team import TeamGovernor, team_trace, work_key
from rlx.toolchain.param_store import ParamStore, Source, mapped_source

if TYPE_CHECKING:  # concurrent.futures (and logging, which it imports) load with run_async's first use
    from concurrent.futures import Future


class _Context:
    """One C execution context and the argument arrays `rlx_run` is called with on it."""

    __slots__ = ("ins", "outs", "ptr", "sym", "team")

    def __init__(self, ptr: Any, n_symbols: int, n_inputs: int, n_outputs: int) -> None:
        self.ptr = ptr
        self.team: tuple[int, bool] | None = None  # (threads, spins) last passed to rlx_set_team
        self.sym = ffi.new("int64_t[]", max(n_symbols, 1))
        self.ins = ffi.new("void *[]", max(n_inputs, 1))
        self.outs = ffi.new("void *[]", max(n_outputs, 1))


class _ContextPool:
    """Execution contexts handed out one per concurrent call, plus a writer lock over all of them.

    `checkout` lends an idle context (cloning a new one from the primary while
    fewer than `limit` exist, waiting otherwise); `exclusive` waits until no
    call holds a context and keeps new calls out meanwhile (writers go first,
    so a stream of runs cannot starve `set_param`); `shared` holds writers off
    without taking a context. The primary context is never dropped.
    """

    def __init__(self, primary: _Context, make: Callable[[], _Context], limit: int) -> None:
        self.primary = primary
        self._make = make
        self._limit = limit
        self._idle = [primary]  # LIFO: a lone caller keeps getting the same warm context
        self._size = 1  # contexts in existence (idle + lent + being cloned)
        self._busy = 0  # calls holding a context or a shared hold
        self._writing = False
        self._writers_waiting = 0
        self._cond = threading.Condition()

    @property
    def size(self) -> int:
        return self._size

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, n: int) -> None:
        with self._cond:
            self._limit = n
            while self._size > n and len(self._idle) > 1:
                victim = next(c for c in self._idle if c is not self.primary)
                self._idle.remove(victim)
                self._size -= 1
            self._cond.notify_all()

    def contexts(self) -> list[_Context]:
        """Every context; call only inside `exclusive`, when all of them are idle."""
        return list(self._idle)

    def drop_clones(self) -> None:
        """Forget every context but the primary (inside `exclusive`); they are re-cloned when needed."""
        self._idle = [self.primary]
        self._size = 1

    @contextlib.contextmanager
    def checkout(self) -> Iterator[_Context]:
        ctx = self.take()
        try:
            yield ctx
        finally:
            self.give(ctx)

    def take(self) -> _Context:
        """`checkout` without the context manager (a run's own path, where each line counts on caches the previous
        run flushed): an idle context, lent until `give`."""
        with self._cond:
            while self._writing or self._writers_waiting or (not self._idle and self._size >= self._limit):
                self._cond.wait()
            self._busy += 1
            if self._idle:
                return self._idle.pop()
            self._size += 1
        try:
            return self._make()  # outside the lock: copies the params; writers are held off by _busy
        except BaseException:
            with self._cond:
                self._size -= 1
                self._busy -= 1
                self._cond.notify_all()
            raise

    def give(self, ctx: _Context) -> None:
        """Return a context `take` lent."""
        with self._cond:
            self._busy -= 1
            if ctx is self.primary or self._size <= self._limit:
                self._idle.append(ctx)
            else:
                self._size -= 1  # the limit was lowered while it was out
            self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._busy:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def default_max_contexts(library: Library) -> int:
    """The pool bound a CompiledGraph gets unless told otherwise: the CPU count (1 for non-CPU targets)."""
    if str(library.manifest.get("target", "cpu")) != "cpu":
        return 1  # device contexts hold device memory; runs on them are serialized
    return os.cpu_count() or 1


class CompiledGraph(Provenance):
    """A compiled graph ready to run: params set once, then `run` many times, from any threads.

    >>> import numpy as np, rlx
    >>> from concurrent.futures import ThreadPoolExecutor
    >>> g = rlx.Graph("rowsum")
    >>> x = g.input("x", [rlx.Dim.dynamic("n", max=8), 4])
    >>> g.set_outputs([g.reduce("sum", g.mul(x, g.param("w", [4])), [1])])
    >>> cg = rlx.Session().compile(g, num_threads=1)
    >>> cg.set_param("w", np.arange(4, dtype=np.float32))
    >>> with ThreadPoolExecutor(4) as pool:
    ...     outs = list(pool.map(lambda n: cg.run(x=np.ones((n, 4), np.float32))[0], range(1, 9)))
    >>> [o.tolist() for o in outs[:3]]
    [[6.0], [6.0, 6.0], [6.0, 6.0, 6.0]]
    >>> 1 <= cg.num_contexts <= cg.max_contexts
    True
    """

    def __init__(self, library: Library, *, source: Path | None = None, key: str = "", cache_hit: bool = False,
                 num_threads: int | None = None, max_contexts: int | None = None, _ctx: Any = None,
                 _param_set: list[bool] | None = None, param_store: ParamStore | None = None) -> None:
        self._library = library
        self._lib = library.lib
        raw = _ctx if _ctx is not None else self._lib.rlx_create()
        if raw == ffi.NULL:
            raise ExecutionError(f"rlx_create failed for {library.path} (out of memory?)")
        self._ctx = ffi.gc(raw, self._lib.rlx_destroy)  # the primary context: params are set here
        self._source_path = source
        self.key = key or str(library.manifest.get("key", ""))
        self.cache_hit = cache_hit
        self._inputs = {t.name: i for i, t in enumerate(library.inputs)}
        self._outputs = {t.name: i for i, t in enumerate(library.outputs)}
        self._params = {t.name: i for i, t in enumerate(library.params)}
        self._param_set = list(_param_set) if _param_set is not None else [False] * len(library.params)
        self._params_ready = False  # every param set: checked once by a run, then not again (params stay set)
        # The arrays handed to rlx_set_param (references, not copies), for save(weights=True).
        self._param_values: dict[str, np.ndarray | _Recomputed] = {}
        # Params the library reads in place (rlx_bind_param), by index: the arrays, kept alive while bound.
        self._bound: dict[int, np.ndarray] = {}
        # Params bound to their stored layout kept in the cache (rlx_bind_stored, `rlx.toolchain.param_store`):
        # the mapped files, by index, kept alive while bound.
        self._stored: dict[int, np.ndarray] = {}
        on_cpu = str(library.manifest.get("target", "cpu")) == "cpu"
        self._binds = on_cpu and hasattr(self._lib, "rlx_bind_param")
        self._store = param_store if self._binds and hasattr(self._lib, "rlx_bind_stored") else None
        self._handles: dict[str, np.ndarray] = {}
        # RLX_RECORD (rlx.runtime.record): the recorder `run` writes each call to, and the params' version
        self._recorder: Any = None
        self._params_version = 0
        self._bounds = dict(library.symbols)
        self._sym_order = [name for name, _ in library.symbols]
        # Per input, the numpy dtype an array is taken as it is in (no conversion, no copy), None where `run` always
        # converts (bf16 and the narrow formats); the dynamic dims of the last input shapes `run` saw, and its
        # outputs' shapes and dtypes: a run of the same shapes checks and works them out once (cold Python after a
        # run of a model flushed the caches: ~20 us of MobileNetV3-small's 1.3 ms went to them)
        self._bf16_outputs = any(t.dtype is DType.BF16 for t in library.outputs)
        self._input_np = [None if t.dtype is DType.BF16 or t.dtype.is_narrow else t.dtype.np for t in library.inputs]
        self._shapes_seen: tuple[tuple[tuple[int, ...], ...], dict[str, int]] | None = None
        self._outputs_seen: tuple[dict[str, int], list[tuple[tuple[int, ...], np.dtype]]] | None = None
        self._syms_seen: tuple[dict[str, int], list[int], tuple[int, ...]] | None = None
        limit = default_max_contexts(library) if max_contexts is None else _check_max_contexts(max_contexts)
        self._pool = _ContextPool(self._wrap(self._ctx), self._clone_context, limit)
        self._threads = 0
        # CPU libraries size each run's OpenMP team between runs (rlx.runtime.team; RLX_OMP_WAIT).
        self._team: TeamGovernor | None = None
        if on_cpu and hasattr(self._lib, "rlx_set_team"):
            self._team = TeamGovernor(1, openmp_policy(), trace=team_trace(os.environ))
        self.num_threads = num_threads if num_threads is not None else 0

    def _wrap(self, ptr: Any) -> _Context:
        lib = self._library
        return _Context(ptr, len(lib.symbols), len(lib.inputs), len(lib.outputs))

    def _clone_context(self) -> _Context:
        """A new pooled context cloned from the primary (params and thread count copied)."""
        raw = self._lib.rlx_clone(self._ctx)
        if raw == ffi.NULL:
            raise ExecutionError(f"rlx_clone failed for {self._library.path} (out of memory?); lower max_contexts")
        return self._wrap(ffi.gc(raw, self._lib.rlx_destroy))

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
        """Threads each run uses for OpenMP loops and BLAS together (set it to change; < 1 means the default).

        Setting it waits for the runs in flight and applies to every pooled context.
        """
        return self._threads

    @num_threads.setter
    def num_threads(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise ExecutionError(f"num_threads must be an int, got {n!r}")
        with self._pool.exclusive():
            got = -1
            for ctx in self._pool.contexts():  # the primary first
                got = self._lib.rlx_set_num_threads(ctx.ptr, n)
                if got < 0:
                    msg = self._error(f"set_num_threads({n})", ctx)
                    self._pool.drop_clones()  # clones of a consistent primary come back on demand
                    raise ExecutionError(msg)
            self._threads = int(got)
            for ctx in self._pool.contexts():
                ctx.team = None  # rlx_set_num_threads set the team to the whole count
            if self._team is not None:
                self._team.resize(self._threads)

    @property
    def team(self) -> TeamGovernor | None:
        """The governor that sizes each run's OpenMP team (CPU graphs; None elsewhere): its `threads`
        is what the next run uses, `contended` whether other processes were found taking the cores."""
        return self._team

    @property
    def max_contexts(self) -> int:
        """Most execution contexts (concurrent runs) this graph keeps; more callers wait for one.

        Default: the CPU count (1 for non-CPU targets). Each context holds its own
        arena, scratch and copy of the params. Lowering it drops idle contexts.

        >>> import rlx
        >>> g = rlx.Graph("neg")
        >>> g.set_outputs([g.activation("neg", g.input("x", [2]))])
        >>> cg = rlx.Session().compile(g)
        >>> cg.max_contexts = 2
        >>> cg.max_contexts, cg.num_contexts
        (2, 1)
        """
        return self._pool.limit

    @max_contexts.setter
    def max_contexts(self, n: int) -> None:
        self._pool.limit = _check_max_contexts(n)

    @property
    def num_contexts(self) -> int:
        """Execution contexts created so far (1 until runs overlap)."""
        return self._pool.size

    # ── collectives (graphs with all_reduce / all_gather / reduce_scatter) ──

    def set_transport(self, transport: Any) -> None:
        """Attach this rank's transport (e.g. `rlx.runtime.transport.ShmTransport`); None detaches.

        A graph with collective ops runs once per rank, and each run's collectives meet the
        other ranks' in order, so runs of this graph become one at a time (`max_contexts` 1).
        Only libraries of graphs with collectives take a transport.
        """
        try:
            set_transport = self._lib.rlx_set_transport
        except AttributeError:
            raise ExecutionError(f"{self._library.manifest.get('name', '?')!r} has no collective ops, so it "
                                 "takes no transport") from None
        ptr = ffi.NULL if transport is None else transport.ptr
        self._pool.limit = 1
        with self._pool.exclusive():
            self._pool.drop_clones()
            if set_transport(self._ctx, ptr) != 0:
                raise ExecutionError(self._error("set_transport"))
            self._transport = transport  # its function table and region outlive every run

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}: {t.describe()}" for t in self._library.inputs)
        outs = ", ".join(f"{t.name}: {t.describe()}" for t in self._library.outputs)
        return f"CompiledGraph({self._library.manifest.get('name', '?')!r}, ({ins}) -> ({outs}))"

    # ── params ─────────────────────────────────────────────────────────

    def set_param(self, name: str, array: Any, *, cast: bool = False,
                  source: Callable[[], Any] | None = None) -> None:
        """Copy a weight in (user layout, declared shape), or use it in place when it is read-only.

        The dtype rules of `run` apply: the declared dtype, or one numpy casts to
        it safely (float16 → f32, int8 → i32, ...); bf16 params take float32
        values. Anything lossy (float64 → f32, int64 → i32) raises an
        `ExecutionError` unless `cast=True`, which converts and still refuses
        values that overflow the param's dtype (or, for ints, do not fit).
        Waits for runs in flight; every later run, on any thread, sees the new value.
        The graph keeps a reference to the array it copied (for `param_arrays`, `save(weights=True)`,
        recording); `source`, a function giving the same values again, is kept instead, so an array the
        caller converted for this call (a transposed weight, say) is not held beside the library's copy.

        In place, not copied: on the CPU, an array whose memory nothing can write (read-only, and so is
        every array and buffer under it: a weight mapped read-only from its file, or an array whose
        `flags.writeable` you turned off) that needs no conversion (declared dtype, C-contiguous) is
        read where it is by every run, when the library stores the param as given (embedding tables,
        biases, norm weights; not the weights a GEMM packs, which are copied into panels; an embedding
        table until a run gathers many of its rows: `ResidentTable`). The graph
        (and its clones) keeps the array alive while it is bound; turning `writeable` back on and
        writing it is a data race with every run, and a weight mapped from a file is read from the
        file's pages, so the file must stay as it is while it is bound (replacing it by a rename is fine).
        A weight the library stores in another layout, read-only and mapped from a weights file by
        `rlx.toolchain.param_store.map_file` (`load_safetensors(mapped=True)`), is converted once per cached
        library: the converted bytes are kept beside it in the AOT cache and later processes bind those
        (`params_stored`) instead of converting again.
        A writable array is always copied, so changing it afterwards changes nothing; setting the param
        again replaces the binding. `params_in_place` names the params read in place.

        >>> import numpy as np, rlx
        >>> g = rlx.Graph("scale")
        >>> g.set_outputs([g.mul(g.input("x", [2]), g.param("a", [2]))])
        >>> cg = rlx.Session().compile(g)
        >>> a = np.array([4.0, 5.0], np.float32)
        >>> cg.set_param("a", a)  # writable: copied
        >>> a[:] = 0
        >>> cg.run(x=np.ones(2, np.float32))[0].tolist(), cg.params_in_place
        ([4.0, 5.0], ())
        >>> a.flags.writeable = False
        >>> cg.set_param("a", a)  # read-only: read in place
        >>> cg.run(x=np.ones(2, np.float32))[0].tolist(), cg.params_in_place
        ([0.0, 0.0], ('a',))
        >>> cg.set_param("a", np.array([2.0, 3.0]))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rlx.errors.ExecutionError: param 'a' is f32 but got a float64 array; converting would lose information...
        >>> cg.set_param("a", np.array([2.0, 3.0]), cast=True)
        >>> cg.run(x=np.ones(2, np.float32))[0].tolist()
        [2.0, 3.0]
        >>> cg.set_param("a", np.array([1e40, 1.0]), cast=True)
        Traceback (most recent call last):
        ...
        rlx.errors.ExecutionError: param 'a': value 1e+40 overflows f32
        """
        idx, info = self._param(name)
        want = info.concrete({})
        if info.rounds_f32 and isinstance(array, np.ndarray) and (array.dtype in _F32_VALUES or
                                                                  is_bfloat16(array.dtype)):
            # stored narrow by the session's precision: values an f32 holds exactly (f32, f16, bf16) are rounded
            # once (overflow refused); an array already of the stored type is taken bit for bit
            cast = True
        # An array's shape is checked before its dtype, a list's once it is an array.
        arr = array if isinstance(array, np.ndarray) else _to_param_dtype(name, array, info.dtype, cast=cast)
        if arr.shape != want:
            raise ExecutionError(f"param {name!r} must have shape {want} ({info.describe()}), got {arr.shape}")
        kept = None if source is None else _Recomputed(name, source, info.dtype, cast)
        self._set_param_raw(idx, info, _to_param_dtype(name, arr, info.dtype, cast=cast) if arr is array else arr, kept)

    def set_param_typed(self, name: str, data: Any, dtype: DType | str, *, cast: bool = False) -> None:
        """Set a param from raw bytes (or an array) holding values of `dtype` (bf16 as uint16 bits).

        When `dtype` is not the param's own, the values are converted under
        `set_param`'s rules (lossless, or `cast=True`).
        """
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
        self._set_param_raw(idx, info, _to_param_dtype(name, arr, info.dtype, cast=cast))

    def _param(self, name: str) -> tuple[int, TensorInfo]:
        if name not in self._params:
            raise ExecutionError(f"unknown param {name!r}; the graph's params are {self.param_names}")
        idx = self._params[name]
        return idx, self._library.params[idx]

    @property
    def params_in_place(self) -> tuple[str, ...]:
        """The params the library reads from the caller's (read-only) arrays rather than its own copy,
        in manifest order (`set_param`); a table of wide gathers (`rlx.ir.decisions.ResidentTable`) stays
        bound, but a run gathering many of its rows copies it into the context first and reads the copy."""
        names = self.param_names
        return tuple(names[i] for i in sorted(self._bound))

    @property
    def params_stored(self) -> tuple[str, ...]:
        """The params bound to their stored layout (packed, ...) kept in the AOT cache from an earlier process
        instead of converted from the caller's array (`rlx.toolchain.param_store`), in manifest order."""
        names = self.param_names
        return tuple(names[i] for i in sorted(self._stored))

    def _set_param_raw(self, idx: int, info: TensorInfo, arr: np.ndarray, kept: _Recomputed | None = None) -> None:
        arr = _contiguous(arr)
        in_place = self._binds and read_only_memory(arr)
        with self._pool.exclusive():
            buf = ffi.from_buffer(arr)
            # rlx_bind_param refuses a param stored in another layout (packed, ...): that one is copied, or its
            # stored layout kept in the cache by an earlier process is bound
            if in_place and self._lib.rlx_bind_param(self._ctx, idx, buf, arr.nbytes) == 0:
                self._bound[idx] = arr  # what the contexts now point into
                self._stored.pop(idx, None)
            elif in_place and (stored := self._bind_stored(idx, info, arr)) is not None:
                self._stored[idx] = stored
                self._bound.pop(idx, None)
            else:
                rc = self._lib.rlx_set_param(self._ctx, idx, buf, arr.nbytes)
                if rc != 0:
                    self._raise(rc, f"set_param({info.name!r})")
                self._bound.pop(idx, None)
                self._stored.pop(idx, None)
                if in_place:
                    self._keep_stored(idx, info, arr)
            # Clones hold the old params (copies, or the old binding): drop them; later overlapping runs clone afresh.
            self._pool.drop_clones()
            self._param_set[idx] = True
            self._param_values[info.name] = arr if kept is None else kept
            self._params_version += 1

    def _stored_key(self, idx: int, info: TensorInfo, arr: np.ndarray) -> tuple[str, Source] | None:
        """The store's key of param `idx` set from `arr`, when `arr` is a view of a mapped weights file that
        is still as it was mapped."""
        if self._store is None:
            return None
        source = mapped_source(arr)
        if source is None or not source.unchanged():
            return None
        return self._store.key(idx, info.name, source), source

    def _bind_stored(self, idx: int, info: TensorInfo, arr: np.ndarray) -> np.ndarray | None:
        """Bind param `idx` to its stored layout kept in the cache for `arr`'s values; the mapped payload, or
        None (nothing kept, or the library refused it)."""
        found = self._stored_key(idx, info, arr)
        payload = None if found is None else self._store.load(found[0])
        if payload is None:
            return None
        if self._lib.rlx_bind_stored(self._ctx, idx, ffi.from_buffer(payload), payload.nbytes) != 0:
            return None
        return payload

    def _keep_stored(self, idx: int, info: TensorInfo, arr: np.ndarray) -> None:
        """Keep param `idx`'s stored layout, just converted from `arr`, in the cache (see `param_store`)."""
        found = self._stored_key(idx, info, arr)
        if found is None or not self._store.writable or not found[1].settled():
            return
        data = ffi.new("const void **")
        size = self._lib.rlx_param_stored(self._ctx, idx, data)
        # unchanged while it was converted: the bytes are those of the signature the key names
        if size > 0 and found[1].unchanged():
            self._store.keep(found[0], memoryview(ffi.buffer(data[0], size)))

    # ── handles ────────────────────────────────────────────────────────

    def bind_handle(self, name: str, array: Any) -> None:
        """Bind a persistent buffer as input `name` for every later run that does not pass it.

        An array that already has the declared dtype and is C-contiguous is used in
        place (so writing into it, e.g. through `run_slots` outputs, updates the
        handle); anything else is converted once into a private copy.

        Handles belong to the CompiledGraph, not to an execution context: every
        pooled context, hence every concurrent run, reads the same bound array,
        and a run uses the binding current when it starts (binding or unbinding
        never disturbs a run in flight). Writing into a bound array (e.g. as a
        `run_slots` output) while other threads' runs read it is a data race:
        order such runs yourself.
        """
        if name not in self._inputs:
            raise ExecutionError(f"bind_handle: unknown input {name!r}; the graph's inputs are {self.input_names}")
        info = self._library.inputs[self._inputs[name]]
        arr = _to_input_dtype(name, array, info.dtype)
        self._check_rank(info, arr)
        self._handles[name] = arr

    def read_handle(self, name: str) -> np.ndarray:
        """A copy of the current contents of the bound handle `name`."""
        value = self._handles.get(name)
        if value is None:
            raise ExecutionError(f"no handle is bound as {name!r} (bound: {sorted(self._handles)})")
        info = self._library.inputs[self._inputs[name]]
        return bits_to_bfloat16(value.copy()) if info.dtype is DType.BF16 else value.copy()

    def unbind_handle(self, name: str) -> None:
        """Forget the handle bound as `name` (runs already started keep using it)."""
        self._handles.pop(name, None)

    # ── running ────────────────────────────────────────────────────────

    def run(self, inputs: Mapping[str, Any] | None = None, **kw: Any) -> list[np.ndarray]:
        """Run with named inputs (a dict and/or keywords); returns the outputs as new arrays.

        Safe to call from several threads at once (see the module docstring).
        """
        if inputs is not None and type(inputs) is not dict and not isinstance(inputs, Mapping):
            names = self.input_names
            call = (", ".join(f"{n}=..." for n in names) if all(n.isidentifier() for n in names)
                    else "{" + ", ".join(f"{n!r}: ..." for n in names) + "}")
            raise TypeError(f"run() takes its inputs by name, not a positional {type(inputs).__name__}: "
                            f"run({call}); the graph's inputs are {names}")
        # the caller's dict as it is unless keywords add to it: only read here
        given: dict[str, Any] = inputs if not kw and type(inputs) is dict else dict(inputs or {})
        for k, v in kw.items():
            if k in given:
                raise ExecutionError(f"input {k!r} given both in the dict and as a keyword")
            given[k] = v
        for k in given:
            if k not in self._inputs:
                unknown = [k for k in given if k not in self._inputs]
                raise ExecutionError(f"unknown inputs {unknown}; the graph's inputs are {self.input_names}")
        handles = dict(self._handles) if self._handles else {}  # one consistent view, whatever other threads bind
        arrays: list[np.ndarray] = []
        for info, as_is in zip(self._library.inputs, self._input_np):
            arr = given.get(info.name)
            if (as_is is not None and type(arr) is np.ndarray and arr.dtype == as_is and arr.flags.c_contiguous
                    and not info.state):
                arrays.append(arr)  # what _to_input_dtype returns for it: the array itself
            elif info.name in given and info.state:
                arr = given[info.name]
                want = info.concrete({})
                if not (isinstance(arr, np.ndarray) and arr.dtype == info.dtype.np and arr.shape == want
                        and arr.flags.c_contiguous and arr.flags.writeable):
                    raise ExecutionError(f"state input {info.name!r} must be a writeable C-contiguous "
                                         f"{info.dtype.np} array of shape {want}: the run updates it in place")
                arrays.append(arr)
            elif info.name in given:
                arrays.append(_to_input_dtype(info.name, given[info.name], info.dtype))
            elif info.name in handles:
                arrays.append(handles[info.name])
            else:
                missing = [t.name for t in self._library.inputs if t.name not in given and t.name not in handles]
                raise ExecutionError(f"missing inputs {missing}")
        symbols = self._bind_symbols(arrays)
        made = self._outputs_seen
        if made is None or made[0] is not symbols:  # the same dims as the last run: its outputs' shapes again
            made = (symbols, [(t.concrete(symbols), t.dtype.np) for t in self._library.outputs])
            self._outputs_seen = made
        outs = [np.empty(shape, dtype=dtype) for shape, dtype in made[1]]
        recorder = self._recorder
        before = [a.copy() for a in arrays] if recorder is not None else None  # state inputs change in place
        self._call(symbols, arrays, outs)
        if recorder is not None:
            self._record(recorder, before, outs)
        if not self._bf16_outputs:
            return outs
        return [bits_to_bfloat16(o) if t.dtype is DType.BF16 else o for o, t in zip(outs, self._library.outputs)]

    def host_empty(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """An uninitialized host array for this graph's inputs or outputs (`pipeline`'s slots): plain memory here;
        pinned on CUDA (`CudaGraph.host_empty`).

        >>> import rlx
        >>> g = rlx.Graph("h")
        >>> g.set_outputs([g.activation("relu", g.input("x", [2]))])
        >>> rlx.Session().compile(g).host_empty((2, 3), np.float32).shape
        (2, 3)
        """
        return np.empty(tuple(shape), dtype)

    def run_async(self, inputs: Mapping[str, Any] | None = None, **kw: Any) -> Future:
        """`run` on this graph's worker thread: a `concurrent.futures.Future` of the outputs
        (`rlx.runtime.pipelined`)."""
        from rlx.runtime.pipelined import run_async

        given = dict(inputs or {})
        given.update(kw)
        return run_async(self, given)

    def pipeline(self, inputs: Iterable[Mapping[str, Any]], depth: int = 2,
                 runners: int | None = None) -> Iterator[list[np.ndarray]]:
        """The outputs of every item of `inputs` (dicts of named inputs), in order, with preparing the next
        items, running (`runners` threads: default 1 on the CPU, 2 on CUDA) and reading the outputs
        overlapped; the yielded arrays are reused once the next item is asked for (`rlx.runtime.pipelined`)."""
        from rlx.runtime.pipelined import pipeline

        return pipeline(self, inputs, depth, runners)

    def record_to(self, recorder: Any) -> None:
        """Write every later `run`'s inputs and outputs through `recorder` (`rlx.runtime.record.Recorder`;
        `Session.compile` sets one when RLX_RECORD is set); None stops recording."""
        self._recorder = recorder

    def _record(self, recorder: Any, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        lib = self._library

        def params() -> tuple[int, dict[str, tuple[np.ndarray, DType]]]:
            dtypes = {t.name: t.dtype for t in lib.params}
            snapshot = list(self._param_values.items())  # one copy, whatever set_param does meanwhile
            return self._params_version, {k: (_value(a), dtypes[k]) for k, a in snapshot}

        recorder.record({t.name: (a, t.dtype) for t, a in zip(lib.inputs, inputs)},
                        {t.name: (a, t.dtype) for t, a in zip(lib.outputs, outputs)}, params)

    def run_slots(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run with positional inputs, writing into caller-provided output arrays (no allocation).

        Arrays must already have the storage dtype (`DType.np`; bf16 as uint16 bits), be
        C-contiguous, and outputs must be writable, correctly shaped and not overlap inputs.
        Concurrent calls each take their own pooled context, so they may share inputs
        but must each write to their own output arrays.
        """
        symbols = self._check_slots(inputs, outputs)
        self._call(symbols, inputs, outputs)

    def bind_run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray]) -> Callable[[], None]:
        """A run over fixed arrays, checked once here: calling the result runs the graph on their current
        contents, with no per-call checks, conversions or allocation (a decode loop refills its small
        input arrays in place between calls, and reads the outputs it gave).

        Arrays follow `run_slots`' rules (storage dtype, C-contiguous, writeable outputs that overlap no
        input); the dynamic dims are those of these shapes. The callable keeps the arrays alive and is
        thread-safe like `run` (each call takes a pooled context), though concurrent calls share outputs.

        >>> import numpy as np, rlx
        >>> g = rlx.Graph("t")
        >>> g.set_outputs([g.activation("relu", g.input("x", [3]))])
        >>> cg = rlx.Session().compile(g)
        >>> x, y = np.array([-1, 2, -3], np.float32), np.empty(3, np.float32)
        >>> run = cg.bind_run({"x": x}, [y])
        >>> run(); y.tolist()
        [0.0, 2.0, 0.0]
        >>> x[0] = 5; run(); y.tolist()
        [5.0, 2.0, 0.0]
        """
        lib = self._library
        missing = [t.name for t in lib.inputs if t.name not in inputs]
        if missing:
            raise ExecutionError(f"bind_run: missing inputs {missing}")
        arrays = [inputs[t.name] for t in lib.inputs]
        self._check_slots(arrays, outputs)
        symbols = self._bind_symbols(arrays)
        sym_values = [symbols[name] for name in self._sym_order]
        keep = [ffi.from_buffer(arr) for arr in arrays] + [ffi.from_buffer(a, require_writable=True) for a in outputs]
        n_in = len(arrays)

        def run() -> None:
            self._run_buffers(sym_values, keep, n_in)

        return run

    def _check_slots(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> dict[str, int]:
        """`run_slots`' checks of its arrays; the dynamic dims their shapes give."""
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
        return symbols

    def _check_rank(self, info: TensorInfo, arr: np.ndarray) -> None:
        if arr.ndim != len(info.dims):
            raise ExecutionError(f"input {info.name!r} must have rank {len(info.dims)} ({info.describe()}), "
                                 f"got shape {arr.shape}")

    def _bind_symbols(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        """The dynamic dims the arrays' shapes give, checked (ranks, bounds, shapes); the caller must not change
        the dict (the last one is kept for the next arrays of the same shapes)."""
        shapes = tuple(arr.shape for arr in arrays)
        seen = self._shapes_seen
        if seen is not None and seen[0] == shapes:
            return seen[1]
        values = self._check_symbols(arrays)
        self._shapes_seen = (shapes, values)
        return values

    def _check_symbols(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
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
        keep = [ffi.from_buffer(arr) for arr in inputs]
        keep += [ffi.from_buffer(arr, require_writable=True) for arr in outputs]
        seen = self._syms_seen  # the dims' values in order and their work key, as for the last symbols
        if seen is None or seen[0] is not symbols:
            values = [symbols[name] for name in self._sym_order]
            seen = self._syms_seen = (symbols, values, work_key(values))
        self._run_buffers(seen[1], keep, len(inputs), seen[2])
        del keep

    def _run_buffers(self, sym_values: Sequence[int], buffers: Sequence[Any], n_in: int,
                     work: tuple[int, ...] | None = None) -> None:
        """One `rlx_run` on a pooled context: the dynamic dims' values, then cffi buffers, inputs first (`work`:
        `work_key(sym_values)` when the caller has it)."""
        team = self._team
        if team is None or not team.active:  # a fixed team: nothing to measure, no lock to take
            self._run_on_context(sym_values, buffers, n_in,
                                 None if team is None else (team.threads, team.policy.spins))
            return
        ticket = team.begin(work_key(sym_values) if work is None else work)
        try:
            self._run_on_context(sym_values, buffers, n_in, (team.threads if ticket is None else ticket[0],
                                                              team.forks_cheap))
        finally:
            team.end(ticket)

    def _run_on_context(self, sym_values: Sequence[int], buffers: Sequence[Any], n_in: int,
                        team: tuple[int, bool] | None = None) -> None:
        ctx = self._pool.take()
        try:
            if team is not None and ctx.team != team:
                if self._lib.rlx_set_team(ctx.ptr, team[0], int(team[1])) < team[0]:
                    # Scratch reserved for fewer threads: the governor's oversized team (one thread more
                    # than the cores, rlx.runtime.team) reserves its own the first time a context runs it.
                    if self._lib.rlx_set_num_threads(ctx.ptr, team[0]) < 0:
                        raise ExecutionError(self._error(f"set_num_threads({team[0]})", ctx))
                    self._lib.rlx_set_team(ctx.ptr, team[0], int(team[1]))
                ctx.team = team
            if not self._params_ready:
                unset = [t.name for t, ok in zip(self._library.params, self._param_set) if not ok]
                if unset:
                    raise ExecutionError(f"params never set: {unset}")
                self._params_ready = True
            sym, ins, outs = ctx.sym, ctx.ins, ctx.outs
            for i, v in enumerate(sym_values):
                sym[i] = v
            for i in range(n_in):
                ins[i] = buffers[i]
            for i in range(len(buffers) - n_in):
                outs[i] = buffers[n_in + i]
            rc = self._lib.rlx_run(ctx.ptr, sym, ins, outs)  # releases the GIL
            if rc != 0:
                if ctx is self._pool.primary:
                    self._raise(rc, "run")  # the subclass hook maps return codes; reads the primary's error
                raise ExecutionError(self._error("run", ctx))  # read before the context goes back
        finally:
            self._pool.give(ctx)

    def _raise(self, rc: int, what: str) -> None:
        """Turn a nonzero return code on the primary context into an exception (backends map their own codes)."""
        raise ExecutionError(self._error(what))

    def _error(self, what: str, ctx: _Context | None = None) -> str:
        ptr = self._ctx if ctx is None else ctx.ptr
        msg = ffi.string(self._lib.rlx_last_error(ptr)).decode("utf-8", "replace")
        return f"{what} failed in {self._library.manifest.get('name', '?')!r}: {msg or 'unknown error'}"

    # ── observing ──────────────────────────────────────────────────────

    def memory(self) -> dict[str, int]:
        """Bytes the primary execution context holds, as the library allocated them.

        Keys: arena, params, scratch (for the threads reserved so far), context (the record
        itself), total. Each pooled context holds as much again. Compare `Session.estimate`.

        >>> import rlx
        >>> g = rlx.Graph("m")
        >>> g.set_outputs([g.activation("relu", g.matmul(g.input("x", [8, 64]), g.param("w", [64, 64])))])
        >>> rlx.Session().compile(g, num_threads=1).memory()["total"] == rlx.Session().estimate(g, num_threads=1).total
        True
        """
        out = ffi.new("int64_t[4]")
        try:
            fn = self._lib.rlx_memory
        except AttributeError:
            raise ExecutionError("this library predates rlx_memory; rebuild it") from None
        with self._pool.shared():
            if fn(self._ctx, out) != 0:
                raise ExecutionError("rlx_memory failed")
        sizes = {"arena": out[0], "params": out[1], "scratch": out[2], "context": out[3]}
        return {**sizes, "total": sum(sizes.values())}

    @property
    def profiled(self) -> bool:
        """True for a profiled build (`Session(profile=True)` / RLX_PROFILE=1): `trace()` works."""
        from rlx.runtime.profile import profile_info

        return profile_info(self._lib) is not None

    def trace(self, *, clear: bool = False) -> list:
        """The time spans the runs so far recorded (a profiled build only), oldest first.

        One `rlx.runtime.profile.Span` per kernel per run (`thread == -1`) and one per OpenMP
        thread of each profiled parallel region; spans of every pooled context are merged.
        Each context keeps its last 16384 spans. `clear=True` empties the buffers after reading.

        >>> import numpy as np, rlx
        >>> g = rlx.Graph("t")
        >>> g.set_outputs([g.activation("relu", g.input("x", [4]))])
        >>> cg = rlx.Session(profile=True).compile(g)
        >>> _ = cg.run(x=np.ones(4, np.float32))
        >>> [(s.kind, s.thread) for s in cg.trace()]
        [('activation', -1)]
        """
        from rlx.runtime.profile import not_profiled, profile_info, read_spans

        info = profile_info(self._lib)
        if info is None:
            raise not_profiled(str(self._library.manifest.get("name", "?")))
        with self._pool.exclusive():
            spans = [s for ctx in self._pool.contexts() for s in read_spans(self._lib, ctx.ptr, info)]
            if clear:
                for ctx in self._pool.contexts():
                    self._lib.rlx_profile_clear(ctx.ptr)
        return sorted(spans, key=lambda s: (s.start_ns, s.thread))

    def save_trace(self, path: str | Path) -> Path:
        """Write `trace()` as chrome-trace JSON (open it in ui.perfetto.dev or chrome://tracing)."""
        from rlx.runtime.profile import save_chrome_trace

        return save_chrome_trace(self.trace(), path, name=str(self._library.manifest.get("name", "rlx")))

    # ── copies ─────────────────────────────────────────────────────────

    def clone(self) -> CompiledGraph:
        """An independent CompiledGraph on the same library, with params, thread count and pool bound copied.

        Handles are not copied. Not needed for threading (`run` is thread-safe);
        useful to change params on one copy only.
        """
        with self._pool.shared():
            raw = self._lib.rlx_clone(self._ctx)
            param_set, values, bound = list(self._param_set), dict(self._param_values), dict(self._bound)
            stored = dict(self._stored)
        if raw == ffi.NULL:
            raise ExecutionError("rlx_clone failed (out of memory?)")
        twin = CompiledGraph(self._library, source=self._source_path, key=self.key, cache_hit=self.cache_hit,
                             num_threads=self._threads, max_contexts=self.max_contexts, _ctx=raw,
                             _param_set=param_set)
        twin._param_values = values
        twin._bound = bound  # rlx_clone kept the bindings: the twin keeps their arrays alive too
        twin._stored = stored
        twin._store = self._store
        twin.record_build(self.source_digest, self._decided)  # the same program: the same provenance
        return twin

    # ── artifacts ──────────────────────────────────────────────────────

    def param_arrays(self) -> dict[str, np.ndarray]:
        """The params set so far, by name, as passed to the library (declared dtype, bf16 as uint16 bits);
        a param set with a `source` is had again from it."""
        return {name: _value(v) for name, v in self._param_values.items()}

    def save(self, directory: str | Path, *, weights: bool | Mapping[str, Any] = False) -> Path:
        """Write a relocatable artifact directory (model.so and its BLAS, manifest.json, rlx.h, source, weights).

        See `rlx.runtime.artifact`; load it with `rlx.load(directory)`.
        """
        from rlx.runtime.artifact import save

        return save(self, directory, weights=weights)


#: numpy float types whose every value an f32 holds exactly (set_param rounds them to a narrower stored type)
_F32_VALUES = (np.dtype(np.float32), np.dtype(np.float16))


class _Recomputed:
    """A param's values had again on demand (`set_param(source=...)`), converted as `set_param` converted them.

    A plain class, not a dataclass: an internal holder compared by nobody, whose definition a warm start
    would otherwise pay ~1 ms for (a frozen dataclass's methods are generated and compiled at import).
    """

    __slots__ = ("cast", "dtype", "name", "source")

    def __init__(self, name: str, source: Callable[[], Any], dtype: DType, cast: bool) -> None:
        self.name = name
        self.source = source
        self.dtype = dtype
        self.cast = cast

    def __call__(self) -> np.ndarray:
        return _contiguous(_to_param_dtype(self.name, self.source(), self.dtype, cast=self.cast))


def _value(kept: np.ndarray | _Recomputed) -> np.ndarray:
    return kept() if isinstance(kept, _Recomputed) else kept


def _check_max_contexts(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ExecutionError(f"max_contexts must be an int >= 1, got {n!r}")
    return n


def _fmt_syms(values: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "no dynamic dims"


def _check_exact(arr: Any, info: TensorInfo, what: str) -> None:
    if not isinstance(arr, np.ndarray):
        raise ExecutionError(f"run_slots: {what} {info.name!r} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype != info.dtype.np:
        raise ExecutionError(f"run_slots: {what} {info.name!r} must be {info.dtype.np} ({info.dtype}), got {arr.dtype}")
    if not arr.flags.c_contiguous:
        raise ExecutionError(f"run_slots: {what} {info.name!r} must be C-contiguous")

"""The host side of a Metal program: one shared buffer, the dispatch manifest, the RLX run semantics.

A rendered Metal program (`rlx.codegen.metal.render_metal`) is a .metal source
plus a manifest: the IO tensors, the byte layout of the one program buffer, the
constants' bytes and the dispatches of one run (kernel, grid as expressions of
the dynamic dims, threadgroup size). `MetalGraph` gives it the API of a
compiled graph — `set_param`, `run` (named inputs; dynamic dims bound from
their shapes), errors as `rlx.errors` exceptions — over a `Runner`, which owns
the buffer and executes a list of dispatches:

- `rlx.runtime.metal_device.MetalDeviceRunner`: Apple's Metal through PyObjC
  (all dispatches of a run in one command buffer; macOS only);
- the emulator of `tests/metal/` (the kernels compiled as C++ and run on the CPU).

>>> lay = {"total": 16, "params": [], "inputs": [0], "outputs": [8], "arena": 16, "flag": 12}
>>> grid_size([2, ["seq"], 1], {"seq": 5}), grid_size([100, [], 32], {})
(10, 4)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rlx.errors import ArtifactError, ExecutionError
from rlx.ir.dtype import DType, bf16_to_f32
from rlx.runtime.conversions import _to_input_dtype, _to_param_dtype
from rlx.runtime.loader import TensorInfo
from rlx.runtime.provenance import Provenance

#: What the error flag's value means (set by kernels; checked after every run).
FLAG_ERRORS = {1: "gather index out of range", 2: "integer division by zero",
               3: "cached_attention: a row's position plus its new tokens exceeds the cache capacity"}


@dataclass(frozen=True)
class Launch:
    """One dispatch with its grid evaluated: kernel index (manifest order), threadgroups, threads."""

    kernel: int
    name: str
    grid: tuple[int, int, int]
    threads: tuple[int, int, int]
    sync: bool


class Runner(Protocol):
    """Owns the program buffer and runs dispatches on it."""

    #: The program buffer as host-visible bytes (shared storage).
    memory: np.ndarray

    def run(self, launches: Sequence[Launch], symbols: np.ndarray) -> None:
        """Run `launches` in order, with `symbols` (int64, the LIR's symbol order) bound at buffer(1)."""


def grid_size(axis: Sequence[Any], symbols: Mapping[str, int]) -> int:
    """Threadgroups along one grid axis of the manifest: ceil(coeff * prod(symbols) / div)."""
    coeff, names, div = axis
    n = int(coeff)
    for name in names:
        n *= int(symbols[name])
    return -(-n // int(div))


class MetalGraph(Provenance):
    """A Metal program ready to run: `set_param(name, array)`, then `run({input: array})` → outputs."""

    def __init__(self, manifest: dict, runner: Runner, *, source: str | None = None) -> None:
        if manifest.get("backend") != "metal":
            raise ArtifactError("not a Metal program manifest")
        self.manifest = manifest
        self.source = source
        self._runner = runner
        self._inputs = [TensorInfo.from_json(d, "input") for d in manifest["inputs"]]
        self._outputs = [TensorInfo.from_json(d, "output") for d in manifest["outputs"]]
        self._params = [TensorInfo.from_json(d, "param") for d in manifest["params"]]
        self._symbols = [(s["name"], int(s["max"])) for s in manifest["symbols"]]
        self._layout = manifest["layout"]
        self._dispatches = manifest["dispatches"]
        mem = runner.memory
        if mem.nbytes < int(self._layout["total"]):
            raise ArtifactError(f"the program buffer has {mem.nbytes} bytes; the layout needs {self._layout['total']}")
        for c in manifest["constants"]:
            data = np.frombuffer(bytes.fromhex(c["hex"]), dtype=np.uint8)
            mem[c["offset"]:c["offset"] + data.size] = data
        self._set: set[str] = set()

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self._inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self._outputs]

    @property
    def param_names(self) -> list[str]:
        return [t.name for t in self._params]

    def _write(self, offset: int, arr: np.ndarray) -> None:
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        self._runner.memory[offset:offset + raw.size] = raw

    def set_param(self, name: str, array: Any, *, cast: bool = False, source: Any = None) -> None:
        """Copy a param's values into the program buffer (bf16 params take float32 values). Nothing of the
        array is kept afterwards, so `source` (`CompiledGraph.set_param`'s) is not needed."""
        slot = next((k for k, t in enumerate(self._params) if t.name == name), None)
        if slot is None:
            raise ExecutionError(f"unknown param {name!r}; the graph's params are {self.param_names}")
        info = self._params[slot]
        arr = _to_param_dtype(name, array, info.dtype, cast=cast)
        want = info.concrete({})
        if tuple(arr.shape) != want:
            raise ExecutionError(f"param {name!r} must have shape {want}, got {tuple(arr.shape)}")
        if info.layout is not None:
            # stored in the layout the graph chose (e.g. a transposed weight): stored = user.transpose(layout)
            arr = np.transpose(arr, info.layout)
        self._write(int(self._layout["params"][slot]), arr)
        self._set.add(name)

    def _bind(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        values: dict[str, int] = {}
        bounds = dict(self._symbols)
        for arr, info in zip(arrays, self._inputs):
            if arr.ndim != len(info.dims):
                raise ExecutionError(f"input {info.name!r} must have rank {len(info.dims)} ({info.describe()}), "
                                     f"got shape {arr.shape}")
            for axis, ((coeff, names), size) in enumerate(zip(info.dims, arr.shape)):
                if coeff == 1 and len(names) == 1:
                    if not 1 <= size <= bounds[names[0]]:
                        raise ExecutionError(f"input {info.name!r} axis {axis}: {names[0]}={size} is outside "
                                             f"1..{bounds[names[0]]}")
                    if values.setdefault(names[0], size) != size:
                        raise ExecutionError(f"input {info.name!r} axis {axis}: {names[0]} is {size} here but "
                                             f"{values[names[0]]} in another input")
        missing = [n for n, _ in self._symbols if n not in values]
        if missing:
            raise ExecutionError(f"cannot deduce dynamic dims {missing} from the input shapes")
        for arr, info in zip(arrays, self._inputs):
            if tuple(arr.shape) != info.concrete(values):
                raise ExecutionError(f"input {info.name!r} must have shape {info.concrete(values)}, "
                                     f"got {tuple(arr.shape)}")
        return values

    @staticmethod
    def _state(info: TensorInfo, arr: Any) -> np.ndarray:
        """A state input (a KV cache) as given: the caller's own array, updated by the run."""
        want = info.concrete({})
        if not (isinstance(arr, np.ndarray) and arr.dtype == info.dtype.np and arr.shape == want
                and arr.flags.c_contiguous and arr.flags.writeable):
            raise ExecutionError(f"state input {info.name!r} must be a writeable C-contiguous {info.dtype.np} array "
                                 f"of shape {want}: the run updates it in place")
        return arr

    def launches(self, symbols: Mapping[str, int]) -> list[Launch]:
        """The dispatches of one run with these dynamic dim values (empty grids dropped)."""
        out = []
        for k, d in enumerate(self._dispatches):
            grid = tuple(grid_size(a, symbols) for a in d["grid"])
            if min(grid) > 0:
                out.append(Launch(k, d["kernel"], grid, tuple(d["threads"]), bool(d["sync"])))  # type: ignore[arg-type]
        return out

    def run(self, inputs: Mapping[str, Any] | None = None, **kw: Any) -> list[np.ndarray]:
        """Run with named inputs (a dict and/or keywords); returns the outputs as new arrays."""
        given = {**(inputs or {}), **kw}
        unknown = [k for k in given if k not in self.input_names]
        if unknown:
            raise ExecutionError(f"unknown inputs {unknown}; the graph's inputs are {self.input_names}")
        missing = [n for n in self.input_names if n not in given]
        if missing:
            raise ExecutionError(f"missing inputs {missing}")
        unset = [n for n in self.param_names if n not in self._set]
        if unset:
            raise ExecutionError(f"params not set: {unset}")
        arrays = [self._state(t, given[t.name]) if t.state else _to_input_dtype(t.name, given[t.name], t.dtype)
                  for t in self._inputs]
        values = self._bind(arrays)
        for slot, arr in enumerate(arrays):
            self._write(int(self._layout["inputs"][slot]), arr)
        mem = self._runner.memory
        flag = int(self._layout["flag"])
        mem[flag:flag + 4] = 0
        sym = np.array([values[n] for n, _ in self._symbols] or [0], dtype=np.int64)
        self._runner.run(self.launches(values), sym)
        code = int(mem[flag:flag + 4].view(np.int32)[0])
        for slot, (arr, info) in enumerate(zip(arrays, self._inputs)):
            if info.state:  # the run updated it in the program buffer: the caller's array gets the new values
                off = int(self._layout["inputs"][slot])
                arr.reshape(-1).view(np.uint8)[:] = mem[off:off + arr.nbytes]
        if code:
            # RLX's own flags, or the program's (a user op's nonzero status: its manifest names the op)
            why = FLAG_ERRORS.get(code) or self.manifest.get("flag_errors", {}).get(str(code), f"error flag {code}")
            raise ExecutionError(f"the Metal program failed: {why}")
        outs = []
        for slot, info in enumerate(self._outputs):
            shape = info.concrete(values)
            dt = np.dtype(np.uint16) if info.dtype is DType.BF16 else np.dtype(info.dtype.np)
            off = int(self._layout["outputs"][slot])
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            arr = mem[off:off + n].copy().view(dt).reshape(shape)
            outs.append(bf16_to_f32(arr) if info.dtype is DType.BF16 else arr)
        return outs

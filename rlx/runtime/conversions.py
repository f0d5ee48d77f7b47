"""The dtype rules at the boundary: what `run` and `set_param` accept and how they convert.

Shared by `CompiledGraph` and the artifact writer, so both apply the same rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx.errors import ExecutionError
from rlx.ir.dtype import DType, bf16_to_f32, bfloat16_to_bits, f32_to_bf16, is_bfloat16


def _contiguous(arr: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
    """C-contiguous `arr` (converted to `dtype`), keeping 0-d arrays 0-d (np.ascontiguousarray does not)."""
    arr = np.asarray(arr, dtype=dtype)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def read_only_memory(arr: np.ndarray) -> bool:
    """True when `arr` is read-only and so is every array and buffer under it (`arr.base`, down to the
    owner of the memory: a read-only `numpy.memmap` of a file, bytes, or an array made read-only itself),
    so no Python code can change its values behind a reader that keeps a pointer to them (a param bound
    in place, `CompiledGraph.set_param`). A read-only view of a writable array is not.

    >>> a = np.zeros(3, np.float32)
    >>> read_only_memory(a), read_only_memory(np.frombuffer(bytes(12), np.float32))
    (False, True)
    >>> view = a[:]
    >>> view.flags.writeable = False
    >>> read_only_memory(view)  # writable through `a`
    False
    """
    if arr.flags.writeable:
        return False
    base = arr.base
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    if base is None:
        return True
    try:
        with memoryview(base) as view:  # released at once: a mapped file's mmap stays closable
            return view.readonly
    except TypeError:  # an owner that is no buffer: nothing says it cannot change
        return False


def _to_input_dtype(name: str, value: Any, dtype: DType) -> np.ndarray:
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if dtype.is_narrow:  # a storage format takes only its own numpy (ml_dtypes) type: no lossless source exists
        if not (isinstance(value, np.ndarray) and value.dtype == dtype.np):
            got = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
            raise ExecutionError(f"input {name!r} is {dtype}; got {got} (pass an array of ml_dtypes.{dtype.np.name})")
        return _contiguous(value)
    if not isinstance(value, np.ndarray):
        try:
            if dtype is DType.BF16:
                return f32_to_bf16(np.asarray(value, dtype=np.float32))
            return _contiguous(value, dtype.np)
        except (TypeError, ValueError) as exc:
            raise ExecutionError(f"input {name!r}: cannot convert {type(value).__name__} to {dtype}: {exc}") from None
    if dtype is DType.BF16:
        if is_bfloat16(value.dtype):  # a real bf16 array: its bits, exactly
            return bfloat16_to_bits(value)
        if value.dtype != np.float32:
            raise ExecutionError(f"input {name!r} is bf16: pass bfloat16 or float32 values (got {value.dtype})")
        return f32_to_bf16(value)
    if is_bfloat16(value.dtype) and dtype in (DType.F32, DType.F64):  # widening bf16 is exact
        return _contiguous(bf16_to_f32(bfloat16_to_bits(value)), dtype.np)
    if value.dtype == dtype.np:
        return _contiguous(value)
    if np.can_cast(value.dtype, dtype.np, casting="safe"):
        return _contiguous(value, dtype.np)
    raise ExecutionError(f"input {name!r} is {value.dtype} but the graph takes {dtype}; converting would lose "
                         f"information, so cast it explicitly (e.g. .astype(np.{dtype.np}))")


def _to_param_dtype(name: str, value: Any, dtype: DType, *, cast: bool = False) -> np.ndarray:
    """`value` as a contiguous array of the param's storage dtype (bf16 as uint16 bits).

    The rules of `_to_input_dtype` (declared dtype or a safe cast; bf16 takes
    float32), except that `cast=True` allows lossy conversions that keep every
    value representable: no finite float becoming inf, no integer out of range.
    Lists and scalars have no dtype of their own and are converted that way.
    """
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray) and is_bfloat16(value.dtype):
        if dtype is DType.BF16:  # a real bf16 array: stored bit for bit
            return bfloat16_to_bits(value)
        value = bf16_to_f32(bfloat16_to_bits(value))  # exact; the f32 rules below decide the rest
    if dtype.is_narrow:  # a storage format takes only its own numpy (ml_dtypes) type: no lossless source exists
        if not (isinstance(value, np.ndarray) and value.dtype == dtype.np):
            got = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
            raise ExecutionError(f"param {name!r} is {dtype}; got {got} (pass an array of ml_dtypes.{dtype.np.name})")
        return _contiguous(value)
    if isinstance(value, np.ndarray):
        arr = value
    else:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise ExecutionError(f"param {name!r}: cannot convert {type(value).__name__} to {dtype}: {exc}") from None
        cast = True
    if arr.dtype.kind not in ("fiub" if dtype.is_float else "iub"):
        raise ExecutionError(f"param {name!r} is {dtype}; got a {arr.dtype} array")
    storage = np.dtype(np.float32) if dtype is DType.BF16 else np.dtype(dtype.np)
    if arr.dtype == storage or (dtype is not DType.BF16 and np.can_cast(arr.dtype, storage, casting="safe")):
        out = _contiguous(arr, storage)
    elif not cast:
        raise ExecutionError(f"param {name!r} is {dtype} but got a {arr.dtype} array; converting would lose "
                             f"information, so cast it explicitly (e.g. .astype(np.{storage})) or pass cast=True")
    elif storage.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            out = _contiguous(arr, storage)
        overflow = np.isinf(out) & np.isfinite(arr)
        if overflow.any():
            bad = arr.reshape(-1)[int(np.argmax(overflow.reshape(-1)))]
            raise ExecutionError(f"param {name!r}: value {bad} overflows {dtype}")
    else:
        if arr.size:
            lo, hi = (0, 1) if storage.kind == "b" else (int(np.iinfo(storage).min), int(np.iinfo(storage).max))
            if int(arr.min()) < lo or int(arr.max()) > hi:
                raise ExecutionError(f"param {name!r}: values do not fit in {dtype} (range {lo}..{hi}, got "
                                     f"{int(arr.min())}..{int(arr.max())})")
        out = _contiguous(arr, storage)
    return f32_to_bf16(out) if dtype is DType.BF16 else out

"""A cffi FFI for C declarations, parsed once per machine instead of once per process.

Parsing declarations (`cffi.FFI().cdef`) runs pycparser: tens of milliseconds, the largest part of
what loading a built library costs a fresh process. cffi can write what the parse produced as
the arguments of a `_cffi_backend.FFI(...)` call (its "out-of-line ABI mode": the type table as
bytes, the functions, structs and typedefs as tuples of literals), which builds the same FFI without
pycparser. `load_ffi` keeps that text in the AOT cache's memo (`AotCache.memo`), keyed by the
declarations and the cffi version, reads it back as literals (`ast.literal_eval`, never executed),
and falls back to parsing when the cache is off, not made yet (it is not made for this), or the
memo is unusable.

>>> ffi = load_ffi(["typedef struct { int32_t a; int64_t b; } Pair;"])
>>> ffi.sizeof("Pair"), ffi.offsetof("Pair", "b")
(16, 8)
>>> rebuilt = ffi_from_source(ffi_source(["typedef struct { int32_t a; int64_t b; } Pair;"]))
>>> rebuilt.sizeof("Pair"), rebuilt.offsetof("Pair", "b")
(16, 8)
"""

from __future__ import annotations

import ast
import hashlib
import io
from collections.abc import Sequence
from typing import Any

import _cffi_backend

#: Bumped when what is memoized changes shape.
MEMO_FORMAT = 1
#: The module name cffi gives the FFI (it shows in cffi's own error messages).
MODULE_NAME = "rlx_abi"


def parse_ffi(cdefs: Sequence[str]) -> Any:
    """A `cffi.FFI` with `cdefs` declared (pycparser parses them)."""
    import cffi

    ffi = cffi.FFI()
    for text in cdefs:
        ffi.cdef(text)
    return ffi


def ffi_source(cdefs: Sequence[str]) -> str:
    """The Python text cffi writes for `cdefs` in out-of-line ABI mode (one `_cffi_backend.FFI(...)` call)."""
    from cffi.recompiler import make_py_source

    out = io.StringIO()
    make_py_source(parse_ffi(cdefs), MODULE_NAME, out)
    return out.getvalue()


class _Library:
    """A library dlopen'ed through a rebuilt FFI whose missing symbols raise `AttributeError`, as
    those of a parsed `cffi.FFI`'s libraries do (callers probe optional exports that way); a rebuilt
    FFI's own libraries raise `ffi.error`. Functions are looked up once, then read as attributes."""

    def __init__(self, lib: Any, error: type[Exception]) -> None:
        self._cffi_lib = lib
        self._cffi_error = error

    def __getattr__(self, name: str) -> Any:
        try:
            value = getattr(self._cffi_lib, name)
        except self._cffi_error as exc:
            raise AttributeError(str(exc)) from None
        self.__dict__[name] = value  # a function's address does not change while the library is open
        return value

    def __dir__(self) -> list[str]:
        return dir(self._cffi_lib)


class _RebuiltFFI(_cffi_backend.FFI):
    """An out-of-line FFI whose `dlopen` gives `_Library` objects."""

    def dlopen(self, *args: Any) -> _Library:
        return _Library(super().dlopen(*args), self.error)

    def dlclose(self, lib: Any) -> None:
        super().dlclose(lib._cffi_lib if isinstance(lib, _Library) else lib)


def ffi_from_source(text: str) -> Any:
    """The FFI that `ffi_source`'s text builds, its arguments read as literals; ValueError if it is not one."""
    calls = [node.value for node in ast.parse(text).body
             if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["ffi"]]
    if len(calls) != 1 or not isinstance(calls[0], ast.Call) or ast.unparse(calls[0].func) != "_cffi_backend.FFI":
        raise ValueError("not one `ffi = _cffi_backend.FFI(...)` call")
    call = calls[0]
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
    if len(kwargs) != len(call.keywords) or "_includes" in kwargs:
        raise ValueError("an FFI built on other FFIs")
    return _RebuiltFFI(*args, **kwargs)


def load_ffi(cdefs: Sequence[str], config: Any = None) -> Any:
    """An FFI with `cdefs` declared: from the cache's memo when it holds them, else parsed (and memoized)."""
    from rlx.toolchain.cache import AotCache

    cache = AotCache(config)
    if not cache.enabled or not cache.root.is_dir():
        return parse_ffi(cdefs)  # no cache yet: not made just for this (loading an artifact needs none)
    text = "\0".join(cdefs)
    fingerprint = {"format": str(MEMO_FORMAT), "cffi": str(_cffi_backend.__version__),
                   "cdefs": hashlib.sha256(text.encode()).hexdigest()}

    def compute() -> dict[str, str]:
        source = ffi_source(cdefs)
        return {"source": source, "sha256": hashlib.sha256(source.encode()).hexdigest()}

    try:
        value = cache.memo("cffi_abi", fingerprint, compute)
        source = value["source"]
        if hashlib.sha256(source.encode()).hexdigest() != value["sha256"]:
            raise ValueError("the memoized source does not match its checksum")
        return ffi_from_source(source)
    except Exception:  # a memo that cannot serve (unwritable, damaged, foreign) is only skipped
        return parse_ffi(cdefs)  # parse, as without the cache (a bad declaration raises here, as it would there)


__all__ = ["ffi_from_source", "ffi_source", "load_ffi", "parse_ffi"]

"""Load a generated library: dlopen through cffi, check the ABI, parse the manifest.

>>> from rlx.runtime.loader import parse_dim
>>> parse_dim("4*seq"), parse_dim("384")
((4, ('seq',)), (384, ()))
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx.errors import ArtifactError
from rlx.ir.dtype import DType
from rlx.runtime.abi import ABI_VERSION, ffi
from rlx.runtime.team import WaitPolicy, openmp_spins
from rlx.toolchain.blas_load import blas_loading


def parse_dim(text: str) -> tuple[int, tuple[str, ...]]:
    """A manifest dim ("384", "seq", "4*seq*batch") as (coefficient, symbol names)."""
    coeff = 1
    names: list[str] = []
    for part in str(text).split("*"):
        part = part.strip()
        if part.isdigit():
            coeff *= int(part)
        elif part.isidentifier():
            names.append(part)
        else:
            raise ArtifactError(f"malformed dimension {text!r} in manifest")
    return coeff, tuple(names)


@dataclass(frozen=True)
class TensorInfo:
    """One manifest entry: name, dtype and dims as (coefficient, symbols) pairs."""

    name: str
    dtype: DType
    dims: tuple[tuple[int, tuple[str, ...]], ...]
    layout: tuple[int, ...] | None = None
    #: A state input (a KV cache): the run updates the caller's array in place, so it is never copied.
    state: bool = False
    #: A param the session's precision stores narrower than the f32 its user declared: `set_param` rounds
    #: float32 arrays into it (as `cast=True` would), refusing values past the narrow type's range.
    rounds_f32: bool = False

    @staticmethod
    def from_json(doc: Any, what: str) -> TensorInfo:
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or not isinstance(doc.get("shape"), list):
            raise ArtifactError(f"malformed {what} entry in manifest: {doc!r}")
        try:
            dtype = DType.parse(doc["dtype"])
        except Exception as exc:
            raise ArtifactError(f"bad dtype in manifest {what} {doc['name']!r}: {exc}") from None
        layout = tuple(doc["layout"]) if doc.get("layout") is not None else None
        return TensorInfo(doc["name"], dtype, tuple(parse_dim(d) for d in doc["shape"]), layout,
                          state=doc.get("state") is True, rounds_f32=doc.get("rounds_f32") is True)

    def concrete(self, symbols: dict[str, int]) -> tuple[int, ...]:
        out = []
        for coeff, names in self.dims:
            v = coeff
            for n in names:
                v *= symbols[n]
            out.append(v)
        return tuple(out)

    def describe(self) -> str:
        parts = []
        for coeff, names in self.dims:
            factors = ([str(coeff)] if coeff != 1 or not names else []) + list(names)
            parts.append("*".join(factors))
        return f"{self.dtype}[{','.join(parts)}]"


@dataclass(frozen=True)
class Library:
    """A loaded generated library and its parsed manifest."""

    path: Path
    lib: Any
    manifest: dict
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    params: tuple[TensorInfo, ...]
    symbols: tuple[tuple[str, int], ...]


#: The OpenMP runtime reads its settings once, when it is loaded: the variables must be set before that.
_OMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_omp_lock = threading.Lock()
_omp_policy: WaitPolicy | None = None


def configure_openmp(omp_wait: str | None = None) -> dict[str, str]:
    """Put RLX's OpenMP wait policy (`RLX_OMP_WAIT`, see `rlx.config`) into the environment, once.

    Called by `load_library` before its first dlopen: a generated library needs
    libgomp, so that first load is what loads libgomp and makes it read
    OMP_WAIT_POLICY / GOMP_SPINCOUNT. A user's own setting of either wins (and
    keeps every team fixed). Returns the variables set (empty when nothing was
    changed); `openmp_policy()` says what is in force.

    >>> import os
    >>> configure_openmp() == {} or os.environ.get("GOMP_SPINCOUNT") == "200000"
    True
    """
    global _omp_policy
    with _omp_lock:
        if _omp_policy is not None:
            return {}
        from rlx.config import Config, omp_environment

        users = {v: os.environ[v] for v in _OMP_VARIABLES if v in os.environ}
        if users:
            setting = " ".join(f"{k}={v}" for k, v in users.items())
            _omp_policy = WaitPolicy(spins=openmp_spins(os.environ), adaptive=False,
                                     source=f"{setting} (the user's; teams fixed)")
            return {}
        wait = omp_wait if omp_wait is not None else Config.from_env().omp_wait
        wanted = omp_environment(wait)
        os.environ.update(wanted)  # putenv: visible to the C runtime's getenv
        setting = " ".join(f"{k}={v}" for k, v in wanted.items()) or "the OpenMP runtime's default"
        adaptive = wait == "adaptive"
        _omp_policy = WaitPolicy(spins=openmp_spins(os.environ), adaptive=adaptive,
                                 source=f"RLX_OMP_WAIT={wait}: {setting}"
                                        + ("; teams shrink while other processes take the cores" if adaptive
                                           else "; teams fixed"))
        return wanted


def openmp_policy() -> WaitPolicy:
    """The OpenMP wait policy of this process: fixed by the first library load (configured now if none yet).

    >>> openmp_policy().spins in (True, False)
    True
    """
    configure_openmp()
    assert _omp_policy is not None
    return _omp_policy


def load_library(path: str | os.PathLike[str]) -> Library:
    """dlopen `path` (ABI mode), verify its ABI version and read its manifest.

    The library is never unmapped (RTLD_NODELETE): OpenMP threads that are still
    spinning in it or its libgomp when the interpreter exits must not find the
    code gone. A BLAS it brings in starts without a thread pool (`blas_loading`:
    the runs use it single-threaded).
    """
    path = Path(path)
    configure_openmp()
    try:
        with blas_loading():
            lib = ffi.dlopen(str(path.resolve()), ffi.RTLD_NOW | ffi.RTLD_LOCAL | ffi.RTLD_NODELETE)
    except OSError as exc:
        raise ArtifactError(f"cannot load {path}: {exc}") from None
    try:
        version = lib.rlx_abi_version()
        raw = lib.rlx_manifest()
    except AttributeError as exc:
        raise ArtifactError(f"{path} is not an RLX library: {exc}") from None
    if version != ABI_VERSION:
        raise ArtifactError(f"{path} was built for RLX ABI {version}, this RLX speaks ABI {ABI_VERSION}")
    try:
        manifest = json.loads(ffi.string(raw).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} has a malformed manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path} has a malformed manifest (not an object)")
    try:
        symbols = tuple((s["name"], int(s["max"])) for s in manifest.get("symbols", []))
        inputs = tuple(TensorInfo.from_json(d, "input") for d in manifest["inputs"])
        outputs = tuple(TensorInfo.from_json(d, "output") for d in manifest["outputs"])
        params = tuple(TensorInfo.from_json(d, "param") for d in manifest["params"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path} has a malformed manifest: {exc!r}") from None
    return Library(path, lib, manifest, inputs, outputs, params, symbols)

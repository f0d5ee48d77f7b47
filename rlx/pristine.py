"""Is the running compiler the one on disk? The compile index's guard against monkeypatches.

The driver's compile index (`rlx.driver`, module docstring) maps a graph to an object built
before, trusting that the code that would run is the code whose files it digested. That is not so
after a monkeypatch (`rlx.codegen.cpu.rules.GRAIN = 4096`): no file changed. So the index is used only
while the compiler's modules (`COMPILER_PACKAGES`, `COMPILER_MODULES`) are *pristine*: bound as
they were when they came from their files.

What "as they came from their files" is, is recorded by an import hook (`install`, the first thing
`import rlx` does, before any compiler module loads): when a compiler module finishes executing,
the objects its globals (and its classes' attributes) are bound to are kept, so a module may load
lazily, whoever imports it, and still be watched. A module that loads while another one is patched
may have captured the patched object (`from rlx.ir.shape import product`), so it is recorded only
when the process was pristine as its load began; otherwise it stays unrecorded and the process
non-pristine. Loads inside an outer trusted load or compile (`trusting_own_loads`) run no user code
and need no check of their own. At the end of `import rlx` and after a compile that began pristine,
the modules loaded meanwhile are recorded again (what their own import or first use bound, e.g. a
registration, is theirs too).

A rebound name, or a compiler module loaded but not recorded (put in `sys.modules` by hand, or
loaded while another was patched), makes the process non-pristine. Comparing objects by identity
(holding references, so ids are never reused) needs no import of the compiler.

>>> import rlx, rlx.ir.shape
>>> from rlx.pristine import compiler_is_pristine
>>> before = compiler_is_pristine()  # True in a fresh process
>>> original = rlx.ir.shape.product
>>> rlx.ir.shape.product = lambda dims: 0  # a monkeypatch
>>> compiler_is_pristine()
False
>>> rlx.ir.shape.product = original
>>> compiler_is_pristine() == before
True
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

#: The packages (and modules) whose code turns a graph into a built object: digested for the
#: compile index's fingerprint and watched for monkeypatches.
COMPILER_PACKAGES = ("rlx.ir", "rlx.opt", "rlx.codegen", "rlx.pipeline", "rlx.toolchain")
#: Modules outside those packages whose code decides a compiled graph too: the numpy reference, and the
#: model builders whose graphs `Session.compile_recipe` finds by their arguments alone.
COMPILER_MODULES = ("rlx.reference", "rlx.models.bert")

#: `is_compiler_module`'s test as one set lookup and one `startswith` (it runs over all of `sys.modules`
#: at every pristine check).
_COMPILER_NAMES = frozenset(COMPILER_MODULES + COMPILER_PACKAGES)
_COMPILER_PREFIXES = tuple(p + "." for p in COMPILER_PACKAGES)

#: module name -> (module object, {name: object bound when it came from its file}).
_recorded: dict[str, tuple[ModuleType, dict[str, object]]] = {}


class _LoadState(threading.local):
    """Per thread: how deep in compiler-module loads, whether the outermost one is trusted, and
    whether a trusted scope (`import rlx`, a compile that began pristine) is open."""

    depth: int = 0
    trusted: bool = False
    scope: int = 0


_load = _LoadState()


def is_compiler_module(name: str) -> bool:
    """True for the modules whose code decides what a graph compiles to.

    >>> is_compiler_module("rlx.codegen.cpu.emit"), is_compiler_module("rlx.models.sampling")
    (True, False)
    """
    return name in _COMPILER_NAMES or name.startswith(_COMPILER_PREFIXES)


def loaded_compiler_modules() -> set[str]:
    """The names of the compiler modules in `sys.modules` now."""
    return {name for name in list(sys.modules) if is_compiler_module(name)}


def _bindings(module: ModuleType) -> dict[str, object]:
    """Every global of `module`, and every attribute of the classes it defines (methods patched on a class)."""
    out: dict[str, object] = {}
    for name, value in list(vars(module).items()):
        if isinstance(value, ModuleType):
            continue  # a package gains an attribute per submodule that loads; submodules are watched themselves
        out[name] = value
        if isinstance(value, type) and value.__module__ == module.__name__:
            for attr, member in list(vars(value).items()):
                out[f"{name}.{attr}"] = member
    return out


def _record(module: ModuleType) -> None:
    _recorded[module.__name__] = (module, _bindings(module))


def _is_pristine(skip: str | None = None) -> bool:
    for name in loaded_compiler_modules():
        if name == skip:
            continue
        module = sys.modules.get(name)
        recorded = _recorded.get(name)
        if module is None or recorded is None or recorded[0] is not module:
            return False
        now = _bindings(module)
        then = recorded[1]
        if now.keys() != then.keys() or any(now[k] is not v for k, v in then.items()):
            return False
    return True


def compiler_is_pristine() -> bool:
    """True while every loaded compiler module is recorded and bound as it was when it came from its file."""
    return _is_pristine()


def record_loaded_modules(names: set[str] | None = None) -> None:
    """Record the loaded compiler modules among `names` (None: all of them) as pristine.

    For code that knows no user code ran since they loaded: the end of `import rlx`, a compile
    that began pristine.
    """
    for name in loaded_compiler_modules() if names is None else names & loaded_compiler_modules():
        module = sys.modules.get(name)
        if module is not None:
            _record(module)


def end_own_import() -> None:
    """The end of `import rlx` (rlx/__init__.py, last): everything loaded so far is pristine, and the
    trusted scope `install` opened is closed."""
    record_loaded_modules()
    _load.scope = max(0, _load.scope - 1)


@contextlib.contextmanager
def trusting_own_loads() -> Iterator[bool]:
    """Around a compile: yields whether the process is pristine now. When it is, the compiler
    modules the compile loads (the toolchain, and codegen on a cold compile) come from their
    files, and are recorded as pristine afterwards (with what the compile bound in them)."""
    pristine = compiler_is_pristine()
    before = loaded_compiler_modules()
    if pristine:
        _load.scope += 1
    try:
        yield pristine
    finally:
        if pristine:
            _load.scope -= 1
            record_loaded_modules(loaded_compiler_modules() - before)


class _RecordingLoader:
    """Wraps a compiler module's loader for its one load: runs it, then records the module.

    (A loader and a finder need no base class from importlib.abc, whose import loads
    importlib.resources and tempfile: `import rlx` need not.)

    The module's `__loader__` and `__spec__.loader` are set back to the wrapped loader before it
    runs, so nothing after the load sees the wrapper (source lookup, resources, reload).
    """

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        outer = _load.depth
        if outer == 0:  # the outermost load: anything may have run before it
            _load.trusted = _load.scope > 0 or _is_pristine(skip=module.__name__)
        _load.depth = outer + 1
        try:
            self._loader.exec_module(module)
        finally:
            _load.depth = outer
        if _load.trusted:
            _record(module)

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, ...: the wrapped loader's
        return getattr(self._loader, name)


class _RecordingFinder:
    """First on `sys.meta_path`: finds a compiler module with the finders after it, and wraps its loader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not is_compiler_module(fullname):
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if isinstance(finder, _RecordingFinder) or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RecordingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Start recording compiler modules as they load, trusting every load until `end_own_import`.

    Called first by rlx/__init__.py: any `import rlx.x` runs that file first, so no compiler module
    has loaded (nor been patched) before. Installing again (a reload of rlx) adds no second hook.
    """
    if not any(isinstance(f, _RecordingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RecordingFinder())
    _load.scope += 1


__all__ = ["COMPILER_MODULES", "COMPILER_PACKAGES", "compiler_is_pristine", "end_own_import", "install",
           "is_compiler_module", "loaded_compiler_modules", "record_loaded_modules", "trusting_own_loads"]

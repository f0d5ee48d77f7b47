"""Public names of a package that load on first use (PEP 562), one mechanism for `rlx`, `rlx.ir`, `rlx.models`
and `rlx.pipeline`: a warm start imports only the modules it touches.

>>> ns = {"__name__": "demo"}
>>> getattr_, dir_ = lazy_names(ns, {"sqrt": "math", "json": ("json", None)}, cache=True)
>>> getattr_("sqrt")(9.0), "sqrt" in ns, "json" in dir_()
(3.0, True, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(namespace: dict, names: Mapping[str, str | tuple[str, str | None]], *,
               cache: bool) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A package's `__getattr__` and `__dir__` for `names`: name -> module (the attribute of the same name) or
    (module, attribute; None for the module itself). `cache` binds a loaded name in `namespace`; the compiler's
    packages pass False, since `rlx.pristine` would read a name bound after it recorded them as a monkeypatch."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> object:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, attr = (where, name) if isinstance(where, str) else where
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        if cache:
            namespace[name] = value  # looked up once
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__


__all__ = ["lazy_names"]

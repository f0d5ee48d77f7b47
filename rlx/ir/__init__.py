"""The tensor IR: dtypes, shapes, ops, graphs (MIR), HIR and LIR.

>>> import rlx.ir
>>> rlx.ir.Graph("g").name, rlx.ir.DType.parse("f32")
('g', <DType.F32: 'f32'>)

The names below load on first use (PEP 562): `rlx.ir.dtype` (which the runtime needs) does not pay
for the op classes of `rlx.ir.ops`, which `rlx.ir.graph` imports.
"""

import importlib

#: Public names, loaded on first use: name -> module.
_LAZY = {
    "DType": "rlx.ir.dtype",
    "Dim": "rlx.ir.shape",
    "Graph": "rlx.ir.graph",
    "Node": "rlx.ir.graph",
    "NodeId": "rlx.ir.graph",
    "Shape": "rlx.ir.shape",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'rlx.ir' has no attribute {name!r}")
    # Not cached in this module's globals: rlx.pristine watches a compiler package's globals, and a name
    # bound after the package was recorded would read as a monkeypatch (no compile index from then on).
    return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["DType", "Dim", "Graph", "Node", "NodeId", "Shape"]

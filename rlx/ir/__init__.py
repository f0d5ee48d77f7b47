"""The tensor IR: dtypes, shapes, ops, graphs (MIR), HIR and LIR.

>>> import rlx.ir
>>> rlx.ir.Graph("g").name, rlx.ir.DType.parse("f32")
('g', <DType.F32: 'f32'>)

The names below load on first use (PEP 562): `rlx.ir.dtype` (which the runtime needs) does not pay
for the op classes of `rlx.ir.ops`, which `rlx.ir.graph` imports.
"""

from rlx.lazy import lazy_names

#: Public names, loaded on first use: name -> module.
_LAZY = {
    "DType": "rlx.ir.dtype",
    "Dim": "rlx.ir.shape",
    "Graph": "rlx.ir.graph",
    "Node": "rlx.ir.graph",
    "NodeId": "rlx.ir.graph",
    "Shape": "rlx.ir.shape",
}


# Not cached (rlx.lazy): rlx.pristine watches a compiler package's globals.
__getattr__, __dir__ = lazy_names(globals(), _LAZY, cache=False)


__all__ = ["DType", "Dim", "Graph", "Node", "NodeId", "Shape"]

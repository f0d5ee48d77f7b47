"""Which ONNX opsets and op versions `rlx.from_onnx` imports.

A model declares one default-domain opset; each node's op then has the schema
version that opset selects (``onnx.defs.get_schema(op, opset).since_version``:
the newest version at or below it). RLX accepts opsets up to the newest the
installed ``onnx`` defines, and checks every node's selected version against
`REVIEWED`: the versions of each op whose semantics the importer implements.
Those were read against ONNX's change log (the ``onnx.defs`` schema history):
from opset 13 on, most new versions only widen the accepted types (bfloat16,
int4, float8 …; an unsupported dtype is refused where it occurs). The ones that
changed behaviour are implemented: Reduce* 18 (axes as an input), Split 18
(``num_outputs``), Shape 15 (``start`` / ``end``), Reshape 14 (``allowzero``),
ScatterND 16/18 (reductions, folded at import), Mod 28 (floor semantics for
floats, what numpy's ``mod`` computes), Cast 19/24 (``saturate`` and
``round_mode``, which only apply to float8 targets RLX refuses anyway), Range
27 (``stash_type`` for f16/bf16; Range is folded at import in float64, then
rounded once). A version not in the table — a newer ``onnx`` adding one — is
refused naming the op, the version and the versions reviewed. A model of an
opset before 13 imports when each of its ops has a version opset 13 also
selects (``And``-7, ``Where``-9 …); an older version (``Softmax``-11's 2-D
coercion, ``Squeeze``-11's attribute axes) is refused the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlx.errors import IRError

#: Models declaring an older opset import when each node's selected version is one `REVIEWED` lists.
MIN_OPSET = 1

#: ONNX op type → the schema versions (`since_version`) the importer implements, from the one opset 13 selects.
REVIEWED: dict[str, tuple[int, ...]] = {
    "Abs": (13,), "Add": (13, 14), "And": (7,), "ArgMax": (13,), "ArgMin": (13,),
    "Cast": (13, 19, 21, 23, 24, 25, 28), "CastLike": (15, 19, 21, 23, 24, 25), "Clip": (13,), "Concat": (13,),
    "Constant": (13, 19, 21, 23, 24, 25), "ConstantOfShape": (9, 20, 21, 23, 24, 25), "Cos": (7, 22),
    "CumSum": (11, 14), "Div": (13, 14), "Dropout": (13, 22), "Equal": (13, 19), "Erf": (13,), "Exp": (13,),
    "Expand": (13,), "Flatten": (13, 21, 23, 24, 25), "Gather": (13,), "GatherElements": (13,),
    "GatherND": (13,), "Gelu": (20,), "Gemm": (13,), "Greater": (13,), "GreaterOrEqual": (12, 16),
    "HardSwish": (14, 22), "Identity": (13, 14, 16, 19, 21, 23, 24, 25), "IsInf": (10, 20), "IsNaN": (13, 20),
    "LayerNormalization": (17,), "LeakyRelu": (6, 16), "Less": (13,), "LessOrEqual": (12, 16), "Log": (13,),
    "MatMul": (13,), "Max": (13,), "Mean": (13,), "Min": (13,), "Mish": (18, 22), "Mod": (13, 28),
    "Mul": (13, 14), "Neg": (13,), "Not": (1,), "Or": (7,), "Pow": (13, 15), "Range": (11, 27),
    "Reciprocal": (13,), "ReduceMax": (13, 18, 20), "ReduceMean": (13, 18), "ReduceMin": (13, 18, 20),
    "ReduceProd": (13, 18), "ReduceSum": (13,), "Relu": (13, 14), "Reshape": (13, 14, 19, 21, 23, 24, 25),
    "ScatterND": (13, 16, 18), "Shape": (13, 15, 19, 21, 23, 24, 25), "Sigmoid": (13,), "Sign": (13,),
    "Sin": (7, 22), "Size": (13, 19, 21, 23, 24, 25), "Slice": (13,), "Softmax": (13,), "Softplus": (1, 22),
    "Split": (13, 18), "Sqrt": (13,), "Squeeze": (13, 21, 23, 24, 25), "Sub": (13, 14), "Sum": (13,),
    "Tanh": (13,), "Tile": (13,), "TopK": (11, 24), "Transpose": (13, 21, 23, 24, 25), "Trilu": (14,),
    "Unsqueeze": (13, 21, 23, 24, 25), "Where": (9, 16), "Xor": (7,),
}


def max_opset(onnx: Any) -> int:
    """The newest default-domain opset the installed ``onnx`` defines."""
    return int(onnx.defs.onnx_opset_version())


def model_opset(onnx: Any, proto: Any, default_domains: Iterable[str]) -> int:
    """The model's default-domain opset, checked against the range RLX imports."""
    versions = {o.domain: o.version for o in proto.opset_import}
    version = next((versions[d] for d in default_domains if d in versions), None)
    newest = max_opset(onnx)
    if version is None or not MIN_OPSET <= version <= newest:
        raise IRError(f"ONNX model uses default-domain opset {version}; RLX imports opsets up to {newest}, the "
                      f"newest the installed onnx {onnx.__version__} defines (ops whose version predates opset 13 "
                      "may need onnx.version_converter.convert_version(model, 17))")
    return version


def version_problem(onnx: Any, op_type: str, opset: int) -> str | None:
    """Why the version of `op_type` that `opset` selects cannot be imported, or None when it can."""
    try:
        since = onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        return f"{op_type} is not defined in opset {opset}"
    reviewed = REVIEWED.get(op_type)
    if reviewed is None or since in reviewed:
        return None
    return (f"{op_type}-{since} (selected by opset {opset}) is a version RLX has not implemented; "
            f"it imports {op_type} versions {', '.join(map(str, reviewed))}")

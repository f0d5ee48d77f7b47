"""JSON-compatible encoding of IR values (dims, shapes, ops).

Shared by graph serialization and the canonical LIR form: one encoding, so
what is saved and what is hashed cannot drift apart. Decoding validates
everything it reads and raises `IRError` on anything unexpected.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.ops_scan import Body, BodyNode
from rlx.ir.shape import Dim, Shape

JSON = Any


def dim_to_json(d: Dim) -> JSON:
    if d.is_static:
        return d.coeff
    return {"coeff": d.coeff, "symbols": [[n, b] for n, b in d.symbols]}


#: Most symbols one encoded dim may multiply (rank 16 x a few symbols each); bounds decoding work.
MAX_DIM_SYMBOLS = 64
_DTYPE_NAMES = {d.value: d for d in DType}


def dim_from_json(v: JSON) -> Dim:
    if isinstance(v, bool):
        raise IRError(f"bad dimension {v!r}")
    if isinstance(v, int):
        return Dim(v)
    if isinstance(v, dict) and set(v) == {"coeff", "symbols"} and isinstance(v["symbols"], list):
        if not 1 <= len(v["symbols"]) <= MAX_DIM_SYMBOLS:
            raise IRError(f"dynamic dimension needs 1..{MAX_DIM_SYMBOLS} symbols, got {len(v['symbols'])}")
        d = Dim.of(v["coeff"])
        for sym in v["symbols"]:
            if not (isinstance(sym, list) and len(sym) == 2):
                raise IRError(f"bad dynamic dimension symbol {sym!r}")
            d = d * Dim.dynamic(sym[0], sym[1])
        return d
    raise IRError(f"bad dimension {v!r}")


def shape_to_json(s: Shape) -> JSON:
    return {"dtype": s.dtype.value, "dims": [dim_to_json(d) for d in s.dims]}


def shape_from_json(v: JSON) -> Shape:
    if not isinstance(v, dict) or set(v) != {"dtype", "dims"} or not isinstance(v["dims"], list):
        raise IRError(f"bad shape {_short(v)}")
    if len(v["dims"]) > 16:
        raise IRError(f"shape rank {len(v['dims'])} exceeds 16")
    return Shape(tuple(dim_from_json(d) for d in v["dims"]), _dtype_from_json(v["dtype"], "shape"))


def _dtype_from_json(v: JSON, where: str) -> DType:
    # Exact canonical names only: DType.parse's aliases would make two spellings of one document.
    if not isinstance(v, str) or v not in _DTYPE_NAMES:
        raise IRError(f"{where}: bad dtype {_short(v)}; expected one of {sorted(_DTYPE_NAMES)}")
    return _DTYPE_NAMES[v]


def _value_to_json(v: Any) -> JSON:
    if isinstance(v, O.Op):
        return op_to_json(v)
    if isinstance(v, O.RegionStep):
        return {"op": op_to_json(v.op), "args": list(v.args)}
    if isinstance(v, Body):
        return body_to_json(v)
    if isinstance(v, Shape):
        return shape_to_json(v)
    if isinstance(v, Dim):
        return dim_to_json(v)
    if isinstance(v, DType):
        return v.value
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, float):
        if not math.isfinite(v):
            return {"float": repr(v)}
        return v
    if isinstance(v, (tuple, list)):
        return [_value_to_json(x) for x in v]
    if v is None or isinstance(v, (bool, int, str)):
        return v
    raise IRError(f"cannot encode attribute value {v!r}")


def op_to_json(op: O.Op) -> JSON:
    """`{"op": kind, **attrs}` with attributes in field order."""
    out: dict[str, JSON] = {"op": op.kind}
    float_fields = _float_fields(type(op))
    for f in dataclasses.fields(op):
        value = getattr(op, f.name)
        if f.name in float_fields and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # scale=1 and scale=1.0 are one program, so one encoding
        out[f.name] = _value_to_json(value)
    return out


@functools.cache
def _float_fields(cls: type) -> frozenset[str]:
    hints = typing.get_type_hints(cls)
    return frozenset(name for name, hint in hints.items() if hint is float or float in typing.get_args(hint))


def _decode(hint: Any, v: JSON, where: str, registry: Mapping[str, type]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _decode(a, v, where, registry)
            except IRError as exc:
                errors.append(str(exc))
        raise IRError(f"{where}: {_short(v)} matches none of the allowed types ({'; '.join(errors)})")
    if origin is tuple:
        if not isinstance(v, list):
            raise IRError(f"{where}: expected a list, got {_short(v)}")
        if len(v) > 1_000_000:
            raise IRError(f"{where}: list too long")
        item = args[0] if args else Any
        return tuple(_decode(item, x, where, registry) for x in v)
    if hint is Shape:
        return shape_from_json(v)
    if hint is Dim:
        return dim_from_json(v)
    if hint is DType:
        return _dtype_from_json(v, where)
    if hint is bytes:
        if not isinstance(v, str):
            raise IRError(f"{where}: expected base64 text")
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise IRError(f"{where}: bad base64 data") from exc
    if hint is float:
        if isinstance(v, dict) and set(v) == {"float"} and v["float"] in ("nan", "inf", "-inf"):
            return float(v["float"])
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise IRError(f"{where}: expected a number, got {_short(v)}")
        try:
            return float(v)
        except OverflowError:
            raise IRError(f"{where}: number {_short(v)} is out of float range") from None
    if hint is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise IRError(f"{where}: expected an integer, got {_short(v)}")
        return v
    if hint is bool:
        if not isinstance(v, bool):
            raise IRError(f"{where}: expected true/false, got {_short(v)}")
        return v
    if hint is str:
        if not isinstance(v, str):
            raise IRError(f"{where}: expected a string, got {_short(v)}")
        return v
    if hint is O.RegionStep:
        if not isinstance(v, dict) or set(v) != {"op", "args"}:
            raise IRError(f"{where}: bad region step {_short(v)}")
        # Checked before decoding: a region nested in a step would otherwise recurse without bound.
        step_kind = v["op"].get("op") if isinstance(v["op"], dict) else None
        step_cls = registry.get(step_kind) if isinstance(step_kind, str) else None
        if step_cls is not None and not step_cls.elementwise:
            raise IRError(f"{where}: region step op {step_kind!r} is not elementwise")
        return O.RegionStep(op_from_json(v["op"], registry), _decode(tuple[int, ...], v["args"], where, registry))
    if hint is Body:
        return body_from_json(v, where, registry)
    if hint is Any:
        return v
    raise IRError(f"{where}: cannot decode attribute of type {hint}")


def decode_value(hint: Any, v: JSON, where: str) -> Any:
    """A value of type `hint` (int, float, bool, str, DType, Shape, Dim, tuples of these, ...) from its JSON;
    `IRError` naming `where` when `v` is not one.

    >>> decode_value(tuple[int, ...], [1, 2], "offsets")
    (1, 2)
    """
    return _decode(hint, v, where, O.OPS)


_BODY_KEYS = {"body", "nodes", "outputs", "output_names"}
_BODY_NODE_KEYS = {"op", "in", "shape", "name"}


def body_to_json(b: Body) -> JSON:
    """A sub-graph attribute (scan / custom_fn body) as JSON: its nodes with ops, inputs and shapes."""
    return {"body": b.name, "output_names": list(b.output_names), "outputs": list(b.outputs),
            "nodes": [{"op": op_to_json(n.op), "in": list(n.inputs), "shape": shape_to_json(n.shape), "name": n.name}
                      for n in b.nodes]}


def body_from_json(v: JSON, where: str, registry: Mapping[str, type]) -> Body:
    if not isinstance(v, dict) or set(v) != _BODY_KEYS or not isinstance(v["nodes"], list):
        raise IRError(f"{where}: bad body {_short(v)}")
    if len(v["nodes"]) > 200_000:
        raise IRError(f"{where}: body has too many nodes")
    nodes = []
    for k, n in enumerate(v["nodes"]):
        if not isinstance(n, dict) or set(n) != _BODY_NODE_KEYS or not isinstance(n["name"], str):
            raise IRError(f"{where}: bad body node {k}: {_short(n)}")
        nodes.append(BodyNode(op_from_json(n["op"], registry), _decode(tuple[int, ...], n["in"], where, registry),
                              shape_from_json(n["shape"]), n["name"]))
    if not isinstance(v["body"], str):
        raise IRError(f"{where}: body name must be a string")
    names = _decode(tuple[str, ...], v["output_names"], where, registry)
    return Body(v["body"], tuple(nodes), _decode(tuple[int, ...], v["outputs"], where, registry), names)


def op_from_json(v: JSON, registry: Mapping[str, type] | None = None) -> O.Op:
    """Rebuild an op; unknown kinds or attributes raise `IRError`."""
    registry = registry or O.OPS
    if not isinstance(v, dict) or not isinstance(v.get("op"), str):
        raise IRError(f"bad op {_short(v)}: expected an object with an 'op' string")
    kind = v["op"]
    cls = registry.get(kind)
    if cls is None:
        raise IRError(f"unknown op {kind!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(v) - set(fields) - {"op"}
    if unknown:
        raise IRError(f"op {kind!r} has unknown attributes {sorted(unknown)}")
    kwargs = {}
    for name, f in fields.items():
        if name not in v:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise IRError(f"op {kind!r} is missing attribute {name!r}")
            continue
        kwargs[name] = _decode(hints[name], v[name], f"op {kind!r} attribute {name!r}", registry)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise IRError(f"op {kind!r}: {exc}") from None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."

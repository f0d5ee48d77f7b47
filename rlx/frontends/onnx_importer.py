"""The ONNX importer's state: decoded nodes, values known at import time, and the graph being built.

Shared by `rlx.frontends.onnx` (the entry point and the core op handlers) and
`rlx.frontends.onnx_ops` (the op handlers torch exports need beyond those).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.errors import IRError, ShapeError, UnboundedDimsError
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, NodeId
from rlx.ir.shape import Dim

if TYPE_CHECKING:
    import onnx

def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise ImportError("rlx.from_onnx needs the onnx package: pip install 'rlx[onnx]' (or pip install onnx)") \
            from None
    return onnx



_ONNX_DTYPES = {1: DType.F32, 2: DType.U8, 3: DType.I8, 4: DType.U16, 5: DType.I16, 6: DType.I32, 7: DType.I64,
                9: DType.BOOL, 10: DType.F16, 11: DType.F64, 12: DType.U32, 13: DType.U64, 16: DType.BF16,
                17: DType.F8E4M3FN, 18: DType.F8E4M3FNUZ, 19: DType.F8E5M2, 20: DType.F8E5M2FNUZ, 21: DType.U4,
                22: DType.I4, 23: DType.F4E2M1, 25: DType.U2, 26: DType.I2}


def _dtype(elem_type: int, what: str) -> DType:
    dt = _ONNX_DTYPES.get(elem_type)
    if dt is None:
        try:
            name = _onnx().TensorProto.DataType.Name(elem_type)
        except ValueError:
            name = "unknown"
        raise IRError(f"{what} has ONNX element type {elem_type} ({name}), which RLX does not support "
                      f"(supported: float, float16, bfloat16, double, int8, uint8, int16, uint16, int32, uint32, "
                      f"int64, uint64, bool; float8 e4m3fn/e4m3fnuz/e5m2/e5m2fnuz, float4e2m1, int4, uint4, int2, "
                      f"uint2 as storage formats)")
    return dt


#: ONNX's Cast with saturate=0 to a float8 format: the magnitudes that round past its largest finite value
#: (compare, bound: round to nearest even decides the tie) and the codes they become (+, -): NaN, or e5m2's inf.
_OVERFLOW = {DType.F8E4M3FN: ("gt", 464.0, 0x7F, 0xFF), DType.F8E4M3FNUZ: ("ge", 248.0, 0x80, 0x80),
             DType.F8E5M2: ("ge", 61440.0, 0x7C, 0xFC), DType.F8E5M2FNUZ: ("ge", 61440.0, 0x80, 0x80)}


def narrow_cast(imp: _Importer, x: str, target: DType, saturate: object) -> NodeId:
    """ONNX's Cast of `x` to `target` when either is a storage format (float8 …). RLX's cast saturates (ONNX's
    default); ``saturate=0`` selects the overflow code (NaN, or e5m2's inf) where |x| rounds past the largest
    finite value."""
    g, source = imp.g, imp.value(x).dtype
    y = g.cast(imp.tensor(x), target)
    if saturate == 1 or not target.value.startswith("f") or source is DType.BOOL:  # nothing can overflow
        return y
    if target not in _OVERFLOW or source.is_narrow:
        raise IRError(f"a cast from {source} to {target} with saturate={saturate} is not supported: RLX's cast "
                      f"saturates (ONNX's default saturate=1)")
    fn, bound, up, down = _OVERFLOW[target]
    xt = imp.tensor(x)
    over = g.compare(fn, g.activation("abs", xt), g.constant(np.array(bound), source))
    codes = [g.constant(np.array(c, np.uint8).view(target.np), target) for c in (up, down)]
    special = g.where(g.compare("lt", xt, g.constant(np.array(0), source)), codes[1], codes[0])
    return g.where(over, special, y)


def _to_array(onnx: Any, tensor: onnx.TensorProto) -> np.ndarray:
    dtype = _dtype(tensor.data_type, f"tensor {tensor.name!r}")
    arr = onnx.numpy_helper.to_array(tensor)
    # bf16 is exchanged as float32 holding bf16 values (see rlx.reference).
    return _contiguous(arr, dtype)


def _contiguous(arr: np.ndarray, dtype: DType) -> np.ndarray:
    # reshape: ascontiguousarray turns a 0-d value into shape (1,).
    return np.ascontiguousarray(arr, dtype=np.float32 if dtype is DType.BF16 else dtype.np).reshape(np.shape(arr))


@dataclass(frozen=True)
class _Node:
    """One ONNX node, its attributes decoded; absent optional inputs are ""."""

    index: int
    op_type: str
    domain: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]

    @staticmethod
    def of(onnx: Any, index: int, proto: onnx.NodeProto) -> _Node:
        attrs = {}
        for a in proto.attribute:
            value = onnx.helper.get_attribute_value(a)
            attrs[a.name] = value.decode() if isinstance(value, bytes) else value
        return _Node(index, proto.op_type, proto.domain, proto.name, tuple(proto.input), tuple(proto.output), attrs)

    @property
    def label(self) -> str:
        return self.name or f"#{self.index}"

    def input(self, i: int) -> str | None:
        return self.inputs[i] if i < len(self.inputs) and self.inputs[i] else None

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


# ── values known at import time ─────────────────────────────────────────

# A known integer tensor may hold dynamic dims: it is then an object array of
# ints (static) and `Dim`s (dynamic), as `Shape` of a dynamic input produces.


def _canon_elem(e: object) -> int | Dim:
    if isinstance(e, Dim):
        return e.coeff if e.is_static else e
    if isinstance(e, (int, np.integer)) and not isinstance(e, (bool, np.bool_)):
        return int(e)
    raise IRError(f"expected an integer or dimension in a shape computation, got {e!r}")


def _canon(arr: np.ndarray) -> np.ndarray:
    """Object arrays of ints and Dims: int64 when every element is static."""
    if arr.dtype != object:
        return arr
    flat = [_canon_elem(e) for e in arr.flat]
    if all(isinstance(e, int) for e in flat):
        return np.array(flat, dtype=np.int64).reshape(arr.shape)
    out = np.empty(arr.shape, dtype=object)
    for i, e in enumerate(flat):
        out.flat[i] = e
    return out


def _is_dynamic(arr: np.ndarray) -> bool:
    return arr.dtype == object


def _numeric(arr: np.ndarray, what: str) -> np.ndarray:
    if _is_dynamic(arr):
        raise IRError(f"{what} = [{', '.join(map(str, arr.flat))}] depends on dynamic dims, whose values are only "
                      "known at run time; RLX cannot compute with it as a tensor")
    return arr


def _dim_add(a: int | Dim, b: int | Dim) -> int | Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a == 0 or b == 0:
        return b if a == 0 else a
    raise IRError(f"cannot add dims {a} + {b}: RLX dims are products of symbols")


def _dim_sub(a: int | Dim, b: int | Dim) -> int | Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    if b == 0:
        return a
    if a == b:
        return 0
    raise IRError(f"cannot subtract dims {a} - {b}: RLX dims are products of symbols")


def _dim_mul(a: int | Dim, b: int | Dim) -> int | Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if (isinstance(a, int) and a < 0) or (isinstance(b, int) and b < 0):
        raise IRError(f"cannot multiply dim {a} by {b}: a negative dim")
    return Dim.of(a) * Dim.of(b)


def _dim_div(a: int | Dim, b: int | Dim) -> int | Dim:
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise IRError("integer division by zero in a shape computation")
        q = abs(a) // abs(b)
        return -q if (a < 0) != (b < 0) else q
    q = Dim.of(a).divide(Dim.of(b)) if not (isinstance(b, int) and b <= 0) else None
    if q is None:
        raise IRError(f"cannot divide dim {a} by {b} exactly")
    return q


def _dim_eq(a: int | Dim, b: int | Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, Dim) and isinstance(b, Dim):
        if a == b:
            return True
    else:
        d, c = (a, b) if isinstance(a, Dim) else (b, a)
        if c < 0 or c > d.max:
            return False
    raise IRError(f"cannot decide {a} == {b} at import time: it depends on the run-time value of a dynamic dim")


_DIM_FNS: dict[str, Callable[[Any, Any], Any]] = {"add": _dim_add, "sub": _dim_sub, "mul": _dim_mul,
                                                  "div": _dim_div, "eq": _dim_eq}


def _elementwise_dims(fn: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    impl = _DIM_FNS.get(fn)
    if impl is None:
        raise IRError(f"{fn} of values that depend on dynamic dims is not supported")

    def canon_call(x: object, y: object) -> object:
        return impl(_canon_elem(x), _canon_elem(y))

    out = np.frompyfunc(canon_call, 2, 1)(a.astype(object), b.astype(object))
    out = np.asarray(out, dtype=object)
    return out.astype(bool) if fn == "eq" else _canon(out)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.any(b == 0):
        raise IRError("integer division by zero in a constant computation")
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) ^ (b < 0), -q, q)


def _np_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _int_div(a, b) if a.dtype.kind in "iu" else a / b


def _np_sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


# ── the importer ────────────────────────────────────────────────────────


@dataclass
class _Value:
    """An ONNX tensor: a graph node, a value known at import time, or both.

    `param` names the initializer a known value comes from: it becomes a
    `Graph.param` (not a constant) when the graph needs it as a tensor.
    """

    dtype: DType
    node: NodeId | None = None
    known: np.ndarray | None = None
    param: str | None = None


_IDENT_RE = re.compile(r"[^A-Za-z0-9_]")


def _symbol_name(dim_param: str) -> str:
    ident = _IDENT_RE.sub("_", dim_param)[:64] or "dim"
    return ident if not ident[0].isdigit() else ("d" + ident)[:64]


class _Importer:
    """Holds the graph being built and the value of every ONNX tensor name seen so far."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.values: dict[str, _Value] = {}
        self.params: dict[str, np.ndarray] = {}

    # values

    def value(self, name: str) -> _Value:
        v = self.values.get(name)
        if v is None:
            raise IRError(f"tensor {name!r} is used before any node, input or initializer defines it")
        return v

    def tensor(self, name: str) -> NodeId:
        """The graph node of `name`, materializing a known value as a param or constant."""
        v = self.value(name)
        if v.node is None:
            assert v.known is not None
            if v.param is not None:
                self.params[v.param] = v.known
                v.node = self.g.param(v.param, v.known.shape, v.dtype)
            else:
                v.node = self.g.constant(_numeric(v.known, f"tensor {name!r}"), v.dtype)
        return v.node

    def known(self, name: str | None) -> np.ndarray | None:
        return None if name is None else self.value(name).known

    def static(self, node: _Node, i: int, what: str) -> np.ndarray:
        """Input `i` of `node`, which must be known at import time."""
        name = node.input(i)
        if name is None:
            raise IRError(f"the {what} input is missing")
        arr = self.value(name).known
        if arr is None:
            raise IRError(f"the {what} ({name!r}) must be known at import time (a constant, an initializer or a "
                          "computation on shapes), but it is computed at run time")
        return arr

    def ints(self, node: _Node, i: int, what: str) -> list[int | Dim]:
        arr = self.static(node, i, what)
        if arr.dtype != object and arr.dtype.kind not in "iu":
            raise IRError(f"the {what} must be integers, got {arr.dtype}")
        return [_canon_elem(e) for e in arr.reshape(-1)]

    def dims(self, name: str) -> tuple[Dim, ...]:
        v = self.value(name)
        if v.node is not None:
            return self.g.shape(v.node).dims
        assert v.known is not None
        return tuple(Dim(s) for s in v.known.shape)

    def foldable(self, node: _Node) -> bool:
        """Whether every input is known at import time and none is a float weight."""
        for name in node.inputs:
            if not name:
                continue
            v = self.value(name)
            if v.known is None or (v.param is not None and v.dtype.is_float):
                return False
        return True

    def emit(self, node_id: NodeId) -> _Value:
        return _Value(self.g.shape(node_id).dtype, node=node_id)

    def scalar(self, value: float, dtype: DType) -> NodeId:
        return self.g.constant(np.array(value, dtype=np.float32 if dtype is DType.BF16 else dtype.np), dtype)

    # building

    def add_initializer(self, name: str, arr: np.ndarray, dtype: DType) -> None:
        self.values[name] = _Value(dtype, known=arr, param=name)

    def add_inputs(self, inputs: Sequence[onnx.ValueInfoProto], max_dims: dict[str, int],
                   fixed_dims: dict[str, int] | None = None) -> None:
        fixed = fixed_dims or {}
        both = sorted(set(fixed) & set(max_dims))
        if both:
            raise IRError(f"dynamic axes {both} are given both a bound (max_dims) and a size (fixed_dims)")
        symbols: dict[str, str] = {}
        unbounded: dict[str, list[str]] = {}  # name -> where it occurs, each name once
        specs = []
        for inp in inputs:
            if not inp.type.HasField("tensor_type") or not inp.type.tensor_type.HasField("shape"):
                raise IRError(f"graph input {inp.name!r} must be a tensor of known rank")
            tt = inp.type.tensor_type
            dtype = _dtype(tt.elem_type, f"graph input {inp.name!r}")
            dims: list[int | str] = []
            for axis, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value"):
                    dims.append(d.dim_value)
                elif d.HasField("dim_param") and d.dim_param in fixed:
                    dims.append(int(fixed[d.dim_param]))
                elif d.HasField("dim_param"):
                    dims.append(d.dim_param)
                    if d.dim_param not in max_dims:
                        unbounded.setdefault(d.dim_param, []).append(f"input {inp.name!r} axis {axis}")
                else:
                    raise IRError(f"graph input {inp.name!r} axis {axis} has neither a size nor a dim_param name; "
                                  "give it a name (onnx.tools.update_model_dims) or a fixed size")
            specs.append((inp.name, dims, dtype))
        if unbounded:
            named = ", ".join(f"{name!r} ({', '.join(where)})" for name, where in unbounded.items())
            raise UnboundedDimsError(f"dynamic axes need an upper bound: {named}; pass "
                                     "from_onnx(..., max_dims={'name': N, ...}) (rlxc: --max-dim name=N)", unbounded)
        used = {d.dim_param for i in inputs for d in i.type.tensor_type.shape.dim if d.HasField("dim_param")}
        unknown = sorted((set(max_dims) | set(fixed)) - used)
        if unknown:
            raise IRError(f"max_dims / fixed_dims name {unknown}, which are not dynamic axes of the model's inputs "
                          f"(its dynamic axes: {sorted(used) or 'none'})")
        for name, dims, dtype in specs:
            shape = [d if isinstance(d, int) else self._symbol(d, max_dims[d], symbols) for d in dims]
            self.values[name] = self.emit(self.g.input(name, shape, dtype))

    def _symbol(self, dim_param: str, bound: int, seen: dict[str, str]) -> Dim:
        ident = _symbol_name(dim_param)
        if seen.setdefault(ident, dim_param) != dim_param:
            raise IRError(f"dynamic axes {seen[ident]!r} and {dim_param!r} both map to the RLX dim name {ident!r}")
        return Dim.dynamic(ident, max=bound)

    def convert(self, node: _Node, handler: Handler) -> None:
        try:
            outs = handler(self, node)
        except (IRError, ShapeError) as exc:
            raise type(exc)(f"ONNX node {node.label} ({node.op_type}): {exc}") from None
        self.bind(node, outs)

    def bind(self, node: _Node, outs: Sequence[_Value]) -> None:
        names = [o for o in node.outputs if o]
        if len(outs) < len(names):
            raise IRError(f"ONNX node {node.label} ({node.op_type}) has {len(names)} outputs; RLX computes "
                          f"only the first {len(outs)}")
        for out_name, value in zip(node.outputs, outs):
            if out_name:
                self.values[out_name] = value

    def set_outputs(self, names: Sequence[str]) -> None:
        self.g.set_outputs({n: self.tensor(n) for n in names})


#: An op handler: one per op type, returning the node's output values.
Handler = Callable[[_Importer, _Node], list[_Value]]


def _known(arr: np.ndarray, dtype: DType) -> _Value:
    arr = _canon(np.asarray(arr))
    if arr.dtype != object:
        arr = _contiguous(arr, dtype)
    return _Value(dtype, known=arr)



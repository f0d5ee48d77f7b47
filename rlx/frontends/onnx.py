"""Import an ONNX model (default-domain opsets 13–21) as an RLX MIR graph.

`from_onnx(path_or_model, max_dims=..., name=...)` reads the model with the
`onnx` package and returns `OnnxImport(graph, params)`: a MIR `Graph` built
with the ordinary builder API and the numpy values of the initializers that
became params. It is a `NamedTuple`, so ``graph, params = from_onnx(...)``
works as well as ``result.graph``. Example (needs ``pip install 'rlx[onnx]'``
and a model file, e.g. from ``python examples/make_onnx.py model.onnx``)::

    import numpy as np, rlx
    graph, params = rlx.from_onnx("model.onnx", max_dims={"batch": 8, "sequence": 128})
    compiled = rlx.Session(rlx.Device.CPU).compile(graph)
    for name, value in params.items():
        compiled.set_param(name, value)
    ids = np.array([[2, 7, 9, 3]], np.int64)
    hidden, pooled = compiled.run(input_ids=ids, attention_mask=np.ones_like(ids),
                                  position_ids=np.arange(4, dtype=np.int64))

How the model maps onto RLX:

- Graph inputs become `Graph.input`s. A dynamic axis (a ``dim_param`` name such
  as "batch") becomes ``Dim.dynamic(name, max=max_dims[name])``; every dynamic
  axis needs a bound in `max_dims` (a missing one raises `IRError` naming the
  axis). Names that are not identifiers are made into one (``"seq len"`` →
  ``seq_len``); `max_dims` is keyed by the ONNX name.
- Initializers become params (`Graph.param`, same names) when the graph
  computes with them; `params` holds exactly those, ready for `set_param`.
  Initializers only read at import time (a Reshape target, Slice bounds…) are
  not params. External data is read from the model file's directory.
- Values known at import time (Constant nodes, integer initializers, shapes)
  are folded in numpy: ``Shape → Gather → Unsqueeze → Concat → Reshape`` chains
  fold to tuples of static or symbolic `Dim`s. Known values the graph needs as
  tensors become `Graph.constant`s.
- Erf has no RLX op: the erf-GELU pattern ``0.5*x*(1+erf(x/sqrt(2)))`` (in its
  usual association orders, ``x*0.7071…`` for the division included) becomes
  ``activation gelu``; an Erf anywhere else is reported as unsupported.
- Every unsupported op type is listed, with its node names, in one `IRError`
  before anything is built.

Not supported: Slice with steps other than 1; Range, Slice or Split whose
bounds depend on a dynamic axis (RLX has no dynamic-length iota or narrow:
feed such values, e.g. position ids, as inputs); Concat along a dynamic axis;
LayerNormalization over more than the last axis or using its Mean/InvStdDev
outputs; ops outside the default domain. Gather indices computed at run time
must be in ``[0, n)``: a negative one is a run-time error rather than counted
from the end (known indices are normalized at import).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from rlx.errors import IRError, ShapeError, UnboundedDimsError
from rlx.frontends.onnx_conv import CONV_HANDLERS
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, NodeId
from rlx.ir.shape import Dim, broadcast_dims, normalize_axis

if TYPE_CHECKING:
    import onnx

MIN_OPSET, MAX_OPSET = 13, 21
_DEFAULT_DOMAINS = ("", "ai.onnx")
_MAX_LISTED_NODES = 8


class OnnxImport(NamedTuple):
    """What `from_onnx` returns: the MIR graph and the initializer values it reads as params."""

    graph: Graph
    params: dict[str, np.ndarray]


def from_onnx(model: str | os.PathLike[str] | bytes | onnx.ModelProto, *,
              max_dims: Mapping[str, int] | None = None, name: str | None = None) -> OnnxImport:
    """Import an ONNX model as `OnnxImport(graph, params)` (see the module docstring).

    `model` is a path to a ``.onnx`` file (external data is read from its
    directory), the serialized bytes, or an `onnx.ModelProto` whose external
    data is already loaded. `max_dims` bounds each dynamic axis by its ONNX
    ``dim_param`` name; `name` names the graph (default: the ONNX graph's name).
    Raises `IRError` for malformed or unsupported models.
    """
    if max_dims is not None and not isinstance(max_dims, Mapping):
        raise TypeError(f"max_dims must map dynamic axis names to bounds, got {type(max_dims).__name__}")
    onnx = _onnx()
    proto = _load(onnx, model)
    _check_opset(proto)
    graph = proto.graph
    nodes = [_Node.of(onnx, i, n) for i, n in enumerate(graph.node)]
    initializers = {t.name: t for t in graph.initializer}
    gelus = _find_erf_gelus(onnx, nodes, initializers, [o.name for o in graph.output])
    _check_supported(nodes, gelus)
    imp = _Importer(Graph(name if name is not None else (graph.name or "onnx")))
    for tensor in graph.initializer:
        imp.add_initializer(tensor.name, _to_array(onnx, tensor), _dtype(tensor.data_type, tensor.name))
    imp.add_inputs([i for i in graph.input if i.name not in initializers], dict(max_dims or {}))
    for node in nodes:
        if node.index in gelus.skipped:
            continue
        if node.index in gelus.outputs:
            x = gelus.outputs[node.index]
            imp.bind(node, [imp.emit(imp.g.activation("gelu", imp.tensor(x)))])
            continue
        imp.convert(node)
    imp.set_outputs([o.name for o in graph.output])
    return OnnxImport(imp.g, imp.params)


# ── loading ─────────────────────────────────────────────────────────────


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise ImportError("rlx.from_onnx needs the onnx package: pip install 'rlx[onnx]' (or pip install onnx)") \
            from None
    return onnx


def _load(onnx: Any, model: object) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        for t in model.graph.initializer:
            if onnx.external_data_helper.uses_external_data(t):
                raise IRError(f"initializer {t.name!r} keeps its data in an external file: pass the model's path "
                              "to from_onnx so the data is read from its directory, or load it with "
                              "onnx.load(path, load_external_data=True)")
        return model
    if isinstance(model, bytes):
        try:
            return onnx.load_model_from_string(model)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise IRError(f"cannot parse ONNX model bytes: {exc}") from None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise IRError(f"ONNX model file {path} does not exist")
        try:
            # External data paths are resolved against the model file's directory.
            return onnx.load(str(path), load_external_data=True)
        except Exception as exc:  # protobuf decode errors, missing external-data files
            raise IRError(f"cannot read ONNX model {path}: {exc}") from None
    raise TypeError(f"from_onnx takes a path, bytes or an onnx.ModelProto, got {type(model).__name__}")


def _check_opset(proto: onnx.ModelProto) -> None:
    versions = {o.domain: o.version for o in proto.opset_import}
    version = next((versions[d] for d in _DEFAULT_DOMAINS if d in versions), None)
    if version is None or not MIN_OPSET <= version <= MAX_OPSET:
        raise IRError(f"ONNX model uses default-domain opset {version}; RLX imports opsets {MIN_OPSET}–{MAX_OPSET} "
                      "(convert it with onnx.version_converter.convert_version(model, 17))")


_ONNX_DTYPES = {1: DType.F32, 2: DType.U8, 3: DType.I8, 6: DType.I32, 7: DType.I64, 9: DType.BOOL,
                10: DType.F16, 11: DType.F64, 16: DType.BF16}


def _dtype(elem_type: int, what: str) -> DType:
    dt = _ONNX_DTYPES.get(elem_type)
    if dt is None:
        raise IRError(f"{what} has ONNX element type {elem_type}, which RLX does not support "
                      f"(supported: float, float16, bfloat16, double, int8, uint8, int32, int64, bool)")
    return dt


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


# ── the erf-GELU pattern ────────────────────────────────────────────────


@dataclass
class _Gelus:
    """Matched erf-GELU patterns: final node index → x, and the nodes they replace."""

    outputs: dict[int, str] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)
    erfs: set[int] = field(default_factory=set)


def _find_erf_gelus(onnx: Any, nodes: Sequence[_Node], initializers: Mapping[str, onnx.TensorProto],
                    graph_outputs: Sequence[str]) -> _Gelus:
    producer = {out: n for n in nodes for out in n.outputs if out}
    consumers: dict[str, list[_Node]] = {}
    for n in nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n)
    exported = set(graph_outputs)

    def scalar(tensor: str) -> float | None:
        arr: np.ndarray | None = None
        if tensor in initializers and math.prod(initializers[tensor].dims) == 1:
            arr = onnx.numpy_helper.to_array(initializers[tensor])
        elif tensor in producer and producer[tensor].op_type == "Constant":
            value = producer[tensor].attr("value")
            if value is not None and math.prod(value.dims) == 1:
                arr = onnx.numpy_helper.to_array(value)
            elif producer[tensor].attr("value_float") is not None:
                arr = np.asarray(producer[tensor].attr("value_float"))
        return float(arr.reshape(())) if arr is not None and arr.dtype.kind == "f" else None

    def is_scalar(tensor: str, target: float) -> bool:
        v = scalar(tensor)
        return v is not None and abs(v - target) <= 1e-6 * abs(target)

    def only_user(tensor: str, op_type: str) -> _Node | None:
        users = consumers.get(tensor, [])
        if len(users) != 1 or tensor in exported or users[0].op_type != op_type or len(users[0].inputs) != 2:
            return None
        return users[0]

    def other(node: _Node, tensor: str) -> str:
        return node.inputs[1] if node.inputs[0] == tensor else node.inputs[0]

    found = _Gelus()
    for erf in nodes:
        if erf.op_type != "Erf" or not erf.inputs:
            continue
        x = _erf_argument(producer.get(erf.inputs[0]), is_scalar)
        add = only_user(erf.outputs[0], "Add")
        if x is None or add is None or not is_scalar(other(add, erf.outputs[0]), 1.0):
            continue
        m1 = only_user(add.outputs[0], "Mul")
        if m1 is None:
            continue
        p = other(m1, add.outputs[0])
        half_x = producer.get(p)
        if p == x or is_scalar(p, 0.5):  # (x * (1+erf)) * 0.5  or  (0.5 * (1+erf)) * x
            m2 = only_user(m1.outputs[0], "Mul")
            want_ok = m2 is not None and (is_scalar(other(m2, m1.outputs[0]), 0.5) if p == x
                                          else other(m2, m1.outputs[0]) == x)
            if not want_ok:
                continue
            final, replaced = m2, [erf, add, m1]
        elif half_x is not None and half_x.op_type == "Mul" and len(half_x.inputs) == 2 \
                and x in half_x.inputs and is_scalar(other(half_x, x), 0.5):  # (0.5 * x) * (1+erf)
            final, replaced = m1, [erf, add]
        else:
            continue
        if consumers.get(erf.inputs[0]) == [erf] and erf.inputs[0] not in exported:
            replaced.append(producer[erf.inputs[0]])  # x / sqrt(2) has no other use
        found.outputs[final.index] = x
        found.skipped.update(n.index for n in replaced)
        found.erfs.add(erf.index)
    return found


def _erf_argument(node: _Node | None, is_scalar: Callable[[str, float], bool]) -> str | None:
    """x when `node` computes x / sqrt(2) (as a Div, or a Mul by 1/sqrt(2))."""
    if node is None or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if node.op_type == "Div" and is_scalar(b, math.sqrt(2.0)):
        return a
    if node.op_type == "Mul":
        for x, c in ((a, b), (b, a)):
            if is_scalar(c, math.sqrt(0.5)):
                return x
    return None


# ── the unsupported-op check ────────────────────────────────────────────


def _check_supported(nodes: Sequence[_Node], gelus: _Gelus) -> None:
    bad: dict[str, list[str]] = {}
    for n in nodes:
        if n.domain not in _DEFAULT_DOMAINS:
            bad.setdefault(f"{n.domain}::{n.op_type}", []).append(n.label)
        elif n.op_type == "Erf":
            if n.index not in gelus.erfs:
                bad.setdefault("Erf (supported only in the erf-GELU pattern 0.5*x*(1+erf(x/sqrt(2))))", []) \
                    .append(n.label)
        elif n.op_type not in HANDLERS:
            bad.setdefault(n.op_type, []).append(n.label)
    if not bad:
        return
    parts = []
    for op, labels in bad.items():
        shown = ", ".join(labels[:_MAX_LISTED_NODES])
        more = f" and {len(labels) - _MAX_LISTED_NODES} more" if len(labels) > _MAX_LISTED_NODES else ""
        parts.append(f"{op} (nodes {shown}{more})")
    raise IRError(f"the ONNX model uses {len(bad)} unsupported op type(s): {'; '.join(parts)}. "
                  f"Supported: {', '.join(sorted(HANDLERS))}")


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

    def add_inputs(self, inputs: Sequence[onnx.ValueInfoProto], max_dims: dict[str, int]) -> None:
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
        used = {d for _, dims, _ in specs for d in dims if isinstance(d, str)}
        unknown = sorted(set(max_dims) - used)
        if unknown:
            raise IRError(f"max_dims names {unknown}, which are not dynamic axes of the model's inputs "
                          f"(its dynamic axes: {sorted(used) or 'none'})")
        for name, dims, dtype in specs:
            shape = [d if isinstance(d, int) else self._symbol(d, max_dims[d], symbols) for d in dims]
            self.values[name] = self.emit(self.g.input(name, shape, dtype))

    def _symbol(self, dim_param: str, bound: int, seen: dict[str, str]) -> Dim:
        ident = _symbol_name(dim_param)
        if seen.setdefault(ident, dim_param) != dim_param:
            raise IRError(f"dynamic axes {seen[ident]!r} and {dim_param!r} both map to the RLX dim name {ident!r}")
        return Dim.dynamic(ident, max=bound)

    def convert(self, node: _Node) -> None:
        handler = HANDLERS[node.op_type]
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


# ── handlers: one per op type, each returning the node's output values ──

Handler = Callable[[_Importer, _Node], list[_Value]]


def _known(arr: np.ndarray, dtype: DType) -> _Value:
    arr = _canon(np.asarray(arr))
    if arr.dtype != object:
        arr = _contiguous(arr, dtype)
    return _Value(dtype, known=arr)


def _unary(fn: str, np_fn: Callable[[np.ndarray], np.ndarray]) -> Handler:
    def handle(imp: _Importer, node: _Node) -> list[_Value]:
        x = node.inputs[0]
        v = imp.value(x)
        if imp.foldable(node):
            with np.errstate(all="ignore"):
                return [_known(np_fn(_numeric(v.known, f"input {x!r}")), v.dtype)]
        return [imp.emit(imp.g.activation(fn, imp.tensor(x)))]
    return handle


def _binary(fn: str, np_fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Handler:
    def handle(imp: _Importer, node: _Node) -> list[_Value]:
        a, b = node.inputs[:2]
        va, vb = imp.value(a), imp.value(b)
        if imp.foldable(node):
            assert va.known is not None and vb.known is not None
            if _is_dynamic(va.known) or _is_dynamic(vb.known):
                return [_known(_elementwise_dims(fn, va.known, vb.known), va.dtype)]
            with np.errstate(all="ignore"):
                return [_known(np_fn(va.known, vb.known.astype(va.known.dtype)), va.dtype)]
        na, nb = imp.tensor(a), imp.tensor(b)
        if vb.dtype != va.dtype:  # only Pow allows an exponent of another type
            if vb.dtype.is_float and not va.dtype.is_float:
                raise IRError(f"{fn} of an integer base by a float exponent is not supported")
            nb = imp.g.cast(nb, va.dtype)
        return [imp.emit(imp.g.binary(fn, na, nb))]
    return handle


def _compare(fn: str, np_fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Handler:
    def handle(imp: _Importer, node: _Node) -> list[_Value]:
        a, b = node.inputs[:2]
        if imp.foldable(node):
            ka, kb = imp.known(a), imp.known(b)
            assert ka is not None and kb is not None
            if _is_dynamic(ka) or _is_dynamic(kb):
                return [_known(_elementwise_dims(fn, ka, kb), DType.BOOL)]
            return [_known(np_fn(ka, kb), DType.BOOL)]
        return [imp.emit(imp.g.compare(fn, imp.tensor(a), imp.tensor(b)))]
    return handle


def _not(imp: _Importer, node: _Node) -> list[_Value]:
    x = node.inputs[0]
    if imp.foldable(node):
        return [_known(np.logical_not(_numeric(imp.known(x), f"input {x!r}")), DType.BOOL)]
    false = imp.g.constant(np.array(False), DType.BOOL)
    return [imp.emit(imp.g.compare("eq", imp.tensor(x), false))]


def _where(imp: _Importer, node: _Node) -> list[_Value]:
    c, a, b = node.inputs[:3]
    if imp.foldable(node):
        return [_known(np.where(imp.known(c), imp.known(a), imp.known(b)), imp.value(a).dtype)]
    return [imp.emit(imp.g.where(imp.tensor(c), imp.tensor(a), imp.tensor(b)))]


def _cast(imp: _Importer, node: _Node) -> list[_Value]:
    x = node.inputs[0]
    dtype = _dtype(node.attr("to", 0), "Cast target")
    if imp.foldable(node):
        arr = imp.known(x)
        assert arr is not None
        if _is_dynamic(arr) and dtype in (DType.I32, DType.I64):
            return [_known(arr, dtype)]
        arr = _numeric(arr, f"input {x!r}")
        return [_known(arr != 0 if dtype is DType.BOOL else arr.astype(dtype.np), dtype)]
    if imp.value(x).dtype is dtype:
        return [imp.value(x)]
    return [imp.emit(imp.g.cast(imp.tensor(x), dtype))]


def _identity(imp: _Importer, node: _Node) -> list[_Value]:
    return [imp.value(node.inputs[0])]


def _matmul(imp: _Importer, node: _Node) -> list[_Value]:
    a, b = imp.tensor(node.inputs[0]), imp.tensor(node.inputs[1])
    da, db = imp.g.shape(a).dims, imp.g.shape(b).dims
    if len(da) == 1:  # numpy semantics: a vector is a row (left) or a column (right), dropped afterwards
        a = imp.g.reshape(a, [1, da[0]])
    if len(db) == 1:
        b = imp.g.reshape(b, [db[0], 1])
    y = imp.g.matmul(a, b)
    if len(da) == 1 or len(db) == 1:
        dims = list(imp.g.shape(y).dims)
        if len(db) == 1:
            dims.pop(-1)
        if len(da) == 1:
            dims.pop(-2 if len(db) != 1 else -1)
        y = imp.g.reshape(y, dims)
    return [imp.emit(y)]


def _gemm(imp: _Importer, node: _Node) -> list[_Value]:
    a, b = imp.tensor(node.inputs[0]), imp.tensor(node.inputs[1])
    for name, t in (("A", a), ("B", b)):
        if imp.g.shape(t).rank != 2:
            raise IRError(f"Gemm input {name} must be a matrix, got {imp.g.shape(t)}")
    if node.attr("transA", 0):
        a = imp.g.transpose(a, (1, 0))
    if node.attr("transB", 0):
        b = imp.g.transpose(b, (1, 0))
    y = imp.g.matmul(a, b)
    dtype = imp.g.shape(y).dtype
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = imp.g.mul(y, imp.scalar(alpha, dtype))
    c = node.input(2)
    if c is not None and beta != 0.0:
        cn = imp.tensor(c)
        if beta != 1.0:
            cn = imp.g.mul(cn, imp.scalar(beta, dtype))
        y = imp.g.add_(y, cn)
    return [imp.emit(y)]


def _softmax(imp: _Importer, node: _Node) -> list[_Value]:
    return [imp.emit(imp.g.softmax(imp.tensor(node.inputs[0]), int(node.attr("axis", -1))))]


def _layer_norm(imp: _Importer, node: _Node) -> list[_Value]:
    if any(node.outputs[1:]):
        raise IRError("only the normalized output Y is supported, not Mean or InvStdDev")
    x = imp.tensor(node.inputs[0])
    xs = imp.g.shape(x)
    if normalize_axis(int(node.attr("axis", -1)), xs.rank, "LayerNormalization axis") != xs.rank - 1:
        raise IRError(f"LayerNormalization over axes {node.attr('axis')}.. of {xs}: RLX normalizes the last axis only")
    width = xs.dims[-1]
    gamma = _vector(imp, node.inputs[1], width, "Scale")
    beta_name = node.input(2)
    beta = _vector(imp, beta_name, width, "B") if beta_name else \
        imp.g.constant(np.zeros(width.value, xs.dtype.np), xs.dtype)
    return [imp.emit(imp.g.layer_norm(x, gamma, beta, float(node.attr("epsilon", 1e-5))))]


def _vector(imp: _Importer, name: str, width: Dim, what: str) -> NodeId:
    t = imp.tensor(name)
    s = imp.g.shape(t)
    if s.rank != 1:
        if s.numel != width or not all(d == 1 for d in s.dims[:-1]):
            raise IRError(f"LayerNormalization {what} must be [{width}], got {s}")
        t = imp.g.reshape(t, [width])
    return t


def _gelu(imp: _Importer, node: _Node) -> list[_Value]:
    mode = node.attr("approximate", "none")
    fns = {"none": "gelu", "tanh": "gelu_tanh"}
    if mode not in fns:
        raise IRError(f"unknown Gelu approximate={mode!r}; expected 'none' or 'tanh'")
    return [imp.emit(imp.g.activation(fns[mode], imp.tensor(node.inputs[0])))]


def _gather(imp: _Importer, node: _Node) -> list[_Value]:
    data, idx = node.inputs[:2]
    dims = imp.dims(data)
    axis = normalize_axis(int(node.attr("axis", 0)), len(dims), "Gather axis")
    known_idx = imp.known(idx)
    if known_idx is not None:
        known_idx = _normalize_indices(_numeric(known_idx, f"indices {idx!r}"), dims[axis])
    if imp.foldable(node):
        known_data = imp.known(data)
        assert known_data is not None and known_idx is not None
        return [_known(np.take(known_data, known_idx, axis=axis), imp.value(data).dtype)]
    if known_idx is not None:
        index = imp.g.constant(known_idx, DType.parse(known_idx.dtype))
    else:
        index = imp.tensor(idx)
    return [imp.emit(imp.g.gather(imp.tensor(data), index, axis))]


def _normalize_indices(idx: np.ndarray, dim: Dim) -> np.ndarray:
    if idx.dtype.kind not in "iu":
        raise IRError(f"Gather indices must be integers, got {idx.dtype}")
    if not dim.is_static:
        if np.any(idx < 0):
            raise IRError(f"negative Gather indices along the dynamic axis {dim} cannot be resolved at import time")
        return idx
    n = dim.value
    if np.any((idx < -n) | (idx >= n)):
        raise IRError(f"Gather index {int(idx[(idx < -n) | (idx >= n)].flat[0])} is out of range for an axis of {n}")
    return np.where(idx < 0, idx + n, idx).astype(idx.dtype)


def _reshape(imp: _Importer, node: _Node) -> list[_Value]:
    data = node.inputs[0]
    in_dims = imp.dims(data)
    allow_zero = bool(node.attr("allowzero", 0))
    target: list[Dim | int] = []
    for i, s in enumerate(imp.ints(node, 1, "shape")):
        if isinstance(s, Dim):
            target.append(s)
        elif s == 0 and not allow_zero:
            if i >= len(in_dims):
                raise IRError(f"shape entry {i} is 0 (copy the input dim) but the input has rank {len(in_dims)}")
            target.append(in_dims[i])
        elif s < -1:
            raise IRError(f"shape entry {i} is {s}")
        else:
            target.append(s if s == -1 else Dim(s))
    known = imp.known(data)
    if imp.foldable(node) and known is not None and all(isinstance(d, int) or d.is_static for d in target):
        return [_known(known.reshape([d if isinstance(d, int) else d.value for d in target]), imp.value(data).dtype)]
    return [imp.emit(imp.g.reshape(imp.tensor(data), target))]


def _transpose(imp: _Importer, node: _Node) -> list[_Value]:
    x = node.inputs[0]
    rank = len(imp.dims(x))
    perm = tuple(int(p) for p in node.attr("perm", range(rank - 1, -1, -1)))
    if imp.foldable(node):
        return [_known(np.transpose(imp.known(x), perm), imp.value(x).dtype)]
    return [imp.emit(imp.g.transpose(imp.tensor(x), perm))]


def _reshape_to(imp: _Importer, node: _Node, dims: Sequence[Dim]) -> list[_Value]:
    """Unsqueeze / Squeeze: a reshape, folded for known values."""
    x = node.inputs[0]
    known = imp.known(x)
    if imp.foldable(node) and known is not None:
        return [_known(known.reshape([d.value for d in dims]), imp.value(x).dtype)]
    return [imp.emit(imp.g.reshape(imp.tensor(x), dims))]


def _raw_axes(imp: _Importer, node: _Node) -> list[int | Dim]:
    """Axes from input 1 (opset 13+ Squeeze/Unsqueeze/ReduceSum, 18+ others) or the `axes` attribute."""
    return imp.ints(node, 1, "axes") if node.input(1) else [int(a) for a in node.attr("axes", [])]


def _axes(imp: _Importer, node: _Node, rank: int, what: str) -> list[int]:
    raw = _raw_axes(imp, node)
    axes = [normalize_axis(a, rank, f"{what} axis") if isinstance(a, int) else a for a in raw]
    if any(isinstance(a, Dim) for a in axes) or len(set(axes)) != len(axes):
        raise IRError(f"{what} axes {raw} must be distinct integers")
    return sorted(axes)  # type: ignore[arg-type]


def _unsqueeze(imp: _Importer, node: _Node) -> list[_Value]:
    dims = list(imp.dims(node.inputs[0]))
    for a in _axes(imp, node, len(dims) + len(_raw_axes(imp, node)), "Unsqueeze"):
        dims.insert(a, Dim(1))
    return _reshape_to(imp, node, dims)


def _squeeze(imp: _Importer, node: _Node) -> list[_Value]:
    dims = imp.dims(node.inputs[0])
    if node.input(1) or node.attr("axes") is not None:
        axes = _axes(imp, node, len(dims), "Squeeze")
        for a in axes:
            if dims[a] != 1:
                raise IRError(f"cannot squeeze axis {a} of size {dims[a]}")
    else:  # every axis of size 1; a dynamic axis is never dropped
        axes = [i for i, d in enumerate(dims) if d == 1]
    return _reshape_to(imp, node, [d for i, d in enumerate(dims) if i not in axes])


def _concat(imp: _Importer, node: _Node) -> list[_Value]:
    names = [n for n in node.inputs if n]
    axis = int(node.attr("axis", 0))
    if imp.foldable(node):
        arrays = [imp.known(n) for n in names]
        any_dynamic = any(_is_dynamic(a) for a in arrays)  # type: ignore[arg-type]
        arrays = [a.astype(object) if any_dynamic else a for a in arrays]  # type: ignore[union-attr]
        return [_known(np.concatenate(arrays, axis=axis), imp.value(names[0]).dtype)]
    return [imp.emit(imp.g.concat([imp.tensor(n) for n in names], axis))]


def _slice_range(start: int | Dim, end: int | Dim, dim: Dim) -> tuple[int, int] | None:
    """Clamped [start, end) along `dim`; None for the whole of a dynamic axis."""
    if not dim.is_static:
        starts_at_0 = start == 0 or (isinstance(start, int) and start <= -dim.max)
        ends_at_end = end == dim or (isinstance(end, int) and end >= dim.max)
        if starts_at_0 and ends_at_end:
            return None
        raise IRError(f"Slice [{start}:{end}] of the dynamic axis {dim} is not supported (only the whole axis)")
    n = dim.value
    if isinstance(start, Dim) or isinstance(end, Dim):
        raise IRError(f"Slice bounds [{start}:{end}] of a static axis of {n} depend on a dynamic dim")
    s = min(max(start + n if start < 0 else start, 0), n)
    e = min(max(end + n if end < 0 else end, 0), n)
    return s, max(e, s)


def _slice(imp: _Importer, node: _Node) -> list[_Value]:
    data = node.inputs[0]
    dims = imp.dims(data)
    starts, ends = imp.ints(node, 1, "starts"), imp.ints(node, 2, "ends")
    axes = imp.ints(node, 3, "axes") if node.input(3) else list(range(len(starts)))
    steps = imp.ints(node, 4, "steps") if node.input(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise IRError("Slice starts, ends, axes and steps differ in length")
    if any(s != 1 for s in steps):
        raise IRError(f"Slice steps {steps} are not supported (only steps of 1)")
    ranges: dict[int, tuple[int, int]] = {}
    for start, end, a in zip(starts, ends, axes):
        if isinstance(a, Dim):
            raise IRError("Slice axes must be integers")
        axis = normalize_axis(a, len(dims), "Slice axis")
        r = _slice_range(start, end, dims[axis])
        if axis in ranges:
            raise IRError(f"Slice axis {a} appears twice")
        if r is not None and r != (0, dims[axis].max):
            ranges[axis] = r
    known = imp.known(data)
    if imp.foldable(node) and known is not None:
        index = tuple(slice(*ranges[i]) if i in ranges else slice(None) for i in range(known.ndim))
        return [_known(known[index], imp.value(data).dtype)]
    x = imp.tensor(data)
    for axis, (s, e) in ranges.items():
        x = imp.g.narrow(x, axis, s, e - s)
    return [imp.emit(x)]


def _split(imp: _Importer, node: _Node) -> list[_Value]:
    data = node.inputs[0]
    dims = imp.dims(data)
    axis = normalize_axis(int(node.attr("axis", 0)), len(dims), "Split axis")
    if not dims[axis].is_static:
        raise IRError(f"Split along the dynamic axis {dims[axis]} is not supported")
    n, count = dims[axis].value, len(node.outputs)
    if node.input(1):
        sizes = imp.ints(node, 1, "split")
    elif node.attr("num_outputs") is not None:
        chunk = -(-n // int(node.attr("num_outputs")))
        sizes = [min(chunk, n - i * chunk) for i in range(int(node.attr("num_outputs")))]
    else:
        if n % count:
            raise IRError(f"cannot split an axis of {n} into {count} equal parts")
        sizes = [n // count] * count
    if any(not isinstance(s, int) or s < 0 for s in sizes) or sum(sizes) != n:  # type: ignore[arg-type]
        raise IRError(f"Split sizes {sizes} do not add up to the axis size {n}")
    known = imp.known(data)
    outs, start = [], 0
    for size in sizes:
        assert isinstance(size, int)
        if imp.foldable(node) and known is not None:
            outs.append(_known(np.take(known, range(start, start + size), axis=axis), imp.value(data).dtype))
        else:
            outs.append(imp.emit(imp.g.narrow(imp.tensor(data), axis, start, size)))
        start += size
    return outs


def _expand(imp: _Importer, node: _Node) -> list[_Value]:
    x = node.inputs[0]
    shape = tuple(Dim.of(s) if isinstance(s, Dim) or s >= 0 else _bad_dim(s) for s in imp.ints(node, 1, "shape"))
    in_dims = imp.dims(x)
    out = broadcast_dims(in_dims, shape)
    known = imp.known(x)
    if imp.foldable(node) and known is not None and all(d.is_static for d in out):
        return [_known(np.broadcast_to(known, [d.value for d in out]), imp.value(x).dtype)]
    if out == in_dims:
        return [imp.value(x)]
    return [imp.emit(imp.g.expand(imp.tensor(x), out))]


def _bad_dim(s: int) -> Dim:
    raise IRError(f"shape entry {s} is negative")


def _reduce(fn: str, np_fn: Callable[..., np.ndarray]) -> Handler:
    def handle(imp: _Importer, node: _Node) -> list[_Value]:
        x = node.inputs[0]
        rank = len(imp.dims(x))
        axes = _axes(imp, node, rank, f"Reduce{fn.capitalize()}")
        keep = bool(node.attr("keepdims", 1))
        if not axes:
            if node.attr("noop_with_empty_axes", 0):
                return [imp.value(x)]
            axes = list(range(rank))
        if imp.foldable(node):
            arr = _numeric(imp.known(x), f"input {x!r}")  # type: ignore[arg-type]
            return [_known(np_fn(arr, axis=tuple(axes), keepdims=keep), imp.value(x).dtype)]
        return [imp.emit(imp.g.reduce(fn, imp.tensor(x), axes, keep))]
    return handle


def _range(imp: _Importer, node: _Node) -> list[_Value]:
    values = []
    for i, what in enumerate(("start", "limit", "delta")):
        arr = imp.static(node, i, what)
        if _is_dynamic(arr):
            raise IRError(f"Range {what} {arr.reshape(()).item()} is a dynamic dim: RLX has no dynamic-length range; "
                          "feed the values (e.g. position ids) as a graph input instead")
        values.append(arr.reshape(()).item())
    start, limit, delta = values
    if delta == 0:
        raise IRError("Range delta is 0")
    dtype = imp.value(node.inputs[0]).dtype
    return [_known(np.arange(start, limit, delta, dtype=dtype.np), dtype)]


def _shape(imp: _Importer, node: _Node) -> list[_Value]:
    dims = imp.dims(node.inputs[0])
    rank = len(dims)
    start, end = int(node.attr("start", 0)), node.attr("end")
    end = rank if end is None else int(end)
    s = min(max(start + rank if start < 0 else start, 0), rank)
    e = min(max(end + rank if end < 0 else end, 0), rank)
    arr = np.empty(max(e - s, 0), dtype=object)
    for i, d in enumerate(dims[s:e]):
        arr[i] = d
    return [_known(arr, DType.I64)]


def _constant_of_shape(imp: _Importer, node: _Node) -> list[_Value]:
    shape = imp.ints(node, 0, "shape")
    tensor = node.attr("value")
    fill = _to_array(_onnx(), tensor) if tensor is not None else np.zeros(1, np.float32)
    if fill.size != 1:
        raise IRError(f"ConstantOfShape value must hold one element, got {fill.size}")
    dtype = _dtype(tensor.data_type, "ConstantOfShape value") if tensor is not None else DType.F32
    if all(isinstance(d, int) for d in shape):
        return [_known(np.full(shape, fill.reshape(())), dtype)]  # type: ignore[arg-type]
    dims = [Dim.of(d) for d in shape]
    return [imp.emit(imp.g.expand(imp.g.constant(fill.reshape(()), dtype), dims))]


def _constant(imp: _Importer, node: _Node) -> list[_Value]:
    onnx = _onnx()
    if "value" in node.attrs:
        tensor = node.attrs["value"]
        return [_known(_to_array(onnx, tensor), _dtype(tensor.data_type, "Constant value"))]
    scalars = {"value_float": (np.float32, DType.F32), "value_floats": (np.float32, DType.F32),
               "value_int": (np.int64, DType.I64), "value_ints": (np.int64, DType.I64)}
    for key, (np_type, dtype) in scalars.items():
        if key in node.attrs:
            return [_known(np.asarray(node.attrs[key], dtype=np_type), dtype)]
    raise IRError(f"Constant with attribute {sorted(node.attrs)} is not supported (only value, value_float(s), "
                  "value_int(s))")


_UNARY = {"Sqrt": ("sqrt", np.sqrt), "Tanh": ("tanh", np.tanh), "Relu": ("relu", lambda x: np.maximum(x, 0)),
          "Sigmoid": ("sigmoid", _np_sigmoid), "Exp": ("exp", np.exp), "Log": ("log", np.log),
          "Neg": ("neg", np.negative), "Abs": ("abs", np.abs), "Sin": ("sin", np.sin), "Cos": ("cos", np.cos)}
_BINARY = {"Add": ("add", np.add), "Sub": ("sub", np.subtract), "Mul": ("mul", np.multiply),
           "Div": ("div", _np_div), "Pow": ("pow", np.power)}
_COMPARE = {"Equal": ("eq", np.equal), "Less": ("lt", np.less), "LessOrEqual": ("le", np.less_equal),
            "Greater": ("gt", np.greater), "GreaterOrEqual": ("ge", np.greater_equal)}
_REDUCE = {"ReduceMean": ("mean", np.mean), "ReduceSum": ("sum", np.sum), "ReduceMax": ("max", np.max),
           "ReduceMin": ("min", np.min), "ReduceProd": ("prod", np.prod)}

#: ONNX op type → handler. Erf is handled by the erf-GELU pattern match, not here.
HANDLERS: dict[str, Handler] = {
    **{op: _unary(fn, f) for op, (fn, f) in _UNARY.items()},
    **{op: _binary(fn, f) for op, (fn, f) in _BINARY.items()},
    **{op: _compare(fn, f) for op, (fn, f) in _COMPARE.items()},
    **{op: _reduce(fn, f) for op, (fn, f) in _REDUCE.items()},
    "Not": _not,
    "Where": _where,
    "Cast": _cast,
    "Identity": _identity,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Softmax": _softmax,
    "LayerNormalization": _layer_norm,
    "Gelu": _gelu,
    "Gather": _gather,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Split": _split,
    "Expand": _expand,
    "Range": _range,
    "Shape": _shape,
    "ConstantOfShape": _constant_of_shape,
    "Constant": _constant,
}
HANDLERS.update({op: h for op, h in CONV_HANDLERS.items() if op not in HANDLERS})  # rlx.frontends.onnx_conv


def supported_ops() -> list[str]:
    """The ONNX op types `from_onnx` converts (Erf only inside the erf-GELU pattern)."""
    return sorted([*HANDLERS, "Erf"])

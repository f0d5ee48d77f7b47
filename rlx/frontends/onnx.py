"""Import an ONNX model (default-domain opsets up to the newest the installed onnx defines) as an RLX MIR graph.

`from_onnx(path_or_model, max_dims=..., fixed_dims=..., name=...)` reads the model with the
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

or in one line, ``rlx.from_onnx("model.onnx", max_dims={...}).compile("cpu")``
(`OnnxImport.compile`: compiled, the params set).

How the model maps onto RLX:

- Opsets: each node's op version is the one the model's opset selects
  (``onnx.defs.get_schema``); versions whose semantics RLX implements are
  listed in `rlx.frontends.onnx_opset.REVIEWED`, any other is refused, named.

- Graph inputs become `Graph.input`s. A dynamic axis (a ``dim_param`` name such
  as "batch") becomes ``Dim.dynamic(name, max=max_dims[name])``; every dynamic
  axis needs a bound in `max_dims` (a missing one raises `IRError` naming the
  axis), or a size in `fixed_dims` (then static: shape arithmetic built from
  it, such as the masks and position ids torch exports compute from the
  lengths, folds at import). Names that are not identifiers are made into one
  (``"seq len"`` → ``seq_len``); `max_dims` is keyed by the ONNX name.
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

- LayerNormalization normalizing only the last axis is the fused
  `layer_norm`; over more axes, or with its Mean / InvStdDev outputs used, it
  is built from reductions (`rlx.frontends.onnx_ops.layer_norm_decomposed`).
- The ops torch exports add (And/Or/Xor, IsNaN/IsInf, Max/Min/Sum/Mean, Clip,
  CumSum, Trilu, Tile, GatherElements/GatherND/ScatterND, ArgMax/ArgMin, TopK,
  Mod, Sign, Flatten, Size, Dropout …) live in `rlx.frontends.onnx_ops`.

- ``Range(0, d, delta)`` with a dynamic dim `d` (torch's ``arange(x.shape[i])``
  feeding position ids and masks) is an `iota` of length ``d / delta``, sized
  for d's bound; a Range whose length is not such a dim (a dynamic start, a
  delta not dividing d) or depends on run-time tensor values is refused, named.

- A Slice ``[0:d]`` of a static axis to a dynamic dim `d` (BERT's
  ``position_ids[:, :seq]``) is a gather of ``iota(d)``; d's bound must fit in the axis.

- Slice steps other than 1 (negative included) along static axes are a gather of the indices taken.

Not supported: Slice steps along a dynamic axis; other Slices or Splits whose
bounds depend on a dynamic axis (RLX has no dynamic-length narrow:
feed such values, e.g. position ids, as inputs, or use `fixed_dims`); Concat
along a dynamic axis; TopK with K > 64 on run-time values (no sort); ScatterND
with run-time indices or a reduction on run-time values; ops outside the
default domain (convolutions, pooling, Resize and Pad: `rlx.frontends.onnx_conv`
and `onnx_resize` say what they take). Gather indices computed at run time may
be negative along a static axis (counted from the end, as ONNX says); along
a dynamic axis they must be in ``[0, n)``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from rlx.errors import IRError
from rlx.frontends.onnx_conv import CONV_HANDLERS
from rlx.frontends.onnx_importer import (
    Handler,
    _dtype,
    _elementwise_dims,
    _Importer,
    _is_dynamic,
    _known,
    _Node,
    _np_div,
    _np_sigmoid,
    _numeric,
    _onnx,
    _to_array,
    _Value,
    narrow_cast,
)
from rlx.frontends.onnx_ops import EXTRA_HANDLERS, layer_norm_decomposed, wrap_indices
from rlx.frontends.onnx_opset import model_opset, version_problem
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, NodeId
from rlx.ir.shape import Dim, broadcast_dims, normalize_axis

if TYPE_CHECKING:
    import onnx

    from rlx.driver import Device, Session
    from rlx.runtime import CompiledGraph

_DEFAULT_DOMAINS = ("", "ai.onnx")
_MAX_LISTED_NODES = 8


class OnnxImport(NamedTuple):
    """What `from_onnx` returns: the MIR graph and the initializer values it reads as params."""

    graph: Graph
    params: dict[str, np.ndarray]

    def compile(self, device: Device | str | Session = "cpu", **session: Any) -> CompiledGraph:
        """Compile the graph for `device` (or with a ready `Session`) and set every param.

        ``rlx.from_onnx("model.onnx", max_dims={...}).compile("cpu").run(...)`` is the one-line path;
        `session` keywords (``precision=``, ``target=`` …) go to `rlx.Session`.
        """
        from rlx.driver import Session

        sess = device if isinstance(device, Session) else Session(device, **session)
        compiled = sess.compile(self.graph)
        for name, value in self.params.items():
            compiled.set_param(name, value)
        return compiled


def from_onnx(model: str | os.PathLike[str] | bytes | onnx.ModelProto, *,
              max_dims: Mapping[str, int] | None = None, fixed_dims: Mapping[str, int] | None = None,
              name: str | None = None) -> OnnxImport:
    """Import an ONNX model as `OnnxImport(graph, params)` (see the module docstring).

    `model` is a path to a ``.onnx`` file (external data is read from its
    directory), the serialized bytes, or an `onnx.ModelProto` whose external
    data is already loaded. `max_dims` bounds each dynamic axis by its ONNX
    ``dim_param`` name; `fixed_dims` instead fixes a dynamic axis to one size
    (its shape arithmetic then folds at import: a model whose masks or
    positions are computed from a dynamic length imports this way); `name`
    names the graph (default: the ONNX graph's name).
    Raises `IRError` for malformed or unsupported models.
    """
    if max_dims is not None and not isinstance(max_dims, Mapping):
        raise TypeError(f"max_dims must map dynamic axis names to bounds, got {type(max_dims).__name__}")
    onnx = _onnx()
    proto = _load(onnx, model)
    opset = model_opset(onnx, proto, _DEFAULT_DOMAINS)
    graph = proto.graph
    nodes = [_Node.of(onnx, i, n) for i, n in enumerate(graph.node)]
    initializers = {t.name: t for t in graph.initializer}
    gelus = _find_erf_gelus(onnx, nodes, initializers, [o.name for o in graph.output])
    _check_supported(onnx, nodes, gelus, opset)
    imp = _Importer(Graph(name if name is not None else (graph.name or "onnx")))
    for tensor in graph.initializer:
        imp.add_initializer(tensor.name, _to_array(onnx, tensor), _dtype(tensor.data_type, tensor.name))
    imp.add_inputs([i for i in graph.input if i.name not in initializers], dict(max_dims or {}),
                   dict(fixed_dims or {}))
    for node in nodes:
        if node.index in gelus.skipped:
            continue
        if node.index in gelus.outputs:
            x = gelus.outputs[node.index]
            imp.bind(node, [imp.emit(imp.g.activation("gelu", imp.tensor(x)))])
            continue
        imp.convert(node, HANDLERS[node.op_type])
    imp.set_outputs([o.name for o in graph.output])
    return OnnxImport(imp.g, imp.params)


# ── loading ─────────────────────────────────────────────────────────────



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


def _check_supported(onnx: Any, nodes: Sequence[_Node], gelus: _Gelus, opset: int) -> None:
    bad: dict[str, list[str]] = {}
    for n in nodes:
        problem = version_problem(onnx, n.op_type, opset) if n.domain in _DEFAULT_DOMAINS else None
        if problem is not None and (n.op_type in HANDLERS or n.op_type == "Erf"):
            bad.setdefault(problem, []).append(n.label)
            continue
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


# ── handlers: one per op type, each returning the node's output values ──


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
            if vb.dtype.is_float and not va.dtype.is_float:  # Pow: int ** float, computed in float64
                wide = imp.g.binary(fn, imp.g.cast(na, DType.F64), imp.g.cast(nb, DType.F64))
                return [imp.emit(imp.g.cast(wide, va.dtype))]
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
    if dtype.is_narrow or imp.value(x).dtype.is_narrow:
        return [imp.emit(narrow_cast(imp, x, dtype, node.attr("saturate", 1)))]
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
    x = imp.tensor(node.inputs[0])
    xs = imp.g.shape(x)
    last_axis = normalize_axis(int(node.attr("axis", -1)), xs.rank, "LayerNormalization axis") == xs.rank - 1
    if any(node.outputs[1:]) or not last_axis:
        return layer_norm_decomposed(imp, node)  # Mean / InvStdDev wanted, or more than the last axis
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
    else:  # negative run-time indices count from the end of a static axis
        index = imp.tensor(idx)
        if dims[axis].is_static and imp.g.shape(index).dtype is not DType.U8:
            index = wrap_indices(imp, index, dims[axis].value)
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


def _slice_range(start: int | Dim, end: int | Dim, dim: Dim) -> tuple[int, int | Dim] | None:
    """Clamped [start, end) along `dim`; None for the whole of a dynamic axis. A static axis cut to a dynamic
    length, ``[0:d]`` (BERT's ``position_ids[:, :seq]``), gives (0, d) when d's bound fits in the axis."""
    if not dim.is_static:
        starts_at_0 = start == 0 or (isinstance(start, int) and start <= -dim.max)
        ends_at_end = end == dim or (isinstance(end, int) and end >= dim.max)
        if starts_at_0 and ends_at_end:
            return None
        raise IRError(f"Slice [{start}:{end}] of the dynamic axis {dim} is not supported (only the whole axis)")
    n = dim.value
    if isinstance(end, Dim) and not isinstance(start, Dim) and min(max(start + n if start < 0 else start, 0), n) == 0:
        if end.max > n:  # ONNX clamps the end to n; a dim cannot say min(d, n)
            raise IRError(f"Slice [0:{end}] of a static axis of {n}: {end} may reach {end.max}, past the axis; "
                          f"bound it to at most {n} (max_dims)")
        return 0, end
    if isinstance(start, Dim) or isinstance(end, Dim):
        raise IRError(f"Slice bounds [{start}:{end}] of a static axis of {n} depend on a dynamic dim (only "
                      "[0:d] is supported)")
    s = min(max(start + n if start < 0 else start, 0), n)
    e = min(max(end + n if end < 0 else end, 0), n)
    return s, max(e, s)


def _slice_steps(start: int | Dim, end: int | Dim, step: int | Dim, dim: Dim) -> list[int]:
    """The indices ``Slice(start, end, step)`` takes along a static axis (ONNX clamps as Python's slices do)."""
    if isinstance(step, Dim) or step == 0:
        raise IRError(f"Slice step {step} is not supported (a nonzero integer)")
    if not dim.is_static or isinstance(start, Dim) or isinstance(end, Dim):
        raise IRError(f"Slice steps other than 1 need a static axis and integer bounds; [{start}:{end}:{step}] "
                      f"of axis {dim} has not")
    return list(range(*slice(start, end, step).indices(dim.value)))


def _slice(imp: _Importer, node: _Node) -> list[_Value]:
    data = node.inputs[0]
    dims = imp.dims(data)
    starts, ends = imp.ints(node, 1, "starts"), imp.ints(node, 2, "ends")
    axes = imp.ints(node, 3, "axes") if node.input(3) else list(range(len(starts)))
    steps = imp.ints(node, 4, "steps") if node.input(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise IRError("Slice starts, ends, axes and steps differ in length")
    ranges: dict[int, tuple[int, int | Dim]] = {}
    picks: dict[int, list[int]] = {}  # axes sliced with a step other than 1: the indices taken, in order
    for start, end, a, step in zip(starts, ends, axes, steps):
        if isinstance(a, Dim):
            raise IRError("Slice axes must be integers")
        axis = normalize_axis(a, len(dims), "Slice axis")
        if axis in ranges or axis in picks:
            raise IRError(f"Slice axis {a} appears twice")
        if step != 1:
            picks[axis] = _slice_steps(start, end, step, dims[axis])
            continue
        r = _slice_range(start, end, dims[axis])
        if r is not None and r != (0, dims[axis].max):
            ranges[axis] = r
    known = imp.known(data)
    dynamic = any(isinstance(e, Dim) for _, e in ranges.values())
    if imp.foldable(node) and known is not None and not dynamic:
        arr = known[tuple(slice(*ranges[i]) if i in ranges else slice(None) for i in range(known.ndim))]  # type: ignore
        for axis, idx in picks.items():
            arr = np.take(arr, np.asarray(idx, np.int64), axis=axis)
        return [_known(arr, imp.value(data).dtype)]
    x = imp.tensor(data)
    for axis, idx in picks.items():  # a strided or reversed static axis: a gather of the indices taken
        x = imp.g.gather(x, imp.g.constant(np.asarray(idx, np.int64), DType.I64), axis)
    for axis, (s, e) in ranges.items():
        if isinstance(e, Dim):  # the first d of a static axis: a gather of iota(d)
            x = imp.g.gather(x, imp.g.iota(e, 0, 1, DType.I64), axis)
        else:
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
        t = imp.tensor(x)
        if imp.g.shape(t).dtype is DType.BOOL and fn in ("max", "min"):  # ReduceMax/Min-20: False < True
            return [imp.emit(imp.g.cast(imp.g.reduce(fn, imp.g.cast(t, DType.I32), axes, keep), DType.BOOL))]
        return [imp.emit(imp.g.reduce(fn, t, axes, keep))]
    return handle


def _range(imp: _Importer, node: _Node) -> list[_Value]:
    values = [imp.static(node, i, what).reshape(()).item() for i, what in enumerate(("start", "limit", "delta"))]
    start, limit, delta = values
    dtype = imp.value(node.inputs[0]).dtype
    if any(isinstance(v, Dim) for v in values):  # a length known when the graph runs: an iota of that dim
        return [imp.emit(imp.g.iota(_range_length(start, limit, delta), start, delta, dtype))]
    if delta == 0:
        raise IRError("Range delta is 0")
    if dtype.is_float:  # computed in float64 and rounded once (Range-27's stash_type=1 for f16/bf16)
        return [_known(np.arange(start, limit, delta, dtype=np.float64).astype(dtype.np), dtype)]
    return [_known(np.arange(start, limit, delta, dtype=dtype.np), dtype)]


def _range_length(start: object, limit: object, delta: object) -> Dim:
    """The length of a Range whose limit is a dynamic dim, as a dim: ``(limit - start) / delta`` when that is
    one (start 0 and delta 1 — torch's ``arange(x.shape[i])`` — or a delta dividing the limit exactly)."""
    why = ("RLX dims are products of symbols, so the length (limit - start) / delta must be one; feed the values "
           "(e.g. position ids) as a graph input instead, or fix the axis to one size: from_onnx(..., "
           "fixed_dims={name: N}) (rlxc --fix-dim NAME=N)")
    if isinstance(start, Dim) or isinstance(delta, Dim) or not isinstance(limit, Dim):
        raise IRError(f"Range({start}, {limit}, {delta}) of dynamic dims is not supported: only the limit may be "
                      f"a dynamic dim; {why}")
    if start != 0 or not float(delta).is_integer() or delta < 1:
        raise IRError(f"Range({start}, {limit}, {delta}) with a dynamic limit needs start 0 and a positive integer "
                      f"delta; {why}")
    length = limit.divide(Dim(int(delta)))
    if length is None:
        raise IRError(f"Range(0, {limit}, {delta}): the delta does not divide the dynamic limit; {why}")
    return length


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
    **EXTRA_HANDLERS,
}
HANDLERS.update({op: h for op, h in CONV_HANDLERS.items() if op not in HANDLERS})  # rlx.frontends.onnx_conv


def supported_ops() -> list[str]:
    """The ONNX op types `from_onnx` converts (Erf only inside the erf-GELU pattern)."""
    return sorted([*HANDLERS, "Erf"])

"""MIR: a graph of primitive and fused ops with inferred shapes."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from rlx.errors import IRError, ShapeError
from rlx.ir import ops as O
from rlx.ir import ops_control as C
from rlx.ir import ops_conv as CV
from rlx.ir import ops_feedback as FB
from rlx.ir import ops_int8 as Q8
from rlx.ir import ops_lora as LR
from rlx.ir import ops_moe as MOE
from rlx.ir import ops_range as RG
from rlx.ir import ops_sample as SP
from rlx.ir import ops_scan as L
from rlx.ir import ops_ssm as S
from rlx.ir import ops_user as U
from rlx.ir import serialize
from rlx.ir.dtype import DType, f32_to_bf16
from rlx.ir.shape import Dim, DimLike, Shape, check_symbol_bounds

NodeId = int


@dataclass(frozen=True)
class Node:
    """One value of the graph: `op` applied to the values `inputs`."""

    id: NodeId
    op: O.Op
    inputs: tuple[NodeId, ...]
    shape: Shape
    name: str = ""

    @property
    def kind(self) -> str:
        return self.op.kind

    @property
    def label(self) -> str:
        return f"%{self.id}" + (f" ({self.name})" if self.name else "")


@serialize.register
class Graph:
    """A MIR graph, built op by op with shapes inferred as it goes.

    Node ids are dense and in topological order (an op can only use values
    that already exist). Builder methods return the new node's id.

    >>> g = Graph("mlp")
    >>> x = g.input("x", [4, 8])
    >>> w = g.param("w", [8, 16])
    >>> y = g.activation("gelu", g.matmul(x, w))
    >>> g.set_outputs([y])
    >>> str(g.node(y).shape)
    'f32[4,16]'
    """

    #: The IR stage this class holds, and the ops it accepts (HIR extends both).
    stage = "mir"
    op_registry: dict[str, type[O.Op]] = O.OPS

    def __init__(self, name: str = "graph") -> None:
        if not isinstance(name, str):
            raise IRError(f"graph name must be a string, got {name!r}")
        self.name = name
        self.nodes: list[Node] = []
        self.outputs: list[NodeId] = []
        self.output_names: list[str] = []

    # ── core ───────────────────────────────────────────────────────────

    def add(self, op: O.Op, inputs: Sequence[NodeId] = (), name: str = "") -> NodeId:
        """Append `op` applied to `inputs`, inferring its shape; returns the new id."""
        node_id = len(self.nodes)
        if not isinstance(op, O.Op) or self.op_registry.get(op.kind) is not type(op):
            raise IRError(f"node %{node_id}: {op!r} is not a {self.stage.upper()} op")
        if not isinstance(name, str):
            raise IRError(f"node %{node_id}: name must be a string, got {name!r}")
        ins = tuple(inputs)
        for i in ins:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < node_id:
                raise IRError(f"node %{node_id} ({op.kind}): input {i!r} does not name an earlier node")
        try:
            if op.kind not in O.LEAF_KINDS:
                op.check_arity(len(ins))
            elif ins:
                raise IRError(f"{op.kind} takes no inputs")
            in_shapes = [self.nodes[i].shape for i in ins]
            shape = op.infer(in_shapes)
            O.check_narrow(op.kind, in_shapes, shape)
        except IRError as exc:
            label = f"%{node_id}" + (f" ({name})" if name else "")
            raise type(exc)(f"node {label} {op.kind}: {exc}") from None
        self.nodes.append(Node(node_id, op, ins, shape, name))
        return node_id

    def node(self, node_id: NodeId) -> Node:
        # Reject negatives and bools explicitly: list indexing would accept them.
        if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id < len(self.nodes):
            raise IRError(f"graph {self.name!r} has no node {node_id!r}")
        return self.nodes[node_id]

    def shape(self, node_id: NodeId) -> Shape:
        return self.node(node_id).shape

    def set_outputs(self, outputs: Sequence[NodeId] | dict[str, NodeId], names: Sequence[str] | None = None) -> None:
        """Mark graph outputs, given as ids (named out0, out1…) or a name → id dict."""
        if isinstance(outputs, dict):
            names, ids = list(outputs.keys()), list(outputs.values())
        else:
            ids = list(outputs)
            names = list(names) if names is not None else [f"out{i}" for i in range(len(ids))]
        if not ids:
            raise IRError(f"graph {self.name!r} needs at least one output")
        if len(names) != len(ids):
            raise IRError(f"{len(ids)} outputs but {len(names)} output names")
        for n in names:
            if not isinstance(n, str) or not n:
                raise IRError(f"output names must be non-empty strings, got {n!r}")
        if len(set(names)) != len(names):
            raise IRError(f"duplicate output names: {names}")
        for i in ids:
            self.node(i)
        self.outputs, self.output_names = ids, names

    # ── queries ────────────────────────────────────────────────────────

    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "input"]

    def params(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "param"]

    def symbols(self) -> dict[str, int]:
        """Dynamic dimension names and their upper bounds, in first-seen order."""
        return check_symbol_bounds(n.shape for n in self.nodes)

    def users(self) -> dict[NodeId, list[NodeId]]:
        out: dict[NodeId, list[NodeId]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n.id)
        return out

    def topological_order(self) -> list[NodeId]:
        """Node ids in an order where every node follows its inputs (ids are already one)."""
        return [n.id for n in self.nodes]

    def verify(self) -> None:
        """Re-check every invariant: ids, references, shapes, names, outputs."""
        seen_inputs: set[str] = set()
        seen_params: set[str] = set()
        for idx, n in enumerate(self.nodes):
            if n.id != idx:
                raise IRError(f"node at position {idx} has id {n.id}")
            for i in n.inputs:
                if not 0 <= i < idx:
                    raise IRError(f"node {n.label} {n.kind} uses %{i}, which is not an earlier node")
            try:
                if n.kind not in O.LEAF_KINDS:
                    n.op.check_arity(len(n.inputs))
                shape = n.op.infer([self.nodes[i].shape for i in n.inputs])
            except IRError as exc:
                raise type(exc)(f"node {n.label} {n.kind}: {exc}") from None
            if shape != n.shape:
                raise ShapeError(f"node {n.label} {n.kind}: recorded shape {n.shape} but inputs give {shape}")
            if n.kind in ("input", "param"):
                seen = seen_inputs if n.kind == "input" else seen_params
                if n.op.name in seen:
                    raise IRError(f"duplicate {n.kind} name {n.op.name!r}")
                seen.add(n.op.name)
        overlap = seen_inputs & seen_params
        if overlap:
            raise IRError(f"names used for both inputs and params: {sorted(overlap)}")
        if not self.outputs:
            raise IRError(f"graph {self.name!r} has no outputs")
        for o in self.outputs:
            if not 0 <= o < len(self.nodes):
                raise IRError(f"output %{o} does not exist")
        self.symbols()

    def copy(self) -> Graph:
        g = type(self)(self.name)
        g.nodes = list(self.nodes)
        g.outputs = list(self.outputs)
        g.output_names = list(self.output_names)
        return g

    def __len__(self) -> int:
        return len(self.nodes)

    # ── serialization (rlx/ir/serialize.py: it sits below this module and finds Graph by its stage) ──

    def to_json(self) -> str:
        """This graph as a versioned JSON document (see `rlx.ir.serialize`).

        >>> g = Graph("id")
        >>> g.set_outputs([g.input("x", [2])])
        >>> str(Graph.from_json(g.to_json())) == str(g)
        True
        """
        return serialize.to_json(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        """Rebuild a graph from `to_json` text; the stage picks the class. Bad input raises `IRError`."""
        return serialize.from_json(text, cls)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write `to_json()` to `path` atomically."""
        serialize.save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Graph:
        """Read a graph written by `save`."""
        return serialize.load(path, cls)

    def __str__(self) -> str:
        lines = [f"graph {self.name} {{"]
        for n in self.nodes:
            args = ", ".join(f"%{i}" for i in n.inputs)
            op = n.op
            if isinstance(op, (O.Input, O.Param)):
                desc = f"{op.kind} {op.name!r}" + (f" layout={list(op.layout)}" if getattr(op, "layout", None) else "")
            else:
                desc = op.describe()
            note = f"  # {n.name}" if n.name else ""
            lines.append(f"  %{n.id}: {n.shape} = {desc}({args}){note}")
        outs = ", ".join(f"{name}=%{o}" for name, o in zip(self.output_names, self.outputs))
        lines.append(f"  return {outs}")
        lines.append("}")
        return "\n".join(lines)

    __repr__ = __str__

    # ── builders: leaves ───────────────────────────────────────────────

    def input(self, name: str, dims: Iterable[DimLike] | Shape, dtype: DType | str = DType.F32) -> NodeId:
        _check_name("input", name)
        return self.add(O.Input(name, _shape(dims, dtype)), name=name)

    def state(self, name: str, dims: Iterable[DimLike] | Shape, dtype: DType | str = DType.F32) -> NodeId:
        """A persistent input the caller owns and ops update in place (a KV cache); static shape."""
        _check_name("input", name)
        return self.add(O.Input(name, _shape(dims, dtype), state=True), name=name)

    def param(self, name: str, dims: Iterable[DimLike] | Shape, dtype: DType | str = DType.F32) -> NodeId:
        _check_name("param", name)
        return self.add(O.Param(name, _shape(dims, dtype)), name=name)

    def constant(self, value: np.ndarray | float | int, dtype: DType | str | None = None) -> NodeId:
        """A constant tensor; float values are rounded to `dtype` (bf16 included)."""
        arr = np.asarray(value)
        if dtype is None:
            dt = DType.F32 if arr.dtype.kind == "f" else DType.parse(arr.dtype)
        else:
            dt = DType.parse(dtype)
        stored = f32_to_bf16(arr.astype(np.float32)) if dt is DType.BF16 else arr.astype(dt.np)
        return self.add(O.Constant.from_array(stored, dt))

    # ── builders: elementwise ─────────────────────────────────────────

    def activation(self, fn: str, x: NodeId) -> NodeId:
        return self.add(O.Activation(fn), [x])

    def binary(self, fn: str, a: NodeId, b: NodeId) -> NodeId:
        return self.add(O.Binary(fn), [a, b])

    def add_(self, a: NodeId, b: NodeId) -> NodeId:
        return self.binary("add", a, b)

    def sub(self, a: NodeId, b: NodeId) -> NodeId:
        return self.binary("sub", a, b)

    def mul(self, a: NodeId, b: NodeId) -> NodeId:
        return self.binary("mul", a, b)

    def div(self, a: NodeId, b: NodeId) -> NodeId:
        return self.binary("div", a, b)

    def compare(self, fn: str, a: NodeId, b: NodeId) -> NodeId:
        return self.add(O.Compare(fn), [a, b])

    def where(self, cond: NodeId, a: NodeId, b: NodeId) -> NodeId:
        return self.add(O.Where(), [cond, a, b])

    def cast(self, x: NodeId, dtype: DType | str) -> NodeId:
        return self.add(O.Cast(DType.parse(dtype)), [x])

    # ── builders: compute ─────────────────────────────────────────────

    def matmul(self, a: NodeId, b: NodeId) -> NodeId:
        return self.add(O.MatMul(), [a, b])

    def dequant_matmul(self, x: NodeId, w: NodeId, *, quant: str, act: str = "f32") -> NodeId:
        """x @ dequant(w).T for raw GGUF blocks w u8 `[N, row_bytes]` (`ops.DequantMatMul`)."""
        return self.add(O.DequantMatMul(quant.lower() if isinstance(quant, str) else quant, act), [x, w])

    def int8_matmul(self, x: NodeId, w: NodeId, bias: NodeId | None = None, *,
                    activation: str | None = None) -> NodeId:
        """act(x @ w + bias) in int8, w per output channel, x per row at run time (`ops_int8.Int8MatMul`)."""
        return self.add(Q8.Int8MatMul(activation), [x, w] if bias is None else [x, w, bias])

    def dequantize(self, x: NodeId, *, quant: str) -> NodeId:
        """Rows of raw GGUF blocks → f32 (`ops.Dequantize`)."""
        return self.add(O.Dequantize(quant.lower() if isinstance(quant, str) else quant), [x])

    def reduce(self, fn: str, x: NodeId, axes: Iterable[int] = (), keep_dim: bool = False) -> NodeId:
        return self.add(O.Reduce(fn, tuple(axes), bool(keep_dim)), [x])

    def argmax(self, x: NodeId, axis: int = -1) -> NodeId:
        """i32 index of the largest value along `axis` (`ops.ArgMax`)."""
        return self.add(O.ArgMax(int(axis)), [x])

    def lora_matmul(self, x: NodeId, a: NodeId, b: NodeId, scale: NodeId, index: NodeId) -> NodeId:
        """scale[s] * (x @ a[s]^T) @ b[s]^T per row group of `x` `[G, ..., K]`, s = `index[g]` (< 0: zeros),
        `a` `[S, R, K]`, `b` `[S, N, R]`: one LoRA adapter slot per sequence (`ops_lora.LoraMatMul`)."""
        return self.add(LR.LoraMatMul(), [x, a, b, scale, index])

    def sample_top_k(self, logits: NodeId, u: NodeId, settings: NodeId) -> NodeId:
        """i32 token id per row of `logits` `[rows, vocab]`, sampled with uniforms `u` f64 `[rows]` and
        `settings` f64 `[3]` (temperature, top_k, top_p) (`ops_sample.SampleTopK`)."""
        return self.add(SP.SampleTopK(), [logits, u, settings])

    def token_feed(self, tokens: NodeId, src: NodeId, last: NodeId) -> NodeId:
        """`tokens` i32 `[batch, seq]` with row b's last token ``last[src[b]]`` where `src[b]` is a slot of the i32
        state `last` (`ops_feedback.TokenFeed`)."""
        return self.add(FB.TokenFeed(), [tokens, src, last])

    def token_store(self, values: NodeId, dst: NodeId, last: NodeId) -> NodeId:
        """`values` i32 `[n]`, also stored at ``last[dst[i]]`` where `dst[i]` is a slot of the i32 state `last`
        (in place; `ops_feedback.TokenStore`)."""
        return self.add(FB.TokenStore(), [values, dst, last])

    def iota(self, length: DimLike, start: int | float = 0, delta: int | float = 1,
             dtype: DType | str = DType.I64) -> NodeId:
        """`[length]` values ``start + i * delta`` (`ops_range.Iota`); `length` may be a dynamic dim."""
        return self.add(RG.Iota(Dim.of(length), start, delta, DType.parse(dtype)), [])

    def conv(self, x: NodeId, w: NodeId, bias: NodeId | None = None, *, strides: Sequence[int] = (),
             dilations: Sequence[int] = (), pads: Sequence[int] = (), groups: int = 1,
             activation: str | None = None) -> NodeId:
        """act(conv(x, w) + bias), channels-first, 1-D or 2-D (`ops_conv.Conv`)."""
        op = CV.Conv(tuple(strides), tuple(dilations), tuple(pads), groups, activation)
        return self.add(op, [x, w] if bias is None else [x, w, bias])

    def pool(self, fn: str, x: NodeId, kernel: Sequence[int], *, strides: Sequence[int] = (),
             pads: Sequence[int] = (), dilations: Sequence[int] = (), ceil_mode: bool = False,
             count_include_pad: bool = False) -> NodeId:
        """Max ("max") or average ("avg") pooling of x `[N, C, *S]` (`ops_conv.Pool`)."""
        return self.add(CV.Pool(fn, tuple(kernel), tuple(strides), tuple(pads), tuple(dilations), bool(ceil_mode),
                                bool(count_include_pad)), [x])

    def batch_norm(self, x: NodeId, scale: NodeId, bias: NodeId, mean: NodeId, var: NodeId, *,
                   eps: float = 1e-5) -> NodeId:
        """Inference batch normalization over axis 1 (`ops_conv.BatchNorm`)."""
        return self.add(CV.BatchNorm(eps), [x, scale, bias, mean, var])

    def softmax(self, x: NodeId, axis: int = -1) -> NodeId:
        return self.add(O.Softmax(axis), [x])

    def layer_norm(self, x: NodeId, gamma: NodeId, beta: NodeId, eps: float = 1e-5) -> NodeId:
        return self.add(O.LayerNorm(float(eps)), [x, gamma, beta])

    def rms_norm(self, x: NodeId, gamma: NodeId, eps: float = 1e-6) -> NodeId:
        return self.add(O.RmsNorm(float(eps)), [x, gamma])

    # ── builders: shape ───────────────────────────────────────────────

    def reshape(self, x: NodeId, shape: Iterable[DimLike]) -> NodeId:
        return self.add(O.Reshape(tuple(shape)), [x])

    def transpose(self, x: NodeId, perm: Iterable[int]) -> NodeId:
        return self.add(O.Transpose(tuple(perm)), [x])

    def narrow(self, x: NodeId, axis: int, start: int, length: int) -> NodeId:
        return self.add(O.Narrow(axis, start, length), [x])

    def concat(self, xs: Sequence[NodeId], axis: int) -> NodeId:
        return self.add(O.Concat(axis), list(xs))

    def expand(self, x: NodeId, shape: Iterable[DimLike]) -> NodeId:
        return self.add(O.Expand(tuple(Dim.of(d) for d in shape)), [x])

    def gather(self, table: NodeId, indices: NodeId, axis: int = 0) -> NodeId:
        return self.add(O.Gather(axis), [table, indices])

    # ── builders: transformer blocks ──────────────────────────────────

    def attention(self, q: NodeId, k: NodeId, v: NodeId, *, num_heads: int, head_dim: int,
                  mask: str = "none", mask_input: NodeId | None = None, scale: float | None = None,
                  num_kv_heads: int | None = None) -> NodeId:
        ins = [q, k, v] + ([mask_input] if mask_input is not None else [])
        return self.add(O.Attention(num_heads, head_dim, mask, scale, num_kv_heads), ins)

    def cached_attention(self, q: NodeId, k: NodeId, v: NodeId, k_cache: NodeId, v_cache: NodeId,
                         positions: NodeId, *, num_heads: int, head_dim: int, num_kv_heads: int | None = None,
                         scale: float | None = None, window: int | None = None,
                         block_table: NodeId | None = None, page_size: int | None = None,
                         rows_distinct: NodeId | None = None) -> NodeId:
        """Causal attention of q over the caches after appending k, v at `positions` (`ops.CachedAttention`;
        `window`: sliding-window attention over the last `window` keys; `block_table` and `page_size`: the
        paged layout, caches `[num_pages, page_size, width]`; `rows_distinct`: the paged layout's hint that a
        step's rows are distinct sequences, an i32 input of 1 or 2 elements: 2 says they are)."""
        if rows_distinct is not None and block_table is None:
            raise IRError("cached_attention's rows_distinct hint is for the paged layout (a block_table)")
        extra = [block_table] if block_table is not None else []
        extra += [rows_distinct] if rows_distinct is not None else []
        return self.add(O.CachedAttention(num_heads, head_dim, num_kv_heads, scale, window, page_size),
                        [q, k, v, k_cache, v_cache, positions, *extra])

    def rope(self, x: NodeId, cos: NodeId, sin: NodeId, *, head_dim: int, n_rot: int | None = None,
             variant: str = "neox") -> NodeId:
        return self.add(O.Rope(head_dim, n_rot, variant), [x, cos, sin])


    # ── sub-graphs: scan and custom_fn bodies (rlx/ir/ops_scan.py) ──────

    def as_body(self) -> L.Body:
        """This graph as a frozen `Body` value (the attribute a scan or custom_fn holds)."""
        self.verify()
        return L.Body(self.name, tuple(L.BodyNode(n.op, n.inputs, n.shape, n.name) for n in self.nodes),
                      tuple(self.outputs), tuple(self.output_names))

    @classmethod
    def from_body(cls, body: L.Body) -> Graph:
        """The graph a `Body` holds (rebuilt through `add`, so every shape is inferred again)."""
        g = cls(body.name)
        for n in body.nodes:
            g.add(n.op, n.inputs, name=n.name)
        g.set_outputs(list(body.outputs), list(body.output_names) or None)
        return g

    def scan(self, body: Graph, init: NodeId, *, xs: Sequence[NodeId] = (), bcasts: Sequence[NodeId] = (),
             length: DimLike | None = None, save_trajectory: bool = False, reverse: bool = False,
             num_checkpoints: int = 0) -> NodeId:
        """A loop running `body` (carry, *bcasts, *xs rows) -> carry `length` times (`ops_scan.Scan`).

        `length` defaults to the leading dim of the first xs. Returns the final carry,
        or the stacked carries `[length, *carry]` with `save_trajectory`.
        """
        if length is None:
            if not xs:
                raise IRError("scan needs a length when it has no xs")
            length = self.shape(xs[0]).dims[0]
        op = L.Scan(body.as_body(), Dim.of(length), len(bcasts), len(xs), bool(save_trajectory), bool(reverse),
                    int(num_checkpoints))
        return self.add(op, [init, *bcasts, *xs])

    def scan_checkpointed(self, body: Graph, init: NodeId, *, num_checkpoints: int, **kw: object) -> NodeId:
        """`scan` whose reverse-mode derivative keeps `num_checkpoints` carries and recomputes the rest."""
        return self.scan(body, init, num_checkpoints=num_checkpoints, **kw)  # type: ignore[arg-type]

    def custom_fn(self, inputs: Sequence[NodeId], fwd: Graph, *, vjp: Graph | None = None,
                  jvp: Graph | None = None) -> NodeId:
        """`fwd` applied to `inputs`, with optional derivative bodies (`ops_scan.CustomFn`)."""
        return self.add(L.CustomFn(fwd.as_body(), vjp.as_body() if vjp is not None else None,
                                   jvp.as_body() if jvp is not None else None), list(inputs))

    # ── control flow (rlx/ir/ops_control.py) ──────────────────────────

    def cond(self, pred: NodeId, true_body: Graph, false_body: Graph, operands: Sequence[NodeId] = ()) -> NodeId:
        """`true_body(*operands)` if the bool `pred` holds, else `false_body(*operands)` (`ops_control.Cond`).

        >>> def branch(name, fn):
        ...     b = Graph(name)
        ...     b.set_outputs([b.activation(fn, b.input("x", [2]))])
        ...     return b
        >>> g = Graph("c")
        >>> x = g.input("x", [2])
        >>> pred = g.compare("gt", g.reduce("sum", x), g.constant(0.0))
        >>> str(g.shape(g.cond(pred, branch("t", "exp"), branch("f", "neg"), [x])))
        'f32[2]'
        """
        return self.add(C.Cond(true_body.as_body(), false_body.as_body()), [pred, *operands])

    def while_loop(self, cond_body: Graph, body: Graph, init: NodeId, *, bcasts: Sequence[NodeId] = (),
                   max_trips: int | None = None) -> NodeId:
        """`carry = body(carry, *bcasts)` from `init` while `cond_body(carry, *bcasts)` holds, at most
        `max_trips` times when given (`ops_control.WhileLoop`).

        >>> import numpy as np
        >>> cond, body = Graph("small"), Graph("double")
        >>> c = cond.input("c", [2])
        >>> cond.set_outputs([cond.compare("lt", cond.reduce("sum", c), cond.constant(np.float32(10)))])
        >>> d = body.input("c", [2])
        >>> body.set_outputs([body.add_(d, d)])
        >>> g = Graph("w")
        >>> g.set_outputs([g.while_loop(cond, body, g.input("x", [2]), max_trips=8)])
        >>> g.node(g.outputs[0]).op.describe()
        'while_loop[cond=4 nodes, body=2 nodes, max_trips=8]'
        """
        return self.add(C.WhileLoop(cond_body.as_body(), body.as_body(), max_trips), [init, *bcasts])
    def user_op(self, name: str, inputs: Sequence[NodeId], *, vjp: Graph | None = None) -> NodeId:
        """The registered user op `name` (`rlx.custom_op`) applied to `inputs` (`ops_user.UserOp`)."""
        spec = U.user_op_spec(name)
        return self.add(U.UserOp(name, spec.digest(), vjp.as_body() if vjp is not None else None), list(inputs))

    # ── builders: state-space and linear-attention layers (rlx/ir/ops_ssm.py) ──

    def selective_scan(self, x: NodeId, delta: NodeId, a: NodeId, b: NodeId, c: NodeId, *,
                       state: NodeId | None = None) -> NodeId:
        """Mamba's selective scan over x, delta `[b,s,h]`, A `[h,n]`, B, C `[b,s,n]` (`ops_ssm.SelectiveScan`).

        With `state` (a `[b,h,n]` state input) the recurrence starts from it and leaves the final
        state there (decode through a recurrent cache)."""
        n = self.shape(a).dims[-1] if self.shape(a).rank == 2 else Dim(0)
        if not n.is_static:
            raise ShapeError(f"selective_scan A must have a static state size, got {self.shape(a)}")
        ins = [x, delta, a, b, c] + ([state] if state is not None else [])
        return self.add(S.SelectiveScan(n.value, state is not None), ins)

    def gated_delta_net(self, q: NodeId, k: NodeId, v: NodeId, g: NodeId, beta: NodeId, *,
                        state: NodeId | None = None, scale: float | None = None) -> NodeId:
        """Gated delta rule over q, k, v `[b,s,h,n]`, g, beta `[b,s,h]` (`ops_ssm.GatedDeltaNet`).

        With `state` (a `[b,h,n,n]` state input) the recurrence starts from it and
        leaves the final state there (the `gated_delta_net_carry` form).
        """
        qs = self.shape(q)
        if qs.rank != 4 or not qs.dims[3].is_static:
            raise ShapeError(f"gated_delta_net q must be [batch, seq, heads, n] with a static n, got {qs}")
        ins = [q, k, v, g, beta] + ([state] if state is not None else [])
        return self.add(S.GatedDeltaNet(qs.dims[3].value, state is not None, scale), ins)

    def gated_delta_net_carry(self, q: NodeId, k: NodeId, v: NodeId, g: NodeId, beta: NodeId, state: NodeId, *,
                              scale: float | None = None) -> NodeId:
        """`gated_delta_net` threading `state` `[b,h,n,n]` (read, then updated in place) for decode."""
        return self.gated_delta_net(q, k, v, g, beta, state=state, scale=scale)

    def depthwise_conv1d_causal(self, x: NodeId, weight: NodeId, left_pad: NodeId | None = None, *,
                                reverse: bool = False, lengths: NodeId | None = None) -> NodeId:
        """Causal depthwise conv of x `[b,s,c]` with weight `[c,k]` (`ops_ssm.DepthwiseConv1dCausal`).

        With `lengths` (i32 `[b]`) `left_pad` is a conv state: it receives each row's last k-1
        inputs up to its length (the `carry_state` form)."""
        ws = self.shape(weight)
        if ws.rank != 2 or not ws.dims[1].is_static:
            raise ShapeError(f"depthwise_conv1d_causal weight must be [channels, kernel_size], got {ws}")
        if lengths is not None and left_pad is None:
            raise ShapeError("depthwise_conv1d_causal lengths need a left_pad (the conv state they update)")
        ins = [x, weight] + ([left_pad] if left_pad is not None else []) + ([lengths] if lengths is not None else [])
        return self.add(S.DepthwiseConv1dCausal(ws.dims[1].value, bool(reverse), lengths is not None), ins)


    # ── builders: sparse mixture of experts (rlx/ir/ops_moe.py) ──

    def moe_router(self, logits: NodeId, *, top_k: int, normalize: bool) -> tuple[NodeId, NodeId]:
        """(ids i32, weights f32), each `[T, top_k]`: the `top_k` experts of each row of router logits
        `[T, E]` and their softmax probabilities, renormalized to sum 1 when `normalize`
        (`ops_moe.MoeTopK`, `ops_moe.MoeGate`)."""
        ids = self.add(MOE.MoeTopK(top_k), [logits])
        return ids, self.add(MOE.MoeGate(bool(normalize)), [logits, ids])

    def moe_matmul(self, x: NodeId, ids: NodeId, w: NodeId, *, quant: str | None = None) -> NodeId:
        """f32 `[T, top_k, N]`: expert `ids[t, s]`'s `[N, K]` matrix of w times x `[T, K]` or `[T, top_k, K]`;
        w `[E, N, K]` float, or u8 GGUF blocks with `quant` (`ops_moe.MoeMatMul`)."""
        return self.add(MOE.MoeMatMul(quant.lower() if isinstance(quant, str) else quant), [x, ids, w])


def _check_name(kind: str, name: object) -> None:
    if not isinstance(name, str) or not name:
        raise IRError(f"{kind} name must be a non-empty string, got {name!r}")
    if len(name) > 256:
        raise IRError(f"{kind} name is longer than 256 characters")


def _shape(dims: Iterable[DimLike] | Shape, dtype: DType | str) -> Shape:
    if isinstance(dims, Shape):
        return dims
    try:
        return Shape.of(list(dims), dtype)
    except TypeError:
        raise ShapeError(f"dims must be a sequence of ints or Dims, got {dims!r}") from None


def numel_static(shape: Shape) -> int:
    return math.prod(shape.static_dims)

"""HIR: a graph of transformer-sized blocks that lowers to MIR.

A `HirModule` is a `Graph` whose nodes may also be *blocks* (`linear`,
`swiglu_ffn`, `attention`, `rope`, `rms_norm`, `residual_rms_norm`,
`layer_norm`). A block is a frozen dataclass like every MIR op: it infers its
output shape when it is added, and `lower(graph, inputs)` emits the MIR ops
that compute it. Every MIR builder method works on a `HirModule` too, so any
MIR op can sit between blocks; the four block builders whose names are also
MIR builders (`attention`, `rope`, `rms_norm`, `layer_norm`) keep the MIR
signatures and record the block, and `add(ops.RmsNorm(eps), [x, g])` still
reaches the MIR op directly.

Conventions, decided once here:

- Blocks lower to the *unfused* canonical MIR (matmul, binary add, activation,
  the dedicated attention / rope / norm ops). Fusion is the optimizer's job, so
  a model written with blocks and the same model written op by op optimize to
  the same program.
- `linear` weights are `[in, out]` (``y = x @ w``, the MIR matmul layout). For
  checkpoints that store `[out, in]` (PyTorch / Hugging Face `nn.Linear`), pass
  ``transpose_weight=True``: the block lowers to ``matmul(x, transpose(w))``,
  which the layout pass can turn into a pre-transposed parameter.
- `residual_rms_norm` yields only ``rms_norm(x + residual [+ bias])``: one
  node is one value. Ask the builder for ``return_sum=True`` to also get the
  sum, which it then records as an ordinary add feeding an `rms_norm` block.

Block kinds are prefixed ``hir.`` so they never collide with MIR op kinds in
`HirModule.op_registry` (which serialization uses to decode nodes).

>>> h = HirModule("proj")
>>> x = h.input("x", [2, 8])
>>> w = h.param("w", [16, 8])
>>> h.set_outputs([h.linear(x, w, activation="gelu", transpose_weight=True)])
>>> print(h.lower_to_mir())
graph proj {
  %0: f32[2,8] = input 'x'()  # x
  %1: f32[16,8] = param 'w'()  # w
  %2: f32[8,16] = transpose[perm=(1,0)](%1)
  %3: f32[2,16] = matmul(%0, %2)
  %4: f32[2,16] = activation[fn=gelu](%3)
  return out0=%4
}
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx.errors import IRError, ShapeError
from rlx.ir import ops as O
from rlx.ir import serialize
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.shape import Shape

#: HIR block kind -> class. Blocks register here, never in the MIR `OPS`.
HIR_BLOCKS: dict[str, type[O.Op]] = {}


def _fmt(shapes: Sequence[Shape]) -> str:
    return ", ".join(str(s) for s in shapes)


def _one_float_dtype(kind: str, shapes: Sequence[Shape]) -> None:
    if len({s.dtype for s in shapes}) != 1:
        raise ShapeError(f"{kind} needs inputs of one dtype, got {_fmt(shapes)}")
    if not shapes[0].dtype.is_float:
        raise ShapeError(f"{kind} needs floating-point inputs, got {_fmt(shapes)}")


def _check_activation(kind: str, activation: str | None) -> None:
    if activation is not None and activation not in O.ACTIVATIONS:
        raise ShapeError(f"{kind}: unknown activation {activation!r}; expected one of {O.ACTIVATIONS}")


def _weight_io(kind: str, what: str, w: Shape, transpose: bool) -> tuple:
    """(in_features, out_features) of a 2-D weight under the block's convention."""
    if w.rank != 2:
        layout = "[out, in]" if transpose else "[in, out]"
        raise ShapeError(f"{kind} {what} must be a 2-D {layout} matrix, got {w}")
    return (w.dims[1], w.dims[0]) if transpose else (w.dims[0], w.dims[1])


def _layout_hint(transpose: bool) -> str:
    if transpose:
        return "weights are [out, in] because transpose_weight=True"
    return "weights are [in, out]; pass transpose_weight=True for [out, in] (PyTorch) weights"


def _matmul_weight(graph: Graph, w: NodeId, transpose: bool) -> NodeId:
    return graph.add(O.Transpose((1, 0)), [w]) if transpose else w


@dataclass(frozen=True)
class Block(O.Op):
    """Base of HIR blocks: an op that `lower`s to MIR instead of being executed."""

    registry: ClassVar[dict[str, type[O.Op]]] = HIR_BLOCKS

    def lower(self, graph: Graph, inputs: list[NodeId]) -> NodeId:  # pragma: no cover - abstract
        """Append the MIR ops computing this block to `graph`; return the result's id."""
        raise NotImplementedError


@dataclass(frozen=True)
class Linear(Block):
    """``act(x @ w + bias)``. Inputs x ``[..., in]``, weight, optional bias ``[out]``.

    The weight is ``[in, out]``, or ``[out, in]`` when `transpose_weight`.
    """

    kind: ClassVar[str] = "hir.linear"
    arity: ClassVar[tuple[int, int]] = (2, 3)
    activation: str | None = None
    transpose_weight: bool = False

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, w = inputs[:2]
        _one_float_dtype("linear", inputs)
        _check_activation("linear", self.activation)
        if x.rank < 2:
            raise ShapeError(f"linear input must have rank >= 2 ([..., rows, in]), got {x}")
        k_in, n_out = _weight_io("linear", "weight", w, self.transpose_weight)
        if x.dims[-1] != k_in:
            raise ShapeError(f"linear input {x} has {x.dims[-1]} features but weight {w} takes {k_in} "
                             f"({_layout_hint(self.transpose_weight)})")
        if len(inputs) == 3 and inputs[2].dims != (n_out,):
            raise ShapeError(f"linear bias must be [{n_out}], got {inputs[2]} (weight {w})")
        return x.with_dims((*x.dims[:-1], n_out))

    def lower(self, graph: Graph, inputs: list[NodeId]) -> NodeId:
        y = graph.add(O.MatMul(), [inputs[0], _matmul_weight(graph, inputs[1], self.transpose_weight)])
        if len(inputs) == 3:
            y = graph.add(O.Binary("add"), [y, inputs[2]])
        if self.activation is not None:
            y = graph.add(O.Activation(self.activation), [y])
        return y


@dataclass(frozen=True)
class SwiGLUFFN(Block):
    """``(silu(x @ w_gate) * (x @ w_up)) @ w_down``. Inputs x, w_gate, w_up, w_down.

    Weights follow the `Linear` convention: gate/up ``[hidden, ffn]`` and down
    ``[ffn, out]``, or all transposed when `transpose_weight`.
    """

    kind: ClassVar[str] = "hir.swiglu_ffn"
    arity: ClassVar[tuple[int, int]] = (4, 4)
    transpose_weight: bool = False

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, wg, wu, wd = inputs
        _one_float_dtype("swiglu_ffn", inputs)
        if x.rank < 2:
            raise ShapeError(f"swiglu_ffn input must have rank >= 2 ([..., rows, hidden]), got {x}")
        tw = self.transpose_weight
        g_in, g_out = _weight_io("swiglu_ffn", "w_gate", wg, tw)
        if wu != wg:
            raise ShapeError(f"swiglu_ffn w_gate and w_up must have one shape, got {wg} and {wu}")
        if x.dims[-1] != g_in:
            raise ShapeError(f"swiglu_ffn input {x} has {x.dims[-1]} features but w_gate {wg} takes {g_in} "
                             f"({_layout_hint(tw)})")
        d_in, d_out = _weight_io("swiglu_ffn", "w_down", wd, tw)
        if d_in != g_out:
            raise ShapeError(f"swiglu_ffn w_down {wd} takes {d_in} features but w_gate {wg} gives {g_out} "
                             f"({_layout_hint(tw)})")
        return x.with_dims((*x.dims[:-1], d_out))

    def lower(self, graph: Graph, inputs: list[NodeId]) -> NodeId:
        x, wg, wu, wd = inputs
        tw = self.transpose_weight
        gate = graph.add(O.MatMul(), [x, _matmul_weight(graph, wg, tw)])
        up = graph.add(O.MatMul(), [x, _matmul_weight(graph, wu, tw)])
        hidden = graph.add(O.Binary("mul"), [graph.add(O.Activation("silu"), [gate]), up])
        return graph.add(O.MatMul(), [hidden, _matmul_weight(graph, wd, tw)])


@dataclass(frozen=True)
class AttentionBlock(Block):
    """Multi-head attention; same inputs and attributes as MIR `ops.Attention`."""

    kind: ClassVar[str] = "hir.attention"
    arity: ClassVar[tuple[int, int]] = (3, 4)
    num_heads: int
    head_dim: int
    mask: str = "none"
    scale: float | None = None
    num_kv_heads: int | None = None

    def mir_op(self) -> O.Attention:
        return O.Attention(self.num_heads, self.head_dim, self.mask, self.scale, self.num_kv_heads)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        return self.mir_op().infer(inputs)

    def lower(self, graph: Graph, inputs: list[NodeId]) -> NodeId:
        return graph.add(self.mir_op(), inputs)


@dataclass(frozen=True)
class RopeBlock(Block):
    """Rotary embedding; same inputs (x, cos, sin) and attributes as MIR `ops.Rope`."""

    kind: ClassVar[str] = "hir.rope"
    arity: ClassVar[tuple[int, int]] = (3, 3)
    head_dim: int
    n_rot: int | None = None
    variant: str = "neox"

    def mir_op(self) -> O.Rope:
        return O.Rope(self.head_dim, self.n_rot, self.variant)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        return self.mir_op().infer(inputs)

    def lower(self, graph: Graph, inputs: list[NodeId]) -> NodeId:
        return graph.add(self.mir_op(), inputs)


@dataclass(frozen=True)
class RmsNormBlock(Block):
    """``x / sqrt(mean(x^2) + eps) * gamma`` over the last axis. Inputs x, gamma."""

    kind: ClassVar[str] = "hir.rms_norm"
    arity: ClassVar[tuple[int, int]] = (2, 2)
    eps: float = 1e-6

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        return O.RmsNorm(self.eps).infer(inputs)

    def lower(self, graph: Graph, inputs: list[NodeId]) -> NodeId:
        return graph.add(O.RmsNorm(self.eps), inputs)


@dataclass(frozen=True)
class ResidualRmsNorm(Block):
    """``rms_norm(x + residual [+ bias], gamma)``. Inputs x, residual, gamma, optional bias.

    x and residual must have one shape (no broadcasting), as the fused MIR op
    requires, so the optimizer can always fuse the lowered add + norm.
    """

    kind: ClassVar[str] = "hir.residual_rms_norm"
    arity: ClassVar[tuple[int, int]] = (3, 4)
    eps: float = 1e-6

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, res, gamma = inputs[:3]
        if x != res:
            raise ShapeError(f"residual_rms_norm residual must match the input exactly: {x} vs {res}")
        out = O.RmsNorm(self.eps).infer([x, gamma])
        if len(inputs) == 4:
            bias = inputs[3]
            if bias.dims != (x.dims[-1],) or bias.dtype != x.dtype:
                raise ShapeError(f"residual_rms_norm bias must be {x.dtype}[{x.dims[-1]}], got {bias} for input {x}")
        return out

    def lower(self, graph: Graph, inputs: list[NodeId]) -> NodeId:
        total = graph.add(O.Binary("add"), inputs[:2])
        if len(inputs) == 4:
            total = graph.add(O.Binary("add"), [total, inputs[3]])
        return graph.add(O.RmsNorm(self.eps), [total, inputs[2]])


@dataclass(frozen=True)
class LayerNormBlock(Block):
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over the last axis. Inputs x, gamma, beta."""

    kind: ClassVar[str] = "hir.layer_norm"
    arity: ClassVar[tuple[int, int]] = (3, 3)
    eps: float = 1e-5

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        return O.LayerNorm(self.eps).infer(inputs)

    def lower(self, graph: Graph, inputs: list[NodeId]) -> NodeId:
        return graph.add(O.LayerNorm(self.eps), inputs)


def _opt_float(v: float | None) -> float | None:
    return None if v is None else float(v)


@serialize.register
class HirModule(Graph):
    """A graph of HIR blocks and MIR ops; `lower_to_mir()` turns it into a MIR `Graph`.

    Builders return node ids, like `Graph`'s. An optional `name` labels the
    block's node and is carried to the node that computes it after lowering.

    >>> h = HirModule("norm")
    >>> x = h.input("x", [2, 4])
    >>> g = h.param("g", [4])
    >>> h.set_outputs([h.rms_norm(x, g, eps=1e-5)])
    >>> [n.kind for n in h.nodes], [n.kind for n in h.lower_to_mir().nodes]
    (['input', 'param', 'hir.rms_norm'], ['input', 'param', 'rms_norm'])
    """

    stage = "hir"
    op_registry: ClassVar[dict[str, type[O.Op]]] = {**O.OPS, **HIR_BLOCKS}

    # ── block builders ────────────────────────────────────────────────

    def linear(self, x: NodeId, weight: NodeId, bias: NodeId | None = None, *, activation: str | None = None,
               transpose_weight: bool = False, name: str = "") -> NodeId:
        """``act(x @ weight + bias)``; weight ``[in, out]``, or ``[out, in]`` with `transpose_weight`."""
        ins = [x, weight] + ([bias] if bias is not None else [])
        return self.add(Linear(activation, bool(transpose_weight)), ins, name=name)

    def swiglu_ffn(self, x: NodeId, w_gate: NodeId, w_up: NodeId, w_down: NodeId, *,
                   transpose_weight: bool = False, name: str = "") -> NodeId:
        """LLaMA-style gated feed-forward: ``(silu(x @ w_gate) * (x @ w_up)) @ w_down``."""
        return self.add(SwiGLUFFN(bool(transpose_weight)), [x, w_gate, w_up, w_down], name=name)

    def attention(self, q: NodeId, k: NodeId, v: NodeId, *, num_heads: int, head_dim: int,
                  mask: str = "none", mask_input: NodeId | None = None, scale: float | None = None,
                  num_kv_heads: int | None = None, name: str = "") -> NodeId:
        """Attention block over ``[B, S, H*D]`` q/k/v (see `ops.Attention` for masks and GQA)."""
        ins = [q, k, v] + ([mask_input] if mask_input is not None else [])
        block = AttentionBlock(num_heads, head_dim, mask, _opt_float(scale), num_kv_heads)
        return self.add(block, ins, name=name)

    def rope(self, x: NodeId, cos: NodeId, sin: NodeId, *, head_dim: int, n_rot: int | None = None,
             variant: str = "neox", name: str = "") -> NodeId:
        """Rotary embedding block (see `ops.Rope`)."""
        return self.add(RopeBlock(head_dim, n_rot, variant), [x, cos, sin], name=name)

    def rms_norm(self, x: NodeId, gamma: NodeId, eps: float = 1e-6, *, name: str = "") -> NodeId:
        """RMS norm block over the last axis."""
        return self.add(RmsNormBlock(float(eps)), [x, gamma], name=name)

    def residual_rms_norm(self, x: NodeId, residual: NodeId, gamma: NodeId, bias: NodeId | None = None,
                          eps: float = 1e-6, *, return_sum: bool = False,
                          name: str = "") -> NodeId | tuple[NodeId, NodeId]:
        """``rms_norm(x + residual [+ bias], gamma)``.

        With ``return_sum=True`` returns ``(normed, sum)``: the sum is then an
        explicit add (the next residual of a pre-norm transformer) followed by
        an `rms_norm` block, since a block has exactly one value.
        """
        if not return_sum:
            ins = [x, residual, gamma] + ([bias] if bias is not None else [])
            return self.add(ResidualRmsNorm(float(eps)), ins, name=name)
        if self.shape(x) != self.shape(residual):
            raise ShapeError(f"residual_rms_norm residual must match the input exactly: "
                             f"{self.shape(x)} vs {self.shape(residual)}")
        total = self.add_(x, residual)
        if bias is not None:
            total = self.add_(total, bias)
        return self.rms_norm(total, gamma, eps, name=name), total

    def layer_norm(self, x: NodeId, gamma: NodeId, beta: NodeId, eps: float = 1e-5, *, name: str = "") -> NodeId:
        """Layer norm block over the last axis."""
        return self.add(LayerNormBlock(float(eps)), [x, gamma, beta], name=name)

    # ── queries and lowering ──────────────────────────────────────────

    def blocks(self) -> list[Node]:
        """The nodes that are HIR blocks (not MIR ops)."""
        return [n for n in self.nodes if isinstance(n.op, Block)]

    def summary(self) -> str:
        """One line: node count and how many of each block kind."""
        counts = Counter(n.kind for n in self.blocks())
        parts = ", ".join(f"{k} x{c}" for k, c in sorted(counts.items())) or "none"
        return f"hir {self.name}: {len(self.nodes)} nodes, {sum(counts.values())} blocks ({parts})"

    def lower_to_mir(self) -> Graph:
        """Lower every block to MIR, copy MIR ops as they are, and verify the result.

        Inputs and params keep their names and order; outputs keep their names.
        """
        self.verify()
        mir = Graph(self.name)
        remap: dict[NodeId, NodeId] = {}
        for n in self.nodes:
            ins = [remap[i] for i in n.inputs]
            if not isinstance(n.op, Block):
                remap[n.id] = mir.add(n.op, ins, name=n.name)
                continue
            first_new = len(mir.nodes)
            try:
                out = n.op.lower(mir, ins)
            except IRError as exc:
                raise type(exc)(f"lowering {n.label} {n.kind}: {exc}") from None
            if mir.shape(out) != n.shape:
                raise IRError(f"lowering {n.label} {n.kind} produced {mir.shape(out)}, but the block infers {n.shape}")
            if n.name and out >= first_new and not mir.nodes[out].name:
                mir.nodes[out] = dataclasses.replace(mir.nodes[out], name=n.name)
            remap[n.id] = out
        mir.set_outputs([remap[o] for o in self.outputs], self.output_names)
        mir.verify()
        return mir

    def __str__(self) -> str:
        text = super().__str__()
        return "hir" + text[len("graph"):] if text.startswith("graph") else text

    __repr__ = __str__

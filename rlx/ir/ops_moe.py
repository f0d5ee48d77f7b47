"""MIR ops of sparse mixture-of-experts layers: the router and the grouped expert matmul.

These ops register in the MIR op set (`rlx.ir.ops.OPS`) when this module is
imported (`rlx.ir.graph` imports it). Their meaning is written once, in
`rlx/reference.py`; `rlx/models/moe.py` builds a MoE feed-forward block from them.

- `moe_topk(logits, top_k)`: logits float `[T, E]` → i32 `[T, top_k]`, the ids
  of the `top_k` largest logits of each row (equivalently the largest softmax
  probabilities), largest first; ties go to the lower id, and a NaN counts as
  larger than any number (as `argmax`).
- `moe_gate(logits, ids, normalize)`: → f32 `[T, top_k]`, ``p[ids]`` where
  ``p = softmax(logits)`` over all E experts, divided by ``sum(p[ids])`` when
  `normalize` (Mixtral always; Qwen3-MoE when `norm_topk_prob`). Together the
  two are the router (`Graph.moe_router`).
- `moe_matmul(x, ids, w[, quant])`: x f32 `[T, K]` (one activation for every
  chosen expert of a token) or `[T, top_k, K]` (one per chosen expert); w the
  experts' weights `[E, N, K]` (f32 / f16 / bf16), or u8 `[E, N, row_bytes]`
  holding each expert's `[N, K]` matrix in a GGUF block format (`quant`, as
  `dequant_matmul`). Result f32 `[T, top_k, N]`: ``y[t, s] = W[ids[t, s]] @
  x[t(, s)]``. An id outside ``[0, E)`` gives a row of NaN. Backends group the
  (token, slot) pairs by expert (one GEMM per group) or, for few pairs
  (decode), run one GEMV per pair, reading only the chosen experts' weights.

>>> from rlx.ir.graph import Graph
>>> g = Graph("route")
>>> logits = g.input("logits", [3, 8])
>>> ids, weights = g.moe_router(logits, top_k=2, normalize=True)
>>> str(g.shape(ids)), str(g.shape(weights))
('i32[3,2]', 'f32[3,2]')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx.errors import ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import Op, _quant_format, _require_float
from rlx.ir.shape import Dim, Shape

#: Float dtypes `moe_matmul` takes for unquantized expert weights (x is f32).
EXPERT_FLOAT_DTYPES = (DType.F32, DType.F16, DType.BF16)


def _check_top_k(kind: str, top_k: object) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ShapeError(f"{kind} top_k must be an int >= 1, got {top_k!r}")
    return top_k


def _check_logits(kind: str, logits: Shape, top_k: int) -> None:
    _require_float(kind, logits)
    if logits.rank != 2 or not logits.dims[1].is_static:
        raise ShapeError(f"{kind} logits must be [tokens, experts] with a static expert count, got {logits}")
    if top_k > logits.dims[1].value:
        raise ShapeError(f"{kind}: top_k={top_k} is more than the {logits.dims[1].value} experts of {logits}")


@dataclass(frozen=True)
class MoeTopK(Op):
    """The router's choice: ids of the `top_k` largest logits per row (see the module docstring)."""

    kind: ClassVar[str] = "moe_topk"
    arity: ClassVar[tuple[int, int]] = (1, 1)
    top_k: int

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        k = _check_top_k("moe_topk", self.top_k)
        logits = inputs[0]
        _check_logits("moe_topk", logits, k)
        return Shape((logits.dims[0], Dim(k)), DType.I32)


@dataclass(frozen=True)
class MoeGate(Op):
    """The router's weights: softmax probabilities of the chosen experts, renormalized if `normalize`."""

    kind: ClassVar[str] = "moe_gate"
    arity: ClassVar[tuple[int, int]] = (2, 2)
    normalize: bool

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        logits, ids = inputs
        if not isinstance(self.normalize, bool):
            raise ShapeError(f"moe_gate normalize must be a bool, got {self.normalize!r}")
        if ids.dtype is not DType.I32 or ids.rank != 2 or not ids.dims[1].is_static:
            raise ShapeError(f"moe_gate ids must be i32 [tokens, top_k] (from moe_topk), got {ids}")
        _check_logits("moe_gate", logits, ids.dims[1].value)
        if ids.dims[0] != logits.dims[0]:
            raise ShapeError(f"moe_gate ids {ids} and logits {logits} have different token counts")
        return Shape(ids.dims, DType.F32)


@dataclass(frozen=True)
class MoeMatMul(Op):
    """Each token's chosen experts applied to its activation (see the module docstring)."""

    kind: ClassVar[str] = "moe_matmul"
    arity: ClassVar[tuple[int, int]] = (3, 3)
    quant: str | None = None

    def expert_dims(self, w: Shape) -> tuple[int, int, int]:
        """(E, N, K) of weight `w`: K values per row, stored as `row_bytes` bytes of blocks when quantized."""
        e, n, last = (d.value for d in w.dims)
        if self.quant is None:
            return e, n, last
        fmt = _quant_format("moe_matmul", self.quant)
        return e, n, last // fmt.block_bytes * fmt.block_size

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, ids, w = inputs
        if x.dtype is not DType.F32 or x.rank not in (2, 3) or not x.dims[-1].is_static:
            raise ShapeError(f"moe_matmul x must be f32 [tokens, K] or [tokens, top_k, K], got {x}")
        if ids.dtype is not DType.I32 or ids.rank != 2 or not ids.dims[1].is_static:
            raise ShapeError(f"moe_matmul ids must be i32 [tokens, top_k] (from moe_topk), got {ids}")
        if x.dims[0] != ids.dims[0] or (x.rank == 3 and x.dims[1] != ids.dims[1]):
            raise ShapeError(f"moe_matmul x {x} does not match ids {ids} (tokens, top_k)")
        if w.rank != 3 or not w.is_static:
            raise ShapeError(f"moe_matmul weight must be a static [experts, N, K] tensor, got {w}")
        k = x.dims[-1].value
        if self.quant is None:
            if w.dtype not in EXPERT_FLOAT_DTYPES:
                raise ShapeError(f"moe_matmul weight must be f32/f16/bf16 (or u8 blocks with quant=...), got {w}")
            if w.dims[2].value != k:
                raise ShapeError(f"moe_matmul weight {w} must be [experts, N, {k}] for x {x}")
        else:
            fmt = _quant_format("moe_matmul", self.quant)
            if k % fmt.block_size:
                raise ShapeError(f"moe_matmul: K={k} must be a multiple of the {fmt.name} block size "
                                 f"{fmt.block_size}")
            want = k // fmt.block_size * fmt.block_bytes
            if w.dtype is not DType.U8 or w.dims[2].value != want:
                raise ShapeError(f"moe_matmul: {fmt.name} rows of K={k} values take {want} bytes, so the "
                                 f"weight must be u8[experts, N, {want}], got {w}")
        return Shape((ids.dims[0], ids.dims[1], w.dims[1]), DType.F32)

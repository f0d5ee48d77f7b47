"""Batched LoRA: `lora_matmul`, the low-rank update of a linear layer with one adapter per sequence.

`lora_matmul(x, a, b, scale, index)` is, for every row group `g` of `x` `[G, ..., K]` (a sequence of a
batch, with its query positions),

    y[g] = scale[s] * (x[g] @ a[s]^T) @ b[s]^T      with s = index[g],   and 0 where s < 0,

`a` `[S, R, K]` and `b` `[S, N, R]` holding S adapter slots of rank at most R (smaller ranks are
zero-padded), `scale` f32 `[S]` their scalings (alpha / r, or alpha / sqrt(r) with rsLoRA) and `index`
i32 `[G]` the slot of each group. It is the shrink-then-expand of Punica's SGMV: a step whose rows use
different adapters, or none, is one kernel per projection, and loading an adapter writes a slot's
params (no recompile). The result is added to the base layer's output by the model. Each row's
arithmetic depends only on its own values and slot (batch-invariant): r-sums in order, then n.

This module registers the op in the MIR op set when imported (`rlx.ir.graph` imports it).

>>> import numpy as np
>>> x = np.ones((2, 1, 4), np.float32)
>>> a = np.ones((1, 2, 4), np.float32); b = np.ones((1, 3, 2), np.float32)
>>> lora_rows(x, a, b, np.array([0.5], np.float32), np.array([0, -1], np.int32))[:, 0].tolist()
[[4.0, 4.0, 4.0], [0.0, 0.0, 0.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx.errors import ExecutionError, ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import Op
from rlx.ir.shape import Shape


@dataclass(frozen=True)
class LoraMatMul(Op):
    """scale[s] * (x @ a[s]^T) @ b[s]^T per row group, s = index[group] (< 0: zeros); see the module docstring."""

    kind: ClassVar[str] = "lora_matmul"
    arity: ClassVar[tuple[int, int]] = (5, 5)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, a, b, scale, index = inputs
        if x.dtype is not DType.F32 or x.rank < 2:
            raise ShapeError(f"lora_matmul needs f32 x [groups, ..., K], got {x}")
        if a.dtype is not DType.F32 or a.rank != 3 or a.dims[2] != x.dims[-1]:
            raise ShapeError(f"lora_matmul needs f32 a [slots, rank, K] with K = {x.dims[-1]} (x's last dim), got {a}")
        if b.dtype is not DType.F32 or b.rank != 3 or b.dims[0] != a.dims[0] or b.dims[2] != a.dims[1]:
            raise ShapeError(f"lora_matmul needs f32 b [slots, N, rank] matching a {a} (slots, rank), got {b}")
        if scale.dtype is not DType.F32 or scale.dims != (a.dims[0],):
            raise ShapeError(f"lora_matmul needs f32 scale [{a.dims[0]}] (one per slot), got {scale}")
        if index.dtype is not DType.I32 or index.dims != (x.dims[0],):
            raise ShapeError(f"lora_matmul needs i32 index [{x.dims[0]}] (one slot per row group of x), got {index}")
        return Shape((*x.dims[:-1], b.dims[1]), DType.F32)


def lora_rows(x: np.ndarray, a: np.ndarray, b: np.ndarray, scale: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The op's meaning in numpy (float64 sums, rounded to f32): see the module docstring."""
    slots = a.shape[0]
    out = np.zeros((*x.shape[:-1], b.shape[1]), dtype=np.float32)
    for g, s in enumerate(np.asarray(index).tolist()):
        if s < 0:
            continue
        if s >= slots:
            raise ExecutionError(f"lora_matmul: row group {g} asks for adapter slot {s}; there are {slots}")
        t = np.asarray(x[g], np.float64) @ np.asarray(a[s], np.float64).T
        out[g] = (float(scale[s]) * (t @ np.asarray(b[s], np.float64).T)).astype(np.float32)
    return out


__all__ = ["LoraMatMul", "lora_rows"]

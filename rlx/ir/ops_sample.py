"""Seeded sampling of a token id per row of logits: the `sample_top_k` op and its exact numpy math.

`sample_top_k(logits, u, settings)` picks one token per row of `logits`
(float `[rows, vocab]`) where it lives, so a decode step reads back token ids
instead of a whole vocabulary of logits. `u` (f64 `[rows]`, each in [0, 1))
is a uniform random number drawn on the host from a seeded generator, so the
result is reproducible and the reference exact; `settings` (f64 `[3]`:
temperature, top_k, top_p) are run-time inputs, so one compiled graph serves
every setting. Both are f64 because a CUDA session stores f32 tensors in its
precision: an f16 u would round 0.9999 up to 1, and the settings would shift.
The meaning (`sample_rows`, written once here and used by the reference, by
`rlx.models.sampling.Sampler` on the host, and mirrored by the kernels):

1. order the row by value, largest first, ties by the lower index (a stable
   descending sort); a NaN counts as larger than any number (as `argmax`);
2. temperature 0: the first token of that order (the `argmax`);
3. otherwise keep the first `k = min(top_k, vocab)` of the order, weights
   ``w_i = exp((x_i - x_0) / temperature)`` (float64) and their running sums
   ``c_i``; top_p < 1 keeps the smallest prefix ``m`` with ``c_{m-1} >=
   top_p * c_{k-1}``; the token is the first ``i < m`` with ``c_i > u *
   c_{m-1}`` (the last kept one if rounding leaves none) — inverse-CDF
   sampling of the renormalized softmax;
4. a row whose largest value is not finite (NaN, +-inf) gives that first token.

The op takes `1 <= top_k <= SAMPLE_TOP_K_MAX` (the kernels select the top k
without sorting the vocabulary); larger top_k, or top_p without top_k, is
sampled on the host from the read-back logits (`Sampler.on_device` says
which). Bad settings or a u outside [0, 1) are a run-time `ExecutionError`.

This module registers the op in the MIR op set when imported (`rlx.ir.graph`
imports it).

>>> import numpy as np
>>> x = np.array([[0.0, 2.0, 1.0, 2.0]], np.float32)
>>> sample_rows(x, np.array([0.0]), 1.0, 2, None).tolist()   # top 2: tokens 1 and 3, tied
[1]
>>> sample_rows(x, np.array([0.6]), 1.0, 2, None).tolist()
[3]
>>> sample_rows(x, np.array([0.99]), 0.0, None, None).tolist()  # temperature 0: argmax
[1]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx.errors import ExecutionError, ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import Op
from rlx.ir.shape import Dim, Shape

#: The largest top_k the op (and its kernels' block-wide / heap selection) takes.
SAMPLE_TOP_K_MAX = 256
#: The order of the values in the op's `settings` input.
SETTINGS = ("temperature", "top_k", "top_p")


@dataclass(frozen=True)
class SampleTopK(Op):
    """One token id (i32) per row of `logits` `[rows, vocab]`, sampled with `u` f64 `[rows]` and
    `settings` f64 `[3]` (temperature, top_k, top_p); see the module docstring for the exact meaning."""

    kind: ClassVar[str] = "sample_top_k"
    arity: ClassVar[tuple[int, int]] = (3, 3)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        x, u, settings = inputs
        if not x.dtype.is_float or x.rank != 2:
            raise ShapeError(f"sample_top_k needs floating-point logits [rows, vocab], got {x}")
        if x.dims[1].max == 0:
            raise ShapeError(f"sample_top_k over an empty vocabulary: {x}")
        if x.dims[1].max > 2**31 - 1:  # the kernels keep token ids as int32
            raise ShapeError(f"sample_top_k over a vocabulary of more than 2**31 - 1 tokens: {x}")
        if u.dtype is not DType.F64 or u.dims != (x.dims[0],):
            raise ShapeError(f"sample_top_k needs u as f64[{x.dims[0]}] (one number per row), got {u}")
        if settings.dtype is not DType.F64 or settings.dims != (Dim(len(SETTINGS)),):
            raise ShapeError(f"sample_top_k needs settings as f64[{len(SETTINGS)}] {SETTINGS}, got {settings}")
        return Shape((x.dims[0],), DType.I32)


def check_settings(temperature: float, top_k: float | None, top_p: float | None,
                   max_top_k: int | None = None) -> None:
    """Raise `ExecutionError` naming the bad setting: temperature must be finite and >= 0, top_k an
    integer >= 1 (at most `max_top_k` when given), top_p in (0, 1].

    >>> check_settings(0.8, 40, 0.9)
    >>> check_settings(1.0, 0, None)
    Traceback (most recent call last):
    ...
    rlx.errors.ExecutionError: sample_top_k: top_k must be an integer >= 1, got 0
    """
    if not (isinstance(temperature, (int, float, np.floating)) and math.isfinite(temperature)
            and temperature >= 0):
        raise ExecutionError(f"sample_top_k: temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        if not (isinstance(top_k, (int, float, np.integer, np.floating)) and math.isfinite(top_k)
                and top_k == int(top_k) and top_k >= 1):
            raise ExecutionError(f"sample_top_k: top_k must be an integer >= 1, got {top_k!r}")
        if max_top_k is not None and top_k > max_top_k:
            raise ExecutionError(f"sample_top_k: top_k {int(top_k)} is above the op's cap {max_top_k} "
                                 "(sample on the host from the logits instead)")
    if top_p is not None and not (isinstance(top_p, (int, float, np.floating)) and 0 < top_p <= 1):
        raise ExecutionError(f"sample_top_k: top_p must be in (0, 1], got {top_p!r}")


def descending_order(row: np.ndarray) -> np.ndarray:
    """Indices of `row` by value, largest first, ties by the lower index, NaNs first (in index order)."""
    nan = np.isnan(row)
    order = np.argsort(-row, kind="stable")
    return np.concatenate([np.flatnonzero(nan), order[~nan[order]]]) if nan.any() else order


def sample_rows(logits: np.ndarray, u: np.ndarray, temperature: float, top_k: int | None,
                top_p: float | None) -> np.ndarray:
    """The token (i32) of each row of `logits` `[rows, vocab]` for its uniform `u` (module docstring).
    top_k None keeps the whole vocabulary, top_p None (or 1) keeps every one of the top k."""
    check_settings(temperature, top_k, top_p)
    x = np.asarray(logits)
    u = np.asarray(u, dtype=np.float64)
    if x.ndim != 2 or u.shape != (x.shape[0],):
        raise ExecutionError(f"sample_top_k: logits [rows, vocab] and u [rows], got {x.shape} and {u.shape}")
    if x.shape[1] == 0:
        raise ExecutionError("sample_top_k over an empty vocabulary")
    if x.shape[0] and not bool(np.all((u >= 0) & (u < 1))):
        bad = u[~((u >= 0) & (u < 1))][0]
        raise ExecutionError(f"sample_top_k: u must be in [0, 1), got {bad!r}")
    out = np.empty(x.shape[0], dtype=np.int32)
    for r in range(x.shape[0]):
        out[r] = _sample_row(x[r], float(u[r]), float(temperature), top_k, top_p)
    return out


def kept_weights(row: np.ndarray, temperature: float, top_k: int | None,
                 top_p: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the kept token ids, in order; their weights exp((x - x0) / T) as f64; the running sums) of a row at
    temperature > 0: the top k, cut to the smallest prefix reaching top_p (module docstring, step 3). A row
    whose largest value is not finite keeps its first token alone (step 4)."""
    k = row.size if top_k is None else min(int(top_k), row.size)
    order = descending_order(row)[:k]
    v = row[order].astype(np.float64)
    if not math.isfinite(v[0]) or k == 1:
        return order[:1], np.ones(1), np.ones(1)
    w = np.exp((v - v[0]) / temperature)
    c = np.cumsum(w)  # sequential running sums, as the kernels add
    m = k
    if top_p is not None and top_p < 1:
        m = min(int(np.searchsorted(c, top_p * c[-1], side="left")) + 1, k)
    return order[:m], w[:m], c[:m]


def _sample_row(row: np.ndarray, u: float, temperature: float, top_k: int | None, top_p: float | None) -> int:
    if temperature == 0 or top_k == 1 or row.size == 1:
        nan = np.isnan(row)
        return int(np.flatnonzero(nan)[0]) if nan.any() else int(np.argmax(row))
    order, _, c = kept_weights(row, temperature, top_k, top_p)
    j = int(np.searchsorted(c, u * c[-1], side="right"))  # the first c_j > u * c_{m-1}
    return int(order[min(j, order.size - 1)])

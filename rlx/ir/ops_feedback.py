"""Device-side token feedback: a step's input tokens taken from the tokens the previous step produced.

A decoder serving many sequences feeds each step the tokens the step before produced. Read back to the host
first, they put the host's work (landing the tokens, planning, launching) between every two GPU steps. With
two ops and a small state buffer of tokens (`last` i32 `[slots]`, kept on the device like the KV cache) a step
can be launched before the previous step's tokens reach the host (vLLM's "async scheduling"):

- `token_feed(tokens, src, last)`: `tokens` i32 `[batch, seq]` with the last column of row b replaced by
  ``last[src[b]]`` where ``0 <= src[b] < slots``; any other `src` (-1) leaves the row as given;
- `token_store(values, dst, last)`: writes ``last[dst[i]] = values[i]`` where ``0 <= dst[i] < slots`` (in place:
  `last` is a state input) and returns `values` (its consumers see the tokens as stored). The `dst` of one
  run must be distinct where they are stored (the order of two stores into one slot is not defined).

The store comes after the feed in every run: its values are computed from the fed tokens. The decoder of
`rlx.models.llama.build_decoder(token_feedback=True)` feeds `tokens` through `token_feed` and stores its
`next_token` (the argmax of each output row) with `token_store`, so with all `src` and `dst` -1 a step
computes what it computed without them.

This module registers the ops in the MIR op set when imported (`rlx.ir.graph` imports it).

>>> import numpy as np
>>> i32 = lambda *v: np.array(v, np.int32)
>>> feed_tokens(i32([5], [6], [7]), i32(-1, 2, 0), i32(40, 41, 42)).tolist()
[[5], [42], [40]]
>>> last = np.zeros(4, np.int32)
>>> store_tokens(i32(9, 8), i32(3, -1), last).tolist(), last.tolist()
([9, 8], [0, 0, 0, 9])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx.errors import ShapeError
from rlx.ir.dtype import DType
from rlx.ir.ops import Op
from rlx.ir.shape import Shape


def _check_last(last: Shape, kind: str) -> None:
    if last.dtype is not DType.I32 or last.rank != 1 or not last.is_static:
        raise ShapeError(f"{kind} needs the token state as a static i32 [slots], got {last}")


@dataclass(frozen=True)
class TokenFeed(Op):
    """`tokens` i32 `[batch, seq]` whose row b ends with ``last[src[b]]`` where `src[b]` is a slot of `last`
    (see the module docstring)."""

    kind: ClassVar[str] = "token_feed"
    arity: ClassVar[tuple[int, int]] = (3, 3)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        tokens, src, last = inputs
        if tokens.dtype is not DType.I32 or tokens.rank != 2:
            raise ShapeError(f"token_feed needs tokens as i32 [batch, seq], got {tokens}")
        if src.dtype is not DType.I32 or src.dims != (tokens.dims[0],):
            raise ShapeError(f"token_feed needs src as i32 [{tokens.dims[0]}] (one slot a row), got {src}")
        _check_last(last, "token_feed")
        return tokens


@dataclass(frozen=True)
class TokenStore(Op):
    """`values` i32 `[n]`, also written to ``last[dst[i]]`` where `dst[i]` is a slot of `last` (in place)."""

    kind: ClassVar[str] = "token_store"
    arity: ClassVar[tuple[int, int]] = (3, 3)

    def infer(self, inputs: Sequence[Shape]) -> Shape:
        values, dst, last = inputs
        if values.dtype is not DType.I32 or values.rank != 1:
            raise ShapeError(f"token_store needs values as i32 [n], got {values}")
        if dst.dtype is not DType.I32 or dst.dims != values.dims:
            raise ShapeError(f"token_store needs dst as i32 [{values.dims[0]}] (one slot a value), got {dst}")
        _check_last(last, "token_store")
        return values


def feed_tokens(tokens: np.ndarray, src: np.ndarray, last: np.ndarray) -> np.ndarray:
    """`token_feed`'s meaning (the reference): a copy of `tokens` with row b's last column ``last[src[b]]``
    where ``0 <= src[b] < len(last)``."""
    out = np.array(tokens, dtype=np.int32)
    src = np.asarray(src, dtype=np.int64)
    take = (src >= 0) & (src < len(last))
    out[take, -1] = np.asarray(last)[src[take]]
    return out


def store_tokens(values: np.ndarray, dst: np.ndarray, last: np.ndarray) -> np.ndarray:
    """`token_store`'s meaning (the reference): ``last[dst[i]] = values[i]`` where ``0 <= dst[i] < len(last)``,
    in place, in order; returns a copy of `values`."""
    values = np.array(values, dtype=np.int32)
    dst = np.asarray(dst, dtype=np.int64)
    for i in np.flatnonzero((dst >= 0) & (dst < len(last))):
        last[dst[i]] = values[i]
    return values

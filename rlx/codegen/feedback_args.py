"""What the CPU and CUDA `token_feed` / `token_store` rules share: the kernels' operands and their dtype check.

Both backends' kernels take the same operands (`FeedbackIO`: x the tokens [rows, seq] or values [rows], idx the
src / dst slots, `last` the i32 token state of `slots` entries, y the output), each backend's record extending it,
and take i32 only (`feedback_accepts`).

>>> from rlx.ir.dtype import DType
>>> feedback_accepts(None, (DType.I32, DType.F32, DType.I32), DType.I32)
"on ['i32', 'f32', 'i32']; it takes i32"
>>> FeedbackIO(x="x", idx="s", last="l", y="y", rows="4", seq="1", slots=8).slots
8
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.ir import ops as O
from rlx.ir.dtype import DType


@dataclass(frozen=True, kw_only=True)
class FeedbackIO:
    """Operands of one `token_feed` (x: tokens [rows, seq], idx: src) or `token_store` (x: values [rows], idx: dst)
    kernel: `last` the i32 state of `slots` tokens, y the output (C expressions; rows and seq as written)."""

    x: str
    idx: str
    last: str
    y: str
    rows: str
    seq: str
    slots: int


def feedback_accepts(op: O.Op | None, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    """The `accepts` of both ops' rules: i32 operands only."""
    return None if all(d is DType.I32 for d in in_dtypes) else f"on {[d.value for d in in_dtypes]}; it takes i32"

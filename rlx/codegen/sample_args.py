"""What the CPU and CUDA `sample_top_k` rules share: the kernel's operands and the logits check.

Both backends' kernels take the same six operands (`SampleIO`, extended by each
backend's own record) and refuse logits outside the dtypes they read, naming them
(`logits_accepts`).

>>> from rlx.ir.dtype import DType
>>> check = logits_accepts((DType.F32,), "f32")
>>> check(None, (DType.F64, DType.F64, DType.F64), DType.I32)
'on f64 logits; it takes f32'
>>> SampleIO(x="x", u="u", s="s", y="y", rows="2", n="50").n
'50'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rlx.codegen.registry import Accepts
from rlx.ir import ops as O
from rlx.ir.dtype import DType


@dataclass(frozen=True, kw_only=True)
class SampleIO:
    """Operands of one `sample_top_k` kernel: logits x [rows, n], u [rows], settings s [3], token ids y."""

    x: str
    u: str
    s: str
    y: str
    rows: str
    n: str


def logits_accepts(floats: Iterable[DType], takes: str) -> Accepts:
    """The `accepts` of a `sample_top_k` rule whose kernel reads logits of the dtypes `floats` (`takes` says them)."""
    allowed = frozenset(floats)

    def accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
        return None if in_dtypes[0] in allowed else f"on {in_dtypes[0].value} logits; it takes {takes}"

    return accepts

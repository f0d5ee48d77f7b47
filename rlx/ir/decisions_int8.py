"""The CPU decision of dynamic int8 quantization: a weight param stored quantized.

`Int8Param(node, k, n)`: the f32 `[K, N]` param `node` is read only by
`int8_matmul` nodes (`rlx.ir.ops_int8`), so the CPU stores it quantized:
`rlx_set_param` takes the user's f32 weight, quantizes each output channel to
int8 and writes the kernel's layout (`templates/cpu/kernels/int8_gemm.h`):

- ceil(N / 32) panels of 32 columns; panel p holds ceil(K / 4) groups of
  128 bytes, group g being columns p*32 .. p*32+31 of rows 4g .. 4g+3, each
  column's 4 bytes adjacent (one int32 lane of `vpdpbusd`); padding is zero;
- then the f32 scales of the padded columns, then the int32 compensation
  terms ``128 * sum_k wq[k, n]`` (the kernel feeds activations as u8 = s8 + 128).

>>> Int8Param(node=3, k=384, n=1536).storage_bytes
602112
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlx.ir.decisions import Decision, register_decision

#: Columns per packed panel and rows per group (INT8_NR, INT8_KG in kernels/int8_gemm.h).
INT8_PANEL = 32
INT8_GROUP = 4


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Int8Param(Decision):
    """An f32 `[k, n]` param stored as int8 panels + per-column scales, quantized at `set_param`."""

    kind: ClassVar[str] = "int8_param"
    node: int
    k: int
    n: int

    @property
    def storage_bytes(self) -> int:
        """Bytes of the stored form: panels, then scales and compensation terms (4 bytes each per column)."""
        np_ = _round_up(self.n, INT8_PANEL)
        return np_ * _round_up(self.k, INT8_GROUP) + 8 * np_

    def describe(self) -> str:
        return f"%{self.node} param stored as int8 per output channel for int8_matmul (quantized on set)"

    def nodes(self) -> tuple[int, ...]:
        return (self.node,)


register_decision(Int8Param, ("node",))

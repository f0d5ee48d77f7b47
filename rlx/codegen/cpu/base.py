"""What every CPU codegen module shares: tuning constants, sizes, and the C text helpers (`rlx.codegen.text`).

`rlx.codegen.cpu.emit` (the emitter), `rules` (the core rules) and the other rule modules
(`decoder`, `quant`, ...) import from here; none imports a rule module, so the
codegen layer has no import cycle.
"""

from __future__ import annotations

from rlx.codegen.text import c_string, c_string_lines, comment, node_header

#: Elementwise work (elements) below which a loop runs on the calling thread only.
GRAIN = 1 << 15
#: Query rows per attention task; one task's score tile is ATTN_QBLOCK x Skv floats.
ATTN_QBLOCK = 64
#: Panel width param storage is padded to for packed GEMM operands (the widest kernel's NR;
#: narrower kernels fit in the same bytes, so storage does not depend on the ISA).
PACK_NR_MAX = 32


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def align64(nbytes: int) -> int:
    """`nbytes` rounded up to a cache line (scratch regions start 64-byte aligned)."""
    return round_up(nbytes, 64)


__all__ = ["ATTN_QBLOCK", "GRAIN", "PACK_NR_MAX", "align64", "c_string", "c_string_lines", "comment", "node_header",
           "round_up"]

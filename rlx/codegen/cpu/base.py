"""What every CPU codegen module shares: tuning constants, C text helpers.

`rlx.codegen.cpu.emit` (the emitter), `rules` (the core rules) and the other rule modules
(`decoder`, `quant`, ...) import from here; none imports a rule module, so the
codegen layer has no import cycle.
"""

from __future__ import annotations

import re

from rlx.ir.graph import Node

#: Elementwise work (elements) below which a loop runs on the calling thread only.
GRAIN = 1 << 15
#: Query rows per attention task; one task's score tile is ATTN_QBLOCK x Skv floats.
ATTN_QBLOCK = 64
#: Panel width param storage is padded to for packed GEMM operands (the widest kernel's NR;
#: narrower kernels fit in the same bytes, so storage does not depend on the ISA).
PACK_NR_MAX = 32
_COMMENT_BAD = re.compile(r"[^A-Za-z0-9_.,:;()\[\]<>=+\- #%@!?'^~|&{}$]")


def comment(text: object, limit: int = 96) -> str:
    """Text safe inside a C block comment: no `*`, `/`, backslash, newline or non-printables.

    >>> comment("evil */ system(\\"rm\\"); /*\\n")
    'evil ?? system(?rm?); ???'
    """
    s = _COMMENT_BAD.sub("?", str(text))
    return s if len(s) <= limit else s[: limit - 3] + "..."


def node_header(node: Node, width: int) -> str:
    """The comment text that heads a node's generated code: id, op, debug name, shape (all sanitized)."""
    name = f" ({comment(node.name, 60)})" if node.name else ""
    return comment(f"%{node.id} {node.op.describe()}", width) + name + " : " + comment(str(node.shape), 60)


def c_string(text: str) -> str:
    """A C string literal holding `text` exactly (printable ASCII, everything else escaped).

    >>> c_string('a"b\\\\c\\n')
    '"a\\\\"b\\\\\\\\c\\\\n"'
    """
    out = ['"']
    for ch in text.encode("utf-8"):
        c = chr(ch)
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif 32 <= ch < 127 and c != "?":  # '?' escaped so no trigraph can form
            out.append(c)
        else:
            out.append(f"\\{ch:03o}")
    out.append('"')
    return "".join(out)


def c_string_lines(text: str, width: int = 100) -> list[str]:
    """`text` as a sequence of adjacent string literals of bounded width."""
    chunks = [text[i:i + width] for i in range(0, len(text), width)] or [""]
    return [c_string(c) for c in chunks]


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def align64(nbytes: int) -> int:
    """`nbytes` rounded up to a cache line (scratch regions start 64-byte aligned)."""
    return round_up(nbytes, 64)


"""Source text every backend emits safely: comments and string literals (C, CUDA and MSL share the syntax).

Names from the graph never reach generated code as code: they appear only inside comments, after
`comment()` strips everything that could end one, and inside string literals, after `c_string()`
escapes them.
"""

from __future__ import annotations

import re

from rlx.ir.graph import Node

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

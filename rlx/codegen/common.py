"""Pieces of code generation shared by every backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rlx.ir.shape import Dim


def dim_expr(d: Dim, sym_index: Mapping[str, int], literal: Callable[[int], str], sym: str = "sym") -> str:
    """C expression of a dimension: a literal, or its coefficient times run-time symbol values.

    `sym` names the int64 array holding the symbols at run time (the `symbols`
    argument of `rlx_run`, in the LIR's symbol order); `literal` spells constants
    the way the backend wants them (plain C ints, or explicit int64 casts).

    >>> seq = Dim.dynamic("seq", max=128)
    >>> dim_expr(seq * 4, {"seq": 0}, str), dim_expr(Dim(384), {}, str)
    ('(4 * sym[0])', '384')
    """
    if d.is_static:
        return literal(d.coeff)
    terms = [f"{sym}[{sym_index[name]}]" for name, _ in d.symbols]
    if d.coeff != 1:
        terms.insert(0, literal(d.coeff))
    return terms[0] if len(terms) == 1 else "(" + " * ".join(terms) + ")"

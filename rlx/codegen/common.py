"""Pieces of code generation shared by every backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rlx.errors import BuildError
from rlx.ir.cost import Poly
from rlx.ir.lir import LirModule
from rlx.ir.shape import Dim, product
from rlx.ir.view import View


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


def cost_expr(poly: Poly, sym_index: dict[str, int], sym: str = "sym") -> str:
    """C double expression of a cost polynomial over the run's dims array `sym`.

    >>> cost_expr(((6, ("n",)), (2, ())), {"n": 0})
    '6.0 * (double)sym[0] + 2.0'
    """
    if not poly:
        return "0.0"
    terms = []
    for coeff, syms in poly:
        terms.append(" * ".join([f"{float(coeff)!r}", *(f"(double){sym}[{sym_index[s]}]" for s in syms)]))
    return " + ".join(terms)


def broadcast_index(in_dims: tuple[Dim, ...], out_dims: tuple[Dim, ...], idx: str, dim: Callable[[Dim], str]) -> str:
    """Index expression into an input of `in_dims` for flat output index `i` (numpy broadcasting).

    Output axes group into runs that the input either walks (its broadcast strides are nonzero) or
    repeats; each walked run contributes `(i / ostride % size) * istride`. `idx` is the index type
    the expression computes in, `dim` renders a dimension in the backend's kernel code.

    >>> broadcast_index((Dim(3), Dim(1)), (Dim(3), Dim(4)), "int64_t", lambda d: str(d))
    '(i / (int64_t)4)'
    """
    if (Dim(1),) * (len(out_dims) - len(in_dims)) + tuple(in_dims) == tuple(out_dims):
        return "i"
    if all(d == 1 for d in in_dims):
        return "0"
    view = View.dense(in_dims).broadcast_to(out_dims)
    out_strides = View.dense(out_dims).strides
    groups: list[tuple[bool, list[int]]] = []
    for k, d in enumerate(out_dims):
        if d == 1:
            continue
        bcast = view.is_broadcast(k)
        if groups and groups[-1][0] == bcast:
            groups[-1][1].append(k)
        else:
            groups.append((bcast, [k]))
    terms = []
    for gi, (bcast, ks) in enumerate(groups):
        if bcast:
            continue
        size = product(out_dims[k] for k in ks)
        ostride, istride = out_strides[ks[-1]], view.strides[ks[-1]]
        term = "i" if ostride == 1 else f"(i / ({idx}){dim(ostride)})"
        if gi > 0:
            term = f"({term} % ({idx}){dim(size)})"
        if istride != 1:
            term = f"{term} * ({idx}){dim(istride)}"
        terms.append(term)
    return " + ".join(terms) if terms else "0"


def require_decided(lir: LirModule, backend: str) -> LirModule:
    """`lir`, when it carries `backend`'s decisions; a BuildError otherwise. Codegen renders what the pipeline
    decided (`rlx.pipeline.decide`) and decides nothing itself."""
    if lir.backend != backend:
        found = f"decided for {lir.backend!r}" if lir.backend else "not decided"
        raise BuildError(f"the LIR of {lir.name!r} is {found}; {backend} codegen renders a LIR decided for "
                         f"{backend!r} (rlx.pipeline.decide, or compile through rlx.Session)")
    return lir


def decided_body(lir: LirModule, nid: int) -> LirModule:
    """The decided LIR of scan node `nid`'s body, carried by the decided LIR (`LirModule.bodies`)."""
    try:
        return lir.body(nid)
    except KeyError as exc:
        raise BuildError(f"{exc.args[0]} (codegen renders the bodies the pipeline decided)") from None

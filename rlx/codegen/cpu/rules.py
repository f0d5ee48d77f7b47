"""The CPU backend's core rules: elementwise loops, GEMMs, reductions, norms, movement, attention, RoPE.

Each rule turns one scheduled node and the `CpuEmitter` (pointers, dims, the LIR's decisions) into
the node's kernel arguments, a frozen dataclass per macro (`ElementwiseArgs`, `GemmArgs`, ...): every
field a C expression, a number or a flag, which the macro named by the class's `macro` renders
(`MACRO_TEMPLATES`, under `templates/cpu/`). The rules of other op families live in the other CPU
rule modules (`decoder`, `quant`, `half`, ...); `rlx.codegen.cpu.rule_table` lists them all.

>>> sorted(r.kind for r in RULES.rules)[:3]
['activation', 'attention', 'binary']
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from rlx.codegen.cpu import half as c_half
from rlx.codegen.cpu.base import ATTN_QBLOCK, GRAIN, PACK_NR_MAX, align64, round_up
from rlx.codegen.cpu.emit import CpuArgs, CpuEmitter, GemmBatch
from rlx.codegen.registry import Kernel, RuleSet, float32_only
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.decisions import AttentionPlan
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.ir.norms import norm_inputs
from rlx.ir.shape import Dim, Shape, product
from rlx.ir.view import View, collapse, dense_strides, movement_view

#: The CPU core rules (the CPU table is made from them and the other rule modules: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

_COMPUTE = {DType.F32: "float", DType.F16: "float", DType.BF16: "float", DType.F64: "double",
            DType.I8: "int8_t", DType.I16: "int16_t", DType.I32: "int32_t", DType.I64: "int64_t", DType.U8: "uint8_t",
            DType.U16: "uint16_t", DType.U32: "uint32_t", DType.U64: "uint64_t", DType.BOOL: "uint8_t",
            # storage formats are carried as their bits; only a cast step reads or writes them (narrow.h)
            **{d: "uint8_t" for d in DType if d.is_narrow}}


# ── kernel arguments: one frozen dataclass per macro (`CpuArgs`, `rlx.codegen.cpu.emit`) ──

@dataclass(frozen=True)
class EwInput:
    """One input of an elementwise loop nest: its pointer and per-axis strides (elements)."""

    ptr: str
    dtype: str
    var: str
    ctype: str
    stype: str
    strides: tuple[str, ...]
    inner: str
    #: Every stride is 0: the input is one scalar.
    scalar: bool


@dataclass(frozen=True)
class EwStep:
    """One computed value of an elementwise region: `var = kind/fn(args)` in `ctype`."""

    var: str
    kind: str
    fn: str
    args: tuple[str, ...]
    dtype: str
    ctype: str
    arg_ctype: str
    arg_dtype: str
    #: A cast step's source / target storage format (`DType.is_narrow`: "f8e4m3fn" …), else "".
    narrow_from: str = ""
    narrow_to: str = ""


@dataclass(frozen=True, kw_only=True)
class ElementwiseArgs(CpuArgs):
    """An elementwise op or fused region over collapsed axes (macro `elementwise`)."""

    macro: ClassVar[str] = "elementwise"
    rank: int
    dims: tuple[str, ...]
    outer_dims: tuple[str, ...]
    total: str
    inner: str
    rows: str
    inputs: tuple[EwInput, ...]
    steps: tuple[EwStep, ...]
    result: str
    out: str
    out_dtype: str
    out_stype: str
    #: Integer division/power present: the loop records bad divisors and the kernel fails.
    checks: bool
    grain: int


@dataclass(frozen=True, kw_only=True)
class GemmArgs(CpuArgs):
    """C = op(A) @ op(B) (+ bias, activation) through sgemm (macro `gemm`)."""

    macro: ClassVar[str] = "gemm"
    m: str
    n: str
    k: str
    a: str
    b: str
    c: str
    ta: bool
    tb: bool
    lda: str
    ldb: str
    batch: GemmBatch
    #: One GEMM over all rows (no batch loop).
    fold: bool
    bias: str
    act: str
    epilogue: bool
    mat_c: str
    block: int
    grain: int


@dataclass(frozen=True, kw_only=True)
class PgemmArgs(CpuArgs):
    """C = A @ B with B a param stored in packed panels; epilogue fused (macro `pgemm`)."""

    macro: ClassVar[str] = "pgemm"
    m: str
    n: str
    k: str
    lda: str
    a: str
    b: str
    c: str
    bias: str
    fold: bool
    batch: GemmBatch
    mat_c: str
    #: The epilogue enum constant (RLX_EPI_NONE, RLX_EPI_GELU, ...).
    epi: str
    #: `GemmSiblings`: every member's (packed B, C, bias or "NULL", epilogue), this node's first; () alone
    group: tuple[tuple[str, str, str, str], ...] = ()


@dataclass(frozen=True, kw_only=True)
class SwigluArgs(CpuArgs):
    """silu(x @ Wg) * (x @ Wu), blocked over rows (macro `swiglu`)."""

    macro: ClassVar[str] = "swiglu"
    m: str
    n: str
    k: str
    x: str
    wg: str
    wu: str
    tg: bool
    tu: bool
    ldg: str
    ldu: str
    c: str
    #: Rows per step (the up-projection block lives in shared scratch).
    block: int
    batch: GemmBatch
    fold: bool
    mat_c: str
    grain: int


@dataclass(frozen=True, kw_only=True)
class ReduceArgs(CpuArgs):
    """A reduction over kept/reduced axis groups (macro `reduce`)."""

    macro: ClassVar[str] = "reduce"
    fn: str
    #: The pattern is [K] R [K]: outer x count x inner loops; else the generic kept/red strides.
    simple: bool
    outer: str
    inner: str
    count: str
    kept: tuple[tuple[str, str], ...]
    red: tuple[tuple[str, str], ...]
    red_count: str
    out_count: str
    x: str
    y: str
    dtype: str
    ctype: str
    stype: str
    acc: str
    is_float: bool
    grain: int


@dataclass(frozen=True, kw_only=True)
class SoftmaxArgs(CpuArgs):
    """Softmax over one axis of an [outer, n, inner] view (macro `softmax`)."""

    macro: ClassVar[str] = "softmax"
    outer: str
    n: str
    inner: str
    x: str
    y: str
    grain: int


@dataclass(frozen=True, kw_only=True)
class NormArgs(CpuArgs):
    """LayerNorm / RMSNorm over rows, optionally after a fused residual (+ bias) add (macro `norm`)."""

    macro: ClassVar[str] = "norm"
    rms: bool
    x: str
    #: Empty when absent.
    residual: str
    bias: str
    gamma: str
    beta: str
    y: str
    rows: str
    n: str
    eps: str
    grain: int


@dataclass(frozen=True, kw_only=True)
class CopyArgs(CpuArgs):
    """A byte copy (reshape of a node that is not a view; macro `copy`)."""

    macro: ClassVar[str] = "copy"
    src: str
    dst: str
    nbytes: str


@dataclass(frozen=True, kw_only=True)
class TransposeArgs(CpuArgs):
    """A strided gather of the input into dense output order (macro `transpose`)."""

    macro: ClassVar[str] = "transpose"
    rank: int
    dims: tuple[str, ...]
    strides: tuple[str, ...]
    rows: str
    inner: str
    ctype: str
    x: str
    y: str
    grain: int


@dataclass(frozen=True, kw_only=True)
class NarrowArgs(CpuArgs):
    """A slice along one axis: `outer` row copies, byte offsets (macro `narrow`)."""

    macro: ClassVar[str] = "narrow"
    outer: str
    src_row: str
    dst_row: str
    start: str
    src: str
    dst: str


@dataclass(frozen=True)
class ConcatPart:
    """One input of a concat: its base, row bytes and byte offset in the output row."""

    src: str
    row: str
    offset: str


@dataclass(frozen=True, kw_only=True)
class ConcatArgs(CpuArgs):
    """Concatenation along one axis (macro `concat`)."""

    macro: ClassVar[str] = "concat"
    outer: str
    dst_row: str
    parts: tuple[ConcatPart, ...]
    dst: str


@dataclass(frozen=True, kw_only=True)
class GatherArgs(CpuArgs):
    """Rows of a table selected by an index tensor, indices bounds-checked (macro `gather`)."""

    macro: ClassVar[str] = "gather"
    outer: str
    n: str
    count: str
    inner_bytes: str
    table: str
    idx: str
    idx_type: str
    dst: str
    grain: int


@dataclass(frozen=True)
class AttentionMask:
    """The attention mask: kind, and for padding/bias masks its pointer (and type or strides)."""

    kind: str
    ptr: str = ""
    ctype: str = ""
    strides: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class AttentionArgs(CpuArgs):
    """Multi-head (grouped-query) attention in query blocks (macro `attention`)."""

    macro: ClassVar[str] = "attention"
    q: str
    k: str
    v: str
    o: str
    batch: str
    sq: str
    skv: str
    heads: int
    kv_heads: int
    group: int
    hd: int
    scale: str
    mask: AttentionMask
    qblock: int
    #: Byte offsets in the per-thread scratch: packed K^T, packed V, the mask row.
    kp_offset: int
    vp_offset: int
    row_offset: int
    #: `AttentionPlan.form`: "blocks" or "rows"
    form: str = "blocks"


@dataclass(frozen=True, kw_only=True)
class RopeArgs(CpuArgs):
    """Rotary position embedding over [batch, seq, width] (macro `rope`)."""

    macro: ClassVar[str] = "rope"
    x: str
    cos: str
    sin: str
    y: str
    batch: str
    seq: str
    width: int
    hd: int
    half: int
    rot: int
    neox: bool
    #: cos/sin tables per batch row ([batch, seq, rot/2]) rather than shared ([seq, rot/2]).
    per_row: bool
    grain: int


def _float_literal(v: float) -> str:
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return repr(float(v))


def _add_rows(offset: Dim, row: Dim) -> Dim:
    """offset + row where both are multiples of the same symbolic factor (concat rows share trailing dims)."""
    if offset.coeff == 0:
        return row
    if offset.symbols != row.symbols:
        raise BuildError("concat rows with different dynamic factors")
    return Dim(offset.coeff + row.coeff, offset.symbols)




def _elem_type(size: int) -> str:
    return {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}[size]



# ── elementwise ────────────────────────────────────────────────────

def elementwise_args(em: CpuEmitter, node: Node) -> ElementwiseArgs:
    op = node.op
    in_shapes = [em.node(i).shape for i in node.inputs]
    if isinstance(op, O.ElementwiseRegion):
        steps = list(op.steps)
        shapes = op.step_shapes(in_shapes)
    elif isinstance(op, O.Expand):
        steps = [None]
        shapes = [*in_shapes, node.shape]
    else:
        steps = [O.RegionStep(op, tuple(range(len(node.inputs))))]
        shapes = [*in_shapes, node.shape]
    n_in = len(node.inputs)
    out_dims = node.shape.dims

    # Each input read as the output's shape (broadcast axes have stride 0), then the loop nest
    # collapsed to as few axes as every input allows.
    views = [View.dense(sh.dims).broadcast_to(out_dims) for sh in in_shapes]
    dims, collapsed = collapse(out_dims, *views)
    strides = [[em.dim(st) for st in v.strides] for v in collapsed]

    inputs = []
    for j, i in enumerate(node.inputs):
        dt = in_shapes[j].dtype
        inner = strides[j][-1] if dims else "0"
        inputs.append(EwInput(ptr=em.ptr(i), dtype=dt.value, var=f"v{j}", ctype=_COMPUTE[dt],
                              stype=dt.c_type, strides=tuple(strides[j]), inner=inner,
                              scalar=all(s == "0" for s in strides[j])))
    step_ctx = []
    checks = False
    for si, step in enumerate(steps):
        dt = shapes[n_in + si].dtype
        var = f"v{n_in + si}"
        if step is None:  # expand: a plain copy of the broadcast input
            step_ctx.append(EwStep(var=var, kind="copy", fn="", args=("v0",), dtype=dt.value,
                                   ctype=_COMPUTE[dt], arg_ctype=_COMPUTE[dt], arg_dtype=dt.value))
            continue
        arg_dts = [shapes[a].dtype for a in step.args]
        sop = step.op
        fn = getattr(sop, "fn", "")
        if isinstance(sop, O.Cast):
            fn = DType.parse(sop.dtype).value
        if isinstance(sop, O.Binary) and fn in ("div", "pow") and dt.is_int:
            checks = True
        narrow_from = arg_dts[-1].value if arg_dts[-1].is_narrow else ""
        step_ctx.append(EwStep(var=var, kind=sop.kind, fn=fn, args=tuple(f"v{a}" for a in step.args),
                               dtype=dt.value, ctype=_COMPUTE[dt], arg_ctype=_COMPUTE[arg_dts[-1]],
                               arg_dtype=arg_dts[-1].value, narrow_from=narrow_from,
                               narrow_to=dt.value if dt.is_narrow else ""))
    out_dt = node.shape.dtype
    return ElementwiseArgs(
        rank=len(dims),
        dims=tuple(em.dim(d) for d in dims),
        outer_dims=tuple(em.dim(d) for d in dims[:-1]),
        total=em.numel(dims) if dims else "1",
        inner=em.dim(dims[-1]) if dims else "1",
        rows=em.numel(dims[:-1]) if len(dims) > 1 else "1",
        inputs=tuple(inputs),
        steps=tuple(step_ctx),
        result=step_ctx[-1].var,
        out=em.ptr(node.id, const=False),
        out_dtype=out_dt.value,
        out_stype=out_dt.c_type,
        checks=checks,
        grain=GRAIN,
    )

# ── GEMM family ────────────────────────────────────────────────────

def gemm_args(em: CpuEmitter, node: Node) -> GemmArgs | PgemmArgs:
    a_id, b_id = node.inputs[:2]
    a, b = em.node(a_id).shape, em.node(b_id).shape
    out = node.shape
    m, k, n = out.dims[-2], a.dims[-1], out.dims[-1]
    em.check_gemm_dims(node, m * product(out.dims[:-2]), k, n)
    a_ptr, ta = em.gemm_operand(a_id)
    b_ptr, tb = em.gemm_operand(b_id)
    bias = em.ptr(node.inputs[2]) if len(node.inputs) == 3 else ""
    act = getattr(node.op, "activation", None) or ""
    b_param = em.absorbed.get(b_id, b_id)
    if b_param in em.packed:
        return pgemm_args(em, node, a, b, b_param, a_ptr, bias, act)
    # A 2-D right operand with an unbroadcast left batch folds the batch into M: one GEMM.
    fold = b.rank == 2 and not ta
    batch = em.gemm_batch(a, b, out)
    rows = em.dim(product(out.dims[:-1])) if fold else em.dim(m)
    return GemmArgs(
        m=rows, n=em.dim(n), k=em.dim(k),
        a=a_ptr, b=b_ptr, c=em.ptr(node.id, const=False), ta=ta, tb=tb,
        lda=em.dim(m if ta else k), ldb=em.dim(k if tb else n),
        batch=batch, fold=fold or batch.rank == 0,
        bias=bias, act=act, epilogue=bool(bias or act),
        mat_c=em.dim(m * n), block=0, grain=GRAIN,
    )

def pgemm_args(em: CpuEmitter, node: Node, a: Shape, b: Shape, b_param: NodeId, a_ptr: str, bias: str,
          act: str) -> PgemmArgs:
    """A GEMM whose right operand is a packed param (see find_packed_params)."""
    out = node.shape
    m, k, n = out.dims[-2], a.dims[-1], out.dims[-1]
    fold = b.rank == 2
    if act:
        em.gemm_acts.add(act)
    group = tuple(_sibling(em, em.node(m)) for m in em.siblings.get(node.id, ()))
    return PgemmArgs(
        m=em.dim(product(out.dims[:-1]) if fold else m), n=em.dim(n),
        k=em.dim(k), lda=em.dim(k), a=a_ptr, b=em.ptr(b_param),
        c=em.ptr(node.id, const=False), bias=bias, fold=fold,
        batch=em.gemm_batch(a, b, out, em.packed_mat[b_param]), mat_c=em.dim(m * n),
        epi=f"RLX_EPI_{act.upper()}" if act else "RLX_EPI_NONE", group=group,
    )

def _sibling(em: CpuEmitter, node: Node) -> tuple[str, str, str, str]:
    """(packed B, C, bias, epilogue) of a `GemmSiblings` member."""
    act = getattr(node.op, "activation", None) or ""
    if act:
        em.gemm_acts.add(act)
    b_param = em.absorbed.get(node.inputs[1], node.inputs[1])
    return (em.ptr(b_param), em.ptr(node.id, const=False), em.ptr(node.inputs[2]) if len(node.inputs) == 3 else "NULL",
            f"RLX_EPI_{act.upper()}" if act else "RLX_EPI_NONE")

def swiglu_args(em: CpuEmitter, node: Node) -> SwigluArgs:
    x_id, g_id, u_id = node.inputs
    x, wg = em.node(x_id).shape, em.node(g_id).shape
    out = node.shape
    m, k, n = out.dims[-2], x.dims[-1], out.dims[-1]
    em.check_gemm_dims(node, m * product(out.dims[:-2]), k, n)
    g_ptr, tg = em.gemm_operand(g_id)
    u_ptr, tu = em.gemm_operand(u_id)
    fold = wg.rank == 2
    rows_dim = product(out.dims[:-1]) if fold else m
    # rows per step: the up-projection block (block x N floats of scratch) stays within ~1 MiB
    block = max(16, min(512, (1 << 18) // max(n.max, 1)))
    block = max(1, min(block, rows_dim.max))
    em.scratch_shared = max(em.scratch_shared, block * n.max * 4)
    return SwigluArgs(
        m=em.dim(rows_dim), n=em.dim(n), k=em.dim(k),
        x=em.ptr(x_id), wg=g_ptr, wu=u_ptr, tg=tg, tu=tu,
        ldg=em.dim(k if tg else n), ldu=em.dim(k if tu else n),
        c=em.ptr(node.id, const=False), block=block,
        batch=em.gemm_batch(x, wg, out), fold=fold or len(out.dims) == 2,
        mat_c=em.dim(m * n), grain=GRAIN,
    )

# ── reductions and normalization ───────────────────────────────────

def reduce_args(em: CpuEmitter, node: Node) -> ReduceArgs:
    op: O.Reduce = node.op  # type: ignore[assignment]
    x = em.node(node.inputs[0]).shape
    axes = set(op.normalized_axes(x.rank))
    # Collapse into alternating kept/reduced groups, dropping static 1s.
    groups: list[tuple[Dim, bool]] = []
    for i, d in enumerate(x.dims):
        if d == 1:
            continue
        red = i in axes
        if groups and groups[-1][1] == red:
            groups[-1] = (groups[-1][0] * d, red)
        else:
            groups.append((d, red))
    pattern = "".join("R" if r else "K" for _, r in groups)
    # Generic fallback for patterns other than [K] R [K]: reduced groups and kept groups with strides.
    strides = dense_strides([d for d, _ in groups])
    kept = tuple((em.dim(d), em.dim(s)) for (d, r), s in zip(groups, strides) if not r)
    red = tuple((em.dim(d), em.dim(s)) for (d, r), s in zip(groups, strides) if r)
    simple = pattern in ("", "R", "KR", "RK", "KRK", "K")
    outer = inner = "1"
    count = "1"
    if simple:
        idx = pattern.find("R")
        if idx >= 0:
            outer = em.numel([d for d, _ in groups[:idx]]) if idx > 0 else "1"
            count = em.dim(groups[idx][0])
            inner = em.numel([d for d, _ in groups[idx + 1:]]) if idx + 1 < len(groups) else "1"
        else:
            outer = em.numel([d for d, _ in groups]) if groups else "1"
    red_count = em.numel([d for d, r in groups if r]) if any(r for _, r in groups) else "1"
    dt = x.dtype
    wide = "uint64_t" if dt.is_unsigned else "int64_t"  # sums wrap as the numpy reference's do
    acc_type = "double" if dt.is_float else (wide if op.fn in ("sum", "prod") else _COMPUTE[dt])
    if op.fn == "mean":
        acc_type = "double"
    if op.fn in ("max", "min"):
        acc_type = _COMPUTE[dt]
    return ReduceArgs(
        fn=op.fn, simple=simple, outer=outer, inner=inner, count=count,
        kept=kept, red=red, red_count=red_count, out_count=em.numel(node.shape.dims),
        x=em.ptr(node.inputs[0]), y=em.ptr(node.id, const=False), dtype=dt.value,
        ctype=_COMPUTE[dt], stype=dt.c_type, acc=acc_type, is_float=dt.is_float, grain=GRAIN,
    )

def softmax_args(em: CpuEmitter, node: Node) -> SoftmaxArgs:
    x = node.shape
    axis = node.op.axis % x.rank
    return SoftmaxArgs(outer=em.numel(x.dims[:axis]), n=em.dim(x.dims[axis]),
                       inner=em.numel(x.dims[axis + 1:]), x=em.ptr(node.inputs[0]),
                       y=em.ptr(node.id, const=False), grain=GRAIN)

def norm_args(em: CpuEmitter, node: Node) -> NormArgs:
    n = norm_inputs(node)
    x = node.shape
    return NormArgs(rms=n.rms, x=em.ptr(n.x), residual=em.ptr(n.residual) if n.residual is not None else "",
                    bias=em.ptr(n.bias) if n.bias is not None else "", gamma=em.ptr(n.gamma),
                    beta=em.ptr(n.beta) if n.beta is not None else "", y=em.ptr(node.id, const=False),
                    rows=em.numel(x.dims[:-1]), n=em.dim(x.dims[-1]), eps=_float_literal(node.op.eps),
                    grain=GRAIN)

# ── data movement ──────────────────────────────────────────────────

def copy_args(em: CpuEmitter, node: Node) -> CopyArgs:
    return CopyArgs(src=em.base(node.inputs[0]), dst=em.base(node.id),
                    nbytes=f"({em.numel(node.shape.dims)}*{node.shape.dtype.itemsize})")

def transpose_args(em: CpuEmitter, node: Node) -> TransposeArgs:
    x = em.node(node.inputs[0]).shape
    # The input read through the transpose's View; output axes that are neighbours in the
    # input too merge (collapse), size-1 axes drop.
    view = movement_view(node.op, x, node.shape)
    dims, (read,) = collapse(node.shape.dims, view)
    strides = list(read.strides)
    esize = x.dtype.itemsize
    if not dims:
        dims, strides = [Dim(1)], [Dim(1)]
    return TransposeArgs(rank=len(dims), dims=tuple(em.dim(d) for d in dims),
                         strides=tuple(em.dim(s) for s in strides),
                         rows=em.numel(dims[:-1]) if len(dims) > 1 else "1",
                         inner=em.dim(dims[-1]), ctype=_elem_type(esize),
                         x=f"((const {_elem_type(esize)} *){em.base(node.inputs[0])})",
                         y=f"(({_elem_type(esize)} *){em.base(node.id)})", grain=GRAIN)

def narrow_args(em: CpuEmitter, node: Node) -> NarrowArgs:
    op: O.Narrow = node.op  # type: ignore[assignment]
    x = em.node(node.inputs[0]).shape
    axis = op.axis % x.rank
    inner = product(x.dims[axis + 1:])
    size = x.dtype.itemsize
    return NarrowArgs(outer=em.numel(x.dims[:axis]),
                      src_row=f"({em.dim(x.dims[axis] * inner)}*{size})",
                      dst_row=f"({em.dim(inner * op.length)}*{size})",
                      start=f"({em.dim(inner * op.start)}*{size})",
                      src=em.base(node.inputs[0]), dst=em.base(node.id))

def concat_args(em: CpuEmitter, node: Node) -> ConcatArgs:
    axis = node.op.axis % node.shape.rank
    size = node.shape.dtype.itemsize
    out_row = product(node.shape.dims[axis:])
    parts = []
    offset = Dim(0)
    for i in node.inputs:
        s = em.node(i).shape
        row = product(s.dims[axis:])
        parts.append(ConcatPart(src=em.base(i), row=f"({em.dim(row)}*{size})",
                                offset=f"({em.dim(offset)}*{size})" if offset.coeff else "0"))
        offset = _add_rows(offset, row)
    return ConcatArgs(outer=em.numel(node.shape.dims[:axis]),
                      dst_row=f"({em.dim(out_row)}*{size})", parts=tuple(parts), dst=em.base(node.id))

def gather_args(em: CpuEmitter, node: Node) -> GatherArgs:
    table_id, idx_id = node.inputs
    table, idx = em.node(table_id).shape, em.node(idx_id).shape
    axis = node.op.axis % table.rank
    size = table.dtype.itemsize
    return GatherArgs(outer=em.numel(table.dims[:axis]), n=em.dim(table.dims[axis]),
                      count=em.numel(idx.dims), inner_bytes=f"({em.numel(table.dims[axis + 1:])}*{size})",
                      table=em.base(table_id), idx=em.ptr(idx_id), idx_type=idx.dtype.c_type,
                      dst=em.base(node.id), grain=GRAIN)

# ── transformer blocks ─────────────────────────────────────────────

def attention_args(em: CpuEmitter, node: Node) -> AttentionArgs:
    op: O.Attention = node.op  # type: ignore[assignment]
    q, k = em.node(node.inputs[0]).shape, em.node(node.inputs[1]).shape
    h, hkv, d = op.num_heads, op.kv_heads, op.head_dim
    skv_max = k.dims[1].max
    # per thread: the score tile, K^T and V of one head in panels padded to PACK_NR_MAX, a mask row
    kp_offset = align64(ATTN_QBLOCK * skv_max * 4)
    vp_offset = kp_offset + align64(d * round_up(skv_max, PACK_NR_MAX) * 4)
    row_offset = vp_offset + align64(skv_max * round_up(d, PACK_NR_MAX) * 4)
    scratch = row_offset + align64(skv_max * 4)
    em.scratch_per_thread = max(em.scratch_per_thread, scratch)
    plan = next((d for d in em.lir.decided(AttentionPlan) if d.node == node.id), None)
    form = plan.form if plan is not None else "blocks"
    mask = AttentionMask(op.mask)
    if op.mask == "padding":
        m_id = node.inputs[3]
        mask = AttentionMask(op.mask, ptr=em.ptr(m_id), ctype=em.node(m_id).shape.dtype.c_type)
    elif op.mask == "bias":
        m_id = node.inputs[3]
        ms = em.node(m_id).shape
        if ms.dtype is not DType.F32:
            raise BuildError(f"the CPU backend needs an f32 attention bias (node {node.label}), got {ms.dtype}")
        target = (q.dims[0], Dim(h), q.dims[1], k.dims[1])
        st = tuple(em.dim(d) for d in View.dense(ms.dims).broadcast_to(target).strides)
        mask = AttentionMask(op.mask, ptr=em.ptr(m_id), strides=st)
    return AttentionArgs(q=em.ptr(node.inputs[0]), k=em.ptr(node.inputs[1]),
                         v=em.ptr(node.inputs[2]), o=em.ptr(node.id, const=False),
                         batch=em.dim(q.dims[0]), sq=em.dim(q.dims[1]), skv=em.dim(k.dims[1]),
                         heads=h, kv_heads=hkv, group=h // hkv, hd=d, scale=_float_literal(op.softmax_scale),
                         mask=mask, qblock=ATTN_QBLOCK, kp_offset=kp_offset, vp_offset=vp_offset,
                         row_offset=row_offset, form=form)

def rope_args(em: CpuEmitter, node: Node) -> RopeArgs:
    op: O.Rope = node.op  # type: ignore[assignment]
    x = node.shape
    return RopeArgs(x=em.ptr(node.inputs[0]), cos=em.ptr(node.inputs[1]),
                    sin=em.ptr(node.inputs[2]), y=em.ptr(node.id, const=False),
                    batch=em.dim(x.dims[0]), seq=em.dim(x.dims[1]), width=x.dims[2].value,
                    hd=op.head_dim, half=op.rot // 2, rot=op.rot, neox=op.variant == "neox",
                    per_row=em.node(node.inputs[1]).shape.rank == 3, grain=GRAIN)


# ── the CPU rule table ─────────────────────────────────────────────────────

#: Template file of each kernel macro, and the fixed kernel headers its code calls into.
MACRO_TEMPLATES = {
    "elementwise": "elementwise.c.j2", "gemm": "gemm.c.j2", "pgemm": "gemm.c.j2", "swiglu": "gemm.c.j2",
    "norm": "norm.c.j2", "softmax": "norm.c.j2", "reduce": "reduce.c.j2", "copy": "movement.c.j2",
    "transpose": "movement.c.j2", "narrow": "movement.c.j2", "concat": "movement.c.j2",
    "gather": "movement.c.j2", "attention": "attention.c.j2", "rope": "attention.c.j2",
}
MACRO_HEADERS = {
    "pgemm": ("kernels/packed_gemm.h",),
    "attention": ("kernels/packed_gemm.h", "kernels/attention.h"),
    "norm": ("kernels/norm_rows.h",),
}


def _emit_with(args_of: Callable[[CpuEmitter, Node], CpuArgs]) -> Callable[[CpuEmitter, Node], Kernel]:
    """A rule that renders a node with the arguments `args_of` gives (their class names the macro)."""

    def emit(em: CpuEmitter, node: Node) -> Kernel:
        args = args_of(em, node)
        macro = args.macro
        return em.kernel(node, macro, MACRO_TEMPLATES[macro], args, headers=MACRO_HEADERS.get(macro, ()))

    emit.__name__ = f"emit_{args_of.__name__.removesuffix('_args')}"
    return emit


def _attention_dtypes(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    # q, k, v by position (they may be one node): f32; a padding mask may be any dtype, a bias is f32.
    data = in_dtypes[:3] + (in_dtypes[3:] if getattr(op, "mask", "") == "bias" else ())
    return float32_only(op, data, out_dtype)


def _no_bool(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return "on bool" if DType.BOOL in in_dtypes else None


RULES.register("activation", "binary", "compare", "where", "cast", "expand", "elementwise_region")(
    _emit_with(elementwise_args))
# f32 GEMMs render with `gemm_args`; f32 activations x f16/bf16 weights with c_half's kernels
RULES.register("matmul", "fused_matmul_bias_act", accepts=c_half.gemm_dtypes, mixed=True)(
    c_half.gemm_rule(_emit_with(gemm_args), gemm_args))
RULES.register("fused_swiglu", accepts=float32_only)(_emit_with(swiglu_args))
RULES.register("reduce", accepts=_no_bool)(_emit_with(reduce_args))
RULES.register("softmax", accepts=float32_only)(_emit_with(softmax_args))
RULES.register("layer_norm", "rms_norm", "fused_residual_layer_norm", "fused_residual_rms_norm",
               accepts=float32_only)(_emit_with(norm_args))
RULES.register("transpose")(_emit_with(transpose_args))
RULES.register("narrow")(_emit_with(narrow_args))
RULES.register("concat")(_emit_with(concat_args))
RULES.register("reshape")(_emit_with(copy_args))
RULES.register("gather")(_emit_with(gather_args))
RULES.register("attention", accepts=_attention_dtypes)(_emit_with(attention_args))
RULES.register("rope", accepts=float32_only)(_emit_with(rope_args))

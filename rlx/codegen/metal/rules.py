"""The Metal rules: one per MIR op kind, each returning a `Kernel` whose args say what to render and launch.

A rule reads one scheduled node and the `MetalEmitter` (pointers, dims, the
buffer layout) and returns `Kernel(node, macro, template, args, headers)`:
`templates/metal/ops.metal.j2`'s macro `macro` renders the node's kernel
function(s) from `args` (a frozen dataclass below), `headers` name the fixed
MSL under `templates/metal/kernels/` those kernels call, and `args.launches`
are the dispatches the host encodes for it (threadgroup size chosen per op).

>>> sorted(r.kind for r in RULES.rules)[:3]
['activation', 'argmax', 'attention']
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.common import broadcast_index
from rlx.codegen.metal.emit import (
    COPY_HEADER,
    MSL_TYPE,
    OPS_TEMPLATE,
    VALUE_TYPE,
    CopyNd,
    Dispatch,
    GridAxis,
    MetalArgs,
    MetalEmitter,
    category,
    float_literal,
    grid_1d,
)
from rlx.codegen.region_steps import RegionStep, as_region, region_steps
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir import ops as O
from rlx.ir.activation_table import activation_table
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.ir.norms import norm_inputs
from rlx.ir.shape import Dim, normalize_axis, product
from rlx.ir.view import View, collapse

ROWS, GEMM, ATTENTION = "metal/kernels/rows.metal", "metal/kernels/gemm.metal", "metal/kernels/attention.metal"
_FLOATS = (DType.F32, DType.F16, DType.BF16)
_INTS = (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8)
_RED = {"sum": "RLX_RED_SUM", "mean": "RLX_RED_MEAN", "max": "RLX_RED_MAX", "min": "RLX_RED_MIN",
        "prod": "RLX_RED_PROD"}
_MASK = {"none": "RLX_MASK_NONE", "causal": "RLX_MASK_CAUSAL", "padding": "RLX_MASK_PADDING",
         "bias": "RLX_MASK_BIAS"}
#: GEMM tile: a threadgroup of 4 simdgroups computes a 32 x 32 block of C in 8 x 8 simdgroup matrices.
GEMM_TILE, GEMM_THREADS = 32, 128
#: Attention: one simdgroup per (query row, head, batch); lanes split head_dim.
ATTN_MAX_HEAD_DIM = 256
#: This module's Metal rules (the table is made from them: `rlx.codegen.metal.rule_table`).
RULES = RuleSet("metal")


def _act(fn: str | None) -> str:
    return activation_table().enum(fn)


# ── accepts: which variants each rule takes ───────────────────────────────────


def _no_f64(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    if DType.F64 in (*in_dtypes, out_dtype):
        return "on f64; the Metal Shading Language has no 64-bit float"
    return None


def _floats_only(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    bad = sorted({d.value for d in (*in_dtypes, out_dtype) if d not in _FLOATS})
    return f"on {'/'.join(bad)}; it takes f32/f16/bf16" if bad else None


def _gather_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return _no_f64(op, in_dtypes[:1], out_dtype)


def _attention_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    reason = _floats_only(op, in_dtypes[:3], out_dtype)
    if reason is None and DType.F64 in in_dtypes[3:]:
        reason = "with an f64 mask; the Metal Shading Language has no 64-bit float"
    if reason is None and op.head_dim > ATTN_MAX_HEAD_DIM:  # type: ignore[attr-defined]
        reason = f"with head_dim {op.head_dim} > {ATTN_MAX_HEAD_DIM}"  # type: ignore[attr-defined]
    return reason


def _reduce_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    if op.fn not in _RED:  # type: ignore[attr-defined]
        return f"has no reduction {op.fn!r}"  # type: ignore[attr-defined]
    return _no_f64(op, in_dtypes, out_dtype)


def _kernel(node: Node, macro: str, args: MetalArgs, *headers: str) -> Kernel:
    return Kernel(node.id, macro, OPS_TEMPLATE, args, headers=headers, header=args.comment, label=node.label)


def _one_d(e: MetalEmitter, name: str, n: Dim, sync: bool = False) -> tuple[Dispatch, ...]:
    t = e.target.threads
    return (Dispatch(name, grid_1d(n, t), (t, 1, 1), sync),)


# ── elementwise ───────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class RegionLoad:
    mtype: str
    vtype: str
    cat: str
    ptr: str
    index: str


@dataclass(frozen=True, kw_only=True)
class Region(MetalArgs):
    """One elementwise kernel: loads (broadcast indices), steps in registers, one store."""

    name: str
    idx: str
    n: str
    out: str
    out_mtype: str
    out_cat: str
    flag: str
    ins: tuple[RegionLoad, ...]
    steps: tuple[RegionStep, ...]
    result: str


def _bcast_index(e: MetalEmitter, in_dims: tuple[Dim, ...], out_dims: tuple[Dim, ...], idx: str) -> str:
    """Index into an input of `in_dims` for flat output index `i` (numpy broadcasting)."""
    return broadcast_index(in_dims, out_dims, idx, e.dim)


@RULES.register("activation", "binary", "compare", "where", "cast", "elementwise_region", accepts=_no_f64)
def region(e: MetalEmitter, node: Node) -> Kernel:
    """Elementwise ops (alone, or fused into a region): one thread per output element, values in registers."""
    reg = as_region(node)
    in_shapes = [e.node(i).shape for i in node.inputs]
    values = reg.step_shapes(in_shapes)
    idx = e.idx_type(node.shape, *in_shapes)
    ins = tuple(RegionLoad(MSL_TYPE[s.dtype], VALUE_TYPE[s.dtype], category(s.dtype), e.ptr(i),
                           _bcast_index(e, tuple(s.dims), tuple(node.shape.dims), idx))
                for i, s in zip(node.inputs, in_shapes))
    steps = region_steps(reg, values, len(node.inputs), VALUE_TYPE)
    name = e.kernel_name(node)
    n = product(node.shape.dims)
    args = Region(comment=e.header(node), launches=_one_d(e, name, n), name=name, idx=idx, n=e.dim(n),
                  out=e.ptr(node.id), out_mtype=e.mtype(node.id), out_cat=category(node.shape.dtype),
                  flag=e.flag(), ins=ins, steps=steps, result=f"v{len(values) - 1}")
    return _kernel(node, "block_region", args)


# ── data movement ─────────────────────────────────────────────────────────────


@dataclass(frozen=True, kw_only=True)
class Copies(MetalArgs):
    pieces: tuple[CopyNd, ...]


def _copy_kernel(e: MetalEmitter, node: Node, src_view: View, src: str | None = None) -> Kernel:
    dims = tuple(node.shape.dims)
    args = e.copy(node, e.kernel_name(node), src or e.ptr(node.inputs[0]), e.ptr(node.id), dims, src_view,
                  View.dense(dims))
    return _kernel(node, "block_copy_nd", args, COPY_HEADER)


@RULES.register("transpose", accepts=_no_f64)
def transpose(e: MetalEmitter, node: Node) -> Kernel:
    src = e.node(node.inputs[0]).shape
    return _copy_kernel(e, node, View.dense(src.dims).permute(node.op.perm))


@RULES.register("expand", accepts=_no_f64)
def expand(e: MetalEmitter, node: Node) -> Kernel:
    src = e.node(node.inputs[0]).shape
    return _copy_kernel(e, node, View.dense(src.dims).broadcast_to(tuple(node.shape.dims)))


@RULES.register("narrow", accepts=_no_f64)
def narrow(e: MetalEmitter, node: Node) -> Kernel:
    src = e.node(node.inputs[0]).shape
    axis = node.op.axis % src.rank
    window = View(tuple(node.shape.dims), View.dense(src.dims).strides)
    start = f"({e.ptr(node.inputs[0])} + {node.op.start} * {e.dim(window.strides[axis])})"
    return _copy_kernel(e, node, window, start)


@RULES.register("reshape", accepts=_no_f64)
def reshape(e: MetalEmitter, node: Node) -> Kernel:
    """A reshape that is not a view of its input (e.g. of an output): a dense copy."""
    return _copy_kernel(e, node, View.dense(tuple(node.shape.dims)))


@RULES.register("concat", accepts=_no_f64)
def concat(e: MetalEmitter, node: Node) -> Kernel:
    axis = node.op.axis % node.shape.rank
    out = View.dense(node.shape.dims)
    pieces = []
    start = 0
    for k, i in enumerate(node.inputs):
        s = e.node(i).shape
        dst = f"({e.ptr(node.id)} + {start} * {e.dim(out.strides[axis])})"
        pieces.append(e.copy(node, e.kernel_name(node, f"_p{k}"), e.ptr(i), dst, tuple(s.dims),
                             View.dense(s.dims), View(tuple(s.dims), out.strides)))
        start += s.dims[axis].value
    args = Copies(comment=e.header(node), launches=tuple(d for p in pieces for d in p.launches),
                  pieces=tuple(pieces))
    return _kernel(node, "block_copies", args, COPY_HEADER)


@dataclass(frozen=True, kw_only=True)
class Gather(MetalArgs):
    name: str
    t: str
    it: str
    table: str
    index: str
    out: str
    flag: str
    outer: str
    rows: str
    nidx: str
    inner: str


@RULES.register("gather", accepts=_gather_accepts)
def gather(e: MetalEmitter, node: Node) -> Kernel:
    """One thread per output element; an index out of range sets the error flag (the host raises)."""
    table_, idx = (e.node(i).shape for i in node.inputs)
    axis = node.op.axis % table_.rank
    name = e.kernel_name(node)
    args = Gather(comment=e.header(node), launches=_one_d(e, name, product(node.shape.dims)), name=name,
                  t=e.mtype(node.id), it=MSL_TYPE[idx.dtype], table=e.ptr(node.inputs[0]),
                  index=e.ptr(node.inputs[1]), out=e.ptr(node.id), flag=e.flag(),
                  outer=e.numel(table_.dims[:axis]), rows=e.dim(table_.dims[axis]), nidx=e.numel(idx.dims),
                  inner=e.numel(table_.dims[axis + 1:]))
    return _kernel(node, "block_gather", args, COPY_HEADER)


@dataclass(frozen=True, kw_only=True)
class Rope(MetalArgs):
    name: str
    t: str
    neox: str
    per_row: str
    x: str
    cos: str
    sin: str
    out: str
    n: str
    seq: str
    width: int
    hd: int
    rot: int


@RULES.register("rope", accepts=_floats_only)
def rope(e: MetalEmitter, node: Node) -> Kernel:
    """One thread per output element: rotated pairs read their partner, the rest copy through."""
    x = node.shape
    op = node.op
    cos = e.node(node.inputs[1]).shape
    name = e.kernel_name(node)
    n = product(x.dims)
    args = Rope(comment=e.header(node), launches=_one_d(e, name, n), name=name, t=e.mtype(node.id),
                neox=str(op.variant == "neox").lower(), per_row=str(cos.rank == 3).lower(), x=e.ptr(node.inputs[0]),
                cos=e.ptr(node.inputs[1]), sin=e.ptr(node.inputs[2]), out=e.ptr(node.id), n=e.dim(n),
                seq=e.dim(x.dims[1]), width=x.dims[2].value, hd=op.head_dim, rot=op.rot)
    return _kernel(node, "block_rope", args, COPY_HEADER)


# ── rows: norms, softmax, reductions ──────────────────────────────────────────


def row_threads(nmax: int) -> int:
    """Threads per row (a whole number of simdgroups): about 4 values per thread, 32 to 256."""
    t = 32
    while t < 256 and t * 4 < nmax:
        t *= 2
    return t


def _row_launch(name: str, rows: Dim, tpr: int) -> tuple[Dispatch, ...]:
    return (Dispatch(name, (GridAxis(rows), GridAxis(Dim(1)), GridAxis(Dim(1))), (tpr, 1, 1), True),)


@dataclass(frozen=True, kw_only=True)
class Norm(MetalArgs):
    name: str
    t: str
    tpr: int
    rms: str
    res_on: str
    bias_on: str
    x: str
    res: str
    bias: str
    gamma: str
    beta: str
    out: str
    n: int
    eps: str


@RULES.register("layer_norm", "rms_norm", "fused_residual_layer_norm", "fused_residual_rms_norm",
                accepts=_floats_only)
def norm(e: MetalEmitter, node: Node) -> Kernel:
    """One threadgroup per row; mean and variance by simdgroup sums, then across simdgroups."""
    op = node.op
    x = node.shape
    n = x.dims[-1].value
    roles = norm_inputs(node)
    rms, res, bias, gamma, beta = roles.rms, roles.residual, roles.bias, roles.gamma, roles.beta
    x_ptr = e.ptr(roles.x)
    name = e.kernel_name(node)
    tpr = row_threads(n)
    args = Norm(comment=e.header(node), launches=_row_launch(name, product(x.dims[:-1]), tpr), name=name,
                t=e.mtype(node.id), tpr=tpr, rms=str(rms).lower(), res_on=str(res is not None).lower(),
                bias_on=str(bias is not None).lower(), x=x_ptr, res=e.ptr(res) if res is not None else x_ptr,
                bias=e.ptr(bias) if bias is not None else x_ptr, gamma=e.ptr(gamma),
                beta=e.ptr(beta) if beta is not None else x_ptr, out=e.ptr(node.id), n=n, eps=float_literal(op.eps))
    return _kernel(node, "block_norm", args, ROWS)


@dataclass(frozen=True, kw_only=True)
class Softmax(MetalArgs):
    name: str
    t: str
    x: str
    out: str
    rows: bool
    tpr: int
    n: str
    inner: str
    cols: str


@RULES.register("softmax", accepts=_floats_only)
def softmax(e: MetalEmitter, node: Node) -> Kernel:
    """Last axis: one threadgroup per row (simdgroup max and sum); other axes: one thread per column."""
    x = node.shape
    axis = node.op.axis % x.rank
    name = e.kernel_name(node)
    common = dict(comment=e.header(node), name=name, t=e.mtype(node.id), x=e.ptr(node.inputs[0]),
                  out=e.ptr(node.id), n=e.dim(x.dims[axis]))
    if axis == x.rank - 1:
        tpr = row_threads(x.dims[-1].max)
        return _kernel(node, "block_softmax", Softmax(**common, launches=_row_launch(name, product(x.dims[:-1]), tpr),
                                                      rows=True, tpr=tpr, inner="1", cols="0"), ROWS)
    cols = product([*x.dims[:axis], *x.dims[axis + 1:]])
    return _kernel(node, "block_softmax", Softmax(**common, launches=_one_d(e, name, cols), rows=False, tpr=0,
                                                  inner=e.numel(x.dims[axis + 1:]), cols=e.dim(cols)), ROWS)


@dataclass(frozen=True, kw_only=True)
class Reduce(MetalArgs):
    name: str
    t: str
    acc: str
    fn: str
    x: str
    out: str
    nout: str
    nred: str
    kept: tuple[tuple[str, str], ...]
    red: tuple[tuple[str, str], ...]


@RULES.register("reduce", accepts=_reduce_accepts)
def reduce(e: MetalEmitter, node: Node) -> Kernel:
    """One thread per output element, walking the reduced axes (collapsed) in order."""
    op = node.op
    x = e.node(node.inputs[0]).shape
    axes = op.normalized_axes(x.rank)
    kept = [k for k in range(x.rank) if k not in axes]
    dense = View.dense(x.dims)
    kd, (kv,) = collapse([x.dims[k] for k in kept], dense.permute(kept))
    rd, (rv,) = collapse([x.dims[k] for k in axes], dense.permute(axes))
    name = e.kernel_name(node)
    nout = product(node.shape.dims)
    acc = "float" if category(x.dtype) == "float" else ("long" if category(x.dtype) == "int" else "int")
    args = Reduce(comment=e.header(node), launches=_one_d(e, name, nout), name=name, t=e.mtype(node.id),
                  acc=acc, fn=_RED[op.fn], x=e.ptr(node.inputs[0]), out=e.ptr(node.id), nout=e.dim(nout),
                  nred=e.numel([x.dims[k] for k in axes]),
                  kept=tuple((e.dim(d), e.dim(s)) for d, s in zip(kd, kv.strides)),
                  red=tuple((e.dim(d), e.dim(s)) for d, s in zip(rd, rv.strides)))
    return _kernel(node, "block_reduce", args, ROWS)


@dataclass(frozen=True, kw_only=True)
class ArgMax(MetalArgs):
    name: str
    t: str
    x: str
    out: str
    nout: str
    n: str
    inner: str


@RULES.register("argmax", accepts=_no_f64)
def argmax(e: MetalEmitter, node: Node) -> Kernel:
    """One thread per output value, scanning its axis (x viewed as [outer, n, inner])."""
    x = e.node(node.inputs[0]).shape
    axis = normalize_axis(node.op.axis, x.rank, "argmax axis")
    name = e.kernel_name(node)
    nout = product(node.shape.dims)
    args = ArgMax(comment=e.header(node), launches=_one_d(e, name, nout), name=name, t=e.mtype(node.inputs[0]),
                  x=e.ptr(node.inputs[0]), out=e.ptr(node.id), nout=e.dim(nout), n=e.dim(x.dims[axis]),
                  inner=e.numel(x.dims[axis + 1:]))
    return _kernel(node, "block_argmax", args, ROWS)


# ── matrix products ───────────────────────────────────────────────────────────


@dataclass(frozen=True, kw_only=True)
class Gemm(MetalArgs):
    """C = act(A B + bias) (or SwiGLU: silu(A B) * (A B2)) on 8 x 8 simdgroup matrices.

    `bdims`: (dim, A stride, B stride) per collapsed batch dim (grid z walks them); C is dense.
    """

    name: str
    t: str
    a: str
    b: str
    b2: str
    bias: str
    c: str
    m: str
    n: str
    k: str
    act: str
    bias_on: str
    swiglu: str
    bdims: tuple[tuple[str, str, str], ...]


def _gemm(e: MetalEmitter, node: Node, b_id: NodeId, b2_id: NodeId | None, bias: NodeId | None,
          act: str | None) -> Kernel:
    a_id = node.inputs[0]
    a, b, out = e.node(a_id).shape, e.node(b_id).shape, node.shape
    M, K, N = a.dims[-2], a.dims[-1], b.dims[-1]
    ob = list(out.dims[:-2])
    bb = [Dim(1)] * (len(ob) - (b.rank - 2)) + list(b.dims[:-2])
    ab = [Dim(1)] * (len(ob) - (a.rank - 2)) + list(a.dims[:-2])
    if all(d == 1 for d in bb) and ab == ob:
        # one B for every batch and a dense A: the batch folds into M
        M, bdims, batch = product([*ob, M]), (), Dim(1)
    else:
        av = View.dense(a.dims[:-2]).broadcast_to(ob)
        bv = View.dense(b.dims[:-2]).broadcast_to(ob)
        av = View(av.dims, tuple(s * (M * K) for s in av.strides))
        bv = View(bv.dims, tuple(s * (K * N) for s in bv.strides))
        bd, (ca, cb) = collapse(ob, av, bv)
        bdims = tuple((e.dim(d), e.dim(x), e.dim(y)) for d, x, y in zip(bd, ca.strides, cb.strides))
        batch = product(ob)
    name = e.kernel_name(node)
    grid = (GridAxis(N, GEMM_TILE), GridAxis(M, GEMM_TILE), GridAxis(batch))
    b_ptr = e.ptr(b_id)
    args = Gemm(comment=e.header(node), launches=(Dispatch(name, grid, (GEMM_THREADS, 1, 1), True),), name=name,
                t=e.mtype(node.id), a=e.ptr(a_id), b=b_ptr, b2=e.ptr(b2_id) if b2_id is not None else b_ptr,
                bias=e.ptr(bias) if bias is not None else b_ptr, c=e.ptr(node.id), m=e.dim(M), n=e.dim(N),
                k=e.dim(K), act=_act(act), bias_on=str(bias is not None).lower(),
                swiglu=str(b2_id is not None).lower(), bdims=bdims)
    return _kernel(node, "block_gemm", args, GEMM)


@RULES.register("matmul", "fused_matmul_bias_act", accepts=_floats_only)
def matmul(e: MetalEmitter, node: Node) -> Kernel:
    bias = node.inputs[2] if len(node.inputs) == 3 else None
    act = node.op.activation if isinstance(node.op, O.FusedMatMulBiasAct) else None
    return _gemm(e, node, node.inputs[1], None, bias, act)


@RULES.register("fused_swiglu", accepts=_floats_only)
def swiglu(e: MetalEmitter, node: Node) -> Kernel:
    """silu(x Wg) * (x Wu): both products in one kernel (two accumulator sets), combined in the epilogue."""
    return _gemm(e, node, node.inputs[1], node.inputs[2], None, None)


# ── attention ─────────────────────────────────────────────────────────────────


@dataclass(frozen=True, kw_only=True)
class Attention(MetalArgs):
    name: str
    t: str
    mt: str
    D: int
    H: int
    Hkv: int
    mask: str
    Sq: str
    Skv: str
    scale: str
    bs: tuple[str, str, str, str]
    q: str
    k: str
    v: str
    m: str
    out: str


@RULES.register("attention", accepts=_attention_accepts)
def attention(e: MetalEmitter, node: Node) -> Kernel:
    """Flash-style: one simdgroup per (query row, head, batch) streams the keys with an online softmax."""
    op = node.op
    q, k = (e.node(i).shape for i in node.inputs[:2])
    mask_id = node.inputs[3] if len(node.inputs) > 3 else None
    bs: tuple[str, ...] = ("0",) * 4
    if op.mask == "bias" and mask_id is not None:
        m = e.node(mask_id).shape
        # the bias read as [B, H, Sq, Skv]: missing and size-1 axes broadcast (stride 0)
        mdims = [Dim(1)] * (4 - m.rank) + list(m.dims)
        bs = tuple(e.dim(s) for s in View.dense(m.dims).broadcast_to(mdims).strides)
    name = e.kernel_name(node)
    grid = (GridAxis(q.dims[1]), GridAxis(Dim(op.num_heads)), GridAxis(q.dims[0]))
    q_ptr = e.ptr(node.inputs[0])
    args = Attention(comment=e.header(node), launches=(Dispatch(name, grid, (32, 1, 1), True),), name=name,
                     t=e.mtype(node.id), mt=e.mtype(mask_id) if mask_id is not None else "uchar", D=op.head_dim,
                     H=op.num_heads, Hkv=op.kv_heads, mask=_MASK[op.mask], Sq=e.dim(q.dims[1]), Skv=e.dim(k.dims[1]),
                     scale=float_literal(op.softmax_scale), bs=bs, q=q_ptr, k=e.ptr(node.inputs[1]),
                     v=e.ptr(node.inputs[2]),
                     m=e.ptr(mask_id) if mask_id is not None else f"RLX_P(uchar, {e.offset(node.inputs[0])})",
                     out=e.ptr(node.id))
    return _kernel(node, "block_attention", args, ATTENTION)



@dataclass(frozen=True, kw_only=True)
class CachedAttention(MetalArgs):
    append: str
    name: str
    t: str
    D: int
    H: int
    Hkv: int
    n: str
    S: str
    T: int
    scale: str
    q: str
    k: str
    v: str
    kc: str
    vc: str
    pos: str
    flag: str
    out: str


def _cached_attention_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    if getattr(op, "paged", False):
        return "in the paged KV layout (page_size set): Metal has no paged kernel yet; run it on the CPU or CUDA"
    return _attention_accepts(op, in_dtypes, out_dtype)


@RULES.register("cached_attention", accepts=_cached_attention_accepts)
def cached_attention(e: MetalEmitter, node: Node) -> Kernel:
    """Two launches: this step's k and v appended to the caches (in place), then the flash-style attention
    of every query over its row's cache prefix (one simdgroup per query row and head)."""
    op = node.op
    if op.window is not None:
        from rlx.errors import BuildError

        raise BuildError(f"cached_attention with a sliding window ({op.window}) has no Metal kernel yet "
                         f"(node {node.label}); run this model on the CPU")
    if op.paged:
        from rlx.errors import BuildError

        raise BuildError(f"cached_attention in the paged KV layout has no Metal kernel yet (node {node.label}); "
                         "run this model on the CPU or CUDA")
    q_id, k_id, v_id, kc_id, vc_id, pos_id = node.inputs
    q, k, kc = e.node(q_id).shape, e.node(k_id).shape, e.node(kc_id).shape
    if kc.dtype != q.dtype:
        from rlx.errors import BuildError

        raise BuildError(f"cached_attention with a {kc.dtype.value} cache beside {q.dtype.value} queries has no "
                         f"Metal kernel (node {node.label}); give the caches the queries' dtype")
    append, name = e.kernel_name(node, "_append"), e.kernel_name(node)
    n = product(k.dims)
    grid = (GridAxis(q.dims[1]), GridAxis(Dim(op.num_heads)), GridAxis(q.dims[0]))
    args = CachedAttention(comment=e.header(node), launches=(*_one_d(e, append, n),
                                                             Dispatch(name, grid, (32, 1, 1), True)),
                           append=append, name=name, t=e.mtype(node.id), D=op.head_dim, H=op.num_heads,
                           Hkv=op.kv_heads, n=e.dim(n), S=e.dim(q.dims[1]), T=kc.dims[1].value,
                           scale=float_literal(op.softmax_scale), q=e.ptr(q_id), k=e.ptr(k_id), v=e.ptr(v_id),
                           kc=e.ptr(kc_id), vc=e.ptr(vc_id), pos=e.ptr(pos_id), flag=e.flag(), out=e.ptr(node.id))
    return _kernel(node, "block_cached_attention", args, ATTENTION)

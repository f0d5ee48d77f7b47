"""The CUDA rules: one per MIR op kind, each returning a `Kernel` with typed launch arguments.

A rule reads one scheduled node and the `CudaEmitter` (pointers, dims, the
LIR's decisions) and returns `Kernel(node, macro, template, args, headers)`:
`templates/cuda/ops.cu.j2`'s macro `macro` renders the launch from `args` (a
frozen dataclass below), and `headers` name the fixed device code under
`templates/cuda/kernels/` that the launch needs (included once, only when
used). A macro `<macro>_device`, when the kernel has a `func`, renders the
graph-specific device function (elementwise regions).

>>> sorted(r.kind for r in RULES.rules)[:3]
['activation', 'attention', 'binary']
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from rlx.codegen.common import broadcast_index
from rlx.codegen.cuda.emit import (
    _CTYPE,
    _CUDA_TYPE,
    _OPS_TEMPLATE,
    _VTYPE,
    CudaEmitter,
    Launch,
    NdArgs,
    NoWork,
    _act,
    _float_c,
    category,
)
from rlx.codegen.cuda.region_gather import REGION_KINDS, GatherLoad, absorbing_region, gathered_inputs
from rlx.codegen.region_steps import RegionStep, as_region, region_steps
from rlx.codegen.registry import Kernel, RuleSet
from rlx.codegen.text import comment
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.decisions_cuda import PoolTail
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.ir.norms import norm_inputs
from rlx.ir.shape import Dim, Shape, product
from rlx.ir.view import View, collapse
from rlx.opt.lowering_cuda import gemm_batching
from rlx.opt.lowering_cuda_kernels import (
    lt_fuses,
    mma_gemm_fits,
    small_gemm_fits,
    small_gemm_kmax,
)

OPS = "cuda/ops.cu.j2"
COPY, GATHER, ROPE = "cuda/kernels/copy.cuh", "cuda/kernels/gather.cuh", "cuda/kernels/rope.cuh"
ROWS, ATTENTION, GEMM = "cuda/kernels/rows.cuh", "cuda/kernels/attention.cuh", "cuda/kernels/gemm.cuh"
ATTENTION_SHORT, GEMM_MMA = "cuda/kernels/attention_short.cuh", "cuda/kernels/gemm_mma.cuh"
GEMM_SMALL = "cuda/kernels/gemm_small.cuh"
CUTLASS_HEADER = "cuda/kernels/gemm_cutlass.cuh"
#: rlx_gemm_mma's tile configurations (BM, BN, WARPS_M, WARPS_N), largest first: the host picks the largest
#: whose grid covers every SM (the last one otherwise).
MMA_TILES = ((128, 128, 2, 4), (64, 128, 2, 4), (16, 64, 1, 4))
#: Keys that rlx_attn_short holds in shared memory whole (encoder sequences: BERT, MiniLM).
SHORT_KV = 128

_RED = {"sum": "RLX_RED_SUM", "mean": "RLX_RED_MEAN", "max": "RLX_RED_MAX", "min": "RLX_RED_MIN",
        "prod": "RLX_RED_PROD"}
_MASK = {"none": "RLX_MASK_NONE", "causal": "RLX_MASK_CAUSAL", "padding": "RLX_MASK_PADDING",
         "bias": "RLX_MASK_BIAS"}
_FLOATS = (DType.F32, DType.F16, DType.BF16, DType.F64)
_INTS = (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8)
#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")


# ── launch arguments ─────────────────────────────────────────────────────────


@dataclass(frozen=True, kw_only=True)
class CopyNd(Launch):
    src: str
    dst: str
    ti: str
    to: str
    idx: str
    n: str
    nd: NdArgs


@dataclass(frozen=True, kw_only=True)
class Copies(Launch):
    pieces: tuple[CopyNd, ...]


@dataclass(frozen=True)
class RegionLoad:
    ctype: str
    vtype: str
    cat: str
    ptr: str
    index: str
    #: read through a gather the region does itself (rlx/codegen/cuda/region_gather.py)
    gather: GatherLoad | None = None


@dataclass(frozen=True)
class RegionOut:
    ctype: str
    cat: str


@dataclass(frozen=True)
class RegionKernel:
    """The device function of one elementwise region: loads, steps in registers, one store."""

    name: str
    comment: str
    idx: str
    out: RegionOut
    ins: tuple[RegionLoad, ...]
    steps: tuple[RegionStep, ...]
    result: str


@dataclass(frozen=True, kw_only=True)
class Region(Launch):
    kernel: str
    idx: str
    n: str
    out: str
    ins: tuple[str, ...]
    device: RegionKernel


@dataclass(frozen=True, kw_only=True)
class Gather(Launch):
    t: str
    it: str
    idx: str
    table: str
    index: str
    out: str
    outer: str
    rows: str
    nidx: str
    inner: str


@dataclass(frozen=True, kw_only=True)
class Rope(Launch):
    t: str
    neox: str
    x: str
    cos: str
    sin: str
    out: str
    rows: str
    seq: str
    heads: int
    hd: int
    rot: int


@dataclass(frozen=True, kw_only=True)
class Norm(Launch):
    t: str
    a: str
    tpr: int
    vpt: int
    vec: int
    cpt: int
    rms: str
    res_on: str
    bias_on: str
    x: str
    res: str
    bias: str
    gamma: str
    beta: str
    out: str
    rows: str
    n: int
    eps: str


@dataclass(frozen=True, kw_only=True)
class SoftmaxRows(Launch):
    t: str
    a: str
    x: str
    out: str
    tpr: int
    vpt: int
    rows: str
    n: str


@dataclass(frozen=True, kw_only=True)
class SoftmaxCols(Launch):
    t: str
    a: str
    x: str
    out: str
    outer: str
    n: str
    inner: str


@dataclass(frozen=True, kw_only=True)
class ReduceRows(Launch):
    t: str
    fn: str
    x: str
    out: str
    tpr: int
    rows: str
    nred: str


@dataclass(frozen=True, kw_only=True)
class ReduceGeneric(Launch):
    t: str
    fn: str
    x: str
    out: str
    nout: str
    nred: str
    kept: tuple[tuple[str, str], ...]
    red: tuple[tuple[str, str], ...]


@dataclass(frozen=True, kw_only=True)
class NormPrologue:
    """The normalization whose output is a small GEMM's A, computed inside rlx_gemm_small (a `NormInGemm` decision).

    `kind`: 1 layer norm, 2 RMS norm; `cpt`: 16-byte chunks per lane of a row; pointers of the norm's input,
    residual, gamma, beta and output (the GEMM's A, written by the blocks of column 0).
    """

    kind: int
    res_on: str
    cpt: int
    x: str
    res: str
    gamma: str
    beta: str
    out: str
    eps: str


@dataclass(frozen=True, kw_only=True)
class GemmCall:
    """One GEMM C = act(A B + bias): on cuBLASLt (`mode == "lt"`) or the built-in tiled kernel.

    `full_*`: the node's whole epilogue (applied after a memset when K == 0); `lt_*`: what cuBLASLt's epilogue
    fuses; `post_*`: what a separate bias/activation kernel applies after it (None: nothing).
    """

    t: str
    a: str
    b: str
    c: str
    m: str
    n: str
    k: str
    batch: str
    mode: str
    act: str
    bias_on: str
    bias: str
    full_act: str
    full_bias_on: str
    full_bias: str
    folded: bool = False
    # cuBLASLt
    cuda_type: str = ""
    sa: str = "(int64_t)0"
    sb: str = "(int64_t)0"
    lt_bias: str = "NULL"
    lt_act: str = "RLX_ACT_NONE"
    post_act: str | None = None
    post_bias_on: str = "false"
    post_bias: str = "nullptr"
    post_vec: int = 0
    # built-in: (dim, A stride, B stride) per collapsed batch dim
    bdims: tuple[tuple[str, str, str], ...] = ()
    # rlx_gemm_mma (mode "mma"): its tile configurations, largest first
    tiles: tuple[tuple[int, int, int, int], ...] = ()
    # mode "lt": steps of at most RLX_GSM_MAX_M rows run rlx_gemm_small instead (bias and activation inside)
    small: bool = False
    # ... and compute the normalization that produces A in its prologue (None: A is read as it is)
    prologue: NormPrologue | None = None
    # which operands are weights (no kernel writes them), read before the PDL wait: RLX_GSM_EARLY_* bits
    small_early: int = 0
    # mode "lt": the large steps run this CUTLASS sm90 launcher instead (bias + activation fused: a CutlassGemm
    # decision of the lowering)
    cutlass_fn: str = ""
    # the GEMM provider's choice in words (a comment in the generated source)
    note: str = ""

    @property
    def small_kernel(self) -> str:
        """The rlx_gemm_small instance of this call."""
        p = self.prologue
        norm = f"{p.kind}, {p.res_on}, {p.cpt}" if p is not None else "0, false, 1"
        return f"rlx_gemm_small<{self.t}, {self.full_act}, {self.full_bias_on}, {norm}>"

    @property
    def small_extra_args(self) -> str:
        """rlx_gemm_small's arguments after M, N, K: the normalization's (nullptrs without a prologue), `early`, no
        addend, no second B, no siblings."""
        p = self.prologue
        if p is None:
            return f"({self.t} *)nullptr, ({self.t} *)nullptr, ({self.t} *)nullptr, ({self.t} *)nullptr, " \
                   f"({self.t} *)nullptr, 0.0f, {self.small_early}, ({self.t} *)nullptr, ({self.t} *)nullptr, " \
                   "RlxGsmMembers{}"
        return f"{p.x}, {p.res}, {p.gamma}, {p.beta}, {p.out}, (float){p.eps}, {self.small_early}, " \
               f"({self.t} *)nullptr, ({self.t} *)nullptr, RlxGsmMembers{{}}"


@dataclass(frozen=True, kw_only=True)
class Gemm(Launch):
    gemm: GemmCall


@dataclass(frozen=True, kw_only=True)
class Swiglu(Launch):
    t: str
    gate: GemmCall
    up: GemmCall
    out: str
    upbuf: str
    n: str


@dataclass(frozen=True, kw_only=True)
class Attention(Launch):
    t: str
    mt: str
    D: int
    H: int
    Hkv: int
    mask: str
    mma: bool
    bk: int
    #: Skv never exceeds `short_kv` (its static bound): rlx_attn_short, the whole K/V in shared memory; 0: off.
    short_kv: int
    #: The short-KV kernel's launch: its name with template arguments, its grid and shared-memory size (C
    #: expressions of the warps per block `nw`) and the most warps per block.
    short_kern: str
    short_grid: str
    short_smem: str
    short_warps: int
    vec: str
    B: str
    q_rs: int
    k_rs: int
    v_rs: int
    Sq: str
    Skv: str
    scale: str
    bs: tuple[str, str, str, str]
    q: str
    k: str
    v: str
    m: str
    out: str


def _kernel(node: Node, macro: str, args: Launch, *headers: str, func: str = "") -> Kernel:
    # (cuBLASLt GEMMs name the GEMM header too: its bias/activation kernels run unfused epilogues and K == 0)
    return Kernel(node.id, macro, OPS, args, headers=headers, header=args.comment, func=func, label=node.label)


# ── accepts: which variants each rule takes ───────────────────────────────────


def _dtypes_in(allowed: tuple[DType, ...], what: str) -> Any:
    def accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
        bad = sorted({d.value for d in (*in_dtypes, out_dtype) if d not in allowed})
        return f"takes {what} data only, got {'/'.join(bad)}" if bad else None
    return accepts


_floats_only = _dtypes_in(_FLOATS, "floating-point")


def _gather_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return None if in_dtypes[1] in _INTS else f"takes integer indices only, got {in_dtypes[1].value}"


def _attention_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    reason = _floats_only(op, in_dtypes[:3], out_dtype)  # the mask may be of any dtype
    if reason is None and op.mask not in _MASK:  # type: ignore[attr-defined]
        reason = f"has no mask mode {op.mask!r}"  # type: ignore[attr-defined]
    return reason


def _reduce_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return None if op.fn in _RED else f"has no reduction {op.fn!r}"  # type: ignore[attr-defined]


# ── elementwise ───────────────────────────────────────────────────────────────


def _bcast_index(e: CudaEmitter, in_dims: tuple[Dim, ...], out_dims: tuple[Dim, ...], idx: str) -> str:
    """Index into an input of `in_dims` for flat output index `i`, dims read from the kernel's `sy.v`."""
    return broadcast_index(in_dims, out_dims, idx, lambda d: e.dim(d, "sy.v"))


@RULES.register(*REGION_KINDS)
def region(e: CudaEmitter, node: Node) -> Kernel:
    """Elementwise ops (alone, or fused into a region): one generated kernel, values in registers."""
    reg = as_region(node)
    in_shapes = [e.node(i).shape for i in node.inputs]
    values = reg.step_shapes(in_shapes)
    tables = [e.node(e.node(i).inputs[0]).shape for i in node.inputs if e.node(i).kind == "gather"]
    idx = e.idx_type(node.shape, *in_shapes, *tables)
    gathered = gathered_inputs(e, node, idx)  # gathers whose lookups this kernel does (their kernels are gone)
    ins = tuple(RegionLoad(e.ctype(i), _VTYPE[s.dtype], category(s.dtype), f"in{j}",
                           _bcast_index(e, tuple(s.dims), tuple(node.shape.dims), idx), gathered.get(j))
                for j, (i, s) in enumerate(zip(node.inputs, in_shapes)))
    steps = region_steps(reg, values, len(node.inputs), _VTYPE)
    # a bad index raises the flag (as rlx_gather does), and so does an integer division by zero
    uses_flag = bool(gathered) or any(s.integer and s.fn == "div" for s in steps)
    name = f"{e.prefix}region_{node.id}"
    note = "".join(f"; in{j} = %{node.inputs[j]} (gather) looked up here" for j in sorted(gathered))
    device = RegionKernel(name, e.header(node) + note, idx,
                          RegionOut(e.ctype(node.id), category(node.shape.dtype)), ins, steps,
                          f"v{len(values) - 1}")
    ptrs = tuple(f"{gathered[j].table}, {gathered[j].index}" if j in gathered else e.ptr(i)
                 for j, i in enumerate(node.inputs))
    return _kernel(node, "block_region", Region(
        **e.base(node), uses_flag=uses_flag, kernel=name, idx=idx, n=e.numel(node.shape.dims),
        out=e.ptr(node.id), ins=ptrs, device=device), *((GATHER,) if gathered else ()), func=name)


# ── data movement ─────────────────────────────────────────────────────────────


def _copy(e: CudaEmitter, node: Node, src: str, dst: str, dims: tuple[Dim, ...], src_view: View, dst_view: View,
          shapes: tuple[Shape, ...]) -> CopyNd:
    t = e.ctype(node.id)
    return CopyNd(**e.base(node), src=src, dst=dst, ti=t, to=t, idx=e.idx_type(*shapes), n=e.numel(dims),
                  nd=e.nd(dims, src_view, dst_view))


@RULES.register("transpose")
def transpose(e: CudaEmitter, node: Node) -> Kernel:
    src = e.node(node.inputs[0]).shape
    dims = tuple(node.shape.dims)
    args = _copy(e, node, e.ptr(node.inputs[0]), e.ptr(node.id), dims, View.dense(src.dims).permute(node.op.perm),
                 View.dense(dims), (src, node.shape))
    return _kernel(node, "block_copy_nd", args, COPY)


@RULES.register("expand")
def expand(e: CudaEmitter, node: Node) -> Kernel:
    src = e.node(node.inputs[0]).shape
    dims = tuple(node.shape.dims)
    args = _copy(e, node, e.ptr(node.inputs[0]), e.ptr(node.id), dims, View.dense(src.dims).broadcast_to(dims),
                 View.dense(dims), (src, node.shape))
    return _kernel(node, "block_copy_nd", args, COPY)


@RULES.register("narrow")
def narrow(e: CudaEmitter, node: Node) -> Kernel:
    src = e.node(node.inputs[0]).shape
    axis = node.op.axis % src.rank
    dims = tuple(node.shape.dims)
    # the source's strides over the narrowed dims; the start goes into the pointer
    window = View(dims, View.dense(src.dims).strides)
    start = f"({e.ptr(node.inputs[0])} + {node.op.start} * {e.dim(window.strides[axis])})"
    args = _copy(e, node, start, e.ptr(node.id), dims, window, View.dense(dims), (src, node.shape))
    return _kernel(node, "block_copy_nd", args, COPY)


@RULES.register("reshape")
def reshape(e: CudaEmitter, node: Node) -> Kernel:
    """A reshape that is not a view of its input (e.g. of an output): a dense copy."""
    src = e.node(node.inputs[0]).shape
    dims = tuple(node.shape.dims)
    dense = View.dense(dims)
    args = _copy(e, node, e.ptr(node.inputs[0]), e.ptr(node.id), dims, dense, dense, (src, node.shape))
    return _kernel(node, "block_copy_nd", args, COPY)


@RULES.register("concat")
def concat(e: CudaEmitter, node: Node) -> Kernel:
    axis = node.op.axis % node.shape.rank
    out = View.dense(node.shape.dims)
    pieces = []
    start = 0
    for i in node.inputs:
        s = e.node(i).shape
        dst = f"({e.ptr(node.id)} + {start} * {e.dim(out.strides[axis])})"
        pieces.append(_copy(e, node, e.ptr(i), dst, tuple(s.dims), View.dense(s.dims),
                            View(tuple(s.dims), out.strides), (s, node.shape)))
        start += s.dims[axis].value
    return _kernel(node, "block_copies", Copies(**e.base(node), pieces=tuple(pieces)), COPY)


@RULES.register("gather", accepts=_gather_accepts)
def gather(e: CudaEmitter, node: Node) -> Kernel:
    region = absorbing_region(e, node)
    if region is not None:
        return Kernel(node.id, "block_none", _OPS_TEMPLATE, NoWork(comment=comment(
            f"%{node.id}: looked up inside %{region}'s elementwise kernel (rlx_gather_at)"), what=""))
    table_, idx = (e.node(i).shape for i in node.inputs)
    axis = node.op.axis % table_.rank
    args = Gather(**e.base(node), uses_flag=True, t=e.ctype(node.id), it=_CTYPE[idx.dtype],
                  idx=e.idx_type(table_, idx, node.shape), table=e.ptr(node.inputs[0]), index=e.ptr(node.inputs[1]),
                  out=e.ptr(node.id), outer=e.numel(table_.dims[:axis]), rows=e.dim(table_.dims[axis]),
                  nidx=e.numel(idx.dims), inner=e.numel(table_.dims[axis + 1:]))
    return _kernel(node, "block_gather", args, GATHER)


@RULES.register("rope", accepts=_floats_only)
def rope(e: CudaEmitter, node: Node) -> Kernel:
    x = node.shape
    op = node.op
    hd = op.head_dim
    args = Rope(**e.base(node), t=e.ctype(node.id), neox=str(op.variant == "neox").lower(),
                x=e.ptr(node.inputs[0]), cos=e.ptr(node.inputs[1]), sin=e.ptr(node.inputs[2]), out=e.ptr(node.id),
                # per-row tables ([B, S, rot/2]) are indexed by the flat row: "seq" is then every row
                rows=e.numel(x.dims[:2]),
                seq=e.numel(x.dims[:2]) if e.node(node.inputs[1]).shape.rank == 3 else e.dim(x.dims[1]),
                heads=x.dims[2].value // hd, hd=hd, rot=op.rot)
    return _kernel(node, "block_rope", args, ROPE)


# ── rows: norms, softmax, reductions ──────────────────────────────────────────


def row_config(nmax: int) -> tuple[int, int]:
    """(threads per row, values cached per thread; 0 = stream the row) for rows of up to nmax elements."""
    if nmax <= 512:
        return 32, max(1, -(-nmax // 32))
    for tpr in (64, 128, 256, 512, 1024):
        if -(-nmax // tpr) <= 8:
            return tpr, -(-nmax // tpr)
    return 1024, 0


def _acc(e: CudaEmitter, nid: NodeId) -> str:
    return "double" if e.ddt(nid) is DType.F64 else "float"


@RULES.register("layer_norm", "rms_norm", "fused_residual_layer_norm", "fused_residual_rms_norm",
                accepts=_floats_only)
def norm(e: CudaEmitter, node: Node) -> Kernel:
    op = node.op
    x = node.shape
    n = x.dims[-1].value
    tpr, vpt = row_config(n)
    roles = norm_inputs(node)
    ins = list(node.inputs)
    rms, res, bias, gamma, beta = roles.rms, roles.residual, roles.bias, roles.gamma, roles.beta
    vec = 16 // e.ddt(node.id).itemsize
    ptrs = [i for i in (ins[0], res, bias, gamma, beta, node.id) if i is not None]
    cpt = 0
    # 16-byte vector loads when the row splits into whole vectors and every pointer is aligned
    if n % vec == 0 and all(e.offset(i) % 16 == 0 for i in ptrs):
        chunks = n // vec
        tpr = 32 if chunks <= 32 * 4 else min(1024, 1 << max(5, math.ceil(math.log2(-(-chunks // 4)))))
        cpt = -(-chunks // tpr)
    if cpt == 0 or cpt > 8:
        vec = cpt = 0
    none = "nullptr"
    args = Norm(**e.base(node), t=e.ctype(node.id), a=_acc(e, node.id), tpr=tpr, vpt=vpt, vec=vec, cpt=cpt,
                rms=str(rms).lower(), res_on=str(res is not None).lower(), bias_on=str(bias is not None).lower(),
                x=e.ptr(ins[0]), res=e.ptr(res) if res is not None else none,
                bias=e.ptr(bias) if bias is not None else none, gamma=e.ptr(gamma),
                beta=e.ptr(beta) if beta is not None else none, out=e.ptr(node.id), rows=e.numel(x.dims[:-1]),
                n=n, eps=_float_c(op.eps))
    k = _kernel(node, "block_norm", args, ROWS)
    into = e.norm_in_gemm.get(node.id)
    if into is not None:
        return e._large_step_only(k, x.dims[:-1], into.max_rows,
                                  f"done in the prologue of %{into.gemm}'s rlx_gemm_small")
    tail = next((d for d in e.lir.decided(PoolTail) if d.norm == (node.id,)), None)
    if tail is not None:  # short sentences: the pooling kernel normalizes (rlx_pool_tail_norm), only it reads this
        return e._large_step_only(k, x.dims[1:-1], tail.norm_max_seq,
                                  f"sentences of <= {tail.norm_max_seq} tokens: done in %{tail.out}'s pooling kernel")
    return k


@RULES.register("softmax", accepts=_floats_only)
def softmax(e: CudaEmitter, node: Node) -> Kernel:
    x = node.shape
    axis = node.op.axis % x.rank
    common = dict(**e.base(node), t=e.ctype(node.id), a=_acc(e, node.id), x=e.ptr(node.inputs[0]),
                  out=e.ptr(node.id))
    if axis == x.rank - 1:
        tpr, vpt = row_config(x.dims[-1].max)
        return _kernel(node, "block_softmax_rows", SoftmaxRows(**common, tpr=tpr, vpt=vpt,
                                                               rows=e.numel(x.dims[:-1]), n=e.dim(x.dims[-1])), ROWS)
    return _kernel(node, "block_softmax_cols", SoftmaxCols(**common, outer=e.numel(x.dims[:axis]),
                                                           n=e.dim(x.dims[axis]),
                                                           inner=e.numel(x.dims[axis + 1:])), ROWS)


@RULES.register("reduce", accepts=_reduce_accepts)
def reduce(e: CudaEmitter, node: Node) -> Kernel:
    op = node.op
    x = e.node(node.inputs[0]).shape
    axes = op.normalized_axes(x.rank)
    common = dict(**e.base(node), t=e.ctype(node.id), fn=_RED[op.fn], x=e.ptr(node.inputs[0]), out=e.ptr(node.id))
    kept = [k for k in range(x.rank) if k not in axes]
    red_dims = [x.dims[k] for k in axes]
    nred = e.numel(red_dims)
    if tuple(axes) == tuple(range(x.rank - len(axes), x.rank)):
        tpr = 32 if product(red_dims).max <= 2048 else 256
        return _kernel(node, "block_reduce_rows", ReduceRows(**common, tpr=tpr,
                                                             rows=e.numel([x.dims[k] for k in kept]), nred=nred), ROWS)
    dense = View.dense(x.dims)
    kd, (kv,) = collapse([x.dims[k] for k in kept], dense.permute(kept))
    rd, (rv,) = collapse(red_dims, dense.permute(axes))
    return _kernel(node, "block_reduce_generic", ReduceGeneric(
        **common, nout=e.numel(kd), nred=nred, kept=tuple((e.dim(d), e.dim(s)) for d, s in zip(kd, kv.strides)),
        red=tuple((e.dim(d), e.dim(s)) for d, s in zip(rd, rv.strides))), ROWS)


# ── matrix products ───────────────────────────────────────────────────────────


def _gemm(e: CudaEmitter, a_id: NodeId, b_id: NodeId, out_ptr: str, out: Shape, bias: NodeId | None,
          act: str | None, out_off: int | None = None, gemm_id: NodeId | None = None) -> GemmCall:
    """The call of one GEMM (`gemm_id`: its node, whose CUTLASS decision an unfused activation looks up)."""
    a, b = e.node(a_id).shape, e.node(b_id).shape
    dt = e.ddt(a_id)
    M, K, N = a.dims[-2], a.dims[-1], b.dims[-1]
    ob = list(out.dims[:-2])
    t = _CTYPE[dt]
    bias_ptr = e.ptr(bias) if bias is not None else "nullptr"
    common: dict[str, Any] = dict(t=t, a=e.ptr(a_id), b=e.ptr(b_id), c=out_ptr, k=e.dim(K), n=e.dim(N),
                                  act=_act(act), bias_on=str(bias is not None).lower(), bias=bias_ptr,
                                  full_act=_act(act), full_bias_on=str(bias is not None).lower(), full_bias=bias_ptr)
    batching = gemm_batching(a, b, out)
    if batching is not None and batching.folded:
        # One B for every batch: fold the batch into M (A and C are contiguous).
        common.update(m=e.numel([*ob, M]), batch="(int64_t)1", folded=True)
    else:
        common.update(m=e.dim(M), batch=e.numel(ob), folded=False)
    if e.target.gemm == "cublaslt" and dt in _CUDA_TYPE and batching is not None:
        fold = batching.folded
        fuse_act = fold and lt_fuses(act, e.target.lt_gelu_epilogue)
        offsets = [e.offset(a_id), e.offset(b_id), out_off] + ([e.offset(bias)] if bias is not None else [])
        if e.target.fused_act_gemm and act is not None and not fuse_act and mma_gemm_fits(dt, fold, K, N, offsets):
            return GemmCall(**common, mode="mma", tiles=MMA_TILES)
        fuse_bias = fold and bias is not None
        post_act = act if (act is not None and not fuse_act) else None
        post_bias = bias is not None and not fuse_bias
        vec = 16 // dt.itemsize
        aligned = out_off is not None and out_off % 16 == 0 and (bias is None or e.offset(bias) % 16 == 0)
        small = _small_fits(e, dt, fold, K, N, offsets)
        cut = e.cutlass.get(gemm_id) if gemm_id is not None and post_act is not None else None
        if post_act is not None and cut is None:
            raise BuildError(f"GEMM %{gemm_id}: its {post_act} has no CUTLASS decision in the LIR (lower it for "
                             "CUDA)")
        if cut is not None and cut.function:
            return GemmCall(**common, mode="lt", small=small, cuda_type=_CUDA_TYPE[dt], cutlass_fn=cut.function,
                            note=f"CUTLASS sm90 GEMM, bias and {act} in its epilogue (cuBLASLt cannot fuse {act})")
        return GemmCall(**common, mode="lt", small=small, cuda_type=_CUDA_TYPE[dt], sa=e.dim(batching.a_stride),
                        sb=e.dim(batching.b_stride), lt_bias=bias_ptr if fuse_bias else "NULL",
                        lt_act=_act(act if fuse_act else None),
                        post_act=_act(post_act) if (post_act is not None or post_bias) else None,
                        post_bias_on=str(post_bias).lower(), post_bias=bias_ptr if post_bias else "nullptr",
                        post_vec=vec if (aligned and N.is_static and N.value % vec == 0) else 0,
                        note=comment(f"cuBLASLt, then a {post_act} pass; not on CUTLASS: {cut.why}", 200)
                        if cut is not None else "")
    if batching is not None:
        bdims = () if batching.folded else ((common["batch"], e.dim(batching.a_stride), e.dim(batching.b_stride)),)
        return GemmCall(**common, mode="tiled", bdims=bdims)
    # an irregular batch broadcast: walk the batch dims with per-operand strides (0 where broadcast)
    mk, kn = M * K, K * N
    av = View.dense(a.dims[:-2]).broadcast_to(ob)
    bv = View.dense(b.dims[:-2]).broadcast_to(ob)
    av = View(av.dims, tuple(s * mk for s in av.strides))
    bv = View(bv.dims, tuple(s * kn for s in bv.strides))
    bd, (ca, cb) = collapse(ob, av, bv)
    return GemmCall(**common, mode="tiled",
                    bdims=tuple((e.dim(d), e.dim(x), e.dim(y)) for d, x, y in zip(bd, ca.strides, cb.strides)))


def _small_fits(e: CudaEmitter, dt: DType, folded: bool, K: Dim, N: Dim, offsets: list[int | None]) -> bool:
    """rlx_gemm_small can take the few-row steps (`small_gemm_fits` for this target)."""
    return small_gemm_fits(e.target.small_gemm, e.target.arch, dt, folded, K, N, offsets)


def _small_attrs(e: CudaEmitter, g: GemmCall) -> tuple[tuple[str, str], ...]:
    """rlx_gemm_small's dynamic shared memory limit (raised once, at rlx_create, for the largest K it takes on the
    target's arch: within what the GPU lets a block opt into)."""
    if not g.small:
        return ()
    return ((g.small_kernel, f"rlx_gemm_small_smem({small_gemm_kmax(e.target.arch)})"),)


def is_weight(e: CudaEmitter, nid: NodeId) -> bool:
    """`nid`'s bytes are a param or constant (through views): no kernel writes them during a run."""
    b = e.lir.buffers[nid]
    while b.storage == "view":
        b = e.lir.buffers[b.source]
    return b.storage in ("param", "const")


def _small_call(e: CudaEmitter, g: GemmCall, lead: Node, weight: bool, bias: NodeId | None) -> GemmCall:
    """`g` (a small-path GEMM led by `lead`) with its norm prologue and which of its operands are weights."""
    p = _norm_prologue(e, lead)
    params = [bias] if bias is not None else []
    if p is not None:  # the norm's gamma (and beta): its inputs after x (and the residual)
        norm = e.node(lead.inputs[0])
        params += list(norm_inputs(norm).params)
    return replace(g, prologue=p, small_early=small_early(e, weight, params))


def small_early(e: CudaEmitter, b_is_weight: bool, params: list[NodeId]) -> int:
    """rlx_gemm_small's `early` bits: B (bit 0) and the bias / norm params (bit 1) are read before the PDL wait
    where no kernel writes them."""
    return (1 if b_is_weight else 0) | (2 if all(is_weight(e, i) for i in params) else 0)


def _norm_prologue(e: CudaEmitter, lead: Node) -> NormPrologue | None:
    """The prologue of the small GEMM led by `lead` when its A's norm is fused into it (a `NormInGemm` decision)."""
    a = e.node(lead.inputs[0])
    into = e.norm_in_gemm.get(a.id)
    if into is None or into.gemm != lead.id:
        return None
    return norm_prologue(e, a)


def norm_prologue(e: CudaEmitter, a: Node) -> NormPrologue:
    """rlx_gemm_small's prologue computing norm `a` (its output is the GEMM's A)."""
    roles = norm_inputs(a)
    fused = roles.residual is not None
    k = a.shape.dims[-1].value
    return NormPrologue(kind=roles.kernel_kind, res_on=str(fused).lower(), cpt=-(-k // 256), x=e.ptr(roles.x),
                        res=e.ptr(roles.residual) if fused else "nullptr", gamma=e.ptr(roles.gamma),
                        beta=e.ptr(roles.beta) if roles.beta is not None else "nullptr", out=e.ptr(a.id),
                        eps=_float_c(a.op.eps))


def _grouped_gemm(e: CudaEmitter, node: Node) -> Kernel:
    """The leader of a QKV group: one cuBLASLt GEMM against the combined weight (see `GemmGroup`)."""
    g = e.groups[node.id]
    dt = e.ddt(node.id)
    t = _CTYPE[dt]
    a = e.node(node.inputs[0]).shape
    total = g.row_stride
    has_bias = g.bias_offset >= 0
    act = getattr(node.op, "activation", None)
    fuse_act = lt_fuses(act, e.target.lt_gelu_epilogue)
    w_ptr = f"RLX_P({t}, {g.weight_offset})"
    b_ptr = f"RLX_P({t}, {g.bias_offset})" if has_bias else "nullptr"
    small = _small_fits(e, dt, True, a.dims[-1], Dim(total),
                        [e.offset(node.inputs[0]), g.weight_offset, g.out_offset]
                        + ([g.bias_offset] if has_bias else []))
    call = GemmCall(t=t, a=e.ptr(node.inputs[0]), b=w_ptr, c=f"RLX_P({t}, {g.out_offset})",
                    m=e.numel(a.dims[:-1]), n=f"(int64_t){total}", k=e.dim(a.dims[-1]), batch="(int64_t)1",
                    mode="lt", small=small, act=_act(act), bias_on=str(has_bias).lower(), bias=b_ptr,
                    cuda_type=_CUDA_TYPE[dt], lt_bias=b_ptr if has_bias else "NULL",
                    lt_act=_act(act if fuse_act else None),
                    post_act=_act(act) if (act is not None and not fuse_act) else None,
                    full_act=_act(act), full_bias_on=str(has_bias).lower(), full_bias=b_ptr, folded=True)
    if small:
        # the combined weight and bias are params (GemmGroup takes only those)
        call = _small_call(e, call, node, True, None)
    names = ", ".join(f"%{m}" for m in g.members)
    args = Gemm(**{**e.base(node), "comment": comment(
        f"%{node.id} and its siblings {names}: one GEMM against their combined [K, {total}] weight; each output "
        f"is a column slice (row stride {total})", 160)}, uses_lt=True, smem_attrs=_small_attrs(e, call), gemm=call)
    return _kernel(node, "block_gemm", args, GEMM, *((GEMM_SMALL,) if small else ()))


@RULES.register("matmul", "fused_matmul_bias_act", accepts=_floats_only)
def matmul(e: CudaEmitter, node: Node) -> Kernel:
    if node.id in e.groups:
        return _grouped_gemm(e, node)
    bias = node.inputs[2] if len(node.inputs) == 3 else None
    act = node.op.activation if isinstance(node.op, O.FusedMatMulBiasAct) else None
    g = _gemm(e, node.inputs[0], node.inputs[1], e.ptr(node.id), node.shape, bias, act, e.offset(node.id), node.id)
    if g.small:
        g = _small_call(e, g, node, is_weight(e, node.inputs[1]), bias)
    if g.cutlass_fn:
        return _kernel(node, "block_gemm", Gemm(**e.base(node), uses_lt=True, smem_attrs=_small_attrs(e, g), gemm=g),
                       GEMM, CUTLASS_HEADER, *((GEMM_SMALL,) if g.small else ()))
    if g.mode == "mma":
        smem = tuple((f"rlx_gemm_mma<{g.t}, {g.act}, {g.bias_on}, {bm}, {bn}, {wm}, {wn}>",
                      f"RlxGemmMma<{bm}, {bn}, {wm}, {wn}>::total") for bm, bn, wm, wn in g.tiles)
        return _kernel(node, "block_gemm", Gemm(**e.base(node), smem_attrs=smem, gemm=g), GEMM, GEMM_MMA)
    return _kernel(node, "block_gemm", Gemm(**e.base(node), uses_lt=g.mode == "lt", smem_attrs=_small_attrs(e, g),
                                            gemm=g), GEMM, *((GEMM_SMALL,) if g.small else ()))


@RULES.register("fused_swiglu", accepts=_floats_only)
def swiglu(e: CudaEmitter, node: Node) -> Kernel:
    """silu(x Wg) * (x Wu): the up product goes to scratch (sized by the lowering), then one combine kernel."""
    x, wg, wu = node.inputs
    upbuf = f"RLX_P({e.ctype(node.id)}, RLX_OFF_SCRATCH)"
    gate = _gemm(e, x, wg, e.ptr(node.id), node.shape, None, None)
    up = _gemm(e, x, wu, upbuf, node.shape, None, None)
    args = Swiglu(**e.base(node), uses_lt=gate.mode == "lt", t=e.ctype(node.id), gate=gate, up=up,
                  out=e.ptr(node.id), upbuf=upbuf, n=e.numel(node.shape.dims))
    return _kernel(node, "block_swiglu", args, GEMM)


# ── attention ─────────────────────────────────────────────────────────────────


@RULES.register("attention", accepts=_attention_accepts)
def attention(e: CudaEmitter, node: Node) -> Kernel:
    op = node.op
    q, k = (e.node(i).shape for i in node.inputs[:2])
    dt = e.ddt(node.id)
    t = _CTYPE[dt]
    D, H, Hkv = op.head_dim, op.num_heads, op.kv_heads
    mask_id = node.inputs[3] if len(node.inputs) > 3 else None
    mt = e.ctype(mask_id) if mask_id is not None else "uint8_t"
    bs = ("(int64_t)0",) * 4
    if op.mask == "bias" and mask_id is not None:
        m = e.node(mask_id).shape
        # the bias read as [B, H, Sq, Skv]: missing and size-1 axes broadcast (stride 0)
        mdims = [Dim(1)] * (4 - m.rank) + list(m.dims)
        bs = tuple(e.dim(s) for s in View.dense(m.dims).broadcast_to(mdims).strides)
    mma = dt in (DType.F16, DType.BF16) and D % 16 == 0 and D <= 128
    offs = [e.offset(i) for i in node.inputs[:3]] + [e.offset(node.id)]
    q_id, k_id, v_id = node.inputs[:3]
    q_rs, k_rs, v_rs = e.row_stride(q_id, H * D), e.row_stride(k_id, Hkv * D), e.row_stride(v_id, Hkv * D)
    vec = D % 8 == 0 and all(o % 16 == 0 for o in offs) and all(r % 8 == 0 for r in (q_rs, k_rs, v_rs))
    mask = _MASK[op.mask]
    # keys per tile: 64 measured faster than 128 on an H100 for BERT shapes (more blocks resident per SM)
    bk = 64 if D > 64 or e.target.attn_bk < 64 else e.target.attn_bk
    # every key of a (batch, head) fits in shared memory: one cp.async batch per block, no barrier per tile
    short_kv = SHORT_KV if (e.target.short_attention and mma and vec and D <= 64 and k.dims[1].max <= SHORT_KV) else 0
    short_kern, short_warps = "", e.target.attn_warps or 8
    short_grid = "dim3((unsigned)((p.Sq + 16 * nw - 1) / (16 * nw)), (unsigned)p.H, (unsigned)p.B)"
    short_smem = f"RlxShortSmem<{D}, {short_kv}>::total(nw)"
    if short_kv:
        # rlx_attn_short2 (fewer instructions per score) unless the first kernel is asked for; attn_pipe: its
        # persistent form. Keys in chunks of attn_bk, by default 64 (3 blocks of 8 warps per SM at head_dim 32:
        # measured faster on an H100 than one 128-key pass at 2 blocks per SM), except for the persistent
        # form at head_dim <= 32: 128 (its tile state spills at 64 keys' register budget)
        kbk = e.target.attn_bk or (128 if D <= 32 and e.target.attn_pipe else 64)
        if e.target.short_attention_v1:
            short_kern = f"rlx_attn_short<{t}, {mt}, {D}, {mask}, {short_kv}>"
        elif e.target.attn_pipe:
            short_kern = f"rlx_attn_short2p<{t}, {mt}, {D}, {mask}, {short_kv}, {kbk}>"
            short_grid = f"dim3((unsigned)RlxShort2Pipe<{D}, {short_kv}, {kbk}>::grid(p, nw, c->num_sms))"
            short_smem = f"RlxShort2Pipe<{D}, {short_kv}, {kbk}>::smem(nw)"
        else:
            short_kern = f"rlx_attn_short2<{t}, {mt}, {D}, {mask}, {short_kv}, {kbk}>"
        smem: tuple[tuple[str, str], ...] = ((short_kern, short_smem.replace("(nw)", f"({short_warps})")),)
    elif mma:
        smem = tuple((f"rlx_attn_fa<{t}, {mt}, {D}, {mask}, {str(vec).lower()}, {nw}, {bk}>",
                      f"RlxFaSmem<{D}, {nw}, {bk}>::total") for nw in (1, 4))
    else:
        smem = ((f"rlx_attn_rows<{t}, {mt}, {D}, {mask}>", f"rlx_attn_rows_smem<{t}, {D}>()"),)
    args = Attention(**e.base(node), smem_attrs=smem, t=t, mt=mt, D=D, H=H, Hkv=Hkv, mask=mask, mma=mma, bk=bk,
                     short_kv=short_kv, short_kern=short_kern, short_grid=short_grid, short_smem=short_smem,
                     short_warps=short_warps,
                     vec=str(vec).lower(), B=e.dim(q.dims[0]), q_rs=q_rs, k_rs=k_rs, v_rs=v_rs, Sq=e.dim(q.dims[1]),
                     Skv=e.dim(k.dims[1]), scale=_float_c(op.softmax_scale), bs=bs, q=e.ptr(q_id), k=e.ptr(k_id),
                     v=e.ptr(v_id), m=e.ptr(mask_id) if mask_id is not None else "nullptr", out=e.ptr(node.id))
    return _kernel(node, "block_attention", args, ATTENTION, *((ATTENTION_SHORT,) if short_kv else ()))


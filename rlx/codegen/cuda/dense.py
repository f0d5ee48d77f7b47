"""The one-row decode GEMV over dense 16-bit weights: the launch of a `DecodeGemv` of walk "dense".

A float projection of an f16 / bf16 build keeps its GEMM (cuBLASLt, the small GEMM, the built-in one) for steps of
more than one row; in one-row steps its group's first member launches rlx_dgemv
(`templates/cuda/kernels/dense_gemv.cuh`) over the members' weights as they sit in the params region ([K, N] in the
compute type), with the RMS norm producing x, the residual add or a `fused_swiglu`'s gate and up products absorbed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch, _float_c
from rlx.codegen.registry import Kernel
from rlx.codegen.text import comment
from rlx.ir import ops as O
from rlx.ir.decisions_cuda import DecodeGemv
from rlx.ir.dtype import DType
from rlx.opt.lowering_cuda import DENSE_GEMV_SPLIT_AUTO, dense_gemv_splits

TEMPLATE = "cuda/dense.cu.j2"
QUANT, DENSE = "cuda/kernels/quant.cuh", "cuda/kernels/dense_gemv.cuh"
#: a GEMV whose reduce makes its sum over the clique (AllReduceP2P.gemv): the exchange buffers and that reduce
EXCHANGE, DENSE_AR = "cuda/kernels/exchange.cuh", "cuda/kernels/dense_gemv_ar.cuh"
#: Threads of a block (RLX_DGEMV_THREADS), 16-byte loads a thread issues a step (RLX_DGEMV_LOADS) and the tile
#: widths the host picks from (lg: 8 << lg columns, kernels/dense_gemv.cuh; lg 4..6 mostly with K split).
THREADS, LOADS, LGS = 512, 4, (0, 1, 2, 3, 4, 5, 6)


def dgemv_smem_floats(k: int, lg: int, nm: int) -> int:
    """rlx_dgemv_smem: x padded to whole steps, then the thread sums (floats)."""
    kr = THREADS >> lg
    step = LOADS // nm * kr
    return -(-k // step) * step + kr * (nm * (8 << lg) + 1)


@dataclass(frozen=True)
class SumOverClique:
    """A row-parallel GEMV's one-row launch that also sums over the clique (kernels/dense_gemv_ar.cuh): under `cond`
    (the one-shot sum's condition) the split rlx_dgemv (even of one split) then `reduce`, which writes the sum of the
    ranks' rows (plus `res` when set) into `out`, `n` columns, for the sum `node`."""

    cond: str
    reduce: str
    res: str
    out: str
    n: int
    node: int


@dataclass(frozen=True, kw_only=True)
class DenseGemvLaunch(Launch):
    """Launch arguments of `block_dense_gemv`: rlx_dgemv in one-row steps, `inner` (the first member's own kernel)
    in larger ones."""

    inner: Kernel
    #: rlx_dgemv without and with the K split (template arguments T, BF, NORM, EPI, VEC, SPLIT), the split's
    #: rlx_dgemv_reduce, and the rows of X (a C expression)
    kernel: str
    split_kernel: str
    reduce: str
    m: str
    x: str
    gamma: str
    eps: str
    res: str
    k: int
    #: matrices a tile reads (2: a fused_swiglu's gate and up)
    nm: int
    ws: tuple[str, ...]
    ys: tuple[str, ...]
    ns: tuple[int, ...]
    #: the tiles' lg (8 << lg columns) when the decision forces it (`DecodeGemv.dense_tile`); -1: chosen per launch
    lg: int = -1
    #: the K splits when forced (`DecodeGemv.dense_split`; 1: none); 0: chosen per launch, at most `max_split`
    split: int = 0
    max_split: int = DENSE_GEMV_SPLIT_AUTO
    #: the sum over the clique this GEMV makes in one-row steps (AllReduceP2P.gemv), else None
    ar: SumOverClique | None = None


def dense_decode_gemv(e: CudaEmitter, d: DecodeGemv, inner: Kernel) -> Kernel:
    """The first member's kernel `inner` wrapped: one-row steps launch rlx_dgemv for the whole group."""
    members = [e.node(m) for m in d.members]
    lead = members[0]
    t = e.ctype(lead.id)
    x = lead.inputs[0]
    k = e.node(x).shape.dims[-1].value
    gamma, eps = "nullptr", "0.0"
    if d.norm:
        norm = e.node(d.norm[0])
        x, gamma, eps = norm.inputs[0], e.ptr(norm.inputs[1]), _float_c(norm.op.eps)
    res, epi = "nullptr", 0
    if isinstance(lead.op, O.FusedSwiGLU):
        epi, ws, ys = 2, lead.inputs[1:], (e.ptr(lead.id), "nullptr")
    else:
        ws, ys = tuple(m.inputs[1] for m in members), tuple(e.ptr(m.id) for m in members)
    if d.residual:
        add = e.node(d.residual[0])
        other = add.inputs[1] if add.inputs[0] == lead.id else add.inputs[0]
        res, epi, ys = e.ptr(other), 1, (e.ptr(add.id),)
    ns = tuple(e.node(w).shape.dims[-1].value for w in ws)
    vec = all(n % 8 == 0 for n in ns) and all(e.offset(w) % 16 == 0 for w in ws)
    bf = e.ddt(lead.id) is DType.BF16
    nm = 2 if epi == 2 else 1
    targs = f"{t}, {str(bf).lower()}, {str(bool(d.norm)).lower()}, {epi}, {str(vec).lower()}"
    kernel, split_kernel = f"rlx_dgemv<{targs}, false>", f"rlx_dgemv<{targs}, true>"
    # (a split's x is KC <= K rows: the unsplit bound covers it)
    smem = max(dgemv_smem_floats(k, lg, nm) for lg in LGS) * 4
    splits = dense_gemv_splits(d)
    big = (kernel, split_kernel) if splits > 1 else (kernel,)
    ar = None
    total = e.sum_by_gemv.get(lead.id)
    if total is not None:
        res, out = "nullptr", e.ptr(total.node)
        if total.residual:
            add = e.node(total.residual[0])
            res, out = e.ptr(next(a for a in add.inputs if a != total.node)), e.ptr(add.id)
        ar = SumOverClique(cond=e.p2p_condition(total), node=total.node, res=res, out=out, n=ns[0],
                           reduce=f"rlx_dgemv_reduce_ar<{t}, {str(bool(total.residual)).lower()}, "
                                  f"{e.node(total.node).op.world}>")
    attrs = inner.args.smem_attrs + (tuple((kn, str(smem)) for kn in big) if smem > 48 * 1024 else ())
    what = ", ".join(f"%{m}" for m in d.members) + "".join(f" + %{n}" for n in (*d.norm, *d.residual))
    note = comment(f"{what}: one dense {'bf16' if bf else 'f16'} GEMV over the weights as stored ([{k}, N]) in "
                   f"one-row steps" + (" (the fused_swiglu's gate and up together)" if epi == 2 else ""), 160)
    args = DenseGemvLaunch(comment=note, what=inner.args.what, uses_flag=inner.args.uses_flag,
                           uses_lt=inner.args.uses_lt, smem_attrs=attrs, pdl=inner.args.pdl, inner=inner,
                           kernel=kernel, split_kernel=split_kernel, reduce=f"rlx_dgemv_reduce<{t}, {epi}>",
                           m=e.numel(e.node(lead.inputs[0]).shape.dims[:-1]), x=e.ptr(x),
                           gamma=gamma, eps=eps, res=res, k=k, nm=nm,
                           ws=tuple(f"(const uint8_t *){e.ptr(w)}" for w in ws), ys=ys, ns=ns,
                           lg=d.dense_tile.bit_length() - 4 if d.dense_tile else -1, split=d.dense_split,
                           max_split=splits, ar=ar)
    headers = (EXCHANGE, DENSE_AR) if ar is not None else ()
    return dataclasses.replace(inner, macro="block_dense_gemv", template=TEMPLATE, args=args,
                               headers=(*inner.headers, QUANT, DENSE, *headers))

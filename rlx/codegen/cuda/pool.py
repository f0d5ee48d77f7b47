"""The CUDA code of a `PoolTail` decision: a sentence-embedding tail as one `rlx_pool_tail` launch.

`rlx/opt/lowering_cuda_pool.py` decides which tails run this way; here the last node of the tail renders the
launch (`templates/cuda/pool.cu.j2`, kernel in `templates/cuda/kernels/pool.cuh`) and every absorbed node
renders nothing. When the decision says so, the kernel writes the graph output in its ABI dtype straight into
the output's staging copy, and the model template skips that output's conversion pass.

>>> pool_vec(384, 2, 0), pool_vec(384, 2, 8), pool_vec(20, 4, 0), pool_vec(20, 2, 0)
(8, 1, 4, 1)
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import _CTYPE, _OPS_TEMPLATE, CudaEmitter, Launch, NoWork, _float_c
from rlx.codegen.registry import Kernel
from rlx.codegen.text import comment
from rlx.ir.decisions_cuda import PoolTail
from rlx.ir.norms import norm_inputs

POOL_HEADER = "cuda/kernels/pool.cuh"
POOL_TEMPLATE = "cuda/pool.cu.j2"
#: Threads of one block (one sentence).
POOL_THREADS = 256


@dataclass(frozen=True, kw_only=True)
class PoolTailArgs(Launch):
    t: str
    m: str
    o: str
    vec: int
    norm: str
    x: str
    mask: str
    out: str
    batch: str
    seq: str
    hidden: int
    eps_count: str
    eps_norm: str
    threads: int
    # the norm computed in the kernel for short sentences (nk 0: none; 1 layer norm, 2 RMS norm)
    nk: int = 0
    nres: str = "false"
    nvec: int = 1
    ncpt: int = 0
    nx: str = "nullptr"
    nres_ptr: str = "nullptr"
    ngamma: str = "nullptr"
    nbeta: str = "nullptr"
    neps: str = "0.0"
    norm_max_seq: int = 0
    norm_note: str = ""


def pool_vec(hidden: int, itemsize: int, offset: int) -> int:
    """Elements per load: one 16-byte load when the rows (and the base, byte `offset`) are 16-byte aligned."""
    vec = 16 // itemsize
    return vec if hidden % vec == 0 and offset % 16 == 0 else 1


def _norm_fields(e: CudaEmitter, d: PoolTail, hidden: int) -> dict:
    """rlx_pool_tail_norm's template data for the norm `d.norm` (16-byte loads when every row and pointer allows)."""
    if not d.norm:
        return {}
    norm = e.node(d.norm[0])
    roles = norm_inputs(norm)  # rlx_pool_tail_norm's NK is roles.kernel_kind
    nk, res = roles.kernel_kind, roles.residual is not None
    ins = list(norm.inputs)
    dt = e.ddt(norm.id)
    vec = min((pool_vec(hidden, dt.itemsize, e.offset(i)) for i in ins), default=1)
    vec = min(vec, pool_vec(hidden, dt.itemsize, 0))
    return dict(nk=nk, nres=str(res).lower(), nvec=vec, ncpt=-(-hidden // (vec * 32)), nx=e.ptr(ins[0]),
                nres_ptr=e.ptr(roles.residual) if res else "nullptr", ngamma=e.ptr(roles.gamma),
                nbeta=e.ptr(roles.beta) if roles.beta is not None else "nullptr", neps=_float_c(norm.op.eps),
                norm_max_seq=d.norm_max_seq,
                norm_note=f"short sentences: %{norm.id} ({norm.kind}) computed here from its inputs, its kernel "
                          "skipped")


def emit_pool_tail(e: CudaEmitter, d: PoolTail) -> Kernel:
    """The launch of tail `d` (rendered at its last node, `d.out`)."""
    x, out = e.node(d.hidden), e.node(d.out)
    b, s, h = x.shape.dims
    dt = e.ddt(d.hidden)
    if d.abi_output >= 0:
        o_type, o_ptr = _CTYPE[out.shape.dtype], f"RLX_P({_CTYPE[out.shape.dtype]}, " \
                                                  f"{e.layout.outputs[d.abi_output].staging})"
    else:
        o_type, o_ptr = e.ctype(d.out), e.ptr(d.out)
    what = "masked mean + L2 normalization" if d.normalized else "masked mean"
    into = f", written as output {d.abi_output} ({o_type})" if d.abi_output >= 0 else ""
    args = PoolTailArgs(
        comment=comment(f"%{d.out}: {what} of %{d.hidden} over the sequence (mask %{d.mask}), one kernel "
                        f"for %{' %'.join(str(n) for n in d.absorbed)} %{d.out}{into}"),
        what=e.what(out), pdl=e.target.pdl, t=_CTYPE[dt], m=e.ctype(d.mask), o=o_type,
        vec=min(pool_vec(h.value, dt.itemsize, e.offset(d.hidden)), pool_vec(h.value, dt.itemsize, 0)),
        norm=str(d.normalized).lower(), x=e.ptr(d.hidden), mask=e.ptr(d.mask), out=o_ptr, batch=e.dim(b),
        seq=e.dim(s), hidden=h.value, eps_count=_float_c(d.eps_count), eps_norm=_float_c(d.eps_norm),
        threads=POOL_THREADS, **_norm_fields(e, d, h.value))
    return Kernel(d.out, "block_pool_tail", POOL_TEMPLATE, args, headers=(POOL_HEADER,), header=args.comment,
                  label=out.label)


def pool_absorbed(d: PoolTail, nid: int) -> Kernel:
    """What an absorbed node of tail `d` renders: nothing."""
    return Kernel(nid, "block_none", _OPS_TEMPLATE, NoWork(
        comment=comment(f"%{nid}: computed inside %{d.out}'s pooling kernel"), what=""))


def pool_kernel(e: CudaEmitter, d: PoolTail, nid: int) -> Kernel:
    """The kernel of node `nid` of tail `d`: the launch at its last node, nothing at the others."""
    return emit_pool_tail(e, d) if nid == d.out else pool_absorbed(d, nid)


#: The kernel of each node a decision of this module's kind covers (`rlx.codegen.cuda.decision_kernels`).
DECISION_KERNELS = {PoolTail.kind: pool_kernel}

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

from rlx.codegen.c import comment
from rlx.codegen.cuda_emit import _CTYPE, _OPS_TEMPLATE, DECISION_KERNELS, CudaEmitter, Launch, NoWork, _float_c
from rlx.codegen.registry import Kernel
from rlx.ir.decisions_cuda import PoolTail

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


def pool_vec(hidden: int, itemsize: int, offset: int) -> int:
    """Elements per load: one 16-byte load when the rows (and the base, byte `offset`) are 16-byte aligned."""
    vec = 16 // itemsize
    return vec if hidden % vec == 0 and offset % 16 == 0 else 1


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
        threads=POOL_THREADS)
    return Kernel(d.out, "block_pool_tail", POOL_TEMPLATE, args, headers=(POOL_HEADER,), header=args.comment,
                  label=out.label)


def pool_absorbed(d: PoolTail, nid: int) -> Kernel:
    """What an absorbed node of tail `d` renders: nothing."""
    return Kernel(nid, "block_none", _OPS_TEMPLATE, NoWork(
        comment=comment(f"%{nid}: computed inside %{d.out}'s pooling kernel"), what=""))


def pool_kernel(e: CudaEmitter, d: PoolTail, nid: int) -> Kernel:
    """The kernel of node `nid` of tail `d`: the launch at its last node, nothing at the others."""
    return emit_pool_tail(e, d) if nid == d.out else pool_absorbed(d, nid)


DECISION_KERNELS[PoolTail.kind] = pool_kernel

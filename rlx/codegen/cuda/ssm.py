"""CUDA rules for the state-space and linear-attention ops (`rlx/ir/ops_ssm.py`).

Registered into the CUDA rule table when imported (by `rlx.codegen.backends`).
Device code: `templates/cuda/kernels/ssm.cuh`; launches: `templates/cuda/ssm.cu.j2`.
selective_scan runs one warp per (batch row, channel), or, for prefill with few
rows x channels, chunks of time scanned in parallel and joined by a pass over the
chunks' final states (chosen at run time from the sequence length and the GPU's
SM count; the chunk states live in the scratch region, sized by
`rlx.opt.lowering_cuda.scratch_need`). gated_delta_net runs one warp per
(batch row, head, value column) — the state's columns evolve independently —
or, for prefill (sequence >= GDN_CHUNK_MIN_SEQ, state size <= 64), the chunked
WY form: every chunk's triangular system solved in parallel, then one pass
over the chunks per (row, head, column tile) of small matrix products.
The carried forms (a recurrent cache, Mamba-2 and Qwen3-Next decoding) read a state input and update it in
place: the scan's and the delta rule's state enter and leave the kernels above; a carried conv launches
`rlx_conv_state_update` after the conv, which keeps each row's last k-1 real inputs (`lengths`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch, _float_c
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir import ops as O
from rlx.ir import ops_ssm as S
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.opt.lowering_cuda import GDN_CHUNK_MIN_SEQ, SSM_MIN_CHUNK, SSM_WARPS_PER_SM, gdn_segments, ssm_segments

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/ssm.cu.j2"
HEADER = "cuda/kernels/ssm.cuh"
#: State sizes the kernels hold on chip: 32 lanes x RLX_SSM_PER_LANE registers; N x N floats of shared memory.
SSM_MAX_N = 256
GDN_MAX_N = 256
#: Value columns (warps) per block of the gated delta rule kernel (RLX_GDN_COLS in kernels/ssm.cuh).
GDN_COLS = 8


@dataclass(frozen=True, kw_only=True)
class SelectiveScanLaunch(Launch):
    t: str
    x: str
    delta: str
    a: str
    bm: str
    cm: str
    state_in: str
    state_out: str
    state_note: str
    y: str
    batch: str
    seq: str
    channels: str
    n: int
    min_chunk: int
    warps_per_sm: int
    max_segments: int


@dataclass(frozen=True, kw_only=True)
class GatedDeltaNetLaunch(Launch):
    t: str
    q: str
    k: str
    v: str
    g: str
    beta: str
    state_in: str
    state_out: str
    o: str
    batch: str
    seq: str
    heads: str
    n: int
    scale: str
    regs: int
    cols: int
    tiles: int
    chunk_segments: int
    chunk_min_seq: int
    prep_threads: int


@dataclass(frozen=True, kw_only=True)
class DwConvLaunch(Launch):
    t: str
    x: str
    w: str
    pad: str
    y: str
    batch: str
    seq: str
    channels: str
    ksize: int
    reverse: bool
    state_out: str
    lengths: str


def _accepts(limit: int | None):
    def accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
        floats = (DType.F32, DType.F16, DType.BF16)
        # (a carried conv's fourth input is its i32 lengths, checked by the op)
        data = in_dtypes[:3] if isinstance(op, S.DepthwiseConv1dCausal) else in_dtypes
        bad = sorted({d.value for d in (*data, out_dtype) if d not in floats})
        if bad:
            return f"on {', '.join(bad)}; it takes f32, f16 or bf16"
        if limit is not None and op.state_size > limit:  # type: ignore[attr-defined]
            return f"with state_size {op.state_size} > {limit}"  # type: ignore[attr-defined]
        return None

    return accepts


def _carried(e: CudaEmitter, sid: NodeId) -> tuple[str, str]:
    """(state in, state out) of a carried state: a caller-owned state input is updated in place (like a KV
    cache); any other tensor is only read."""
    src = e.node(sid).op
    return e.ptr(sid), e.ptr(sid) if isinstance(src, O.Input) and src.state else "nullptr"


def selective_scan(e: CudaEmitter, node: Node) -> Kernel:
    x, d, a, b, c = node.inputs[:5]
    bsz, seq, h = node.shape.dims
    state_in, state_out = _carried(e, node.inputs[5]) if node.op.carry_state else ("nullptr", "nullptr")  # type: ignore[attr-defined]
    note = ("from zero" if state_in == "nullptr" else "from the given state" if state_out == "nullptr"
            else "carried in and out of the state input")
    args = SelectiveScanLaunch(**e.base(node), t=e.ctype(node.id), x=e.ptr(x), delta=e.ptr(d), a=e.ptr(a),
                               bm=e.ptr(b), cm=e.ptr(c), state_in=state_in, state_out=state_out, state_note=note,
                               y=e.ptr(node.id), batch=e.dim(bsz), seq=e.dim(seq),
                               channels=e.dim(h), n=node.op.state_size,  # type: ignore[attr-defined]
                               min_chunk=SSM_MIN_CHUNK, warps_per_sm=SSM_WARPS_PER_SM,
                               max_segments=ssm_segments(bsz.max, h.max, seq.max))
    return Kernel(node.id, "block_selective_scan", TEMPLATE, args, headers=(HEADER,), header=args.comment,
                  label=node.label)


def gated_delta_net(e: CudaEmitter, node: Node) -> Kernel:
    op: S.GatedDeltaNet = node.op  # type: ignore[assignment]
    q, k, v, g, beta = node.inputs[:5]
    bsz, seq, h, _n = node.shape.dims
    state_in, state_out = _carried(e, node.inputs[5]) if op.carry_state else ("nullptr", "nullptr")
    regs = 1 << max(0, (-(-op.state_size // 32) - 1).bit_length())  # rows per lane: 1, 2, 4 or 8
    args = GatedDeltaNetLaunch(**e.base(node), t=e.ctype(node.id), q=e.ptr(q), k=e.ptr(k), v=e.ptr(v), g=e.ptr(g),
                               beta=e.ptr(beta), state_in=state_in, state_out=state_out, o=e.ptr(node.id),
                               batch=e.dim(bsz), seq=e.dim(seq), heads=e.dim(h), n=op.state_size,
                               scale=_float_c(op.q_scale), regs=regs, cols=GDN_COLS,
                               tiles=-(-op.state_size // GDN_COLS),
                               chunk_segments=gdn_segments(bsz.max, h.max, seq.max, op.state_size),
                               chunk_min_seq=GDN_CHUNK_MIN_SEQ, prep_threads=-(-2 * op.state_size // 32) * 32)
    return Kernel(node.id, "block_gated_delta_net", TEMPLATE, args, headers=(HEADER,), header=args.comment,
                  label=node.label)


def dwconv(e: CudaEmitter, node: Node) -> Kernel:
    x, w = node.inputs[:2]
    bsz, seq, ch = node.shape.dims
    pad = e.ptr(node.inputs[2]) if len(node.inputs) > 2 else "nullptr"
    state_out = lengths = "nullptr"
    if node.op.carry_state:  # type: ignore[attr-defined]
        state_out, lengths = _carried(e, node.inputs[2])[1], e.ptr(node.inputs[3])
    args = DwConvLaunch(**e.base(node), uses_flag=state_out != "nullptr", t=e.ctype(node.id), x=e.ptr(x), w=e.ptr(w),
                        pad=pad, y=e.ptr(node.id), batch=e.dim(bsz), seq=e.dim(seq), channels=e.dim(ch),
                        ksize=node.op.kernel_size, reverse=node.op.reverse,  # type: ignore[attr-defined]
                        state_out=state_out, lengths=lengths)
    return Kernel(node.id, "block_dwconv1d_causal", TEMPLATE, args, headers=(HEADER,), header=args.comment,
                  label=node.label)


RULES.register("selective_scan", accepts=_accepts(SSM_MAX_N))(selective_scan)
RULES.register("gated_delta_net", accepts=_accepts(GDN_MAX_N))(gated_delta_net)
RULES.register("depthwise_conv1d_causal", accepts=_accepts(None))(dwconv)

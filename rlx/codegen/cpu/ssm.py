"""CPU rules for the state-space and linear-attention ops of `rlx/ir/ops_ssm.py`.

Registered into the CPU rule table when imported (by `rlx.codegen.backends` and
`rlx.codegen.cpu.emit`). Each rule binds the node's buffers and sizes into a frozen
args record; the loops are in `templates/cpu/kernels/ssm.h`, parallel over
batch x heads with each task's state held in a local array.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import c_string, node_header
from rlx.codegen.registry import Kernel, RuleSet, float32_only
from rlx.ir import ops as O
from rlx.ir import ops_ssm as S
from rlx.ir.dtype import DType
from rlx.ir.graph import Node

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "ssm.c.j2"
HEADERS = ("kernels/ssm.h",)
#: Largest state sizes the kernels hold on the stack (RLX_SSM_MAX_N / RLX_GDN_MAX_N in kernels/ssm.h).
SSM_MAX_N = 256
GDN_MAX_N = 128


@dataclass(frozen=True)
class SelectiveScanArgs:
    """C expressions of one `selective_scan` kernel."""

    x: str
    delta: str
    a: str
    b: str
    c: str
    state_in: str
    state_out: str
    state_note: str
    y: str
    batch: str
    seq: str
    channels: str
    n: int


@dataclass(frozen=True)
class GatedDeltaNetArgs:
    """C expressions of one `gated_delta_net` kernel; `state_in`/`state_out` are NULL when absent."""

    q: str
    k: str
    v: str
    g: str
    beta: str
    state_in: str
    state_out: str
    state_note: str
    o: str
    batch: str
    seq: str
    heads: str
    n: int
    scale: str


@dataclass(frozen=True)
class DwConvArgs:
    """C expressions of one `depthwise_conv1d_causal` kernel; `pad` is NULL without a left pad, `state_out`
    (the carried conv state, updated in place) NULL unless the pad is a state input and `lengths` given."""

    x: str
    w: str
    pad: str
    y: str
    batch: str
    seq: str
    channels: str
    ksize: int
    reverse: bool
    state_out: str = "NULL"
    lengths: str = "NULL"
    label: str = '""'


def _kernel(node: Node, macro: str, args: object) -> Kernel:
    label = c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))
    return Kernel(node.id, macro, TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label)


def _carried(em, sid: int) -> tuple[str, str, str]:
    """(state in, state out, note) of a carried state: a caller-owned state input is updated in place."""
    src = em.node(sid).op
    if isinstance(src, O.Input) and src.state:
        return em.ptr(sid), f"((float *){em.base(sid)})", ", carried in and out of the state input"
    return em.ptr(sid), "NULL", ", starting from the given state"


def emit_selective_scan(em, node: Node) -> Kernel:
    """The `selective_scan` kernel of a `selective_scan` node; a carried state input receives the final state."""
    x, d, a, b, c = node.inputs[:5]
    bsz, seq, h = node.shape.dims
    state_in, state_out, note = _carried(em, node.inputs[5]) if node.op.carry_state else ("NULL", "NULL", ", from zero")
    args = SelectiveScanArgs(x=em.ptr(x), delta=em.ptr(d), a=em.ptr(a), b=em.ptr(b), c=em.ptr(c),
                             state_in=state_in, state_out=state_out, state_note=note,
                             y=em.ptr(node.id, const=False), batch=em.dim(bsz), seq=em.dim(seq),
                             channels=em.dim(h), n=node.op.state_size)
    return _kernel(node, "selective_scan", args)


def emit_gated_delta_net(em, node: Node) -> Kernel:
    """The `gated_delta_net` kernel; a carried state that is a state input receives the final state."""
    op: S.GatedDeltaNet = node.op  # type: ignore[assignment]
    q, k, v, g, beta = node.inputs[:5]
    bsz, seq, h, _ = node.shape.dims
    # a caller-owned state buffer (like a KV cache) is updated in place
    state_in, state_out, note = _carried(em, node.inputs[5]) if op.carry_state else ("NULL", "NULL", ", from zero")
    args = GatedDeltaNetArgs(q=em.ptr(q), k=em.ptr(k), v=em.ptr(v), g=em.ptr(g), beta=em.ptr(beta),
                             state_in=state_in, state_out=state_out, state_note=note,
                             o=em.ptr(node.id, const=False), batch=em.dim(bsz), seq=em.dim(seq), heads=em.dim(h),
                             n=op.state_size, scale=repr(float(op.q_scale)))
    return _kernel(node, "gated_delta_net", args)


def emit_dwconv(em, node: Node) -> Kernel:
    """The `dwconv1d_causal` kernel of a `depthwise_conv1d_causal` node."""
    x, w = node.inputs[:2]
    bsz, seq, ch = node.shape.dims
    pad = em.ptr(node.inputs[2]) if len(node.inputs) > 2 else "NULL"
    state_out = lengths = "NULL"
    if node.op.carry_state:
        state_out = _carried(em, node.inputs[2])[1]
        lengths = em.ptr(node.inputs[3])
    label = c_string(f"%{node.id} {node.kind}")
    args = DwConvArgs(x=em.ptr(x), w=em.ptr(w), pad=pad, y=em.ptr(node.id, const=False), batch=em.dim(bsz),
                      seq=em.dim(seq), channels=em.dim(ch), ksize=node.op.kernel_size, reverse=node.op.reverse,
                      state_out=state_out, lengths=lengths, label=label)
    return _kernel(node, "dwconv1d_causal", args)


def _state_limit(limit: int):
    def accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
        reason = float32_only(op, in_dtypes, out_dtype)
        if reason is None and op.state_size > limit:  # type: ignore[attr-defined]
            return f"with state_size {op.state_size} > {limit}"  # type: ignore[attr-defined]
        return reason

    return accepts


def _dwconv_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    """f32 data; the carried form's lengths are i32 (checked by the op)."""
    return float32_only(op, in_dtypes[:3], out_dtype)


RULES.register("selective_scan", accepts=_state_limit(SSM_MAX_N))(emit_selective_scan)
RULES.register("gated_delta_net", accepts=_state_limit(GDN_MAX_N))(emit_gated_delta_net)
RULES.register("depthwise_conv1d_causal", accepts=_dwconv_accepts)(emit_dwconv)

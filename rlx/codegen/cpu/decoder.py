"""CPU rules for decoder ops: attention over a KV cache (`cached_attention`).

Registered into the CPU rule table when `rlx.codegen.cpu.emit` is imported. The
kernel appends this step's keys and values to the caller-owned cache buffers
(state inputs) and runs causal grouped-query attention over the cache with
the same packed-GEMM building blocks as `attention` (`kernels/attention.h`),
or for the few query rows of a decode step plain dot products (`kernels/kv_decode.h`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import ATTN_QBLOCK, PACK_NR_MAX, align64, c_string, node_header, round_up
from rlx.codegen.registry import Kernel, RuleSet, float32_only
from rlx.ir import ops as O
from rlx.ir.graph import Node

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "decoder.c.j2"
#: The most query rows per sequence a step may have and still take the decode path, whose rows are
#: computed independently of each other (batch-invariant): 1 + the longest speculative proposal
#: (`rlx.models.speculative.AdaptiveK.k_max`) that verifies with exactly the one-row arithmetic.
DECODE_ROWS = 9
#: The most query heads per kv head the decode path takes (RLX_KV_MAX_GROUP in kernels/kv_decode.h).
KV_MAX_GROUP = 64
HEADERS = ("kernels/packed_gemm.h", "kernels/attention.h", "kernels/kv_decode.h")


@dataclass(frozen=True)
class KvAttentionArgs:
    """C expressions and sizes of one `cached_attention` kernel (macro `kv_attention`)."""

    label: str
    q: str
    k: str
    v: str
    k_cache: str
    v_cache: str
    positions: str
    o: str
    batch: str
    sq: str
    capacity: int
    heads: int
    kv_heads: int
    group: int
    hd: int
    scale: str
    qblock: int
    kp_offset: int
    vp_offset: int
    #: Steps of at most this many query rows per sequence run the batch-invariant decode path
    #: (kernels/kv_decode.h): decode rows, and speculative verification of up to decode_rows - 1 tokens.
    decode_rows: int = DECODE_ROWS
    #: Sliding-window width (0: every earlier key).
    window: int = 0
    #: The paged layout's page size (0: contiguous caches), its block table, pages per row and pool size.
    paged: int = 0
    block_table: str = ""
    max_pages: int = 0
    num_pages: int = 0
    #: Paged prefill: where a task gathers its row's keys and values in its scratch.
    gather_offset: int = 0




def emit_kv_attention(em, node: Node) -> Kernel:
    """The `kv_attention` kernel of a `cached_attention` node."""
    op: O.CachedAttention = node.op  # type: ignore[assignment]
    q_id, k_id, v_id, kc_id, vc_id, pos_id = node.inputs[:6]
    q = em.node(q_id).shape
    cache = em.node(kc_id).shape
    table = em.node(node.inputs[6]).shape if op.paged else None
    capacity = op.capacity(cache, table)
    # per thread: the score tile (qblock x capacity), then K^T and V of one kv head in packed panels
    kp_offset = align64(ATTN_QBLOCK * capacity * 4)
    vp_offset = kp_offset + align64(op.head_dim * round_up(capacity, PACK_NR_MAX) * 4)
    scratch = vp_offset + align64(capacity * round_up(op.head_dim, PACK_NR_MAX) * 4)
    paged: dict = {}
    if op.paged:  # a prefill task's row gathered from its pages: K and V of one kv head, [capacity, hd] each
        paged = dict(paged=op.page_size, block_table=em.ptr(node.inputs[6]), max_pages=table.dims[1].value,
                     num_pages=cache.dims[0].value, gather_offset=scratch)
        scratch += align64(2 * capacity * op.head_dim * 4)
    # decode steps use the first capacity floats of the score tile (one query row's scores)
    label = c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))
    args = KvAttentionArgs(
        label=label, q=em.ptr(q_id), k=em.ptr(k_id), v=em.ptr(v_id),
        # the caches are state inputs the kernel updates in place
        k_cache=f"((float *){em.base(kc_id)})", v_cache=f"((float *){em.base(vc_id)})",
        positions=em.ptr(pos_id), o=em.ptr(node.id, const=False),
        batch=em.dim(q.dims[0]), sq=em.dim(q.dims[1]), capacity=capacity,
        heads=op.num_heads, kv_heads=op.kv_heads, group=op.num_heads // op.kv_heads, hd=op.head_dim,
        scale=repr(float(op.softmax_scale)), qblock=ATTN_QBLOCK, kp_offset=kp_offset, vp_offset=vp_offset,
        window=op.window or 0, **paged,
        # a decode task holds its G heads' maxima and sums on the stack (RLX_KV_MAX_GROUP in kernels/kv_decode.h)
        decode_rows=DECODE_ROWS if op.num_heads // op.kv_heads <= KV_MAX_GROUP else 0)
    return Kernel(node.id, "kv_attention", TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label, scratch_per_thread=scratch)


def _kv_attention_dtypes(op: O.Op, in_dtypes: tuple, out_dtype) -> str | None:
    # q, k, v and both caches f32; the positions (and a block table) are i32 by the op's own check
    if in_dtypes[3] != in_dtypes[0]:
        return (f"with {in_dtypes[3].value} KV caches beside {in_dtypes[0].value} queries (caches narrower than the "
                f"compute run on CUDA; give them f32 here)")
    return float32_only(op, in_dtypes[:5], out_dtype)


RULES.register("cached_attention", accepts=_kv_attention_dtypes)(emit_kv_attention)

"""CUDA rules for decoder ops: attention over a KV cache (`cached_attention`).

Registered into the CUDA rule table when `rlx.codegen.cuda` is imported. The caches are
state inputs: the run stages them on the device like any input and copies them back to
the caller's buffer afterwards (`templates/cuda/model.cu.j2`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch, _float_c
from rlx.codegen.registry import Kernel, RuleSet
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/decoder.cu.j2"
HEADER = "cuda/kernels/kv_attention.cuh"
#: The largest head dim the attend kernel spreads over one block's threads.
MAX_HEAD_DIM = 256
#: Threads (and warps) of one attend block, and the most new keys it rotates itself: RLX_KV_THREADS and
#: RLX_KV_ROPE_ROWS in kernels/kv_attention.cuh.
KV_THREADS, KV_WARPS, KV_ROPE_ROWS = 256, 8, 4


@dataclass(frozen=True, kw_only=True)
class KvAttention(Launch):
    t: str
    q: str
    k: str
    v: str
    k_cache: str
    v_cache: str
    positions: str
    out: str
    batch: str
    sq: str
    capacity: int
    kw: int
    heads: int
    kv_heads: int
    hd: int
    scale: str
    threads: int
    smem: int
    #: DecodeRope: in steps of <= rope_rows rows the kernel rotates the raw projections itself.
    rope_rows: int = 0
    raw_q: str = ""
    raw_k: str = ""
    cos: str = ""
    sin: str = ""
    rot: int = 0
    neox: str = "false"
    per_row: int = 0
    #: DecodeSplitKv: in steps of <= split_rows rows a query's keys split over up to max_splits blocks.
    max_splits: int = 1
    split_rows: int = 0
    split_keys: int = 1
    partials: str = "(float *)nullptr"
    counters: str = "(int32_t *)nullptr"
    #: The paged layout (kernels/kv_attention.cuh, PAGED): page size (0: contiguous), block table, its width
    #: and the pool's pages; `paged_args` the attend kernel's last four arguments.
    paged: int = 0
    block_table: str = ""
    max_pages: int = 0
    num_pages: int = 0
    paged_args: str = "(const int32_t *)nullptr, (int64_t)1, (int64_t)0, (int64_t)0"


def _accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    floats = (DType.F32, DType.F16, DType.BF16)
    bad = sorted({d.value for d in (*in_dtypes[:5], out_dtype) if d not in floats})
    return f"on {', '.join(bad)}; it takes f32, f16 or bf16" if bad else None


def kv_attention(e: CudaEmitter, node: Node) -> Kernel:
    op: O.CachedAttention = node.op  # type: ignore[assignment]
    if op.window is not None:
        raise BuildError(f"cached_attention with a sliding window ({op.window}) has no CUDA kernel yet "
                         f"(node {node.label}); run this model on the CPU")
    if op.head_dim > MAX_HEAD_DIM:
        raise BuildError(f"cached_attention head_dim {op.head_dim} exceeds {MAX_HEAD_DIM} on CUDA (node {node.label})")
    q_id, k_id, v_id, kc_id, vc_id, pos_id = node.inputs[:6]
    q = e.node(q_id).shape
    cache = e.node(kc_id).shape
    table = e.node(node.inputs[6]).shape if op.paged else None
    capacity = op.capacity(cache, table)  # per row
    paged: dict = {}
    if op.paged:
        bt = e.ptr(node.inputs[6])
        paged = dict(paged=op.page_size, block_table=bt, max_pages=table.dims[1].value, num_pages=cache.dims[0].value,
                     paged_args=f"{bt}, (int64_t){op.page_size}, (int64_t){table.dims[1].value}, "
                                f"(int64_t){cache.dims[0].value}")
    threads = KV_THREADS
    # the query row, reductions, partial sums, rotated new keys, scores
    smem = (op.head_dim + KV_WARPS + KV_WARPS * op.head_dim + KV_ROPE_ROWS * op.head_dim + capacity) * 4
    t = e.ctype(node.id)
    rope: dict = {}
    variants = [(False, False)]
    d = e.decode_rope.get(node.id)
    if d is not None:
        if d.max_rows > KV_ROPE_ROWS:
            raise BuildError(f"DecodeRope of {d.max_rows} rows exceeds the kernel's {KV_ROPE_ROWS} (node {node.label})")
        rq = e.node(d.ropes[0])
        neox = rq.op.variant == "neox"
        rope = dict(rope_rows=d.max_rows, raw_q=e.ptr(rq.inputs[0]), raw_k=e.ptr(e.node(d.ropes[1]).inputs[0]),
                    cos=e.ptr(rq.inputs[1]), sin=e.ptr(rq.inputs[2]), rot=rq.op.rot, neox=str(neox).lower(),
                    per_row=int(e.node(rq.inputs[1]).shape.rank == 3))
        variants.append((True, neox))
    split: dict = {}
    ds = e.decode_split.get(node.id)
    if ds is not None:
        split = dict(max_splits=ds.max_splits, split_rows=ds.max_rows, split_keys=ds.split_keys,
                     partials="RLX_P(float, RLX_OFF_SCRATCH)", counters="RLX_P(int32_t, RLX_OFF_COUNTERS)")
    attrs = tuple((f"rlx_kv_attend<{t}, {op.head_dim}, {str(r).lower()}, {str(n).lower()}>", str(smem))
                  for r, n in variants)
    args = KvAttention(**e.base(node), uses_flag=True, smem_attrs=attrs, **rope, **split, **paged,
                       t=t, q=e.ptr(q_id), k=e.ptr(k_id), v=e.ptr(v_id), k_cache=e.ptr(kc_id), v_cache=e.ptr(vc_id),
                       positions=e.ptr(pos_id), out=e.ptr(node.id), batch=e.dim(q.dims[0]), sq=e.dim(q.dims[1]),
                       capacity=capacity, kw=op.kv_heads * op.head_dim, heads=op.num_heads, kv_heads=op.kv_heads,
                       hd=op.head_dim, scale=_float_c(op.softmax_scale), threads=threads, smem=smem)
    return Kernel(node.id, "block_kv_attention", TEMPLATE, args, headers=(HEADER,), header=args.comment,
                  label=node.label)


RULES.register("cached_attention", accepts=_accepts)(kv_attention)

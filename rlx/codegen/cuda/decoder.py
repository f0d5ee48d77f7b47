"""CUDA rules for decoder ops: attention over a KV cache (`cached_attention`).

Registered into the CUDA rule table when `rlx.codegen.cuda` is imported. The caches are
state inputs: the run stages them on the device like any input and copies them back to
the caller's buffer afterwards (`templates/cuda/model.cu.j2`), or keeps them resident. Decode
steps run rlx_kv_decode (kernels/kv_decode.cuh) where the lowering chose it (`DecodeSplitKv.grouped`),
larger steps rlx_kv_attend (kernels/kv_attention.cuh). The caches may be narrower than the compute
(f16/bf16 beside f32), and a sliding window limits each query to its last `window` keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch, _float_c
from rlx.codegen.registry import Kernel, RuleSet
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.opt.lowering_cuda import KVD_MAX_SPLITS

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/decoder.cu.j2"
HEADER = "cuda/kernels/kv_attention.cuh"
#: The grouped decode kernel (rlx_kv_decode, `DecodeSplitKv.grouped`).
DECODE_HEADER = "cuda/kernels/kv_decode.cuh"
#: An f8e4m3fn cache's type and conversions (included before the kernels that read it).
F8_HEADER = "cuda/kernels/kv_f8.cuh"
#: The C type the kernels take a cache of each dtype as (the others: the emitter's storage type).
CACHE_CTYPES = {DType.F8E4M3FN: "__nv_fp8_e4m3"}
#: The largest head dim the attend kernel spreads over one block's threads.
MAX_HEAD_DIM = 256
#: Threads (and warps) of one attend block, and the most new keys it rotates itself: RLX_KV_THREADS and
#: RLX_KV_ROPE_ROWS in kernels/kv_attention.cuh.
KV_THREADS, KV_WARPS, KV_ROPE_ROWS = 256, 8, 4
#: Threads (and warps) of one rlx_kv_decode block and the most new rows of a step it stages: RLX_KVD_THREADS,
#: RLX_KVD_WARPS and RLX_KVD_NEW_ROWS in kernels/kv_decode.cuh.
KVD_THREADS, KVD_WARPS, KVD_NEW_ROWS = 128, 4, 4


@dataclass(frozen=True, kw_only=True)
class KvAttention(Launch):
    t: str
    #: the caches' element type (the compute type t, or a narrower one)
    kt: str
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
    #: sliding-window width (0: every earlier key)
    window: int = 0
    #: DecodeRope: in steps of <= rope_rows tokens a row the kernel rotates the raw projections itself (and a
    #: paged cache's append kernel the keys it stores).
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
    #: DecodeSplitKv.grouped: steps of <= row_tokens tokens a row (any number of rows) run rlx_kv_decode (group
    #: query heads per block, dec_smem bytes of shared memory); longer ones run rlx_kv_attend unsplit.
    grouped: bool = False
    row_tokens: int = 0
    group: int = 1
    dec_smem: int = 0
    dec_threads: int = KVD_THREADS
    #: The paged layout (kernels/kv_attention.cuh, PAGED): page size (0: contiguous), block table, its width
    #: and the pool's pages; `paged_args` the attention kernels' last four arguments.
    paged: int = 0
    block_table: str = ""
    max_pages: int = 0
    num_pages: int = 0
    paged_args: str = "(const int32_t *)nullptr, (int64_t)1, (int64_t)0, (int64_t)0"
    #: DecodeSplitKv.stores_rows: the distinct-rows hint's length (a C expression, "1" without the hint): at 2,
    #: rlx_kv_decode stores each row's keys itself and no append launch runs before it.
    stores_rows: bool = False
    distinct: str = "1"


def _accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    floats = (DType.F32, DType.F16, DType.BF16)
    bad = sorted({d.value for d in (*in_dtypes[:3], out_dtype) if d not in floats}
                 | {d.value for d in in_dtypes[3:5] if d not in (*floats, *CACHE_CTYPES)})
    return f"on {', '.join(bad)}; it takes f32, f16 or bf16 (and f8e4m3fn caches)" if bad else None


def kv_attention(e: CudaEmitter, node: Node) -> Kernel:
    op: O.CachedAttention = node.op  # type: ignore[assignment]
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
    window = op.window or 0
    # a block's scores: at most the keys one query sees (the capacity, or the window)
    keys = min(capacity, window) if window else capacity
    hd = op.head_dim
    # the query row, reductions, partial sums, rotated new keys, scores
    smem = (hd + KV_WARPS + KV_WARPS * hd + KV_ROPE_ROWS * hd + keys) * 4
    t, kt = e.ctype(node.id), CACHE_CTYPES.get(e.ddt(kc_id), e.ctype(kc_id))
    win = str(bool(window)).lower()
    rope: dict = {}
    variants = [(False, False)]
    d = e.decode_rope.get(node.id)
    if d is not None:
        if d.max_rows > KV_ROPE_ROWS:
            raise BuildError(f"DecodeRope of {d.max_rows} tokens a row exceeds the kernel's {KV_ROPE_ROWS} "
                             f"(node {node.label})")
        rq = e.node(d.ropes[0])
        neox = rq.op.variant == "neox"
        rope = dict(rope_rows=d.max_rows, raw_q=e.ptr(rq.inputs[0]), raw_k=e.ptr(e.node(d.ropes[1]).inputs[0]),
                    cos=e.ptr(rq.inputs[1]), sin=e.ptr(rq.inputs[2]), rot=rq.op.rot, neox=str(neox).lower(),
                    per_row=int(e.node(rq.inputs[1]).shape.rank == 3))
        variants.append((True, neox))
    split: dict = {}
    f8 = (F8_HEADER,) if e.ddt(kc_id) in CACHE_CTYPES else ()
    headers = (*f8, HEADER)
    attrs = tuple((f"rlx_kv_attend<{t}, {kt}, {hd}, {str(r).lower()}, {str(n).lower()}>", str(smem))
                  for r, n in variants)
    ds = e.decode_split.get(node.id)
    if ds is not None:
        split = dict(max_splits=ds.max_splits, split_rows=ds.max_rows, split_keys=ds.split_keys)
        if ds.max_splits > 1:
            split.update(partials="RLX_P(float, RLX_OFF_SCRATCH)", counters="RLX_P(int32_t, RLX_OFF_COUNTERS)")
        if ds.grouped:
            if (d is not None and d.max_rows > KVD_NEW_ROWS) or not 0 < ds.row_tokens <= KVD_NEW_ROWS:
                raise BuildError(f"decode steps of {ds.row_tokens} tokens a row exceed rlx_kv_decode's "
                                 f"{KVD_NEW_ROWS} (node {node.label})")
            # the G query rows, the step's new keys and values, the warps' states (reused by the last block's
            # merge for every warp's G x HD sums) and the merge's weight of each split (rlx_kvd_smem_floats)
            states = KVD_WARPS * ds.group * (hd + 2)
            dec_smem = (ds.group * hd + 2 * KVD_NEW_ROWS * hd + states + ds.group * KVD_MAX_SPLITS) * 4
            split.update(grouped=True, row_tokens=ds.row_tokens, group=ds.group, dec_smem=dec_smem)
            if ds.stores_rows:  # the distinct-rows hint's length, a symbol of the run: at 2 the kernel stores
                paged.update(stores_rows=True, distinct=e.dim(e.node(node.inputs[7]).shape.dims[0]))
            headers = (*f8, HEADER, DECODE_HEADER)
            pg = str(bool(op.paged)).lower()
            attrs += tuple((f"rlx_kv_decode<{t}, {kt}, {hd}, {ds.group}, {str(r).lower()}, {str(n).lower()}, {win}, "
                            f"{pg}>", str(dec_smem)) for r, n in variants)
    args = KvAttention(**e.base(node), uses_flag=True, smem_attrs=attrs, **rope, **split, **paged,
                       t=t, kt=kt, q=e.ptr(q_id), k=e.ptr(k_id), v=e.ptr(v_id),
                       k_cache=f"RLX_P({kt}, {e.offset(kc_id)})", v_cache=f"RLX_P({kt}, {e.offset(vc_id)})",
                       positions=e.ptr(pos_id), out=e.ptr(node.id), batch=e.dim(q.dims[0]),
                       sq=e.dim(q.dims[1]), capacity=capacity, kw=op.kv_heads * hd, heads=op.num_heads,
                       kv_heads=op.kv_heads, hd=hd, scale=_float_c(op.softmax_scale), threads=KV_THREADS, smem=smem,
                       window=window)
    return Kernel(node.id, "block_kv_attention", TEMPLATE, args, headers=headers, header=args.comment,
                  label=node.label)


RULES.register("cached_attention", accepts=_accepts, narrow=frozenset(CACHE_CTYPES))(kv_attention)

"""CUDA lowering passes: which GEMMs run together, and the byte layout of the one device allocation.

`cuda_decisions(lir, precision=..., gemm=...)`, the first half of `LOWERINGS["cuda"]`
(`rlx.opt.lowering_cuda_kernels.cuda_lowering` adds the kernel choices made from its layout),
returns `GemmGroup` records (Q/K/V projections of one activation run as a
single cuBLASLt GEMM), `DecodeGemv` records (quantized projections of a decode
step run as one GEMV launch with their norm and epilogue), `DecodeRope`
records (decode queries and keys rotated inside the attention kernel),
`DecodeSplitKv` records (a decode query's keys split over several blocks) and
one `DeviceLayout`. The CUDA codegen only reads
them. Both depend on the compute precision (f32 tensors are stored in it on
the device) and on the GEMM provider (groups and the cuBLASLt workspace exist
only with cuBLASLt), so those are options of the lowering.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> from rlx.opt.lowering import lower_for
>>> g = Graph("demo")
>>> x = g.input("x", [4, 8])
>>> g.set_outputs([g.activation("relu", x)])
>>> lir = lower_for(plan(g), "cuda", precision="f16", gemm="builtin")
>>> layout = lir.decisions[0]
>>> layout.inputs  # the f32 input is staged at 0, converted into its f16 copy at 256
(Staged(dev=256, staging=0),)
>>> layout.total, layout.uses_lt
(1280, False)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from rlx.ir import ops as O
from rlx.ir.decisions import Decision
from rlx.ir.decisions_cuda import (
    AllReduceP2P,
    ControlFlow,
    DecodeGemv,
    DecodeRope,
    DecodeSplitKv,
    DequantCopy,
    DeviceLayout,
    GemmGroup,
    ParamPlacement,
    QuantMma,
    Region,
    SampleFromArgmax,
    ScanConstants,
    Staged,
)
from rlx.ir.dtype import DType, f32_to_bf16
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.lir import LirModule
from rlx.ir.ops_control import Cond, WhileLoop, step_bodies
from rlx.ir.ops_moe import MoeMatMul
from rlx.ir.ops_ssm import GatedDeltaNet, SelectiveScan
from rlx.ir.shape import Dim, Shape
from rlx.opt.control import parse_fallback
from rlx.opt.fusion import is_silu_times, scheduled_runs
from rlx.opt.lowering_cuda_pool import find_pool_tails
from rlx.opt.lowering_moe import cuda_scratch_bytes
from rlx.opt.memplan import plan
from rlx.opt.scan_body import step_graph

PRECISIONS = (DType.F32, DType.F16, DType.BF16)
GEMM_MODES = ("cublaslt", "builtin")
#: Data types cuBLASLt runs (the others use the built-in tiled GEMM).
LT_DTYPES = (DType.F32, DType.F16, DType.BF16)
#: cuBLASLt workspace (Hopper kernels want up to 32 MiB).
LT_WORKSPACE = 32 << 20
#: Most KV splits of the decode attention path (its partials live in the scratch region).
ATTN_MAX_SPLITS = 64
#: Decode attention over a KV cache (`DecodeSplitKv`): the fewest keys one block of a split query takes, and the
#: most rows a step may have for its queries to split (decode steps; a prefill step has blocks enough).
KV_SPLIT_KEYS = 256
KV_SPLIT_ROWS = 4
#: The grouped decode kernel (rlx_kv_decode, `DecodeSplitKv.grouped`): the fewest keys of a split block, the most
#: splits, the most query heads per KV head (its registers hold each head's state), the largest head dim, the
#: blocks per SM its splits aim for, and the SM count assumed when the target names none (H100 / H200 SXM).
KVD_SPLIT_KEYS = 64
KVD_MAX_SPLITS = 128  # RLX_KVD_MAX_SPLITS in kernels/kv_decode.cuh sizes the merge for it
KVD_MAX_GROUP = 8
KVD_MAX_HEAD_DIM = 256
KVD_BLOCKS_PER_SM = 2
DEFAULT_SMS = 132
#: The most tokens a row of a step may hold for rlx_kv_decode to run it (it stages a row's new keys and values in
#: shared memory: RLX_KVD_NEW_ROWS); any number of rows.
KVD_ROW_TOKENS = 4
#: Alignment of every span of the device allocation.
ALIGN = 256

_GEMM_OPS = (O.MatMul, O.FusedMatMulBiasAct)


def device_dtype(dt: DType, precision: DType) -> DType:
    """f32 tensors are stored and computed in the session precision; other dtypes as declared."""
    return precision if dt is DType.F32 else dt


@dataclass(frozen=True)
class GemmBatching:
    """How a batched GEMM's operands walk the batch when it is regular enough for a strided-batched call.

    `folded`: one B for every batch, so the batch folds into M. Otherwise `a_stride` / `b_stride` are the
    element strides between batches (None: the operand is shared by every batch).
    """

    folded: bool
    a_stride: Dim | None
    b_stride: Dim | None


def gemm_batching(a: Shape, b: Shape, out: Shape) -> GemmBatching | None:
    """The strided-batched form of `a @ b -> out`, or None when the batch broadcast is irregular."""
    M, K, N = a.dims[-2], a.dims[-1], b.dims[-1]
    ob = list(out.dims[:-2])
    ab = [Dim(1)] * (len(ob) - (a.rank - 2)) + list(a.dims[:-2])
    bb = [Dim(1)] * (len(ob) - (b.rank - 2)) + list(b.dims[:-2])
    if all(d == 1 for d in bb) and ab == ob:
        return GemmBatching(True, None, None)
    if ab == ob and bb == ob:
        return GemmBatching(False, M * K, K * N)
    if all(d == 1 for d in ab) and bb == ob:
        return GemmBatching(False, None, K * N)
    return None


def runs_on_lt(gemm: str, dt: DType, a: Shape, b: Shape, out: Shape) -> bool:
    """True when a GEMM of these operands (device dtype `dt`) runs on cuBLASLt."""
    return gemm == "cublaslt" and dt in LT_DTYPES and gemm_batching(a, b, out) is not None


def constant_bytes(node: Node, dev: DType) -> bytes:
    """The device bytes of a constant stored in `dev`.

    Rounded to nearest, except that a nonzero value never becomes zero: one below the narrow type's smallest
    subnormal (f16: 6e-8) is stored as that subnormal, with its sign. Such constants are guards
    (`max(count, 1e-9)`, `max(norm, 1e-12)`); flushed to zero, a fully masked sentence would pool to 0 / 0.

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("c")
    >>> c = g.constant(np.array([1e-9, -1e-9, 0.0, 0.5], np.float32))
    >>> np.frombuffer(constant_bytes(g.node(c), DType.F16), np.float16).tolist()
    [5.960464477539063e-08, -5.960464477539063e-08, 0.0, 0.5]
    """
    arr = node.op.array()
    if dev is not node.shape.dtype:
        wide = np.asarray(arr, dtype=np.float32)
        bits = wide.astype(np.float16).view(np.uint16) if dev is DType.F16 else f32_to_bf16(wide)
        flushed = ((bits & 0x7FFF) == 0) & (wide != 0)
        arr = np.where(flushed, np.where(np.signbit(wide), np.uint16(0x8001), np.uint16(0x0001)), bits)
        arr = arr.astype(np.uint16)
    return np.ascontiguousarray(arr).tobytes()


#: Most scratch bytes a prefill `dequant_matmul` holds dequantized weight in (larger weights go in column tiles).
QUANT_TILE_BYTES = 16 << 20


def quant_tile(n: int, k: int, itemsize: int) -> int:
    """Weight rows one prefill `dequant_matmul` step dequantizes: all N when they fit QUANT_TILE_BYTES,
    else a multiple of 64 rows that does."""
    if n * k * itemsize <= QUANT_TILE_BYTES:
        return n
    return max(64, QUANT_TILE_BYTES // (k * itemsize) // 64 * 64)


def quant_act_offset(n: int, k: int, rows: int, itemsize: int) -> int:
    """Scratch bytes of a prefill `dequant_matmul`'s weight tile and split product; an act="q8" node's int8
    activations follow them (at the next ALIGN)."""
    tile = quant_tile(n, k, itemsize)
    return -(-k * tile * itemsize // ALIGN) * ALIGN + (rows * tile * itemsize if tile < n else 0)


#: Chunked selective scan (prefill): shortest chunk of time, warps per SM it aims for, most (row, channel,
#: chunk) segments at once (their final states and dt sums live in the scratch region).
SSM_MIN_CHUNK = 32
SSM_WARPS_PER_SM = 32
SSM_MAX_SEGMENTS = 16384


def ssm_segments(batch: int, channels: int, seq: int) -> int:
    """Most (row, channel, chunk) segments a chunked selective scan of these (largest) sizes holds."""
    if seq < 2 * SSM_MIN_CHUNK:
        return 0
    return min(SSM_MAX_SEGMENTS, batch * channels * (seq // SSM_MIN_CHUNK))


#: Chunked gated delta rule (prefill): steps per chunk, largest state size it takes, shortest sequence it
#: runs for, most scratch bytes its per-chunk matrices (Ut, W: C x N; M: C x C; G: C) may take.
GDN_CHUNK = 32
GDN_CHUNK_MAX_N = 64
GDN_CHUNK_MIN_SEQ = 128
GDN_SCRATCH_CAP = 64 << 20


def gdn_segment_bytes(n: int) -> int:
    """Scratch bytes of one (row, head, chunk) of the chunked gated delta rule."""
    return GDN_CHUNK * (2 * n + GDN_CHUNK + 1) * 4


def gdn_segments(batch: int, heads: int, seq: int, n: int) -> int:
    """Most (row, head, chunk) segments the chunked gated delta rule holds at these (largest) sizes; 0: the
    chunked form never runs (state too large, or sequences too short)."""
    if n > GDN_CHUNK_MAX_N or seq < GDN_CHUNK_MIN_SEQ:
        return 0
    return min(GDN_SCRATCH_CAP // gdn_segment_bytes(n), batch * heads * -(-seq // GDN_CHUNK))


def scratch_need(graph: Graph, node: Node, precision: DType) -> int:
    """Scratch bytes one node's kernels use (the scratch region is sized to the largest)."""
    if isinstance(node.op, GatedDeltaNet):  # per chunk: Ut, W, M and the running decay
        bsz, seq, heads, _ = node.shape.dims
        n = node.op.state_size
        return gdn_segments(bsz.max, heads.max, seq.max, n) * gdn_segment_bytes(n)
    if isinstance(node.op, SelectiveScan):  # per segment: its final (then entering) state and its sum of dt
        bsz, seq, ch = node.shape.dims
        return ssm_segments(bsz.max, ch.max, seq.max) * (node.op.state_size + 1) * 4
    if isinstance(node.op, O.DequantMatMul):  # a dequantized weight tile [K, tile], and its product when N is split
        x = graph.node(node.inputs[0]).shape
        k, n = x.dims[-1].value, node.shape.dims[-1].value
        size = device_dtype(node.shape.dtype, precision).itemsize
        rows = 1
        for d in x.dims[:-1]:
            rows *= d.max
        act_off = quant_act_offset(n, k, rows, size)
        if node.op.act == "f32":
            return act_off
        # then int8 activations: records of up to 8 rows (48 bytes per 32 values), or x' = q * d [rows, K]
        return -(-act_off // ALIGN) * ALIGN + rows * k * max(size, 2)
    if isinstance(node.op, MoeMatMul):  # the grouped path's expert starts, tiles and sorted pairs
        return cuda_scratch_bytes(graph, node)
    if isinstance(node.op, O.FusedSwiGLU):  # the up projection, before it is combined with the gate
        return node.shape.max_numel * device_dtype(node.shape.dtype, precision).itemsize
    if isinstance(node.op, (O.AllGather, O.ReduceScatter)):  # NCCL's rank-major layout <-> the axis
        axis = node.op.axis % node.shape.rank
        if axis == 0 or all(d.is_static and d.value == 1 for d in node.shape.dims[:axis]):
            return 0
        size = device_dtype(node.shape.dtype, precision).itemsize
        return max(node.shape.max_numel, graph.node(node.inputs[0]).shape.max_numel) * size
    if isinstance(node.op, O.CachedAttention):  # split decode partials: per (row, head, split) max, sum, D values
        d = decode_split_plan(graph, node, precision, sms=1 << 20)  # the most splits any SM count asks for
        splits = d.max_splits if d is not None else 1
        return _kv_split_rows(node) * node.op.num_heads * splits * (node.op.head_dim + 2) * 4 if splits > 1 else 0
    if isinstance(node.op, O.Attention):  # split-KV decode partials: per (batch, head, split) D values + max + sum
        q = graph.node(node.inputs[0]).shape
        return q.dims[0].max * node.op.num_heads * ATTN_MAX_SPLITS * (node.op.head_dim + 2) * 4
    return 0


def find_gemm_groups(lir: LirModule, precision: DType, gemm: str) -> list[list[NodeId]]:
    """GEMMs that read the same activation with their own weights, feeding only attention (Q, K, V).

    They run as one GEMM against a combined [K, sum(N)] weight (each param is stored as a column slice
    of it, written so at set_param); their outputs are column slices of one [M, sum(N)] buffer, which
    the attention kernels read through row strides. One launch instead of three, and a wider GEMM.
    """
    if gemm != "cublaslt":
        return []
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    buckets: dict[tuple, list[NodeId]] = {}
    for nid in lir.schedule:
        n = graph.node(nid)
        if not isinstance(n.op, _GEMM_OPS) or nid in outputs:
            continue
        dt = device_dtype(n.shape.dtype, precision)
        if dt not in LT_DTYPES or lir.buffers[nid].storage != "arena":
            continue
        a, w = n.inputs[0], n.inputs[1]
        bias = n.inputs[2] if len(n.inputs) == 3 else None
        wn = graph.node(w)
        ok = wn.kind == "param" and wn.shape.rank == 2 and users[w] == [nid]
        ok = ok and (bias is None or (graph.node(bias).kind == "param" and users[bias] == [nid]))
        ok = ok and bool(users[nid]) and all(
            isinstance(graph.node(u).op, O.Attention) and nid in graph.node(u).inputs[:3]
            and nid not in graph.node(u).inputs[3:] for u in users[nid])
        if not ok:
            continue
        act = getattr(n.op, "activation", None)
        key = (a, act, bias is not None, wn.shape.dims[0], dt)
        buckets.setdefault(key, []).append(nid)
    return [members for members in buckets.values() if len(members) >= 2]


#: Most rows of activations a fused decode GEMV takes, by the largest K it stages in shared memory
#: (each row is staged as f32 with 4 floats of padding per 32: `max_rows * K * 4.5` bytes; past 48 KiB the
#: kernel's shared-memory limit is raised, up to 72 KiB at K = 16384: three blocks still fit an SM).
DECODE_GEMV_ROWS = ((2048, 4), (16384, 1))
#: Most quantized projections one fused decode GEMV computes.
DECODE_GEMV_MEMBERS = 4
#: Smallest K whose one-row decode steps take rlx_qgemv_xr (x in registers, slabs of 32 units of 32 values;
#: DECODE_XR_FORMATS, f32 activations). Shorter rows (SmolLM2: K = 576 is 18 units, 1536 is 48) leave lanes of a
#: slab idle (14 of 32, or 16 of the second slab's) where the old walk's lanes cycle over the row's units with no
#: idle slab; they keep it. At the 8B shape on an H200 the register walk measured 3-4% faster (docs/perf-h100.md).
DECODE_XR_MIN_K = 2048
#: Block formats rlx_qgemv_xr takes (kernels/quant.cuh's RLX_QFAST ones).
DECODE_XR_FORMATS = ("q4_k", "q4_0", "q4_1", "q8_0")
#: Groups of 8 weight rows a block of rlx_qgemv_xr may take.
DECODE_XR_GROUPS = (1, 2, 4)
#: The occupancy walk (rlx_qgemv_occ, kernels/quant_occ.cuh): its `gemv_walk` names and the weight rows a warp's item
#: takes for each (2: at most 64 registers, two blocks of up to 16 warps an SM; 4: more loads in flight a warp, fewer
#: warps, the default: 8B q4_k on an H200 331 decode tok/s against 274 with 2, docs/perf-h100.md; 8: more still;
#: "occp" / "occ4p": 2 / 4 rows and the warp's next item prefetched into L2, `DecodeGemv.occ_prefetch`). Most K it
#: takes: 16 slabs of 32 units (one replica of the slabs in 512 threads).
DECODE_OCC_WALKS = {"occ": 2, "occ4": 4, "occ8": 8, "occp": 2, "occ4p": 4}
#: The walk "auto" takes for DECODE_XR_FORMATS with f32 or int8 activations at DECODE_XR_MIN_K <= K <= DECODE_OCC_MAX_K.
DECODE_OCC_AUTO = "occ4"
#: ... with int8 activations (act "q8": x in 8 registers a lane, not 34), per format: q4_k takes 8 rows an item (the
#: 8B q4_k shape on an H200: 383.5 decode tok/s against 309.3 with 4, and 336.3 for f32 activations on occ4;
#: docs/perf-h100.md); the others 4 (q8_0: 255.9 against f32's 258.1; 8 not measured).
DECODE_OCC_AUTO_Q8 = {"q4_k": "occ8"}
DECODE_OCC_MAX_K = 16384


def decode_walk(fmt: str, act: str, k: int, walk: str = "auto", groups: int = 0) -> tuple[str, int]:
    """The one-row walk of a `DecodeGemv` and its size (`walk`, then `xr_groups` or `occ_rows`). "auto": the
    occupancy walk (rlx_qgemv_occ, 4 weight rows a warp's item: DECODE_OCC_AUTO) for DECODE_XR_FORMATS with f32
    activations, or int8 ones (act "q8": the kernel quantizes its lanes' x, ACT = 1; q4_k with 8 rows an item,
    DECODE_OCC_AUTO_Q8), and
    DECODE_XR_MIN_K <= K <= DECODE_OCC_MAX_K (the 8B q4_k shape on an H200: 228 decode tok/s on the
    register walk, 274 on the occupancy walk with 2 rows an item, 331 with 4; docs/perf-h100.md), the register walk
    ("xreg", f32 activations only) past that K, else "rows". `walk` (`CudaTarget(gemv_walk=)`,
    RLX_QGEMV_WALK) forces one: "rows" the old walk; "xreg" the register walk, whose groups a block takes are the
    fewest that make the block's work items (slabs x groups) a multiple of its 8 warps (K = 4096: 4 slabs, 2 groups;
    K = 14336: 14 slabs, 4 groups), else the one that leaves the fewest warp turns idle (`groups`: `xr_groups`,
    RLX_QGEMV_XR_GROUPS, forces them); "occ" / "occ4" / "occ8" the occupancy walk with 2 / 4 / 8 rows an item
    ("occp" / "occ4p": 2 / 4 and the next item prefetched) for those formats and activations at any K up to
    DECODE_OCC_MAX_K.

    >>> decode_walk("q4_k", "f32", 4096), decode_walk("q4_k", "f32", 14336), decode_walk("q4_k", "f32", 32768)
    (('occ', 4), ('occ', 4), ('xreg', 1))
    >>> decode_walk("q4_k", "f32", 4096, walk="xreg"), decode_walk("q4_k", "f32", 14336, walk="xreg")
    (('xreg', 2), ('xreg', 4))
    >>> decode_walk("q4_k", "f32", 576), decode_walk("q4_k", "f32", 4096, walk="rows")
    (('rows', 0), ('rows', 0))
    >>> decode_walk("q4_k", "f32", 576, walk="occ"), decode_walk("q6_k", "f32", 4096, walk="occ4")
    (('occ', 2), ('rows', 0))
    >>> decode_walk("q8_0", "q8", 4096), decode_walk("q4_k", "q8", 14336), decode_walk("q4_k", "q8", 32768)
    (('occ', 4), ('occ', 8), ('rows', 0))
    >>> decode_walk("q4_k", "q8", 4096, walk="occ4")
    ('occ', 4)
    """
    occ = fmt in DECODE_XR_FORMATS and act in ("f32", "q8")
    fast = occ and act == "f32"
    if walk == "auto" and occ and DECODE_XR_MIN_K <= k <= DECODE_OCC_MAX_K:
        walk = DECODE_OCC_AUTO_Q8.get(fmt, DECODE_OCC_AUTO) if act == "q8" else DECODE_OCC_AUTO
    if walk in DECODE_OCC_WALKS:
        if occ and k <= DECODE_OCC_MAX_K:
            return "occ", DECODE_OCC_WALKS[walk]
        return "rows", 0
    if not fast or k < DECODE_XR_MIN_K or walk == "rows":
        return "rows", 0
    if groups:
        return "xreg", groups
    nslab = (k // 32 + 31) // 32

    def idle(g: int) -> float:  # the share of the warps' turns on a block's items that find none
        turns = -(-nslab * g // 8) * 8
        return (turns - nslab * g) / turns

    return "xreg", min(DECODE_XR_GROUPS, key=lambda g: (idle(g), g))


#: The one-row GEMV over dense 16-bit weights (rlx_dgemv, kernels/dense_gemv.cuh): the largest K it stages (x as f32
#: in shared memory, 64 KiB at 16384: the kernel's limit is raised at load) and the build precisions whose float
#: weights it reads as stored ([K, N] in the compute type).
DENSE_GEMV_MAX_K = 16384
DENSE_GEMV_PRECISIONS = (DType.F16, DType.BF16)
#: Tile widths (output columns) rlx_dgemv may be forced to (`CudaTarget.dense_tile`, RLX_DENSE_GEMV_TILE; 0: chosen).
DENSE_GEMV_TILES = (0, 8, 16, 32, 64, 128, 256, 512)
#: Most blocks rlx_dgemv's K may be forced to split over (`CudaTarget.dense_split`, RLX_DENSE_GEMV_SPLIT; 0: chosen
#: per launch, at most DENSE_GEMV_SPLIT_AUTO; 1: no split). The scratch region holds [S][N] f32 partials.
DENSE_GEMV_SPLIT_MAX = 64
DENSE_GEMV_SPLIT_AUTO = 16


def dense_gemv_splits(d: DecodeGemv) -> int:
    """Most K splits a `DecodeGemv` of walk "dense" may launch (its partials' rows in scratch)."""
    return d.dense_split or DENSE_GEMV_SPLIT_AUTO


def dense_gemv_scratch(graph: Graph, d: DecodeGemv) -> int:
    """Scratch bytes of a dense `DecodeGemv`'s K-split partials: [S][NP] f32 (NP: every member's columns, SwiGLU's gate
    and up); 0 when it never splits."""
    splits = dense_gemv_splits(d)
    if d.walk != "dense" or splits == 1:
        return 0
    lead = graph.node(d.members[0])
    if isinstance(lead.op, O.FusedSwiGLU):
        cols = 2 * lead.shape.dims[-1].value
    else:
        cols = sum(graph.node(m).shape.dims[-1].value for m in d.members)
    return splits * cols * 4


def find_decode_gemvs(lir: LirModule, walk: str = "auto", groups: int = 0, dense: DType | None = None,
                      grouped: frozenset[NodeId] = frozenset(), dense_tile: int = 0,
                      dense_split: int = 0) -> list[DecodeGemv]:
    """Quantized projections that run as one GEMV launch in decode steps (see `DecodeGemv`).

    Members are consecutive `dequant_matmul`s of one activation with one block format and K; the norm
    before them, and the residual add or SwiGLU region after them, join only when scheduled right next
    to them and read by nothing else, so running them early (or not at all) in a decode step changes no
    value another kernel reads.

    `dense` (an f16 / bf16 build's precision; None: none): float projections too, walk "dense" (rlx_dgemv over the
    weight as stored) in one-row steps: consecutive `matmul`s of one activation against 2-D params (not in a
    `GemmGroup`: `grouped`), or one `fused_swiglu` (its gate and up weights), with the same norm and residual;
    `dense_tile` forces their tiles' width, `dense_split` their K splits over blocks (0: chosen per launch).
    """
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    schedule = list(lir.schedule)
    pos = {nid: i for i, nid in enumerate(schedule)}

    def sole_next(nid: NodeId, kind: type) -> Node | None:
        """The one consumer of `nid`, when it is of `kind` and scheduled right after `nid`'s group."""
        if nid in outputs or len(set(users[nid])) != 1:
            return None
        u = graph.node(users[nid][0])
        return u if isinstance(u.op, kind) else None

    def quantized(n: Node) -> bool:  # f32 activations, or int8 ones (act="q8": the kernel quantizes them)
        return isinstance(n.op, O.DequantMatMul) and n.op.act in ("f32", "q8") \
            and lir.buffers[n.id].storage in ("arena", "output")

    def dense_member(n: Node) -> bool:  # x @ W, W a 2-D param read as stored ([K, N] in the compute type)
        if dense is None or not isinstance(n.op, (O.MatMul, O.FusedSwiGLU)) or n.id in grouped:
            return False
        if lir.buffers[n.id].storage not in ("arena", "output") or device_dtype(n.shape.dtype, dense) is not dense:
            return False
        ws = [graph.node(w) for w in n.inputs[1:]]
        return all(w.kind == "param" and w.shape.rank == 2 and lir.buffers[w.id].storage == "param"
                   and device_dtype(w.shape.dtype, dense) is dense for w in ws) \
            and graph.node(n.inputs[0]).shape.rank >= 2

    def absorbed(members: list[Node], k: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
        """The norm, residual add and SwiGLU region `members` take (None: the group cannot run fused)."""
        x = members[0].inputs[0]
        ids = tuple(m.id for m in members)
        first, last = pos[ids[0]], pos[ids[-1]]
        norm: tuple[int, ...] = ()
        xn = graph.node(x)
        if (isinstance(xn.op, O.RmsNorm) and x not in outputs and pos.get(x) == first - 1
                and sorted(set(users[x])) == sorted(ids) and lir.buffers[x].storage == "arena"
                and graph.node(xn.inputs[1]).shape.numel == k):
            norm = (x,)
        residual: tuple[int, ...] = ()
        swiglu: tuple[int, ...] = ()
        if len(members) == 1 and not isinstance(members[0].op, O.FusedSwiGLU):
            add = sole_next(ids[0], O.Binary)
            if (add is not None and add.op.fn == "add" and pos[add.id] == last + 1
                    and all(graph.node(a).shape == add.shape for a in add.inputs)
                    and add.inputs[0] != add.inputs[1] and lir.buffers[add.id].storage == "arena"):
                residual = (add.id,)
        elif len(members) == 2 and members[0].shape == members[1].shape:
            region = sole_next(ids[0], O.ElementwiseRegion)
            if (region is not None and is_silu_times(region.op) and region.inputs == ids
                    and sole_next(ids[1], O.ElementwiseRegion) is region and pos[region.id] == last + 1
                    and region.shape == members[0].shape and lir.buffers[region.id].storage == "arena"):
                swiglu = (region.id,)
        staged = graph.node(x).inputs[0] if norm else x
        written = residual or swiglu or ids
        if any(lir.arena_overlap(staged, w) for w in written):
            # an early write would clobber what another block still stages: keep the epilogue separate
            residual = swiglu = ()
            if any(lir.arena_overlap(staged, w) for w in ids):
                return None
        return norm, residual, swiglu

    found: list[DecodeGemv] = []
    for members in scheduled_runs(lir, quantized, lambda n: (n.inputs[0], n.op.quant, n.op.act),
                                  DECODE_GEMV_MEMBERS):
        k = graph.node(members[0].inputs[0]).shape.dims[-1].value
        rows = next((r for kmax, r in DECODE_GEMV_ROWS if k <= kmax), 0)
        if not rows or k % 32:
            continue
        taken = absorbed(members, k)
        if taken is None:
            continue
        # a lone projection with nothing to absorb joins too: the fused kernel's inner loops are the fast ones
        how, size = decode_walk(members[0].op.quant, members[0].op.act, k, walk, groups)
        found.append(DecodeGemv(tuple(m.id for m in members), rows, *taken, how, size if how == "xreg" else 0,
                                size if how == "occ" else 0, how == "occ" and walk in ("occp", "occ4p"),
                                act=members[0].op.act))
    # (a fused_swiglu is a group of its own: its key never equals a matmul's)
    for members in scheduled_runs(lir, dense_member, lambda n: (n.inputs[0], n.kind, n.id * (n.kind != "matmul")),
                                  DECODE_GEMV_MEMBERS):
        k = graph.node(members[0].inputs[0]).shape.dims[-1].value
        if k % 8 or k > DENSE_GEMV_MAX_K:
            continue
        taken = absorbed(members, k)
        if taken is None:
            continue
        # the kernel reads x (the norm's input) 16 bytes at a time
        staged = lir.buffers[graph.node(taken[0][0]).inputs[0] if taken[0] else members[0].inputs[0]]
        if staged.storage == "input" or (staged.storage == "arena" and staged.offset % 16 == 0):
            found.append(DecodeGemv(tuple(m.id for m in members), 1, *taken, "dense", dense_tile=dense_tile,
                                    dense_split=dense_split))
    return found


#: Block formats rlx_qmma dequantizes into mma fragments (the RlxQmmaUnit specializations of kernels/quant_mma.cuh).
QUANT_MMA_FORMATS = ("q4_k", "q4_0", "q4_1", "q8_0")
#: Rows of a step from which a quantized projection takes rlx_qmma (one row: the GEMVs).
QUANT_MMA_MIN_ROWS = 2
#: Most rows rlx_qmma takes, by the weight's values (N x K): (fewest values, rows), the first that applies.
#: Measured on an H200 (docs/perf-h100.md, batched decode): on the 8B shape (16.8M-58.7M values a weight) rlx_qmma
#: beat dequantize + cuBLASLt at every row count up to 64 (64 rows: 19.1 against 32.5 ms a step); on SmolLM2's
#: (0.3M-0.9M) up to 16 rows (1.77 against 2.06 ms), even at 32 (2.24 / 2.19) and behind at 64 (2.97 / 2.67), where
#: dequantizing its small weights costs little and the GEMM reads each value once for 64 rows.
QUANT_MMA_MAX_ROWS = ((4 << 20, 64), (0, 16))


def find_quant_mmas(lir: LirModule, precision: DType) -> list[QuantMma]:
    """Quantized projections whose batched steps take the tensor-core kernel (see `QuantMma`): f16 / bf16 builds,
    f32 or int8 activations, a block format rlx_qmma reads."""
    if precision not in (DType.F16, DType.BF16):
        return []
    found = []
    for nid in lir.schedule:
        node = lir.graph.node(nid)
        if not isinstance(node.op, O.DequantMatMul) or node.op.quant not in QUANT_MMA_FORMATS:
            continue
        n, k = node.shape.dims[-1].value, lir.graph.node(node.inputs[0]).shape.dims[-1].value
        rows = next(r for least, r in QUANT_MMA_MAX_ROWS if n * k >= least)
        found.append(QuantMma(nid, QUANT_MMA_MIN_ROWS, rows))
    return found


#: Rows of X the warp-per-row quantized GEMVs take (RLX_QGEMV_MAX_M in kernels/quant.cuh): larger steps without a
#: `QuantMma` take the dequantize + GEMM path.
QGEMV_MAX_ROWS = 8
#: Default byte budget of `DequantCopy` copies (`CudaTarget.dequant_copies`): the dequantized weights of a model of
#: up to ~1B parameters in f16 (SmolLM2-135M: 270 MB); an 8B model's (16 GB) stay off unless asked for.
DEQUANT_COPY_BYTES = 2 << 30


def find_dequant_copies(lir: LirModule, precision: DType, budget: int, mmas: Sequence[QuantMma],
                        gemvs: Sequence[DecodeGemv]) -> list[tuple[int, NodeId, tuple[NodeId, ...], int,
                                                                tuple[int, ...]]]:
    """Quantized weight params worth a dequantized copy (see `DequantCopy`): (param slot, param node, the
    `dequant_matmul` readers whose steps can outgrow their GEMV and `rlx_qmma` rows, copy bytes, each reader's
    first row count on the copy), in schedule order of their first reader while the copies fit `budget` bytes.
    f16 / bf16 builds only (the copy is in the compute type, half the bytes of an f32 one). A reader in a fused
    `DecodeGemv` keeps that kernel's rows (it reads the weight once for all of them), any other its GEMV for one
    row; int8 activations (act="q8") keep their GEMV up to `QGEMV_MAX_ROWS` rows. `mmas` and `gemvs`: the LIR's
    `QuantMma` and `DecodeGemv` decisions."""
    if precision not in (DType.F16, DType.BF16) or budget <= 0:
        return []
    graph = lir.graph
    slots = {spec.node: slot for slot, spec in enumerate(lir.params)}
    mma = {d.node: d.max_rows for d in mmas}
    fused = {m: d.max_rows for d in gemvs for m in d.members}
    readers: dict[NodeId, list[NodeId]] = {}
    for nid in lir.schedule:
        node = graph.node(nid)
        if not isinstance(node.op, O.DequantMatMul) or lir.buffers[nid].storage == "view":
            continue
        w = node.inputs[1]
        rows = 1
        for d in graph.node(node.inputs[0]).shape.dims[:-1]:
            rows *= d.max
        if w in slots and rows > max(QGEMV_MAX_ROWS, mma.get(nid, 0)):
            readers.setdefault(w, []).append(nid)
    found, used = [], 0
    for w, nodes in readers.items():
        first = graph.node(nodes[0])
        n, k = first.shape.dims[-1].value, graph.node(first.inputs[0]).shape.dims[-1].value
        nbytes = n * k * precision.itemsize
        if used + nbytes > budget:
            continue
        used += nbytes
        # (int8 activations: steps of up to QGEMV_MAX_ROWS rows take their q8 GEMV over records first)
        found.append((slots[w], w, tuple(nodes), nbytes,
                      tuple(max(fused.get(r, 1) + 1, QGEMV_MAX_ROWS + 1 if graph.node(r).op.act == "q8" else 0)
                            for r in nodes)))
    return found


#: Most tokens a row of a step may hold for its attention kernel to apply the rotary embedding itself (it stages a
#: row's new keys, rotated, in shared memory), whatever the number of rows.
DECODE_ROPE_ROWS = 4


def find_decode_ropes(lir: LirModule) -> list[DecodeRope]:
    """`cached_attention` nodes whose query and key ropes run inside the attention kernel in decode steps.

    Both ropes read the same tables, feed only this attention and are scheduled right before it, so the raw
    projections they read are still intact when the attention reads them instead. The attention's output may
    reuse the raw queries' buffer exactly (each block reads its query slice before it writes the same slice),
    but no other raw input's bytes.
    """
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    schedule = list(lir.schedule)
    pos = {nid: i for i, nid in enumerate(schedule)}
    found = []
    for nid in schedule:
        att = graph.node(nid)
        if not isinstance(att.op, O.CachedAttention):
            continue
        ropes = [graph.node(att.inputs[0]), graph.node(att.inputs[1])]
        if not all(isinstance(r.op, O.Rope) and r.id not in outputs and set(users[r.id]) == {nid}
                   and lir.buffers[r.id].storage == "arena" for r in ropes):
            continue
        rq, rk = ropes
        if (rq.inputs[1:] != rk.inputs[1:] or rq.op != rk.op or rq.op.head_dim != att.op.head_dim
                or rq.op.rot % 2 or sorted((pos[rq.id], pos[rk.id])) != [pos[nid] - 2, pos[nid] - 1]):
            continue
        raw_q, raw_k = rq.inputs[0], rk.inputs[0]
        same_q = (lir.buffers[raw_q].storage == "arena" and lir.buffers[raw_q].offset == lir.buffers[nid].offset
                  and graph.node(raw_q).shape == att.shape)
        if (lir.arena_overlap(nid, raw_q) and not same_q) or lir.arena_overlap(nid, raw_k):
            continue
        found.append(DecodeRope(nid, (rq.id, rk.id), DECODE_ROPE_ROWS))
    return found


def find_samples_from_argmax(lir: LirModule) -> list[SampleFromArgmax]:
    """`sample_top_k` nodes that copy an `argmax`'s ids at temperature 0 / top_k 1: an argmax over the last axis of
    the same logits, scheduled earlier, whose ids no node scheduled in between can overwrite (arena bytes)."""
    graph = lir.graph
    schedule = list(lir.schedule)
    pos = {nid: i for i, nid in enumerate(schedule)}
    users = graph.users()
    found = []
    for nid in schedule:
        node = graph.node(nid)
        if node.kind != "sample_top_k":
            continue
        logits = node.inputs[0]
        rank = graph.node(logits).shape.rank
        for a in users.get(logits, ()):
            am = graph.node(a)
            if (am.kind != "argmax" or am.op.axis % rank != rank - 1 or pos.get(a, len(schedule)) >= pos[nid]
                    or any(lir.arena_overlap(a, b) for b in schedule[pos[a] + 1:pos[nid]])):
                continue
            found.append(SampleFromArgmax(nid, a))
            break
    return found


def kv_splits(capacity: int) -> int:
    """The most blocks a decode query over a KV cache of `capacity` rows splits its keys over (1: never split).

    >>> kv_splits(256), kv_splits(257), kv_splits(2048), kv_splits(1 << 20) == ATTN_MAX_SPLITS
    (1, 2, 8, True)
    """
    return 1 if capacity <= KV_SPLIT_KEYS else min(ATTN_MAX_SPLITS, -(-capacity // KV_SPLIT_KEYS))


def _kv_split_rows(node: Node) -> int:
    """Most query rows (batch x seq) of a step whose `cached_attention` splits (DecodeSplitKv)."""
    batch, seq = node.shape.dims[0].max, node.shape.dims[1].max
    return min(KV_SPLIT_ROWS, batch * seq)


def visible_keys(graph: Graph, node: Node) -> int:
    """The most keys one query of a `cached_attention` attends to: the cache's capacity, or its window."""
    capacity = _capacity(graph, node)
    return capacity if node.op.window is None else min(capacity, node.op.window)


def kvd_lanes(head_dim: int, itemsize: int) -> int:
    """Lanes reading one K/V row of the grouped decode kernel in 16-byte loads (0: the row does not tile).

    >>> kvd_lanes(64, 2), kvd_lanes(128, 2), kvd_lanes(128, 4), kvd_lanes(256, 4), kvd_lanes(80, 2)
    (8, 16, 32, 32, 0)
    """
    nbytes = head_dim * itemsize
    if nbytes % 16 or head_dim > KVD_MAX_HEAD_DIM:
        return 0
    vectors = nbytes // 16
    if vectors <= 32:
        return vectors if 32 % vectors == 0 else 0
    return 32 if vectors % 32 == 0 else 0


def kvd_blocks_per_sm(group: int, head_dim: int, lanes: int) -> int:
    """Blocks of rlx_kv_decode an SM holds, the bound its `__launch_bounds__` sets (RLX_KVD_BLOCKS_PER_SM): 4 where
    a lane keeps at most 24 query and output values per state (`group` heads x head_dim / lanes dims), else 2.

    >>> kvd_blocks_per_sm(3, 64, 8), kvd_blocks_per_sm(4, 128, 16), kvd_blocks_per_sm(3, 64, 16)
    (4, 2, 4)
    """
    return 4 if group * (head_dim // lanes) <= 24 else KVD_BLOCKS_PER_SM


def kvd_splits(keys: int, kv_heads: int, sms: int, blocks_per_sm: int = KVD_BLOCKS_PER_SM) -> int:
    """The most blocks a grouped decode query over `keys` visible keys splits over: enough for `sms` SMs to hold
    `blocks_per_sm` blocks each at batch 1 (kv_heads blocks per split), no block under KVD_SPLIT_KEYS keys.

    >>> kvd_splits(32, 3, 132), kvd_splits(4096, 3, 132), kvd_splits(16384, 3, 132), kvd_splits(16384, 8, 132)
    (1, 64, 88, 33)
    >>> kvd_splits(16384, 3, 132, 4)
    128
    """
    by_keys = -(-keys // KVD_SPLIT_KEYS)
    by_sms = -(-blocks_per_sm * sms // kv_heads)
    return max(1, min(KVD_MAX_SPLITS, by_keys, by_sms))


def decode_split_plan(graph: Graph, node: Node, precision: DType, sms: int = DEFAULT_SMS,
                      grouped: bool = True) -> DecodeSplitKv | None:
    """How a `cached_attention`'s decode steps run (`DecodeSplitKv`), or None: rlx_kv_attend unsplit.
    `grouped=False` keeps them on rlx_kv_attend (split when the past is long), as before rlx_kv_decode existed."""
    op: O.CachedAttention = node.op  # type: ignore[assignment]
    keys = visible_keys(graph, node)
    group = op.num_heads // op.kv_heads
    cache = device_dtype(graph.node(node.inputs[3]).shape.dtype, precision)
    lanes = kvd_lanes(op.head_dim, cache.itemsize)
    if grouped and lanes and group <= KVD_MAX_GROUP:
        blocks = kvd_blocks_per_sm(group, op.head_dim, lanes)
        return DecodeSplitKv(node.id, kvd_splits(keys, op.kv_heads, sms, blocks), KVD_SPLIT_KEYS, KV_SPLIT_ROWS,
                             grouped=True, group=group, lanes=lanes, sms=sms, blocks_per_sm=blocks,
                             row_tokens=KVD_ROW_TOKENS, stores_rows=op.paged and len(node.inputs) > 7)
    splits = kv_splits(keys)
    return DecodeSplitKv(node.id, splits, KV_SPLIT_KEYS, KV_SPLIT_ROWS) if splits > 1 else None


def find_decode_splits(lir: LirModule, precision: DType = DType.F32, sms: int = DEFAULT_SMS,
                       grouped: bool = True) -> list[DecodeSplitKv]:
    """How each `cached_attention`'s decode steps run (`decode_split_plan`): the grouped kernel, or rlx_kv_attend
    with its keys split (caches longer than one block's `KV_SPLIT_KEYS`)."""
    found = []
    for nid in lir.schedule:
        node = lir.graph.node(nid)
        if isinstance(node.op, O.CachedAttention):
            d = decode_split_plan(lir.graph, node, precision, sms, grouped)
            if d is not None:
                found.append(d)
    return found


def _counters(lir: LirModule, precision: DType) -> int:
    """Bytes of per-query block counters the split attentions need (they run one at a time: one set serves all)."""
    graph = lir.graph
    own = max((_kv_split_rows(graph.node(d.attention)) * graph.node(d.attention).op.num_heads * 4
               for d in find_decode_splits(lir, precision, 1 << 20) if d.max_splits > 1), default=0)
    return max([own, *(_counters(body, precision) for _, body in scan_bodies(lir))])


class _Allocator:
    """Bump allocation of aligned spans, remembering which region each belongs to."""

    def __init__(self) -> None:
        self.total = 0
        self.spans: list[tuple[str, int, int]] = []

    def alloc(self, region: str, nbytes: int) -> int:
        offset = (self.total + ALIGN - 1) // ALIGN * ALIGN
        self.total = offset + max(int(nbytes), 0)
        self.spans.append((region, offset, int(nbytes)))
        return offset

    def regions(self) -> tuple[Region, ...]:
        out: dict[str, list[int]] = {}
        for name, offset, nbytes in self.spans:
            if name not in out:
                out[name] = [offset, 0]
            out[name][1] = offset + nbytes - out[name][0]
        return tuple(Region(k, v[0], v[1]) for k, v in out.items())


def _uses_lt(lir: LirModule, precision: DType, gemm: str, groups: Sequence[Sequence[NodeId]]) -> bool:
    if gemm != "cublaslt":
        return False
    if groups:
        return True
    graph = lir.graph
    for nid in lir.schedule:
        n = graph.node(nid)
        if lir.buffers[nid].storage == "view":
            continue
        if isinstance(n.op, O.DequantMatMul) and device_dtype(n.shape.dtype, precision) in LT_DTYPES:
            return True  # its prefill path multiplies dequantized tiles on cuBLASLt
        if isinstance(n.op, (*_GEMM_OPS, O.FusedSwiGLU)):
            x, w = n.inputs[0], n.inputs[1]  # (SwiGLU: x and the gate weight; the up GEMM has the same shapes)
            dt = device_dtype(graph.node(x).shape.dtype, precision)
            if runs_on_lt(gemm, dt, graph.node(x).shape, graph.node(w).shape, n.shape):
                return True
    return False


def scan_bodies(lir: LirModule) -> list[tuple[NodeId, LirModule]]:
    """Each scheduled node holding bodies (scan, cond, while_loop) with each body's step graph planned (what
    the CUDA rules render in their loop or branches), a node once per body in `step_bodies` order."""
    return [(nid, plan(step_graph(body))) for nid in lir.schedule for body in step_bodies(lir.graph.node(nid).op)]


def control_flow(lir: LirModule) -> tuple[ControlFlow, ...]:
    """How each cond / while_loop runs (rendered by `rlx.codegen.cuda.control`), and the fallbacks
    `rlx.opt.control` left where the rule did not take one, with the reason (from the name it gave them)."""
    out = []
    for nid in lir.schedule:
        node = lir.graph.node(nid)
        if isinstance(node.op, Cond):
            out.append(ControlFlow(nid, "cond", "branch"))
        elif isinstance(node.op, WhileLoop):
            out.append(ControlFlow(nid, "while_loop", "loop"))
        elif (fallback := parse_fallback(node.name)) is not None:
            kind, how, reason = fallback
            out.append(ControlFlow(nid, kind, how, reason))
    return tuple(out)


def _dense_partials_bound(lir: LirModule, splits: int) -> int:
    """Scratch bytes a scan body's dense GEMVs' K-split partials may take (`splits` at most; 0: none): an upper bound,
    every float projection's columns (SwiGLU's twice), the body's own decisions being made apart from the graph's."""
    if splits <= 1:
        return 0
    cols = sum(n.shape.dims[-1].max * (2 if isinstance(n.op, O.FusedSwiGLU) else 1)
               for n in (lir.graph.node(nid) for nid in lir.schedule) if isinstance(n.op, (O.MatMul, O.FusedSwiGLU)))
    return splits * cols * 4


def _scratch(lir: LirModule, precision: DType, dense_splits: int = 0) -> int:
    """The largest scratch any kernel uses, scan bodies' kernels included (they share the region); `dense_splits`:
    the most K splits a dense GEMV of a body may launch (0: no dense GEMV)."""
    graph = lir.graph
    own = max((scratch_need(graph, graph.node(nid), precision) for nid in lir.schedule
               if lir.buffers[nid].storage != "view"), default=0)
    return max([own, *(max(_scratch(body, precision, dense_splits), _dense_partials_bound(body, dense_splits))
                       for _, body in scan_bodies(lir))])


def plan_device(lir: LirModule, precision: DType, gemm: str, pool_tail: bool = True,
                pool_norm: bool = False, decode_sms: int = DEFAULT_SMS, kv_decode: bool = True,
                p2p_all_reduce: bool = True, gemv_walk: str = "auto", xr_groups: int = 0,
                dequant_copies: int = DEQUANT_COPY_BYTES, dense_gemv: bool = True,
                dense_tile: int = 0, dense_split: int = 0) -> tuple[Decision, ...]:
    """The QKV groups, the fused kernels' records and the device layout (the groups' weights and outputs are
    part of the layout); `decode_sms` sizes the split of decode attention (`DecodeSplitKv`), `kv_decode` lets
    its decode steps run the grouped kernel; `dequant_copies` is the byte budget of `DequantCopy` copies;
    `dense_gemv` lets float projections of f16 / bf16 builds take the dense one-row GEMV (`DecodeGemv` walk "dense")."""
    graph = lir.graph
    bodies = scan_bodies(lir)
    mem = _Allocator()
    position = {nid: i for i, nid in enumerate(lir.schedule)}
    users = graph.users()

    # QKV groups first: their combined weights open the params region; their outputs share a pool of
    # buffers (a group's buffer is reused once every reader of an earlier group has run).
    grouped = find_gemm_groups(lir, precision, gemm)
    param_slice: dict[int, tuple[int, int]] = {}  # param slot -> (byte offset, row stride)
    pool: list[tuple[int, int, int]] = []  # (offset in the qkv region, nbytes, last schedule position)
    qkv_bytes = 0
    pending: list[tuple[list[NodeId], list[int], int, int, int, int]] = []
    for members in grouped:
        first = graph.node(members[0])
        dt = device_dtype(first.shape.dtype, precision)
        K = graph.node(first.inputs[1]).shape.dims[0].value
        widths = [graph.node(graph.node(m).inputs[1]).shape.dims[1].value for m in members]
        total = sum(widths)
        w_base = mem.alloc("params", K * total * dt.itemsize)
        has_bias = len(first.inputs) == 3
        b_base = mem.alloc("params", total * dt.itemsize) if has_bias else -1
        need = first.shape.max_numel // widths[0] * total * dt.itemsize
        start = position[members[0]]
        last = max(position[u] for m in members for u in users[m])
        slot = next((i for i, (_, nb, end) in enumerate(pool) if nb >= need and end < start), None)
        if slot is None:
            pool.append((qkv_bytes, need, last))
            qkv_bytes += (need + ALIGN - 1) // ALIGN * ALIGN
            slot = len(pool) - 1
        else:
            pool[slot] = (pool[slot][0], pool[slot][1], last)
        col = 0
        for m, width in zip(members, widths):
            node = graph.node(m)
            param_slice[lir.buffers[node.inputs[1]].slot] = (w_base + col * dt.itemsize, total)
            if has_bias:
                param_slice[lir.buffers[node.inputs[2]].slot] = (b_base + col * dt.itemsize, 0)
            col += width
        pending.append((members, widths, K, w_base, b_base, pool[slot][0]))

    params: list[ParamPlacement] = []
    staging_need = 0
    for slot, spec in enumerate(lir.params):
        node = graph.node(spec.node)
        abi, dev = node.shape.dtype, device_dtype(node.shape.dtype, precision)
        offset, row = param_slice.get(slot, (-1, 0))
        if offset < 0:
            offset = mem.alloc("params", node.shape.max_numel * dev.itemsize)
        layout = list(spec.layout) if spec.layout is not None else list(range(spec.shape.rank))
        staged = layout != list(range(spec.shape.rank)) or abi is not dev or bool(row)
        if staged:
            staging_need = max(staging_need, spec.shape.max_nbytes)
        params.append(ParamPlacement(offset, row, staged))
    # dequantized copies of quantized weights (DequantCopy) with the params: rlx_clone copies them too
    # (with cuBLASLt the GEMM of a fused GEMV's lone member also adds its residual: C = the add's other input)
    # (its X must not share bytes with the sum it writes; C may: cuBLASLt accumulates in place)
    dense = precision if dense_gemv and precision in DENSE_GEMV_PRECISIONS else None
    gemvs = find_decode_gemvs(lir, gemv_walk, xr_groups, dense, frozenset(m for g in grouped for m in g), dense_tile,
                              dense_split)
    mmas = find_quant_mmas(lir, precision)
    residual_of = {d.members[0]: (d.residual[0], d.max_rows) for d in gemvs
                   if d.residual and len(d.members) == 1
                   and not lir.arena_overlap(graph.node(d.members[0]).inputs[0], d.residual[0])} \
        if gemm == "cublaslt" else {}
    copies = [DequantCopy(w, slot, readers, graph.node(readers[0]).op.quant,
                          graph.node(readers[0]).shape.dims[-1].value,
                          graph.node(graph.node(readers[0]).inputs[0]).shape.dims[-1].value,
                          mem.alloc("params", nbytes), nbytes, first,
                          tuple(residual_of[r][0] for r, m in zip(readers, first)
                                if r in residual_of and m == residual_of[r][1] + 1))
              for slot, w, readers, nbytes, first in find_dequant_copies(lir, precision, dequant_copies, mmas, gemvs)]
    params_end = mem.total
    # the group outputs sit after the params so that rlx_clone copies params only
    qkv = mem.alloc("qkv", qkv_bytes) if grouped else 0
    groups = [GemmGroup(tuple(m), tuple(w), k, wo, bo, qkv + co) for m, w, k, wo, bo, co in pending]

    constants = tuple(mem.alloc("constants", len(constant_bytes(graph.node(nid), device_dtype(
        graph.node(nid).shape.dtype, precision)))) for nid in lir.constants)
    # a scan body's constants sit with the graph's (its kernels are launched from the scan's loop)
    scan_consts = []
    for index, (nid, body) in enumerate(bodies):
        sizes = [len(constant_bytes(body.graph.node(k), device_dtype(body.graph.node(k).shape.dtype, precision)))
                 for k in body.constants]
        which = sum(1 for n, _ in bodies[:index] if n == nid)  # the node's body number (a cond has two)
        if sizes:
            scan_consts.append(ScanConstants(nid, tuple(mem.alloc("constants", n) for n in sizes), which))
    # The staging copies of the per-run (non-state) inputs come first and back to back: a host-fed step
    # (rlx_run_host_step) fills them all with one copy of that span, which holds nothing else.
    host_staging = {i: mem.alloc("inputs", spec.shape.max_numel * spec.shape.dtype.itemsize)
                    for i, spec in enumerate(lir.inputs) if not spec.state}
    inputs: list[Staged] = []
    for i, spec in enumerate(lir.inputs):
        abi = spec.shape.dtype
        dev = device_dtype(abi, precision)
        staging = host_staging[i] if i in host_staging else mem.alloc("inputs", spec.shape.max_numel * abi.itemsize)
        inputs.append(Staged(staging if dev is abi else mem.alloc("inputs", spec.shape.max_numel * dev.itemsize),
                             staging))
    outputs: list[Staged] = []
    for spec in lir.outputs:
        abi = spec.shape.dtype
        dev = device_dtype(abi, precision)
        dev_off = mem.alloc("outputs", spec.shape.max_numel * dev.itemsize)
        outputs.append(Staged(dev_off, dev_off if dev is abi else mem.alloc("outputs", spec.shape.max_numel
                                                                            * abi.itemsize)))
    # the arena doubles as the staging area of set_param (no run is in flight then)
    arena = mem.alloc("arena", max(lir.arena_bytes, staging_need))
    # (a dense GEMV's K-split partials live there too, between its two kernels)
    body_splits = (dense_split or DENSE_GEMV_SPLIT_AUTO) if dense is not None else 0
    scratch = mem.alloc("scratch", max([_scratch(lir, precision, body_splits),
                                        *(dense_gemv_scratch(graph, d) for d in gemvs)]))
    lt = _uses_lt(lir, precision, gemm, grouped) or any(_uses_lt(b, precision, gemm, ()) for _, b in bodies)
    workspace_bytes = LT_WORKSPACE if lt else 0
    workspace = mem.alloc("workspace", workspace_bytes)
    flag = mem.alloc("flag", ALIGN)
    counters_bytes = _counters(lir, precision)
    counters = mem.alloc("counters", counters_bytes) if counters_bytes else 0
    layout = DeviceLayout(precision=precision.value, gemm=gemm, total=mem.total, params_end=params_end,
                          regions=mem.regions(), params=tuple(params), constants=constants, inputs=tuple(inputs),
                          outputs=tuple(outputs), arena=arena, scratch=scratch, workspace=workspace,
                          workspace_bytes=workspace_bytes, flag=flag, counters=counters,
                          counters_bytes=counters_bytes)
    return (*groups, *scan_consts, *control_flow(lir), *gemvs, *mmas, *copies,
            *find_decode_ropes(lir), *find_samples_from_argmax(lir),
            *find_decode_splits(lir, precision, decode_sms, kv_decode),
            *(find_pool_tails(lir, pool_norm) if pool_tail else ()),
            *(sums_made_by_gemvs(lir, find_p2p_all_reduces(lir), gemvs) if p2p_all_reduce else ()), layout)


def cuda_decisions(lir: LirModule, precision: DType | str = DType.F32, gemm: str = "cublaslt",
                   pool_tail: bool = True, pool_norm: bool = False, decode_sms: int = DEFAULT_SMS,
                   kv_decode: bool = True, p2p_all_reduce: bool = True, gemv_walk: str = "auto",
                   xr_groups: int = 0, dequant_copies: int = DEQUANT_COPY_BYTES, dense_gemv: bool = True,
                   dense_tile: int = 0, dense_split: int = 0, **_target: object) -> tuple[Decision, ...]:
    """The GEMM groups, decode GEMVs and device layout for this precision and GEMM provider (the memory half of
    `LOWERINGS["cuda"]`). `decode_sms`: the SM count decode attention's key splits are sized for; `kv_decode=False`
    keeps decode attention on rlx_kv_attend (no grouped kernel: comparisons); `p2p_all_reduce=False` leaves every
    all-reduce to NCCL (no `AllReduceP2P`); `gemv_walk` / `xr_groups` pick the one-row decode GEMV's walk
    (`decode_walk`); `dense_gemv` puts float projections on the dense one-row GEMV (`False`: RLX_DENSE_GEMV=0),
    `dense_tile` forces its tiles' width (RLX_DENSE_GEMV_TILE), `dense_split` its K splits (RLX_DENSE_GEMV_SPLIT).

    `pool_tail=False` leaves pooling tails as separate kernels (no `PoolTail`); `pool_norm=True` lets a tail take
    the norm before it for short sentences (`PoolTail.norm`; off by default: no wall gain measured). Other target
    options (arch, epilogue fusion, tile sizes) change none of these decisions and are ignored.
    """
    precision = DType.parse(precision)
    if precision not in PRECISIONS:
        raise ValueError(f"CUDA precision must be one of {[p.value for p in PRECISIONS]}, got {precision}")
    if gemm not in GEMM_MODES:
        raise ValueError(f"CUDA gemm provider must be one of {GEMM_MODES}, got {gemm!r}")
    if isinstance(decode_sms, bool) or not isinstance(decode_sms, int) or decode_sms < 1:
        raise ValueError(f"decode_sms must be a positive int (the GPU's SM count), got {decode_sms!r}")
    if isinstance(dequant_copies, bool) or not isinstance(dequant_copies, int) or dequant_copies < 0:
        raise ValueError(f"dequant_copies must be a byte count >= 0, got {dequant_copies!r}")
    if dense_tile not in DENSE_GEMV_TILES:
        raise ValueError(f"dense_tile must be one of {DENSE_GEMV_TILES}, got {dense_tile!r}")
    if isinstance(dense_split, bool) or not isinstance(dense_split, int) \
            or not 0 <= dense_split <= DENSE_GEMV_SPLIT_MAX:
        raise ValueError(f"dense_split must be 0 (chosen) .. {DENSE_GEMV_SPLIT_MAX}, got {dense_split!r}")
    return plan_device(lir, precision, gemm, pool_tail, pool_norm, decode_sms, kv_decode, p2p_all_reduce, gemv_walk,
                       xr_groups, dequant_copies, dense_gemv, dense_tile, dense_split)


#: Bytes a one-shot all-reduce call may carry (a slot of the exchange buffer: RLX_AR_SLOT_BYTES in
#: kernels/collectives.cuh): up to 16 rows of hidden 4096 in f16, 8 in f32 (decode steps; prefill chunks take NCCL).
P2P_ALL_REDUCE_BYTES = 128 << 10
#: Most ranks of a clique the one-shot kernel serves (RLX_AR_MAX_WORLD).
P2P_ALL_REDUCE_WORLD = 8


def find_p2p_all_reduces(lir: LirModule) -> list[AllReduceP2P]:
    """The sums of a CUDA clique that run one-shot through the peers' memory when small (see `AllReduceP2P`)."""
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    pos = {nid: i for i, nid in enumerate(lir.schedule)}
    found = []
    for nid in lir.schedule:
        node = graph.node(nid)
        op = node.op
        if not (isinstance(op, O.AllReduce) and op.reduce == "sum" and 1 < op.world <= P2P_ALL_REDUCE_WORLD):
            continue
        residual: tuple[int, ...] = ()
        if nid not in outputs and len(set(users[nid])) == 1 and lir.buffers[nid].storage == "arena":
            add = graph.node(users[nid][0])
            other = [a for a in add.inputs if a != nid]
            # the sum's one reader adds it to a value of its shape, scheduled right after the sum with its other
            # input before it (nothing in between reads or writes them): the kernel writes that add, elementwise, so
            # an output sharing the other input's bytes exactly is fine, a shifted overlap is not
            if (isinstance(add.op, O.Binary) and add.op.fn == "add" and len(other) == 1
                    and pos.get(add.id) == pos[nid] + 1 and pos.get(other[0], -1) < pos[nid]
                    and graph.node(other[0]).shape == node.shape == add.shape
                    and lir.buffers[add.id].storage in ("arena", "output")
                    and (not lir.arena_overlap(other[0], add.id)
                         or lir.buffers[other[0]].offset == lir.buffers[add.id].offset)):
                residual = (add.id,)
        found.append(AllReduceP2P(nid, op.world, P2P_ALL_REDUCE_BYTES, residual))
    return found


#: Most blocks of a call of rlx_dgemv_reduce_ar (RLX_AR_MAX_BLOCKS in kernels/exchange.cuh: per-block flags) and
#: its columns a block (RLX_DGEMV_AR_THREADS in kernels/dense_gemv_ar.cuh).
P2P_MAX_BLOCKS, P2P_BLOCK_COLUMNS = 64, 256


def sums_made_by_gemvs(lir: LirModule, sums: Sequence[AllReduceP2P],
                       gemvs: Sequence[DecodeGemv]) -> list[AllReduceP2P]:
    """`sums` with `gemv` set where the summed value is a row-parallel projection on the dense one-row GEMV (walk
    "dense", one member that may split K, no residual or SwiGLU of its own) read by the sum alone, whose row fits a
    slot and the reduce's blocks: in one-row steps that GEMV's split reduce makes the sum (see `AllReduceP2P`)."""
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    dense = {d.members[0]: d for d in gemvs if d.walk == "dense" and len(d.members) == 1 and not d.residual
             and not d.swiglu and dense_gemv_splits(d) > 1}
    made = []
    for s in sums:
        node = graph.node(s.node)
        (x,) = node.inputs
        n = node.shape.dims[-1].value
        if (x in dense and x not in outputs and set(users[x]) == {s.node} and n * node.shape.dtype.itemsize
                <= s.max_bytes and -(-n // P2P_BLOCK_COLUMNS) <= P2P_MAX_BLOCKS):
            s = replace(s, gemv=(x,))
        made.append(s)
    return made


def _capacity(graph: Graph, node: Node) -> int:
    """Tokens per row of a `cached_attention`'s cache (max_pages x page_size when paged)."""
    table = graph.node(node.inputs[6]).shape if node.op.paged else None
    return node.op.capacity(graph.node(node.inputs[3]).shape, table)

"""Backend lowering passes: LIR → LIR with the backend's decisions recorded.

`lower_for(lir, backend)` runs the decision passes of one backend and returns
the LIR that backend renders. Each pass is a pure function of the LIR; what
it decides is a `rlx.ir.decisions` record, visible in
`LirModule.inspect()` and covered by the LIR hash.

CPU decisions:

- `absorb_transposes`: a transpose of the last two axes whose every reader is
  a GEMM operand becomes a transpose flag of those GEMMs (no copy).
- `pack_params`: an f32 param read only as the right operand of GEMMs, all in
  one orientation, is stored in RLX's packed-panel layout at `set_param`; so
  is an f16/bf16 param read only as the narrow weights of f32 GEMMs (in its
  own precision: `templates/cpu/kernels/gemm_bf16.h`).
- `widen_params`: an f16/bf16 param read only by one cast to f32 (the bias
  and norm vectors of a graph stored in bf16) is stored widened at
  `set_param`; the cast reads that copy instead of running per call.
- `int8_params` (`rlx.opt.lowering_int8`): an f32 param read only as the weight
  of `int8_matmul` is stored quantized to int8 at `set_param`.
- `conv_plans` (`rlx.opt.lowering_conv`): each convolution's algorithm and tile
  layout (implicit GEMM on pixel-major tiles, or depthwise on planes), and
  whether its weight is stored packed for the GEMM micro-kernel; `pool_plans`
  each pool's layout (a max pool on phase copies or row by row); `conv_residuals`
  (`rlx.opt.lowering_conv_residual`) the residual adds (and their activation)
  that a conv computes in its store; `conv_input_scales` (`rlx.opt.lowering_conv_scale`)
  the squeeze-excite products a pointwise conv computes in its weight.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("mlp")
>>> x = g.input("x", [4, 8])
>>> w = g.param("w", [8, 16])
>>> g.set_outputs([g.matmul(x, w)])
>>> lir = lower_for(plan(g), "cpu")
>>> [d.describe() for d in lir.decisions]
['%1 param stored packed for the GEMM kernel (K x N panels)']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rlx.ir import ops as O
from rlx.ir.decisions import (
    AbsorbedTranspose,
    AttentionPlan,
    Decision,
    GemmSiblings,
    HugePageArena,
    PackedParam,
    ResidentTable,
    WidenedParam,
)
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.ir.lir import LirModule, spans_meet
from rlx.opt.lowering_conv import conv_plans, pool_plans
from rlx.opt.lowering_conv_residual import conv_residuals
from rlx.opt.lowering_conv_scale import conv_input_scales
from rlx.opt.lowering_cuda_kernels import cuda_lowering
from rlx.opt.lowering_int8 import int8_params
from rlx.opt.lowering_metal import metal_decisions
from rlx.opt.lowering_moe import moe_plans
from rlx.opt.lowering_quant_cpu import interleaved_params, quant_gemv_groups

LoweringPass = Callable[[LirModule], tuple[Decision, ...]]

_GEMM_KINDS = (O.MatMul, O.FusedMatMulBiasAct)
#: Param dtypes the CPU stores packed (f16/bf16 only as weights of f32 GEMMs: see pack_params).
_PACKABLE = (DType.F32, DType.F16, DType.BF16)


def _gemm_operand_slot(user: Node, nid: NodeId) -> bool:
    """True when `user` reads `nid` only as a GEMM operand (A or B)."""
    if isinstance(user.op, _GEMM_KINDS):
        return all(i < 2 for i, x in enumerate(user.inputs) if x == nid)
    if isinstance(user.op, O.FusedSwiGLU):
        return all(i in (1, 2) for i, x in enumerate(user.inputs) if x == nid)
    return False


def absorb_transposes(lir: LirModule) -> tuple[Decision, ...]:
    """Transposes of the last two (f32) axes feeding only GEMM operands become transpose flags."""
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    out: list[Decision] = []
    for n in graph.nodes:
        if not isinstance(n.op, O.Transpose) or n.id in outputs:
            continue
        r = n.shape.rank
        if r < 2 or tuple(n.op.perm) != (*range(r - 2), r - 1, r - 2) or n.shape.dtype is not DType.F32:
            continue
        if lir.buffers[n.id].storage == "view":
            continue
        us = users[n.id]
        if us and all(_gemm_operand_slot(graph.node(u), n.id) for u in us) and _lives_until(lir, n, us):
            out.append(AbsorbedTranspose(n.id, n.inputs[0]))
    return tuple(out)


def _lives_until(lir: LirModule, transpose: Node, readers: list[NodeId]) -> bool:
    """True when the transpose's source still holds its value when the last GEMM reads it.

    The memory plan ends the source's life at the transpose; absorbed, the GEMMs read the
    source instead, so no node scheduled up to the last of them may write over its bytes
    (an arena source, e.g. a weight widened from bf16 by a cast, can be reused at once).
    """
    span = lir.arena_span(transpose.inputs[0])
    if span is None:
        return True  # inputs, params, constants and outputs are never reused
    pos = {nid: i for i, nid in enumerate(lir.schedule)}
    if transpose.id not in pos or any(u not in pos for u in readers):
        return False
    return not any(lir.buffers[nid].storage != "view" and spans_meet(lir.arena_span(nid), span)
                   for nid in lir.schedule[pos[transpose.id] + 1: max(pos[u] for u in readers) + 1])


def pack_params(lir: LirModule, absorbed: dict[NodeId, NodeId]) -> tuple[Decision, ...]:
    """Params read only as the right operand of GEMMs (one orientation) get the packed layout.

    f32 params, or f16/bf16 ones read as the weights of f32 GEMMs (`matmul(f32, bf16)`).

    Every reader must be a MatMul / FusedMatMulBiasAct taking the param (directly,
    or through an absorbed transpose) as B and nothing else: the stored bytes then
    only ever serve the packed kernel.
    """
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)

    def packable_use(user: Node, nid: NodeId) -> bool:
        if not isinstance(user.op, _GEMM_KINDS):
            return False
        if [i for i, x in enumerate(user.inputs) if x == nid] != [1]:
            return False
        return user.inputs[0] not in absorbed and graph.node(user.inputs[0]).shape.dtype is DType.F32

    out: list[Decision] = []
    for spec in lir.params:
        nid = spec.node
        shape = graph.node(nid).shape
        if shape.dtype not in _PACKABLE or shape.rank < 2 or nid in outputs or not users[nid]:
            continue
        uses: list[tuple[NodeId, NodeId]] = []  # (gemm, the operand it reads)
        orientations = set()
        for u in users[nid]:
            if u in absorbed:
                orientations.add(True)
                uses.extend((uu, u) for uu in users[u])
            else:
                orientations.add(False)
                uses.append((u, nid))
        if len(orientations) == 1 and all(packable_use(graph.node(g), x) for g, x in uses):
            out.append(PackedParam(nid, orientations.pop()))
    return tuple(out)


def widen_params(lir: LirModule) -> tuple[Decision, ...]:
    """f16/bf16 params read only by one cast to f32 are stored widened (the cast then costs nothing per call).

    The cast must not be a graph output (an output has its own buffer) and must live in the
    arena, so redirecting its readers to the param's storage changes no other buffer.

    >>> from rlx.ir.graph import Graph
    >>> from rlx.opt.memplan import plan
    >>> g = Graph("b")
    >>> b = g.cast(g.param("b", [8], "bf16"), "f32")
    >>> g.set_outputs([g.add_(g.input("x", [2, 8]), b)])
    >>> [d.describe() for d in widen_params(plan(g))]
    ['%0 param widened to f32 once at set_param (%1, its cast, reads it: no per-call cast)']
    """
    graph = lir.graph
    outputs = set(graph.outputs)
    out: list[Decision] = []
    for spec, readers in lir.param_readers():
        nid = spec.node
        if graph.node(nid).shape.dtype not in (DType.F16, DType.BF16) or len(readers) != 1:
            continue
        if spec.layout is not None and list(spec.layout) != sorted(spec.layout):
            continue  # re-laid out on set: kept as it is
        cast = readers[0]
        if (isinstance(cast.op, O.Cast) and cast.shape.dtype is DType.F32 and cast.id not in outputs
                and lir.buffers[cast.id].storage == "arena"):
            out.append(WidenedParam(nid, cast.id))
    return tuple(out)


#: A table gathered from is a `ResidentTable` when its gathers can read at least this many rows a run (a batch of
#: token ids), and the first run that does copies it (a decode step's row or a short sentence reads too few to pay
#: for the copy) ...
RESIDENT_TABLE_MIN_ROWS = 64
#: ... and it is at most this large (MiniLM's / BERT's word embeddings: 45 / 90 MiB; not an 8B decoder's 1-2 GiB,
#: whose second copy would cost more memory than its gathers' page walks cost time).
RESIDENT_TABLE_MAX_BYTES = 128 << 20
#: Rows this long or longer span whole 4 KiB pages: their TLB misses are a small part of their reads.
RESIDENT_TABLE_MAX_ROW_BYTES = 4096
#: Float tables: an encoder's embeddings. A quantized one (GGUF blocks, `token_embd.weight.rows`) belongs to a decoder,
#: whose prefill and decode steps stream far more weight bytes than their gathers' rows.
_RESIDENT_DTYPES = (DType.F32, DType.F16, DType.BF16)


def resident_tables(lir: LirModule) -> tuple[ResidentTable, ...]:
    """`ResidentTable` for every param read only as the table of axis-0 gathers that can read at least
    `RESIDENT_TABLE_MIN_ROWS` rows a run (their index counts' bounds, summed), of floats, rows shorter than a page,
    the table at most `RESIDENT_TABLE_MAX_BYTES` and stored as given (not permuted on set); a run copies it once it
    gathers `RESIDENT_TABLE_MIN_ROWS` rows.

    >>> from rlx.ir.graph import Graph
    >>> from rlx.ir.shape import Dim
    >>> from rlx.opt.memplan import plan
    >>> g = Graph("e")
    >>> table = g.param("table", [30522, 384])
    >>> ids = g.input("ids", [Dim.dynamic("batch", 8), Dim.dynamic("seq", 128)], "i64")
    >>> types = g.gather(g.param("types", [2, 384]), g.input("type_ids", [Dim.dynamic("n", 16)], "i64"))
    >>> g.set_outputs([g.gather(table, ids), types])
    >>> for d in resident_tables(plan(g)):  # the 16 rows of "types" are too few
    ...     print(d.describe())
    %0 param copied into the context's 2 MiB pages by the first run gathering >= 64 rows (%5 gathers up to 1024 a run)
    """
    graph = lir.graph
    out: list[ResidentTable] = []
    for spec, readers in lir.param_readers():
        nid = spec.node
        shape = graph.node(nid).shape
        if (not readers or shape.dtype not in _RESIDENT_DTYPES or shape.rank < 2
                or shape.max_nbytes > RESIDENT_TABLE_MAX_BYTES
                or shape.max_nbytes // shape.dims[0].max >= RESIDENT_TABLE_MAX_ROW_BYTES):
            continue
        if spec.layout is not None and list(spec.layout) != list(range(len(spec.layout))):
            continue  # re-laid out on set: copied anyway
        if not all(isinstance(r.op, O.Gather) and r.op.axis == 0 and r.inputs[0] == nid != r.inputs[1]
                   for r in readers):
            continue
        rows = sum(graph.node(r.inputs[1]).shape.max_numel for r in readers)
        if rows >= RESIDENT_TABLE_MIN_ROWS:
            out.append(ResidentTable(nid, tuple(r.id for r in readers), rows, RESIDENT_TABLE_MIN_ROWS))
    return tuple(out)


def attention_plans(lir: LirModule, vector: int = 8) -> tuple[AttentionPlan, ...]:
    """The `AttentionPlan` of every f32 `attention` node: ``rows`` where the target has AVX-512 (`vector` 16: the
    micro-kernel's 12 x 32 tile), the head dimension is a multiple of 32 (V's rows read in place as whole panels)
    and the mask is none or padding; ``blocks`` otherwise.

    >>> from rlx.ir.graph import Graph
    >>> from rlx.opt.memplan import plan
    >>> g = Graph("a")
    >>> q, k, v = (g.input(n, [2, 16, 64]) for n in "qkv")
    >>> g.set_outputs([g.attention(q, k, v, num_heads=2, head_dim=32), g.attention(q, k, v, num_heads=4, head_dim=16)])
    >>> [d.describe() for d in attention_plans(plan(g), 16)]  # doctest: +NORMALIZE_WHITESPACE
    ['%3 attention: rows (scores, 2^x softmax (float sums), P V per 12-row group in L1; K^T packed, V in place)',
     '%4 attention: blocks (scores, softmax and weighted sum per 64-row block; K^T and V packed)']
    """
    out = []
    for n in lir.graph.nodes:
        if not isinstance(n.op, O.Attention):
            continue
        rows = (vector == 16 and n.op.head_dim % 32 == 0 and n.op.mask in ("none", "padding")
                and n.shape.dtype is DType.F32)
        out.append(AttentionPlan(n.id, "rows" if rows else "blocks"))
    return tuple(out)


#: Arenas from this size on go to 2 MiB pages (`HugePageArena`) once a run uses this much of them: the reach of a
#: Sapphire Rapids core's second-level TLB in 4 KiB pages (2048 entries), which the weights' pages share.
HUGE_ARENA_MIN_BYTES = 8 << 20


def huge_page_arena(lir: LirModule) -> tuple[HugePageArena, ...]:
    """`HugePageArena` for an arena of at least `HUGE_ARENA_MIN_BYTES`. MiniLM at batch 8 x seq 128 (a 9 MiB arena,
    2 threads; one context whose arena is switched between 4 KiB and 2 MiB pages every other block of 5 calls,
    `madvise` between blocks, 20 blocks, 6 processes): 0.3-2.3% less a call in 2 MiB pages (median 0.8%, faster in
    all 6; blocks after a 0.3 s pause as the benchmark's 1.5-2.3%, back to back 0.3-0.7%). A smaller arena, and any
    run using less of one, stays on 4 KiB pages: a run's first touch of a 2 MiB page zeroes all of it.

    >>> from rlx.ir.graph import Graph
    >>> from rlx.opt.memplan import plan
    >>> def chain(rows: int) -> LirModule:
    ...     g = Graph("chain")
    ...     x = g.input("x", [rows, 1024])
    ...     g.set_outputs([g.activation("relu", g.activation("relu", g.activation("relu", x)))])
    ...     return plan(g)
    >>> [d.describe() for d in huge_page_arena(chain(1024))], huge_page_arena(chain(512))
    (['arena of 8.0 MiB in 2 MiB pages (MADV_HUGEPAGE) from the first run using 8.0 MiB of it'], ())
    """
    if lir.arena_bytes < HUGE_ARENA_MIN_BYTES:
        return ()
    return (HugePageArena(lir.arena_bytes, HUGE_ARENA_MIN_BYTES),)


def gemm_siblings(lir: LirModule, packed: tuple[Decision, ...], sources: dict[NodeId, NodeId],
                  vector: int = 8) -> tuple[GemmSiblings, ...]:
    """`GemmSiblings` of every run of 2+ consecutive scheduled GEMMs (`fused_matmul_bias_act`) reading the same left
    operand with packed, unbatched weights (`packed`) of one shape whose N is a multiple of the panel width, where the
    target has AVX-512 (`vector` 16: the 32-column panels). Consecutive in the schedule, so running the later members
    at the first one's place moves no write past any other node's use of memory.
    """
    if vector != 16:
        return ()
    packed_ids = {d.node for d in packed if isinstance(d, PackedParam)}
    graph = lir.graph

    def key(nid: NodeId) -> tuple[object, ...] | None:
        n = graph.node(nid)
        if n.kind != "fused_matmul_bias_act" or len(n.inputs) < 2 or lir.buffers[nid].storage != "arena":
            return None
        b = graph.node(n.inputs[1]).shape
        if sources.get(n.inputs[1], n.inputs[1]) not in packed_ids or b.rank != 2 or n.shape.dtype is not DType.F32:
            return None
        if not n.shape.dims[-1].is_static or n.shape.dims[-1].value % 32:
            return None
        return (n.inputs[0], tuple(b.dims), tuple(n.shape.dims))

    out: list[GemmSiblings] = []
    run: list[NodeId] = []
    run_key: tuple[object, ...] | None = None
    for nid in (*lir.schedule, None):
        k = key(nid) if nid is not None else None
        if k is not None and k == run_key:
            run.append(nid)
            continue
        if len(run) > 1:
            out.append(GemmSiblings(tuple(run)))
        run, run_key = ([nid], k) if k is not None else ([], None)
    return tuple(out)


def _cpu_decisions(lir: LirModule, conv_vector: int = 8, quant_interleave: bool = False) -> tuple[Decision, ...]:
    """The CPU's decisions; `conv_vector`: floats per vector of the conv register tiles (`tile_vector` of the
    target's instruction set: the pipeline passes it, 8 otherwise); `quant_interleave`: store q8_0 / q4_0 / q4_1 weights
    of integer-activation matmuls interleaved by 16 rows (the pipeline decides it from the target's AVX-512
    VNNI, or RLX_QUANT_LAYOUT)."""
    absorbed = absorb_transposes(lir)
    sources = {d.node: d.source for d in absorbed if isinstance(d, AbsorbedTranspose)}
    interleaved = interleaved_params(lir) if quant_interleave else ()
    convs = conv_plans(lir, conv_vector)
    packed = pack_params(lir, sources)
    return (*absorbed, *packed, *gemm_siblings(lir, packed, sources, conv_vector), *widen_params(lir),
            *int8_params(lir), *interleaved,
            *quant_gemv_groups(lir, frozenset(d.node for d in interleaved)), *moe_plans(lir, "cpu"),
            *convs, *conv_residuals(lir, convs), *conv_input_scales(lir, convs), *pool_plans(lir, conv_vector),
            *attention_plans(lir, conv_vector), *resident_tables(lir), *huge_page_arena(lir))


#: The decision passes of each backend (CUDA's: GEMM groups, fused kernels, the device memory layout and the kernel
#: choices that depend on it; Metal's: its one buffer).
def _cuda_decisions(lir: LirModule, **target: object) -> tuple[Decision, ...]:
    return (*cuda_lowering(lir, **target), *moe_plans(lir, "cuda"))


LOWERINGS: dict[str, LoweringPass] = {"cpu": _cpu_decisions, "cuda": _cuda_decisions, "metal": metal_decisions}


def lower_for(lir: LirModule, backend: str, **options: object) -> LirModule:
    """`lir` with `backend`'s decisions recorded (idempotent: an LIR lowered for `backend` is returned as is)."""
    if lir.backend == backend:
        return lir
    if lir.backend:
        raise ValueError(f"this LIR was lowered for {lir.backend!r}, not {backend!r}: plan the graph again")
    try:
        decide = LOWERINGS[backend]
    except KeyError:
        raise ValueError(f"no lowering passes for backend {backend!r}; expected one of {sorted(LOWERINGS)}") from None
    decisions = decide(lir, **options) if options else decide(lir)
    return dataclasses.replace(lir, backend=backend, decisions=tuple(decisions))

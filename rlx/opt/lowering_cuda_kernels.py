"""CUDA lowering: which kernel does a node's work where several could (`rlx.ir.decisions_cuda_kernels`).

`cuda_lowering(lir, **target)` is `LOWERINGS["cuda"]`: the memory decisions of `rlx.opt.lowering_cuda`
(`cuda_decisions`: QKV groups, fused decode kernels, the device layout), then, from that layout, the kernel
choices that depend on where bytes live and on neighbouring nodes:

- `CutlassGemm` (`find_cutlass_gemms`): a GEMM on cuBLASLt's path whose activation its epilogue cannot fuse (erf
  GELU, SiLU) runs on the CUTLASS sm90 unit (`templates/cuda/kernels/gemm_cutlass.cu`, TMA + wgmma, bias and
  activation on the accumulators: the output crosses device memory once) where `cutlass_choice` allows, and
  stays on cuBLASLt plus a bias/activation pass otherwise, with the reason.
- `GatherInRegion` (`find_region_gathers`): a BERT embedding is `word[ids] + position[pos] + type[0]`, two gather
  kernels and the region adding their outputs, three dependent launches at the start of every step. When a
  gather's only reader is an elementwise region scheduled after it with nothing but views and other such gathers
  between them, the region's kernel reads `table[idx[j]]` itself. Taken only when the table is a weight (no
  kernel writes it), the gather takes rows of axis 0 of a table with static dims, and the region's output bytes
  are not the index's (a block writes while others read).
- `NormInGemm` (`find_norms_in_gemms`): a layer / RMS norm whose output is the A of a GEMM scheduled right after
  it that takes rlx_gemm_small in steps of few rows is computed in that GEMM's prologue.
- `CopySmallGemm` (`find_copy_small_gemms`): a quantized product whose weight keeps a dequantized copy multiplies
  it on rlx_gemm_small in steps of few rows, its residual add in the epilogue, instead of a
  cuBLASLt call whose fixed cost dominates a product of 5-64 rows of a small model; a SwiGLU's gate and up
  (`pair`) and a layer's Q, K and V (`siblings`) in one launch each.

The choices are made for the target's options (`arch`, `cutlass_gemm`: asked for *and* available to the build,
as the toolchain resolved it; `gather_region`, `small_gemm`, `lt_gelu_epilogue`, `fused_act_gemm`), recorded
as `CudaKernelOptions`. The kernel-fit predicates (`cutlass_choice`, `small_gemm_fits`, `mma_gemm_fits`) are
shared with the CUDA rules, which apply them to the GEMMs no decision covers.

A scan body is lowered on its own (`scan_body=True`): its per-step inputs and output live where the enclosing
loop puts them, so their alignment is unknown here (taken as unaligned) and they never overlap the body's arena.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> from rlx.opt.pipeline import optimize
>>> g = Graph("ffn")
>>> x = g.input("x", [64, 384])
>>> g.set_outputs([g.activation("gelu", g.matmul(x, g.param("w", [384, 1536])))])
>>> decisions = cuda_lowering(plan(optimize(g)), precision="f16")
>>> [d.describe() for d in decisions if d.kind == "cuda_cutlass_gemm"]
['%2 GEMM on CUTLASS sm90 (rlx_cutlass_gemm_f16_gelu): bias and gelu in its epilogue']
>>> cutlass_choice(True, "sm_90", DType.F16, "gelu", True, Dim(384), Dim(1532), [0, 16, 32, 48]).why
'N = 1532 is not a multiple of 8 (TMA rows are whole 16-byte units)'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from rlx.ir.activation_table import activation_table
from rlx.ir.decisions import Decision
from rlx.ir.decisions_cuda import DecodeGemv, DequantCopy, DeviceLayout, GemmGroup, PoolTail
from rlx.ir.decisions_cuda_kernels import CopySmallGemm, CudaKernelOptions, CutlassGemm, GatherInRegion, NormInGemm
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.ir.lir import LirModule
from rlx.ir.norms import is_norm, norm_inputs
from rlx.ir.shape import Dim, product
from rlx.opt.lowering_cuda import DEQUANT_COPY_BYTES, LT_DTYPES, cuda_decisions, device_dtype, gemm_batching

#: Activations the CUTLASS unit is built for (the rest stay on cuBLASLt's epilogue or a separate pass).
CUTLASS_ACTS = tuple(activation_table().cutlass_ids)
#: The archs of the sm90 kernels.
CUTLASS_ARCHS = ("sm_90", "sm_90a")
_CUTLASS_DT = {DType.F16: "f16", DType.BF16: "bf16"}
#: rlx_gemm_small's limits (RLX_GSM_KMAX in gemm_small.cuh: its shared memory holds a K x 16 slab of B and 16
#: rows of A, 107 KB at K = 1536).
SMALL_GEMM_KMAX = 1536
#: RLX_GSM_MAX_M: the most rows a step may have for rlx_gemm_small.
SMALL_GEMM_MAX_M = 64
#: The most dynamic shared memory a block may opt into (bytes), by compute capability: the data-center parts
#: (A100 / Orin 163 KB, H100 / H200 227 KB); the others (sm_86, sm_89, sm_120: the consumer GPUs) 99 KB.
BLOCK_SMEM_OPT_IN = {80: 166912, 87: 166912, 90: 232448, 100: 232448}
BLOCK_SMEM_DEFAULT = 101376


def small_gemm_kmax(arch: str) -> int:
    """The largest K rlx_gemm_small takes on `arch`: SMALL_GEMM_KMAX where its shared memory (`rlx_gemm_small_smem`:
    64 K + 8448 bytes) fits the arch's opt-in limit, else the largest multiple of 16 that fits.

    >>> small_gemm_kmax("sm_90"), small_gemm_kmax("sm_80"), small_gemm_kmax("sm_89")
    (1536, 1536, 1440)
    """
    limit = BLOCK_SMEM_OPT_IN.get(arch_number(arch), BLOCK_SMEM_DEFAULT)
    return min(SMALL_GEMM_KMAX, (limit - 8448) // 64 // 16 * 16)


def arch_number(arch: str) -> int:
    """The compute capability of an `sm_XY[a]` arch as XY (0 when it is not one).

    >>> arch_number("sm_90a"), arch_number("sm_89"), arch_number("compute")
    (90, 89, 0)
    """
    sm = arch.removeprefix("sm_").rstrip("a")
    return int(sm) if sm.isdigit() else 0
#: The op kinds the CUDA region rule renders (one generated elementwise kernel each).
REGION_KINDS = ("activation", "binary", "compare", "where", "cast", "elementwise_region")
_GEMM_KINDS = ("matmul", "fused_matmul_bias_act")


# ── what each GEMM kernel takes ───────────────────────────────────────────────


@dataclass(frozen=True)
class CutlassChoice:
    """A GEMM's CUTLASS verdict: the launcher to call (`function`), or '' and why not (`why`)."""

    function: str = ""
    why: str = ""


def cutlass_choice(enabled: bool, arch: str, dt: DType, act: str | None, folded: bool, K: Dim, N: Dim,
                   offsets: Sequence[int | None]) -> CutlassChoice:
    """Whether a GEMM C = act(A B + bias) runs on the CUTLASS unit: f16/bf16 on sm_90, an activation the unit has,
    one B for all rows (M folds the batch), static K and N multiples of 8 and 16-byte aligned operands (TMA).

    >>> cutlass_choice(True, "sm_90", DType.F16, "gelu", True, Dim(384), Dim(1536), [0, 16, 32, 48]).function
    'rlx_cutlass_gemm_f16_gelu'
    """
    if act not in CUTLASS_ACTS:
        return CutlassChoice(why=f"activation {act} is fused by cuBLASLt or absent" if act else "no activation")
    if not enabled:
        return CutlassChoice(why="CudaTarget(cutlass_gemm=False), or CUTLASS unavailable for this build")
    if arch not in CUTLASS_ARCHS:
        return CutlassChoice(why=f"the CUTLASS kernels are sm_90 (wgmma); the target is {arch}")
    if dt not in _CUTLASS_DT:
        return CutlassChoice(why=f"{dt.value} products (the unit is f16/bf16)")
    if not folded:
        return CutlassChoice(why="a batched product (one B per batch)")
    for name, d in (("K", K), ("N", N)):
        if not d.is_static:
            return CutlassChoice(why=f"{name} is dynamic")
        if d.value % 8:
            return CutlassChoice(why=f"{name} = {d.value} is not a multiple of 8 (TMA rows are whole 16-byte units)")
    if not _aligned(offsets):
        return CutlassChoice(why="an operand is not 16-byte aligned")
    return CutlassChoice(function=f"rlx_cutlass_gemm_{_CUTLASS_DT[dt]}_{act}")


def small_gemm_fits(enabled: bool, arch: str, dt: DType, folded: bool, K: Dim, N: Dim,
                    offsets: Sequence[int | None]) -> bool:
    """rlx_gemm_small can take the few-row steps: f16/bf16 on sm_80+, one B for all rows, K whole 16-deep steps
    (at most `small_gemm_kmax(arch)`: its shared memory), N whole 16-byte chunks, 16-byte aligned operands
    (cp.async).

    >>> small_gemm_fits(True, "sm_90", DType.F16, True, Dim(384), Dim(1536), [0, 16, 32])
    True
    """
    return (enabled and dt in (DType.F16, DType.BF16) and folded and arch_number(arch) >= 80
            and K.is_static and N.is_static and K.value % 16 == 0 and 0 < K.value <= small_gemm_kmax(arch)
            and N.value % 8 == 0 and _aligned(offsets))


def mma_gemm_fits(dt: DType, folded: bool, K: Dim, N: Dim, offsets: Sequence[int | None]) -> bool:
    """rlx_gemm_mma takes it: f16/bf16, one B for all rows, whole 16-byte chunks of K and N, aligned operands."""
    return (dt in (DType.F16, DType.BF16) and folded and K.is_static and N.is_static
            and K.value % 8 == 0 and N.value % 8 == 0 and _aligned(offsets))


def lt_fuses(act: str | None, lt_gelu_epilogue: bool) -> bool:
    """cuBLASLt's epilogue applies `act` itself (ReLU; its GELU is the tanh form)."""
    return act == "relu" or (act == "gelu_tanh" and lt_gelu_epilogue)


def _aligned(offsets: Sequence[int | None]) -> bool:
    return all(o is not None and o % 16 == 0 for o in offsets)


# ── device places ─────────────────────────────────────────────────────────────


class DevicePlaces:
    """Byte offsets of a LIR's nodes in the one device allocation, as the CUDA codegen places them.

    None: a scan body's per-step input or output, placed by the enclosing loop (alignment unknown).
    """

    def __init__(self, lir: LirModule, layout: DeviceLayout, groups: Sequence[GemmGroup], precision: DType,
                 scan_body: bool) -> None:
        self.lir = lir
        self.layout = layout
        self.precision = precision
        self.scan_body = scan_body
        self.group_of = {m: g for g in groups for m in g.members}

    def ddt(self, nid: NodeId) -> DType:
        return device_dtype(self.lir.graph.node(nid).shape.dtype, self.precision)

    def offset(self, nid: NodeId) -> int | None:
        g = self.group_of.get(nid)
        if g is not None:
            return g.out_offset + g.column(nid) * self.ddt(nid).itemsize
        b = self.lir.buffers[nid]
        lay = self.layout
        if b.storage == "view":
            # the planner's view offset is in bytes of the declared dtype; the device may store it narrower
            src = self.lir.graph.node(b.source).shape.dtype
            base = self.offset(b.source)
            if base is None:
                return None
            return base + b.offset // src.itemsize * device_dtype(src, self.precision).itemsize
        if b.storage in ("input", "output") and self.scan_body:
            return None
        where = {"input": lambda: lay.inputs[b.slot].dev, "output": lambda: lay.outputs[b.slot].dev,
                 "param": lambda: lay.params[b.slot].offset, "const": lambda: lay.constants[b.slot],
                 "arena": lambda: lay.arena + b.offset}
        return where[b.storage]()

    def extent(self, nid: NodeId) -> tuple[int, int] | None:
        """Device bytes [start, end) of `nid`'s values at the dims' upper bounds (a QKV group member: all of the
        group's wide output); None where `offset` is."""
        g = self.group_of.get(nid)
        node = self.lir.graph.node(nid)
        item = self.ddt(nid).itemsize
        if g is not None:
            return g.out_offset, g.out_offset + product(node.shape.dims[:-1]).max * g.row_stride * item
        start = self.offset(nid)
        return None if start is None else (start, start + node.shape.max_numel * item)

    def overlap(self, a: NodeId, b: NodeId) -> bool:
        """The bytes of `a` and `b` may intersect (two loop-placed buffers may; one never meets a placed one)."""
        ea, eb = self.extent(a), self.extent(b)
        if ea is None or eb is None:
            return ea is None and eb is None
        return ea[0] < eb[1] and eb[0] < ea[1]

    def is_weight(self, nid: NodeId) -> bool:
        """`nid`'s bytes are a param or constant (through views): no kernel writes them during a run."""
        b = self.lir.buffers[nid]
        while b.storage == "view":
            b = self.lir.buffers[b.source]
        return b.storage in ("param", "const")


# ── the decisions ─────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class _Options:
    precision: DType
    gemm: str
    arch: str
    cutlass: bool
    gather_region: bool
    small_gemm: bool
    lt_gelu_epilogue: bool
    fused_act_gemm: bool


def _rendered(lir: LirModule, places: DevicePlaces, covered: set[NodeId]) -> list[Node]:
    """Scheduled nodes whose own rule renders them (no view, no QKV sibling, no node a fused kernel covers)."""
    out = []
    for nid in lir.schedule:
        g = places.group_of.get(nid)
        if lir.buffers[nid].storage == "view" or nid in covered or (g is not None and g.members[0] != nid):
            continue
        out.append(lir.graph.node(nid))
    return out


def _gemm_operands(places: DevicePlaces, node: Node) -> list[int | None]:
    """Offsets of a (non-grouped) GEMM's A, B, output and bias, as its rule checks them."""
    return [places.offset(i) for i in (node.inputs[0], node.inputs[1], node.id, *node.inputs[2:3])]


def find_cutlass_gemms(lir: LirModule, places: DevicePlaces, nodes: Sequence[Node],
                       opt: _Options) -> list[CutlassGemm]:
    """The CUTLASS verdict of every GEMM on cuBLASLt's path whose activation cuBLASLt's epilogue leaves to a pass."""
    if opt.gemm != "cublaslt":
        return []
    graph = lir.graph
    found = []
    for node in nodes:
        act = getattr(node.op, "activation", None)
        if node.kind not in _GEMM_KINDS or act is None or node.id in places.group_of:
            continue
        a, b = (graph.node(i).shape for i in node.inputs[:2])
        dt = places.ddt(node.inputs[0])
        batching = gemm_batching(a, b, node.shape)
        if dt not in LT_DTYPES or batching is None:
            continue
        K, N = a.dims[-1], b.dims[-1]
        offsets = _gemm_operands(places, node)
        if batching.folded and lt_fuses(act, opt.lt_gelu_epilogue):
            continue  # cuBLASLt's epilogue applies it
        if opt.fused_act_gemm and mma_gemm_fits(dt, batching.folded, K, N, offsets):
            continue  # rlx_gemm_mma, activation in its epilogue
        cut = cutlass_choice(opt.cutlass, opt.arch, dt, act, batching.folded, K, N, offsets)
        found.append(CutlassGemm(node.id, act, cut.function, cut.why))
    return found


def _gather_candidate(places: DevicePlaces, users: dict[NodeId, list[NodeId]], outputs: set[NodeId], g: Node,
                      region: Node) -> bool:
    """`g` is a gather whose only reader is `region`, which could do its lookups (all checks but the schedule's)."""
    graph = places.lir.graph
    if g.kind != "gather" or len(g.inputs) != 2 or g.id in outputs or set(users[g.id]) != {region.id}:
        return False
    table, idx = (graph.node(i) for i in g.inputs)
    if g.op.axis % table.shape.rank != 0 or table.shape.rank < 1 or not all(d.is_static for d in table.shape.dims):
        return False
    if idx.shape.dtype.value not in ("i32", "i64") or not places.is_weight(table.id):
        return False
    return not places.overlap(idx.id, region.id)


def find_region_gathers(lir: LirModule, places: DevicePlaces, nodes: Sequence[Node],
                        opt: _Options) -> list[GatherInRegion]:
    """Gathers looked up by the elementwise region that reads them (see the module docstring)."""
    if not opt.gather_region:
        return []
    graph = lir.graph
    users = graph.users()
    outputs = set(graph.outputs)
    position = {nid: i for i, nid in enumerate(lir.schedule)}
    found = []
    for g in nodes:
        if g.kind != "gather" or len(users[g.id]) != 1:
            continue
        region = graph.node(users[g.id][0])
        if region.kind not in REGION_KINDS or position.get(region.id, -1) <= position[g.id]:
            continue
        if not _gather_candidate(places, users, outputs, g, region):
            continue
        between = lir.schedule[position[g.id] + 1:position[region.id]]
        if all(lir.buffers[nid].storage == "view" or _gather_candidate(places, users, outputs, graph.node(nid), region)
               for nid in between):  # a kernel between them could write the index (or read the gather's output)
            found.append(GatherInRegion(g.id, region.id))
    return found


def _gemm_is_small(lir: LirModule, places: DevicePlaces, lead: Node, opt: _Options) -> bool:
    """The GEMM led by `lead` runs rlx_gemm_small in steps of few rows (what its rule checks)."""
    if opt.gemm != "cublaslt":
        return False
    graph = lir.graph
    a = graph.node(lead.inputs[0]).shape
    dt = places.ddt(lead.inputs[0])
    g = places.group_of.get(lead.id)
    if g is not None:
        offs = [places.offset(lead.inputs[0]), g.weight_offset, g.out_offset] + (
            [g.bias_offset] if g.bias_offset >= 0 else [])
        return small_gemm_fits(opt.small_gemm, opt.arch, dt, True, a.dims[-1], Dim(g.row_stride), offs)
    b = graph.node(lead.inputs[1]).shape
    batching = gemm_batching(a, b, lead.shape)
    if dt not in LT_DTYPES or batching is None:
        return False
    offs = _gemm_operands(places, lead)
    act = getattr(lead.op, "activation", None)
    if (opt.fused_act_gemm and act is not None and not (batching.folded and lt_fuses(act, opt.lt_gelu_epilogue))
            and mma_gemm_fits(dt, batching.folded, a.dims[-1], b.dims[-1], offs)):
        return False  # rlx_gemm_mma runs it in every step: no small path to hold a prologue
    return small_gemm_fits(opt.small_gemm, opt.arch, dt, batching.folded, a.dims[-1], b.dims[-1], offs)


def find_norms_in_gemms(lir: LirModule, places: DevicePlaces, nodes: Sequence[Node], decode: set[NodeId],
                        opt: _Options, dense: Mapping[NodeId, tuple[NodeId, ...]] | None = None) -> list[NormInGemm]:
    """Norms computed in the prologue of the small GEMM reading them.

    Taken when the norm's output is the A of a GEMM scheduled right after it (views between) that takes the small
    path, every other reader of the norm comes after that GEMM, and the bytes the GEMM's blocks read (the norm's
    input and residual) are not the bytes they write (its output and the norm's). A norm a fused decode GEMV
    absorbs keeps that GEMV's step-size switch. `dense` (a dense decode GEMV's members -> the norms it computes):
    a GEMM that runs a dense GEMV in one-row steps takes only the norm that GEMV computes (its one-row steps read
    any other norm's output, which the norm's own kernel must then write).
    """
    if not opt.small_gemm:
        return []
    graph = lir.graph
    users = graph.users()
    position = {nid: i for i, nid in enumerate(lir.schedule)}
    found = []
    for norm in nodes:
        if not is_norm(norm) or places.ddt(norm.id) not in (DType.F16, DType.BF16):
            continue
        roles = norm_inputs(norm)  # every norm kind: rlx_gemm_small's NORM is roles.kernel_kind
        fused = roles.residual is not None
        if roles.bias is not None:
            continue  # a norm with a bias input
        if lir.buffers[norm.id].storage != "arena" or norm.id in decode:
            continue
        readers = [u for u in users[norm.id] if graph.node(u).kind in _GEMM_KINDS
                   and graph.node(u).inputs[0] == norm.id]
        if not readers:
            continue
        first = min(readers, key=lambda u: position.get(u, 1 << 60))
        g = places.group_of.get(first)
        lead = g.members[0] if g is not None else first
        members = set(g.members) if g is not None else {lead}
        if lead not in position or any(u not in members and position.get(u, -1) <= position[lead]
                                       for u in users[norm.id]):
            continue
        if any(lir.buffers[b].storage != "view" for b in lir.schedule[position[norm.id] + 1:position[lead]]):
            continue
        if not _gemm_is_small(lir, places, graph.node(lead), opt):
            continue
        absorbing = (dense or {}).get(lead)
        if absorbing is not None and norm.id not in absorbing:
            # a one-row step runs the dense GEMV of `lead`, which reads the norm's output (and so may another
            # reader): the norm's kernel must run in that step, not only past the small GEMM's rows
            continue
        if _prologue_fits(places, norm, norm.inputs[:1 + int(fused)], lead):
            found.append(NormInGemm(norm.id, lead, SMALL_GEMM_MAX_M))
    return found


def find_copy_small_gemms(lir: LirModule, places: DevicePlaces, memory: Sequence[Decision],
                          opt: _Options) -> list[CopySmallGemm]:
    """Readers of a `DequantCopy` whose copy steps (from its `min_rows`) up to SMALL_GEMM_MAX_M rows run
    rlx_gemm_small: the target's cuBLASLt path with small GEMMs on, f16 / bf16 on sm_80+, K whole 16-deep steps up
    to SMALL_GEMM_KMAX, N whole 16-byte chunks and X, the copy, the output and a residual addend 16-byte aligned."""
    if opt.gemm != "cublaslt" or not opt.small_gemm:
        return []
    graph = lir.graph
    residual = {d.members[0]: d.residual[0] for d in memory if isinstance(d, DecodeGemv) and d.residual
                and len(d.members) == 1}
    gemvs = {d.members[0]: d for d in memory if isinstance(d, DecodeGemv)}
    copies = {r: (d, first) for d in memory if isinstance(d, DequantCopy) for r, first in zip(d.readers, d.min_rows)}
    found: dict[NodeId, CopySmallGemm] = {}
    for reader, (copy, first) in copies.items():
        if first > SMALL_GEMM_MAX_M:
            continue
        node = graph.node(reader)
        add = residual.get(reader)
        adds = (add,) if add is not None and add in copy.adds else ()
        offsets = [places.offset(node.inputs[0]), copy.offset, places.offset(adds[0] if adds else reader)]
        if adds:
            a = graph.node(adds[0])
            offsets.append(places.offset(a.inputs[1] if a.inputs[0] == reader else a.inputs[0]))
        if small_gemm_fits(True, opt.arch, places.ddt(reader), True, Dim(copy.k), Dim(copy.n), offsets):
            norm = _copy_norm(places, gemvs.get(reader), reader, first, adds[0] if adds else reader)
            found[reader] = CopySmallGemm(reader, first, SMALL_GEMM_MAX_M, adds, norm)
    for gate, small in list(found.items()):
        pair = _swiglu_pair(places, opt.arch, gemvs.get(gate), small, found, copies)
        if pair is not None:
            up, region = pair
            found[gate] = replace(small, pair=(up,), swiglu=(region,))
            del found[up]
    for lead, small in list(found.items()):
        siblings = _siblings(places, gemvs.get(lead), small, found, copies)
        if siblings:
            found[lead] = replace(small, siblings=siblings)
            for s in siblings:
                del found[s]
    for node, small in list(found.items()):
        copy = copies[node][0]
        if (not (small.add or small.pair or small.siblings) and copy.n >= SMALL_GEMM_WIDE_MIN_N
                and copy.k <= small_gemm_wide_kmax(opt.arch)):
            found[node] = replace(small, wide=True)
    return list(found.values())


#: The N from which a plain small-GEMM product takes rlx_gemm_small_wide (CopySmallGemm.wide): 512 column tiles, past
#: which the ordinary launch's blocks (a 16 x 16 tile each) run in several waves, each reading its B slab again.
SMALL_GEMM_WIDE_MIN_N = 8192


def small_gemm_wide_kmax(arch: str) -> int:
    """The largest K rlx_gemm_small_wide takes on `arch`: its shared memory (`rlx_gemm_small_wide_smem`: 64 rows of
    A, three 32-column slabs of B, 368 K + 9216 bytes) within the arch's opt-in limit, a multiple of 16.

    >>> small_gemm_wide_kmax("sm_90"), small_gemm_wide_kmax("sm_80"), small_gemm_wide_kmax("sm_89")
    (592, 416, 240)
    """
    limit = BLOCK_SMEM_OPT_IN.get(arch_number(arch), BLOCK_SMEM_DEFAULT)
    return (limit - 9216) // 368 // 16 * 16


#: Most products one rlx_gemm_small launch multiplies (RlxGsmMembers: the lead's and two siblings').
SMALL_GEMM_MAX_SIBLINGS = 2


def _siblings(places: DevicePlaces, gemv: DecodeGemv | None, lead: CopySmallGemm, found: dict[NodeId, CopySmallGemm],
              copies: dict[NodeId, tuple[DequantCopy, int]]) -> tuple[NodeId, ...]:
    """The other members of the fused decode GEMV `lead` leads (a layer's K and V beside its Q) that the lead's
    small GEMM can also multiply: each takes the small GEMM in the same steps with no norm, add or pair of its own,
    its copy has the lead's K, and its output is not among the bytes the launch reads (X, or the norm's input and
    residual). All of them or none (at most SMALL_GEMM_MAX_SIBLINGS)."""
    if gemv is None or gemv.swiglu or gemv.residual or gemv.members[0] != lead.node or lead.pair or lead.add:
        return ()
    others = gemv.members[1:]
    if not others or len(others) > SMALL_GEMM_MAX_SIBLINGS:
        return ()
    spans = _launch_reads(places, lead)
    if any(e is None for e in spans):
        return ()
    k = copies[lead.node][0].k
    for s in others:
        other, out = found.get(s), places.extent(s)
        if (other is None or other.min_rows != lead.min_rows or other.add or other.norm or other.pair
                or copies[s][0].k != k or out is None or any(e[0] < out[1] and out[0] < e[1] for e in spans)):
            return ()
    return tuple(others)


def _launch_reads(places: DevicePlaces, lead: CopySmallGemm) -> list[tuple[int, int] | None]:
    """The byte spans the small GEMM launch of `lead` reads besides the weights: its norm's input and residual when
    it computes the norm, else its X (None: a value with no place in the arena)."""
    graph = places.lir.graph
    if lead.norm:
        roles = norm_inputs(graph.node(lead.norm[0]))
        read = [roles.x, *((roles.residual,) if roles.residual is not None else ())]
    else:
        read = [graph.node(lead.node).inputs[0]]
    return [places.extent(i) for i in read]


def _swiglu_pair(places: DevicePlaces, arch: str, gemv: DecodeGemv | None, gate: CopySmallGemm,
                 found: dict[NodeId, CopySmallGemm],
                 copies: dict[NodeId, tuple[DequantCopy, int]]) -> tuple[NodeId, NodeId] | None:
    """(up, region) when the small GEMM of `gate` can also multiply its SwiGLU partner's copy and write the region:
    on sm_90 and later, `gate` leads a fused decode GEMV with a SwiGLU (gate, up), the up product takes the small
    GEMM in the same steps with no norm or add of its own, the two copies have one shape, and the region's output
    (16-byte aligned) is not among the bytes the launch reads (X, or the norm's input and residual). The norm's
    output, which only the two products read, is then not stored (its bytes may be the region's)."""
    if gemv is None or not gemv.swiglu or len(gemv.members) != 2 or gemv.members[0] != gate.node:
        return None
    if arch_number(arch) < 90:
        return None  # two slabs: up to 164 KB of shared memory a block at K = 1536 (Hopper's 227 KB; not sm_8x's)
    up, region = gemv.members[1], gemv.swiglu[0]
    other = found.get(up)
    if other is None or other.min_rows != gate.min_rows or other.add or other.norm:
        return None
    if (copies[gate.node][0].n, copies[gate.node][0].k) != (copies[up][0].n, copies[up][0].k):
        return None
    out = places.extent(region)
    if out is None or not _aligned([places.offset(region)]):
        return None
    if any(e is None or (e[0] < out[1] and out[0] < e[1]) for e in _launch_reads(places, gate)):
        return None
    return up, region


def _copy_norm(places: DevicePlaces, gemv: DecodeGemv | None, reader: NodeId, first: int,
               out: NodeId) -> tuple[NodeId, ...]:
    """The norm a copy's small GEMM computes in its prologue: the one `gemv` (the fused decode GEMV `reader` leads)
    absorbs, when the copy takes every step past that GEMV's rows, the norm has no bias, its f16/bf16 input,
    residual and output are 16-byte aligned, and the bytes the GEMM's blocks read (the norm's input and residual)
    are not those they write (`out` and the norm's output)."""
    if gemv is None or not gemv.norm or first != gemv.max_rows + 1:
        return ()
    norm = places.lir.graph.node(gemv.norm[0])
    roles = norm_inputs(norm)
    if roles.bias is not None or places.ddt(norm.id) not in (DType.F16, DType.BF16):
        return ()
    reads = (roles.x, *((roles.residual,) if roles.residual is not None else ()))
    return (norm.id,) if _prologue_fits(places, norm, reads, out) else ()


def _prologue_fits(places: DevicePlaces, norm: Node, reads: Sequence[NodeId], out: NodeId) -> bool:
    """A small GEMM writing `out` may compute `norm` in its prologue: the bytes its blocks read (`reads`: the norm's
    input and residual) are not those they write (`out` and the norm's output), and the norm's operands and output
    are 16-byte aligned."""
    writes = [places.extent(out), places.extent(norm.id)]
    if any(r is None or w is None or (r[0] < w[1] and w[0] < r[1]) for r in map(places.extent, reads) for w in writes):
        return False
    return _aligned([places.offset(i) for i in (*norm.inputs, norm.id)])


def kernel_choices(lir: LirModule, memory: Sequence[Decision], opt: _Options,
                   scan_body: bool) -> tuple[Decision, ...]:
    """The kernel decisions of `lir` given its memory decisions (`memory`: what `cuda_decisions` returned)."""
    (layout,) = [d for d in memory if isinstance(d, DeviceLayout)]
    groups = [d for d in memory if isinstance(d, GemmGroup)]
    places = DevicePlaces(lir, layout, groups, opt.precision, scan_body)
    covered = {n for d in memory if isinstance(d, PoolTail) for n in (d.out, *d.absorbed)}
    # (a dense GEMV's members and norm keep their own kernels, and choices, for steps of more than one row)
    covered |= {m for d in memory if isinstance(d, DecodeGemv) and d.walk != "dense" for m in d.members[1:]}
    decode = {n for d in memory if isinstance(d, DecodeGemv) and d.walk != "dense" for n in d.nodes()}
    # a dense GEMV's members -> the norms it computes in one-row steps
    dense = {m: d.norm for d in memory if isinstance(d, DecodeGemv) and d.walk == "dense" for m in d.members}
    nodes = _rendered(lir, places, covered)
    options = CudaKernelOptions(opt.arch, opt.cutlass, opt.gather_region, opt.small_gemm, opt.lt_gelu_epilogue,
                                opt.fused_act_gemm)
    return (options, *find_cutlass_gemms(lir, places, nodes, opt), *find_region_gathers(lir, places, nodes, opt),
            *find_norms_in_gemms(lir, places, nodes, decode, opt, dense),
            *find_copy_small_gemms(lir, places, memory, opt))


def cuda_lowering(lir: LirModule, precision: DType | str = DType.F32, gemm: str = "cublaslt", pool_tail: bool = True,
                  pool_norm: bool = False, arch: str = "sm_90", cutlass_gemm: bool = True, gather_region: bool = True,
                  small_gemm: bool = True, lt_gelu_epilogue: bool = True, fused_act_gemm: bool = False,
                  scan_body: bool = False, decode_sms: int = 132, kv_decode: bool = True,
                  p2p_all_reduce: bool = True, gemv_walk: str = "auto", xr_groups: int = 0,
                  dequant_copies: int = DEQUANT_COPY_BYTES, dense_gemv: bool = True, dense_tile: int = 0,
                  dense_split: int = 0, **_target: object) -> tuple[Decision, ...]:
    """`LOWERINGS["cuda"]`: the memory decisions (`cuda_decisions`), then the kernel choices for these options.

    The defaults are `CudaTarget()`'s; other target options (tile sizes, attention variants, profiling) change
    no decision and are ignored.
    """
    memory = cuda_decisions(lir, precision, gemm, pool_tail, pool_norm, decode_sms, kv_decode, p2p_all_reduce,
                            gemv_walk, xr_groups, dequant_copies, dense_gemv, dense_tile, dense_split)
    opt = _Options(DType.parse(precision), gemm, arch, cutlass_gemm, gather_region,
                   small_gemm, lt_gelu_epilogue, fused_act_gemm)
    return (*memory, *kernel_choices(lir, memory, opt, scan_body))

"""LIR → template context for the CUDA backend, and the rendering of one .cu file.

`cuda_context(lir, target, manifest)` reads the LIR decided for CUDA (QKV GEMM groups
and the device byte layout are decisions of `rlx.opt.lowering_cuda`, recorded
in the LIR), then asks the rule of each scheduled node's op kind
(`rlx.codegen.cuda.rules` and the other rule modules, in `rlx.codegen.cuda.rule_table()`) for its `Kernel`:
the template macro that launches it and that macro's typed arguments. Device
pointers are one base plus a static offset (the whole program lives in a
single `cudaMalloc`), dims are expressions of the run-time symbol values
(`S[k]` on the host, `sy.v[k]` inside generated kernels). All CUDA text lives
in `templates/cuda/`; this module supplies identifiers, numbers and index
arithmetic only.

Precision: tensors declared f32 are *stored and computed* in the session
precision (f32, f16 or bf16) on the device, with f32 accumulation
everywhere; the C ABI keeps the declared dtypes, so inputs, outputs and
params cross the boundary as f32 and are converted on the device (params
once, at `rlx_set_param`).

The backend's entry point is `rlx.codegen.cuda` (its `rule_table()` lists the rule modules).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import jinja2

from rlx.abi_version import ABI_VERSION
from rlx.codegen.activations import install
from rlx.codegen.common import cost_expr, dim_expr, require_decided
from rlx.codegen.registry import Kernel, user_code_of
from rlx.codegen.template_cache import header_text
from rlx.codegen.text import c_string, c_string_lines, comment, node_header
from rlx.errors import BuildError
from rlx.ir.activation_table import activation_table
from rlx.ir.cost import node_cost
from rlx.ir.decisions_cuda import (
    AllReduceP2P,
    DecodeGemv,
    DecodeRope,
    DecodeSplitKv,
    DequantCopy,
    DeviceLayout,
    GemmGroup,
    PoolTail,
    QuantMma,
    SampleFromArgmax,
    ScanConstants,
)
from rlx.ir.decisions_cuda_kernels import CopySmallGemm, CudaKernelOptions, CutlassGemm, GatherInRegion, NormInGemm
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.ir.lir import LirModule
from rlx.ir.quant import quant_format
from rlx.ir.shape import Dim, Shape, product
from rlx.ir.view import View, collapse
from rlx.opt.lowering_cuda import (
    ATTN_MAX_SPLITS,
    DECODE_OCC_WALKS,
    DENSE_GEMV_SPLIT_MAX,
    DENSE_GEMV_TILES,
    DEQUANT_COPY_BYTES,
    GEMM_MODES,
    LT_DTYPES,
    PRECISIONS,
    constant_bytes,
    device_dtype,
    scan_bodies,
)
from rlx.templates_path import templates_dir

#: Bumped whenever generated code changes for the same LIR and templates (part of the cache key).
CODEGEN_VERSION = "cuda-2"
_INT32_LIMIT = (1 << 31) - 1
#: The format ids of kernels/quant.cuh (the quantized rules and set_param's `DequantCopy` fill).
FORMAT_IDS = {"q8_0": "RLX_Q8_0", "q4_0": "RLX_Q4_0", "q4_1": "RLX_Q4_1", "q5_0": "RLX_Q5_0",
              "q5_1": "RLX_Q5_1", "q4_k": "RLX_Q4_K", "q6_k": "RLX_Q6_K"}
#: Fixed device code, in the order it appears in the .cu (each file only when some kernel names it).
KERNEL_HEADERS = ("cuda/kernels/copy.cuh", "cuda/kernels/gather.cuh", "cuda/kernels/rope.cuh",
                  "cuda/kernels/rows.cuh", "cuda/kernels/attention.cuh", "cuda/kernels/attention_short.cuh",
                  "cuda/kernels/gemm.cuh", "cuda/kernels/gemm_mma.cuh", "cuda/kernels/gemm_small.cuh",
                  "cuda/kernels/kv_f8.cuh", "cuda/kernels/kv_attention.cuh", "cuda/kernels/kv_decode.cuh",
                  "cuda/kernels/quant.cuh",
                  "cuda/kernels/quant_q8.cuh", "cuda/kernels/quant_occ.cuh", "cuda/kernels/quant_mma.cuh",
                  "cuda/kernels/dense_gemv.cuh",
                  "cuda/kernels/moe.cuh", "cuda/kernels/ssm.cuh", "cuda/kernels/argmax.cuh", "cuda/kernels/sample.cuh",
                  "cuda/kernels/lora.cuh",
                  "cuda/kernels/exchange.cuh", "cuda/kernels/collectives.cuh", "cuda/kernels/dense_gemv_ar.cuh",
                  "cuda/kernels/pool.cuh", "cuda/kernels/gemm_cutlass.cuh",
                  "cuda/kernels/user_op.cuh", "cuda/kernels/conv.cuh", "cuda/kernels/control.cuh",
                  "cuda/kernels/iota.cuh", "cuda/kernels/feedback.cuh")
#: The NCCL header: its graphs' contexts hold a communicator (`nccl` below) and their build links NCCL.
NCCL_HEADER = "cuda/kernels/collectives.cuh"
#: The collective ops' launch macros (rlx/codegen/cuda/collectives.py; `block_unless_p2p` here).
COLLECTIVES_TEMPLATE = "cuda/collectives.cu.j2"
#: The strided copy / convert kernels: params, inputs and outputs converted at the boundary use them too.
COPY_HEADER = "cuda/kernels/copy.cuh"

_CTYPE = {DType.F32: "float", DType.F16: "__half", DType.BF16: "rlx_bf16", DType.F64: "double",
          DType.I8: "int8_t", DType.I16: "int16_t", DType.I32: "int32_t", DType.I64: "int64_t", DType.U8: "uint8_t",
          DType.U16: "uint16_t", DType.U32: "uint32_t", DType.U64: "uint64_t", DType.BOOL: "uint8_t",
          **{d: "uint8_t" for d in DType if d.is_narrow}}  # storage formats: bytes a view may pass through
_VTYPE = {DType.F32: "float", DType.F16: "float", DType.BF16: "float", DType.F64: "double",
          DType.I8: "int8_t", DType.I16: "int16_t", DType.I32: "int32_t", DType.I64: "int64_t", DType.U8: "uint8_t",
          DType.U16: "uint16_t", DType.U32: "uint32_t", DType.U64: "uint64_t", DType.BOOL: "bool",
          **{d: "uint8_t" for d in DType if d.is_narrow}}
_CUDA_TYPE = {DType.F32: "CUDA_R_32F", DType.F16: "CUDA_R_16F", DType.BF16: "CUDA_R_16BF"}
assert set(_CUDA_TYPE) == set(LT_DTYPES)


def graph_slots(symbols: Sequence[tuple[str, int]]) -> int:
    """How many captured step graphs a context keeps (one per distinct dims of a run): a serving engine steps
    through every row count up to its bound, so as many as the symbols' bounds add up to, from 16 to 128.

    >>> graph_slots([]), graph_slots([("rows", 64)]), graph_slots([("seq", 2048)])
    (16, 64, 128)
    """
    return min(128, max(16, sum(bound for _, bound in symbols)))


def category(dt: DType) -> str:
    """How generated code treats values of `dt`: float, double, int or bool."""
    if dt in (DType.F32, DType.F16, DType.BF16):
        return "float"
    if dt is DType.F64:
        return "double"
    return "bool" if dt is DType.BOOL else "int"


def _act(fn: str | None) -> str:
    return activation_table().enum(fn)


def _int64_literal(value: int) -> str:
    return f"(int64_t){value}" if value <= _INT32_LIMIT else f"(int64_t){value}LL"


def _float_c(v: float) -> str:
    if not math.isfinite(v):
        raise BuildError(f"non-finite attribute {v!r} cannot be compiled")
    text = repr(float(v))
    return text if ("e" in text or "." in text) else text + ".0"


@dataclass(frozen=True)
class CudaTarget:
    """What the generated .cu assumes: GPU arch, compute precision, GEMM provider."""

    arch: str = "sm_90"
    precision: DType = DType.F32
    gemm: str = "cublaslt"
    #: Fuse `gelu_tanh` into cuBLASLt's GELU epilogue (its GELU is the tanh form).
    lt_gelu_epilogue: bool = True
    #: f16/bf16 GEMMs whose activation cuBLASLt cannot fuse (erf GELU, SiLU, ...) run on rlx_gemm_mma, bias and
    #: activation in its epilogue, instead of cuBLASLt plus a separate bias/activation pass over the output.
    fused_act_gemm: bool = False
    #: Attention whose keys are bounded by 128 runs a short-KV kernel (all of K/V in shared memory:
    #: rlx_attn_short2); False: the tiled rlx_attn_fa, as before they existed (for comparisons).
    short_attention: bool = True
    #: The short-KV attention runs the first kernel, rlx_attn_short, instead of rlx_attn_short2 (comparisons).
    short_attention_v1: bool = False
    #: Most warps per block of the short-KV kernels (1, 2, 4 or 8; 0: 8); the host halves them for small grids.
    attn_warps: int = 0
    #: rlx_attn_short2p: rlx_attn_short2 as a persistent grid with two shared-memory stages per block (the next
    #: tile's loads in flight while the current one computes).
    attn_pipe: bool = False
    #: Keys per tile of the tensor-core attention kernels (64 or 128; 32 for the short-KV kernels only, the tiled
    #: one takes 64 then); 0 picks by head_dim.
    attn_bk: int = 0
    #: The profiled variant: CUDA events around every kernel, spans read back by `CompiledGraph.trace()`.
    profile: bool = False
    #: Programmatic dependent launch for rlx's own kernels (compute capability 9.0+; checked at run time): each
    #: may start while the kernel before it drains, and waits (rlx_pdl_wait) before touching its data.
    pdl: bool = True
    #: f16/bf16 GEMMs of at most RLX_GSM_MAX_M rows run on rlx_gemm_small (bias and activation, erf GELU too, in
    #: its epilogue; weights fetched before the PDL wait) instead of cuBLASLt (+ a bias/activation pass).
    small_gemm: bool = True
    #: A masked-mean (+ L2 normalization) pooling tail runs as one kernel (a PoolTail decision of the lowering).
    pool_tail: bool = True
    #: ... and, for sentences of at most 64 tokens, computes the layer / RMS norm producing its input itself
    #: (`PoolTail.norm`: the norm's own kernel runs only for longer sentences). Off by default: at MiniLM 1x16 on
    #: the H100 it saved a launch but its one block per sentence took 5.2 µs, no wall gain (docs/perf-h100.md).
    pool_norm: bool = False
    #: A row gather (embedding lookup) read by one elementwise region only is done by that region's kernel
    #: (a `GatherInRegion` decision of rlx/opt/lowering_cuda_kernels.py).
    gather_region: bool = True
    #: A run on device pointers (run_device / bind_device) whose dims and pointers are those of an earlier call
    #: replays one CUDA graph holding its input copies, the step, the error flag's read-back and its output copies.
    io_graph: bool = True
    #: f16/bf16 GEMMs (sm_90) whose activation cuBLASLt cannot fuse (erf GELU, SiLU) run on a CUTLASS sm90 kernel
    #: (TMA + wgmma, bias and activation in its epilogue: a `CutlassGemm` decision of
    #: rlx/opt/lowering_cuda_kernels.py) instead of cuBLASLt plus a separate pass; the build turns it off where
    #: CUTLASS's headers are missing or the arch is not sm_90.
    cutlass_gemm: bool = True
    #: The SM count decode attention's key splits are sized for (`DecodeSplitKv`; 132: H100 / H200 SXM).
    decode_sms: int = 132
    #: Decode steps of `cached_attention` run rlx_kv_decode (a block per KV head for its query heads, 16-byte
    #: K/V loads, flash-decoding splits: `DecodeSplitKv.grouped`) where it fits; False: rlx_kv_attend (comparisons).
    kv_decode: bool = True
    #: Small sums of a tensor-parallel clique run one-shot through the peers' memory (`AllReduceP2P`: CUDA IPC
    #: mappings made when the context joins the clique, NCCL where they cannot be made); False: NCCL only.
    p2p_all_reduce: bool = True
    #: One-row decode GEMVs: "auto" (`decode_walk`: x in registers for the formats and K it fits), "rows" (the
    #: warp-per-rows walk everywhere), "xreg" (the register walk where it fits: "auto"'s choice today, kept by name
    #: for comparisons), the occupancy walk's names (`DECODE_OCC_WALKS`: "occ4", "auto"'s choice where it fits, and
    #: "occ", "occ8", "occp", "occ4p"); `xr_groups`
    #: forces the register walk's groups of 8 rows a block (0: chosen).
    gemv_walk: str = "auto"
    xr_groups: int = 0
    #: Bytes of quantized weights also kept dequantized in the compute type, for steps past the GEMVs' rows
    #: (`DequantCopy`; default `DEQUANT_COPY_BYTES`, 0: none).
    dequant_copies: int = DEQUANT_COPY_BYTES
    #: One-row decode steps of float projections in f16 / bf16 builds run rlx_dgemv over the weights as stored
    #: (`DecodeGemv` walk "dense", with the norm, residual add and SwiGLU it absorbs; RLX_DENSE_GEMV=0: their GEMMs).
    #: On by default since the H200 timed it: the bf16 8B decoder 208.5 decode tok/s against 194.0 on cuBLASLt
    #: (docs/perf-h100.md).
    dense_gemv: bool = True
    #: ... the output columns of its tiles (8, 16, 32, 64; 0: the widest that fills a wave, per launch;
    #: RLX_DENSE_GEMV_TILE, comparisons)
    dense_tile: int = 0
    #: ... the blocks its K is split over (0: chosen per launch with the tile width; 1: no split; n: forced;
    #: RLX_DENSE_GEMV_SPLIT, comparisons)
    dense_split: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", DType.parse(self.precision))
        if self.precision not in PRECISIONS:
            raise BuildError(f"CUDA precision must be one of {[p.value for p in PRECISIONS]}, got {self.precision}")
        if self.attn_bk not in (0, 32, 64, 128):
            raise BuildError(f"attn_bk must be 0, 32, 64 or 128, got {self.attn_bk!r}")
        if self.attn_warps not in (0, 1, 2, 4, 8):
            raise BuildError(f"attn_warps must be 0, 1, 2, 4 or 8, got {self.attn_warps!r}")
        if self.gemm not in GEMM_MODES:
            raise BuildError(f"CUDA gemm provider must be one of {GEMM_MODES}, got {self.gemm!r}")
        walks = ("auto", "rows", "xreg", *DECODE_OCC_WALKS)
        if self.gemv_walk not in walks:
            raise BuildError(f"gemv_walk must be one of {', '.join(walks)}, got {self.gemv_walk!r}")
        if self.xr_groups not in (0, 1, 2, 4):
            raise BuildError(f"xr_groups must be 0 (chosen), 1, 2 or 4, got {self.xr_groups!r}")
        if self.dense_tile not in DENSE_GEMV_TILES:
            raise BuildError(f"dense_tile must be 0 (chosen) or one of {DENSE_GEMV_TILES[1:]}, got {self.dense_tile!r}")
        if isinstance(self.dense_split, bool) or not isinstance(self.dense_split, int) \
                or not 0 <= self.dense_split <= DENSE_GEMV_SPLIT_MAX:
            raise BuildError(f"dense_split must be 0 (chosen) .. {DENSE_GEMV_SPLIT_MAX}, got {self.dense_split!r}")
        if isinstance(self.decode_sms, bool) or not isinstance(self.decode_sms, int) or self.decode_sms < 1:
            raise BuildError(f"decode_sms must be a positive int (the GPU's SM count), got {self.decode_sms!r}")
        if isinstance(self.dequant_copies, bool) or not isinstance(self.dequant_copies, int) or self.dequant_copies < 0:
            raise BuildError(f"dequant_copies must be a byte count >= 0, got {self.dequant_copies!r}")

    def identity(self) -> str:
        return (f"arch={self.arch} precision={self.precision.value} gemm={self.gemm} "
                f"lt_gelu={int(self.lt_gelu_epilogue)} attn_bk={self.attn_bk}" + (" profile=1" if self.profile else "")
                + (" fused_act_gemm=1" if self.fused_act_gemm else "")
                + ("" if self.short_attention else " short_attention=0")
                + (" short_attention_v1=1" if self.short_attention_v1 else "")
                + (f" attn_warps={self.attn_warps}" if self.attn_warps else "")
                + (" attn_pipe=1" if self.attn_pipe else "")
                + ("" if self.pdl else " pdl=0") + ("" if self.small_gemm else " small_gemm=0")
                + ("" if self.pool_tail else " pool_tail=0") + (" pool_norm=1" if self.pool_norm else "")
                + ("" if self.gather_region else " gather_region=0")
                + ("" if self.io_graph else " io_graph=0")
                + ("" if self.cutlass_gemm else " cutlass_gemm=0")
                + ("" if self.decode_sms == 132 else f" decode_sms={self.decode_sms}")
                + ("" if self.kv_decode else " kv_decode=0")
                + ("" if self.p2p_all_reduce else " p2p_all_reduce=0")
                + ("" if self.gemv_walk == "auto" else f" gemv_walk={self.gemv_walk}")
                + (f" xr_groups={self.xr_groups}" if self.xr_groups else "")
                + ("" if self.dequant_copies == DEQUANT_COPY_BYTES else f" dequant_copies={self.dequant_copies}")
                + ("" if self.dense_gemv else " dense_gemv=0")
                + (f" dense_tile={self.dense_tile}" if self.dense_tile else "")
                + (f" dense_split={self.dense_split}" if self.dense_split else ""))


@dataclass(frozen=True)
class NdArgs:
    """An `RlxNd` iteration space: collapsed dims with input / output element strides (C expressions)."""

    rank: int
    dims: tuple[str, ...]
    istride: tuple[str, ...]
    ostride: tuple[str, ...]



# ── launch arguments shared by every rule ─────────────────────────────────────


@dataclass(frozen=True, kw_only=True)
class Launch:
    """What every launch has: its comment line and the C string naming it in errors.

    `uses_flag`: the kernel may raise the device error flag (the run then clears and reads it);
    `uses_lt`: it calls cuBLASLt; `smem_attrs`: (kernel, bytes) whose dynamic shared memory limit
    `rlx_create` raises.
    """

    comment: str
    what: str
    uses_flag: bool = False
    uses_lt: bool = False
    smem_attrs: tuple[tuple[str, str], ...] = ()
    #: launch through rlx_launch_pdl (the kernel waits with rlx_pdl_wait before touching data): see CudaTarget.pdl
    pdl: bool = False


@dataclass(frozen=True, kw_only=True)
class NoWork(Launch):
    """A view, or a QKV sibling computed by its group's GEMM."""


@dataclass(frozen=True, kw_only=True)
class LargeStepOnly(Launch):
    """A node a fused decode GEMV absorbs: `inner` (its own kernel) runs only when `rows` > `max_rows`."""

    inner: Kernel
    rows: str
    max_rows: int
    by: str
    unit: str = "rows"


@dataclass(frozen=True, kw_only=True)
class UnlessP2P(Launch):
    """The residual add of a one-shot all-reduce (`AllReduceP2P.residual`): `inner` runs only when `cond` (the
    all-reduce's one-shot condition) fails, i.e. when NCCL summed."""

    inner: Kernel
    cond: str
    by: int


@dataclass(frozen=True, kw_only=True)
class Memcpy(Launch):
    src: str
    dst: str
    nbytes: str


def kernel_options(target: CudaTarget) -> CudaKernelOptions:
    """The options of `target` the CUDA lowering's kernel choices depend on, as the LIR records them (the
    emitter checks a LIR was decided for its target)."""
    return CudaKernelOptions(arch=target.arch, cutlass=target.cutlass_gemm, gather_region=target.gather_region,
                             small_gemm=target.small_gemm, lt_gelu_epilogue=target.lt_gelu_epilogue,
                             fused_act_gemm=target.fused_act_gemm)


def _wrapped(k: Kernel, macro: str, template: str, launch: type, **fields: object) -> Kernel:
    """`k` inside a launch of `launch`'s kind (a guard around its own macro: `inner`), keeping its headers, device
    function and scratch."""
    return Kernel(k.node, macro, template, launch(
        comment=k.args.comment, what=k.args.what, uses_flag=k.args.uses_flag, uses_lt=k.args.uses_lt,
        smem_attrs=k.args.smem_attrs, inner=k, **fields),
        headers=k.headers, header=k.header, func=k.func, label=k.label,
        scratch_per_thread=k.scratch_per_thread, scratch_shared=k.scratch_shared)


class CudaEmitter:
    """What the CUDA rules see: C expressions for pointers and dims of one lowered LIR.

    Every choice of where bytes live comes from the LIR's `DeviceLayout` and `GemmGroup` decisions; the
    rules (`rlx.codegen.cuda.rules`) choose kernels and their arguments from the node and this emitter.
    """

    #: Prefix of the names this emitter's kernels define (a scan body's kernels carry the scan's).
    prefix = "rlx_"

    def __init__(self, lir: LirModule, target: CudaTarget) -> None:
        self.lir = lir
        self.target = target
        self.graph = lir.graph
        self.sym_index = {name: i for i, (name, _) in enumerate(lir.symbols)}
        layouts = lir.decided(DeviceLayout)
        if len(layouts) != 1:
            raise BuildError("the LIR has no CUDA device layout: decide it with rlx.pipeline.cuda.decide_cuda")
        self.layout: DeviceLayout = layouts[0]
        if (self.layout.precision, self.layout.gemm) != (target.precision.value, target.gemm):
            raise BuildError(f"the LIR was lowered for precision={self.layout.precision} gemm={self.layout.gemm}, "
                             f"not for {target.identity()}: plan the graph again")
        if not target.pool_tail and lir.decided(PoolTail):
            raise BuildError(f"the LIR was lowered with pooling tails fused, not for {target.identity()}: plan the "
                             "graph again")
        if not target.pool_norm and any(d.norm for d in lir.decided(PoolTail)):
            raise BuildError(f"the LIR was lowered with the norm before a pooling tail fused into it, not for "
                             f"{target.identity()}: plan the graph again")
        options = lir.decided(CudaKernelOptions)
        if options != [kernel_options(target)]:
            decided = options[0].describe() if options else "no kernel choices"
            raise BuildError(f"the LIR was lowered with {decided}, not for {target.identity()}: plan the graph "
                             "again")
        #: The kernel choices of the lowering: each GEMM's CUTLASS verdict, gathers done by regions, norms done
        #: in a small GEMM's prologue.
        self.cutlass: dict[NodeId, CutlassGemm] = {d.node: d for d in lir.decided(CutlassGemm)}
        self.gather_in_region: dict[NodeId, GatherInRegion] = {d.gather: d for d in lir.decided(GatherInRegion)}
        self.norm_in_gemm: dict[NodeId, NormInGemm] = {d.norm: d for d in lir.decided(NormInGemm)}
        #: Each QKV group by its leader (the member scheduled first), and by every member.
        self.groups: dict[NodeId, GemmGroup] = {}
        self.group_of: dict[NodeId, GemmGroup] = {}
        for g in lir.decided(GemmGroup):
            self.groups[g.members[0]] = g
            for m in g.members:
                self.group_of[m] = g
        #: The DecodeGemv each of its nodes (members, absorbed norm and epilogue) belongs to.
        self.decode_gemv: dict[NodeId, DecodeGemv] = {nid: d for d in lir.decided(DecodeGemv) for nid in d.nodes()}
        self.quant_mma: dict[NodeId, QuantMma] = {d.node: d for d in lir.decided(QuantMma)}
        self.dequant_copy: dict[NodeId, DequantCopy] = {r: d for d in lir.decided(DequantCopy) for r in d.readers}
        #: residual adds a copy's GEMM writes (`DequantCopy.adds`) -> the reader whose GEMM it is
        self.copy_adds: dict[NodeId, NodeId] = {a: d.readers[0] for d in lir.decided(DequantCopy) for a in d.adds}
        #: readers of a copy that multiply it on rlx_gemm_small in steps of few rows
        self.copy_small: dict[NodeId, CopySmallGemm] = {d.node: d for d in lir.decided(CopySmallGemm)}
        #: ... the norms those compute in their prologue and the SwiGLU regions they write (the fused GEMV's work in
        #: decode steps), and the up products and siblings multiplied by another product's launch
        self.copy_absorbed: dict[NodeId, CopySmallGemm] = {
            n: d for d in lir.decided(CopySmallGemm) for n in (*d.norm, *d.swiglu)}
        self.copy_pair_of: dict[NodeId, CopySmallGemm] = {
            u: d for d in lir.decided(CopySmallGemm) for u in (*d.pair, *d.siblings)}
        #: The DecodeRope of each attention node, and of each rope it absorbs.
        self.decode_rope: dict[NodeId, DecodeRope] = {nid: d for d in lir.decided(DecodeRope) for nid in d.nodes()}
        #: The argmax each sample_top_k copies at temperature 0 / top_k 1.
        self.sample_from_argmax: dict[NodeId, SampleFromArgmax] = {d.sample: d for d in lir.decided(SampleFromArgmax)}
        #: The DecodeSplitKv of each attention node whose decode queries split their keys.
        self.decode_split: dict[NodeId, DecodeSplitKv] = {d.attention: d for d in lir.decided(DecodeSplitKv)}
        #: The all-reduces that run one-shot through the peers' memory when small.
        self.all_reduce_p2p: dict[NodeId, AllReduceP2P] = {n: d for d in lir.decided(AllReduceP2P)
                                                           for n in (d.node, *d.residual)}
        #: a row-parallel projection's dense GEMV -> the sum it makes in one-row steps (AllReduceP2P.gemv)
        self.sum_by_gemv: dict[NodeId, AllReduceP2P] = {d.gemv[0]: d for d in lir.decided(AllReduceP2P) if d.gemv}
        #: The PoolTail each node of a pooling tail belongs to (its last node launches the one kernel).
        self.pool_tail: dict[NodeId, PoolTail] = {n: d for d in lir.decided(PoolTail) for n in (d.out, *d.absorbed)}
        #: Readers of each node, and each scheduled node's position (fusion checks of neighbouring kernels).
        self.users: dict[NodeId, list[NodeId]] = self.graph.users()
        self.position: dict[NodeId, int] = {nid: i for i, nid in enumerate(lir.schedule)}

    # ── types and expressions ──────────────────────────────────────────

    def dev_dtype(self, dt: DType) -> DType:
        return device_dtype(dt, self.target.precision)

    def node(self, nid: NodeId) -> Node:
        return self.graph.node(nid)

    def ddt(self, nid: NodeId) -> DType:
        return self.dev_dtype(self.node(nid).shape.dtype)

    def ctype(self, nid: NodeId) -> str:
        return _CTYPE[self.ddt(nid)]

    def dim(self, d: Dim | None, sym: str = "S") -> str:
        """C int64 expression of a dim: `S[k]` on the host, `sy.v[k]` in kernels; None is a zero stride."""
        if d is None:
            return "(int64_t)0"
        return dim_expr(d, self.sym_index, _int64_literal, sym)

    def numel(self, dims: Sequence[Dim]) -> str:
        return self.dim(product(dims))

    def row_stride(self, nid: NodeId, dense: int) -> int:
        """Elements between rows of `nid`: a QKV group member is a column slice of the group's wide output."""
        g = self.group_of.get(nid)
        return g.row_stride if g is not None else dense

    def offset(self, nid: NodeId) -> int:
        """Byte offset of node `nid`'s first element in the device allocation."""
        g = self.group_of.get(nid)
        if g is not None:
            return g.out_offset + g.column(nid) * self.ddt(nid).itemsize
        b = self.lir.buffers[nid]
        lay = self.layout
        if b.storage == "input":
            return lay.inputs[b.slot].dev
        if b.storage == "output":
            return lay.outputs[b.slot].dev
        if b.storage == "param":
            return lay.params[b.slot].offset
        if b.storage == "const":
            return lay.constants[b.slot]
        if b.storage == "arena":
            return lay.arena + b.offset
        if b.storage == "view":
            # The planner's view offset is in bytes of the declared dtype; the device may store it narrower.
            src = self.node(b.source).shape.dtype
            elems = b.offset // src.itemsize
            return self.offset(b.source) + elems * self.dev_dtype(src).itemsize
        raise BuildError(f"node %{nid}: unknown storage {b.storage!r}")

    def ptr(self, nid: NodeId) -> str:
        return f"RLX_P({self.ctype(nid)}, {self.offset(nid)})"

    def what(self, node: Node) -> str:
        text = f"node %{node.id} ({node.kind}" + (f" {node.name}" if node.name else "") + ")"
        return c_string(text[:160])

    def header(self, node: Node) -> str:
        return node_header(node, 90)

    def idx_type(self, *shapes: Shape) -> str:
        biggest = max((s.max_numel for s in shapes), default=0)
        return "int32_t" if biggest <= _INT32_LIMIT else "int64_t"

    def base(self, node: Node) -> dict[str, str]:
        """The fields every launch has: its comment line and the C string naming it in errors."""
        return {"comment": self.header(node), "what": self.what(node), "pdl": self.target.pdl}

    def nd(self, dims: Sequence[Dim], src: View, dst: View) -> NdArgs:
        """The collapsed iteration space copying `src` to `dst` (both viewed over `dims`)."""
        cdims, (cs, cd) = collapse(list(dims), src, dst)
        if not cdims:
            return NdArgs(1, ("(int64_t)1",), ("(int64_t)0",), ("(int64_t)0",))
        if len(cdims) > 16:
            raise BuildError(f"iteration space of rank {len(cdims)} exceeds 16")
        return NdArgs(len(cdims), tuple(self.dim(d) for d in cdims), tuple(self.dim(s) for s in cs.strides),
                      tuple(self.dim(s) for s in cd.strides))

    # ── one kernel per scheduled node ──────────────────────────────────

    def kernel(self, nid: NodeId) -> Kernel:
        """The `Kernel` of one scheduled node: its op kind's rule, or no work for views and QKV siblings."""

        node = self.node(nid)
        if self.lir.buffers[nid].storage == "view":
            return Kernel(nid, "block_view", _OPS_TEMPLATE, NoWork(**self.base(node)))
        g = self.group_of.get(nid)
        if g is not None and g.members[0] != nid:
            return Kernel(nid, "block_none", _OPS_TEMPLATE, NoWork(
                comment=comment(f"%{nid}: computed by the combined GEMM of %{g.members[0]}"), what=""))
        p = self.pool_tail.get(nid)
        if p is not None:
            from rlx.codegen.cuda import decision_kernels  # the package lists them (their modules import this one)

            return decision_kernels()[PoolTail.kind](self, p, nid)
        d = self.decode_gemv.get(nid)
        if nid in self.copy_adds:
            return Kernel(nid, "block_none", _OPS_TEMPLATE, NoWork(comment=comment(
                f"%{nid}: written by %{d.members[0] if d else self.copy_adds[nid]} (the fused GEMV in decode steps, "
                "the GEMM on its dequantized copy with this residual as C in larger ones)"), what=""))
        if d is not None and d.walk != "dense" and nid in d.members[1:]:
            return Kernel(nid, "block_none", _OPS_TEMPLATE, NoWork(comment=comment(
                f"%{nid}: computed with %{d.members[0]} (one fused GEMV in decode steps, its own path in larger "
                "ones)"), what=""))
        from rlx.codegen.cuda import rule_table  # the package lists the rule modules (they import this one)

        rules = rule_table()
        reason = rules.why_not(self.graph, node)
        if reason is not None:
            raise BuildError(f"{reason} (node {node.label})")
        k = rules.rule(node.kind).emit(self, node)
        if d is not None and d.walk == "dense" and nid in d.members:
            # a float member: its own kernel in larger steps; the first member's launch also runs rlx_dgemv
            from rlx.codegen.cuda import dense_decode_gemv

            lead = self.node(d.members[0])
            if nid != lead.id:
                return self._large_step_only(k, self.node(lead.inputs[0]).shape.dims[:-1], d.max_rows,
                                             f"done by the dense GEMV of %{lead.id}")
            return dense_decode_gemv(self, d, k)
        if d is not None and nid not in d.members:
            lead = self.node(d.members[0])
            cs = self.copy_absorbed.get(nid)
            if cs is not None:
                return self._large_step_only(k, self.node(lead.inputs[0]).shape.dims[:-1], cs.max_rows,
                                             f"done by the fused GEMV of %{lead.id} in steps of <= {d.max_rows} rows, "
                                             f"by its small GEMM on the dequantized copy in larger ones")
            return self._large_step_only(k, self.node(lead.inputs[0]).shape.dims[:-1], d.max_rows,
                                         f"done by the fused GEMV of %{lead.id}")
        a = self.all_reduce_p2p.get(nid)
        if a is not None and nid != a.node:  # the residual add: done by a one-shot call, its own kernel otherwise
            return _wrapped(k, "block_unless_p2p", COLLECTIVES_TEMPLATE, UnlessP2P, cond=self.p2p_condition(a),
                            by=a.node)
        r = self.decode_rope.get(nid)
        if r is not None and nid != r.attention:  # x [batch, seq, heads * dim]: seq tokens a row decide
            return self._large_step_only(k, node.shape.dims[1:2], r.max_rows, f"done inside %{r.attention}",
                                         unit="tokens a row")
        return k

    def p2p_condition(self, d: AllReduceP2P) -> str:
        """The C condition under which a call of `d`'s all-reduce runs one-shot (the same at the residual add, whose
        own kernel runs only when it does not): the clique mapped its buffers, the call fits a slot, and every
        pointer the kernel moves 16 bytes at a time through is 16-byte aligned."""
        node = self.node(d.node)
        ptrs = [self.ptr(node.inputs[0]), self.ptr(node.id)]
        if d.residual:
            add = self.node(d.residual[0])
            ptrs = [ptrs[0], self.ptr(add.id), *(self.ptr(a) for a in add.inputs if a != node.id)]
        aligned = " | ".join(f"(uintptr_t)({p})" for p in ptrs)
        return (f"(c->ar_ready && ({self.numel(node.shape.dims)}) * (int64_t)sizeof({self.ctype(node.id)}) <= "
                f"(int64_t){d.max_bytes} && {d.max_bytes} <= RLX_AR_SLOT_BYTES && !(({aligned}) & 15))")

    def _large_step_only(self, k: Kernel, row_dims: Sequence[Dim], max_rows: int, by: str,
                         unit: str = "rows") -> Kernel:
        """`k` wrapped to run only in steps of more than `max_rows` rows (the product of `row_dims`; `unit` names
        them) — in smaller ones a decode kernel does its work."""
        return _wrapped(k, "block_large_step", _OPS_TEMPLATE, LargeStepOnly, rows=self.numel(row_dims),
                        max_rows=max_rows, by=by, unit=unit)

    def output_copy(self, slot: int, nid: NodeId) -> Kernel:

        node = self.node(nid)
        nbytes = f"{self.numel(node.shape.dims)} * {self.ddt(nid).itemsize}"
        return Kernel(nid, "block_memcpy", _OPS_TEMPLATE, Memcpy(
            comment=comment(f"output {slot} is %{nid}: copy it"), what=c_string(f"copying output {slot}"),
            src=f"RLX_P(char, {self.offset(nid)})", dst=f"RLX_P(char, {self.layout.outputs[slot].dev})",
            nbytes=nbytes))


_OPS_TEMPLATE = "cuda/ops.cu.j2"


def _boundary(emitter: CudaEmitter) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """Template data of params, constants, inputs and outputs: how each crosses the C ABI."""
    lir, lay = emitter.lir, emitter.layout
    params, constants, inputs, outputs = [], [], [], []
    copies = {d.slot: d for d in lir.decided(DequantCopy)}
    for slot, spec in enumerate(lir.params):
        node = emitter.node(spec.node)
        abi, dev = node.shape.dtype, emitter.dev_dtype(node.shape.dtype)
        stored = node.shape
        place = lay.params[slot]
        entry = {
            "index": slot, "name_c": c_string(spec.name), "name_comment": comment(spec.name, 80),
            "abi_ctype": _CTYPE[abi], "dev_ctype": _CTYPE[dev], "abi_nbytes": spec.shape.max_nbytes,
            "dev_off": place.offset, "direct": not place.staged, "numel": stored.max_numel,
            "user_dims": comment(str(list(spec.shape.static_dims))),
            "dev_dims": comment(str(list(stored.static_dims))), "dequant": None,
        }
        if place.staged:
            layout = list(spec.layout) if spec.layout is not None else list(range(spec.shape.rank))
            # the user's dense tensor, read in the stored axis order
            src = View.dense(spec.shape.dims).permute(layout)
            dst = (View(tuple(stored.dims), (Dim(place.row_stride), Dim(1))) if place.row_stride
                   else View.dense(stored.dims))  # a column slice of a combined [K, sum(N)] weight
            entry["nd"] = emitter.nd(stored.dims, src, dst)
        if (copy := copies.get(slot)) is not None:  # dequantized into its copy as the blocks arrive
            fmt = quant_format(copy.quant)
            t = _CTYPE[emitter.ddt(copy.readers[0])]
            entry["dequant"] = {"t": t, "fmt": FORMAT_IDS[fmt.name], "qk": fmt.block_size, "qb": fmt.block_bytes,
                                "rb": stored.dims[-1].value, "n": copy.n, "k": copy.k,
                                "dst": f"RLX_P({t}, {copy.offset})", "w": f"RLX_P(uint8_t, {place.offset})"}
        params.append(entry)
    # the graph's constants, then each scan body's (placed by the lowering's ScanConstants decisions)
    placed = [(str(slot), emitter.node(nid), lay.constants[slot]) for slot, nid in enumerate(lir.constants)]
    body_consts = {(d.node, d.body): d.offsets for d in lir.decided(ScanConstants)}
    bodies = scan_bodies(lir)
    for index, (scan, body) in enumerate(bodies):
        which = sum(1 for n, _ in bodies[:index] if n == scan)  # the node's body number (a cond has two)
        tag = f"s{scan}" if which == 0 else f"s{scan}b{which}"
        placed += [(f"{tag}_{slot}", body.graph.node(nid), off)
                   for slot, (nid, off) in enumerate(zip(body.constants, body_consts.get((scan, which), ())))]
    for index, node, dev_off in placed:
        data = constant_bytes(node, emitter.dev_dtype(node.shape.dtype))
        rows = [", ".join(str(b) for b in data[i:i + 32]) for i in range(0, len(data), 32)]
        constants.append({"index": index, "nbytes": len(data), "dev_off": dev_off,
                          "bytes_c": (",\n    ".join(rows)) if rows else "0"})
    # outputs a kernel writes in their ABI dtype itself (a PoolTail's): no conversion pass after the step
    written = {d.abi_output for d in lir.decided(PoolTail) if d.abi_output >= 0}
    for slots, specs, out in ((lay.inputs, lir.inputs, inputs), (lay.outputs, lir.outputs, outputs)):
        for slot, spec in enumerate(specs):
            abi = spec.shape.dtype
            dev = emitter.dev_dtype(abi)
            out.append({"index": slot, "name_c": c_string(spec.name), "name_comment": comment(spec.name, 80),
                        "abi_ctype": _CTYPE[abi], "dev_ctype": _CTYPE[dev], "convert": dev is not abi,
                        "staging_off": slots[slot].staging, "dev_off": slots[slot].dev,
                        "numel": emitter.numel(spec.shape.dims), "abi_itemsize": abi.itemsize,
                        "max_nbytes": spec.shape.max_numel * abi.itemsize,
                        "state": spec.state, "written": out is outputs and slot in written})
    return params, constants, inputs, outputs


def _span(places: Sequence[tuple[int, int]]) -> dict[str, int]:
    """The byte range [lo, lo + nbytes) covering staging copies given as (offset, largest bytes)."""
    if not places:
        return {"lo": 0, "nbytes": 0}
    lo = min(off for off, _ in places)
    return {"lo": lo, "nbytes": max(off + n for off, n in places) - lo}


def _host_inputs(inputs: Sequence[dict]) -> dict[str, int]:
    """The span of the per-run inputs' staging copies, which a host-fed step overwrites whole: it must hold
    nothing else (the layout places them first, back to back; the allocator never overlaps regions, so a
    region of another kind starting inside the span would be clobbered)."""
    span = _span([(x["staging_off"], x["max_nbytes"]) for x in inputs if not x["state"]])
    lo, hi = span["lo"], span["lo"] + span["nbytes"]
    for x in inputs:
        others = {x["staging_off"], x["dev_off"]} if x["state"] else {x["dev_off"]} - {x["staging_off"]}
        if any(lo <= off < hi for off in others):
            raise BuildError(f"input {x['index']}'s device bytes lie inside the per-run inputs' staging span")
    return span


def cuda_context(lir: LirModule, target: CudaTarget, manifest: dict) -> dict:
    """The template context for a decided `lir`: plain data (numbers, identifiers, C expressions) and the kernels."""
    require_decided(lir, "cuda")
    e = CudaEmitter(lir, target)
    lay = e.layout
    params, constants, inputs, outputs = _boundary(e)
    kernels = [e.kernel(nid) for nid in lir.schedule]
    kernels += [e.output_copy(slot, nid) for slot, nid in lir.output_copies]
    if any(k.args.uses_lt for k in kernels) and not lay.uses_lt:
        raise BuildError("a GEMM runs on cuBLASLt but the device layout has no workspace for it")
    used = {h for k in kernels for h in k.headers}
    # generated device functions, a scan body's too (its kernels are launched inside the scan's loop)
    device_kernels = [d for k in kernels for d in (k, *(k.subprogram or ())) if d.func]
    if any(p.get("nd") for p in params) or any(x["convert"] for x in (*inputs, *outputs)):
        used.add(COPY_HEADER)
    unknown = used - set(KERNEL_HEADERS)
    if unknown:
        raise BuildError(f"kernels name unknown headers {sorted(unknown)}")
    smem: dict[str, str] = {}
    for k in kernels:
        smem.update(k.args.smem_attrs)
    manifest_text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    syms = ", ".join(f"{n}<={m}" for n, m in lir.symbols) or "none"
    return {
        "name_comment": comment(lir.name, 80),
        "precision": target.precision.value,
        "gemm": target.gemm if lay.uses_lt else "builtin",
        "arch": comment(target.arch, 20),
        "abi_version": ABI_VERSION,
        "symbols_comment": comment(syms, 120),
        "nsym": len(lir.symbols),
        "graph_slots": graph_slots(lir.symbols),
        "symbols": [{"name_c": c_string(n), "max": m} for n, m in lir.symbols],
        "total_bytes": lay.total,
        "params_bytes": lay.params_end,
        "regions": [{"name": r.name, "offset": r.offset, "nbytes": r.nbytes} for r in lay.regions],
        "off": {"arena": lay.arena, "scratch": lay.scratch, "workspace": lay.workspace, "flag": lay.flag,
                "counters": lay.counters},
        "counters_bytes": lay.counters_bytes,
        "workspace_bytes": lay.workspace_bytes,
        "attn_max_splits": ATTN_MAX_SPLITS,
        "uses_flag": any(k.args.uses_flag for k in kernels),
        # (a profiled build runs eagerly; state inputs have their own resident / write-back protocol)
        "io_graph": target.io_graph and not target.profile and not any(x["state"] for x in inputs),
        "nccl": NCCL_HEADER in used,
        "p2p_all_reduce": bool(e.all_reduce_p2p),
        "params": params,
        "constants": constants,
        "inputs": inputs,
        "outputs": outputs,
        "host_in": _host_inputs(inputs),
        "host_out": _span([(x["staging_off"], x["max_nbytes"]) for x in outputs]),
        "kernels": kernels,
        "device_kernels": device_kernels,
        "headers": [header_text(h) for h in KERNEL_HEADERS if h in used],
        "user_code": user_code_of(kernels),
        "smem_attrs": [{"kernel": k, "bytes": v} for k, v in smem.items()],
        "manifest_c": "\n    ".join(c_string_lines(manifest_text)),
        **cuda_profile_context(e, kernels, target),
    }


#: Kernel macros that launch nothing (views, members of a combined GEMM): never timed.
_NO_WORK = ("block_view", "block_none")


def cuda_profile_context(e: CudaEmitter, kernels: list[Kernel], target: CudaTarget) -> dict:
    """The template data of the profiled variant: which kernels are timed (index into the span table), their
    costs as C expressions of the run's dims `S[]`, and the kernel table `rlx_profile_info` returns."""
    if not target.profile:
        return {"profile": False, "prof": {}, "prof_count": 0, "profile_info": [], "profile_code": ""}
    sym_index = {name: i for i, (name, _) in enumerate(e.lir.symbols)}
    prof: dict[int, dict] = {}
    table = []
    for pos, k in enumerate(kernels):
        if k.macro in _NO_WORK or k.macro == "block_memcpy":
            continue
        node = e.node(k.node)
        cost = node_cost(e.graph, node)
        index = len(table)
        prof[pos] = {"index": index, "flops": cost_expr(cost.flops, sym_index, "S"),
                     "bytes": cost_expr(cost.bytes, sym_index, "S")}
        table.append({"index": index, "node": node.id, "kind": node.kind, "name": node.name or "",
                      "op": node.op.describe()[:200], "shape": str(node.shape), "func": k.macro})
    info = json.dumps({"fields": ["t0", "t1", "kernel", "thread", "run", "flops", "bytes"], "kernels": table},
                      sort_keys=True, ensure_ascii=True)
    return {"profile": True, "prof": prof, "prof_count": len(table),
            "profile_info": c_string_lines(info),
            # the span ring is the CPU backend's (plain C): its text first, then the CUDA event timing
            "profile_code": header_text("cpu/kernels/profile_ring.h") + header_text("cuda/kernels/profile.cuh")}



def _environment() -> jinja2.Environment:
    return _environment_for(str(templates_dir()))


@functools.cache
def _environment_for(directory: str) -> jinja2.Environment:
    # one environment per templates directory: its templates compile once per process (compiling model.cu.j2
    # costs ~0.5 s per render; the loader still reloads a template whose file changed)
    return install(jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    ))


def render_cuda(lir: LirModule, target: CudaTarget, manifest: dict) -> str:
    """The complete CUDA source of `lir` (one translation unit exporting the RLX C ABI)."""
    ctx = cuda_context(lir, target, manifest)
    try:
        return _environment().get_template("cuda/model.cu.j2").render(**ctx, cublaslt=header_text(
            "cuda/kernels/cublaslt.cuh"))
    except jinja2.TemplateError as exc:
        raise BuildError(f"rendering the CUDA template failed: {type(exc).__name__}: {exc}") from exc


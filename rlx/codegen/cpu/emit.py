"""LIR → template context for the CPU backend, and the rendering of one C file.

`c_context(lir, target, manifest)` is a pure function: it decides, for every
scheduled node, which kernel template renders it and with which C expressions
(pointers, dims as expressions of the run-time `sym[]` array, strides), and
returns plain data. All C text lives in `templates/cpu/`; this module only
supplies identifiers, numbers and arithmetic expressions.

Names from the graph never reach C as code: nodes, inputs and params are
referred to by index, names appear only inside comments (after `comment()`
strips everything that could end a comment) and inside string literals
(after `c_string()` escapes them).

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> from rlx.pipeline import decide  # the pipeline decides, codegen renders
>>> g = Graph("demo")
>>> x = g.input("x", [4, 8])
>>> g.set_outputs([g.activation("relu", x)])
>>> src = render_c(decide(plan(g), "cpu"), CTarget(), {"name": "demo"})
>>> "rlx_run" in src and "relu" in src
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import jinja2

from rlx.abi_version import ABI_VERSION
from rlx.codegen.common import dim_expr, require_decided
from rlx.codegen.cpu import half as c_half
from rlx.codegen.cpu.base import (
    ATTN_QBLOCK,
    GRAIN,
    PACK_NR_MAX,
    align64,
    c_string,
    c_string_lines,
    comment,
    node_header,
    round_up,
)
from rlx.codegen.cpu.observe import PROFILE_RING_BYTES, observe_context
from rlx.codegen.cpu.share import share_kernels
from rlx.codegen.registry import Kernel, RuleSet, float32_only
from rlx.codegen.template_cache import environment
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.decisions import AbsorbedTranspose, PackedParam, WidenedParam
from rlx.ir.decisions_int8 import Int8Param
from rlx.ir.decisions_quant import QuantGemvGroup
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.ir.lir import LirModule
from rlx.ir.norms import norm_inputs
from rlx.ir.shape import Dim, Shape, product
from rlx.ir.view import View, collapse, dense_strides, movement_view

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

#: Bumped whenever generated code changes for the same LIR and templates (part of the cache key).
CODEGEN_VERSION = "cpu-3"
_INT32_MAX = (1 << 31) - 1

_COMPUTE = {DType.F32: "float", DType.F16: "float", DType.BF16: "float", DType.F64: "double",
            DType.I8: "int8_t", DType.I32: "int32_t", DType.I64: "int64_t", DType.U8: "uint8_t",
            DType.BOOL: "uint8_t"}


@dataclass(frozen=True)
class CTarget:
    """What the generated code may assume about the build (from the Toolchain)."""

    blas: bool = False
    blas_prefix: str = ""
    blas_threads: bool = False
    openmp: bool = True
    #: Build variants (rlx.codegen.cpu.observe): time spans per kernel and thread / NaN-inf checks.
    profile: bool = False
    check_nans: bool = False


# ── kernel arguments: one frozen dataclass per macro ──────────────────────
#
# Every field is a C expression (str), a number, or a flag; the macro named by
# `macro` in the class's template renders them. `label` (a C string literal
# naming the node, for run-time error messages) is filled in by
# `_Planner.kernel`.


@dataclass(frozen=True, kw_only=True)
class CpuArgs:
    """Base of every CPU kernel's arguments: the node's label as a C string literal."""

    macro: ClassVar[str] = ""
    label: str = ""


@dataclass(frozen=True, kw_only=True)
class NoteArgs(CpuArgs):
    """A scheduled node that renders no code (a view, a transpose folded into its GEMMs)."""

    note: str


@dataclass(frozen=True)
class EwInput:
    """One input of an elementwise loop nest: its pointer and per-axis strides (elements)."""

    ptr: str
    dtype: str
    var: str
    ctype: str
    stype: str
    strides: tuple[str, ...]
    inner: str
    #: Every stride is 0: the input is one scalar.
    scalar: bool


@dataclass(frozen=True)
class EwStep:
    """One computed value of an elementwise region: `var = kind/fn(args)` in `ctype`."""

    var: str
    kind: str
    fn: str
    args: tuple[str, ...]
    dtype: str
    ctype: str
    arg_ctype: str
    arg_dtype: str


@dataclass(frozen=True, kw_only=True)
class ElementwiseArgs(CpuArgs):
    """An elementwise op or fused region over collapsed axes (macro `elementwise`)."""

    macro: ClassVar[str] = "elementwise"
    rank: int
    dims: tuple[str, ...]
    outer_dims: tuple[str, ...]
    total: str
    inner: str
    rows: str
    inputs: tuple[EwInput, ...]
    steps: tuple[EwStep, ...]
    result: str
    out: str
    out_dtype: str
    out_stype: str
    #: Integer division/power present: the loop records bad divisors and the kernel fails.
    checks: bool
    grain: int


@dataclass(frozen=True)
class GemmBatch:
    """The batch loop of a batched GEMM: dims and per-operand element strides (0 = broadcast)."""

    dims: tuple[str, ...]
    count: str
    a_strides: tuple[str, ...]
    b_strides: tuple[str, ...]
    rank: int


@dataclass(frozen=True, kw_only=True)
class GemmArgs(CpuArgs):
    """C = op(A) @ op(B) (+ bias, activation) through sgemm (macro `gemm`)."""

    macro: ClassVar[str] = "gemm"
    m: str
    n: str
    k: str
    a: str
    b: str
    c: str
    ta: bool
    tb: bool
    lda: str
    ldb: str
    batch: GemmBatch
    #: One GEMM over all rows (no batch loop).
    fold: bool
    bias: str
    act: str
    epilogue: bool
    mat_c: str
    block: int
    grain: int


@dataclass(frozen=True, kw_only=True)
class PgemmArgs(CpuArgs):
    """C = A @ B with B a param stored in packed panels; epilogue fused (macro `pgemm`)."""

    macro: ClassVar[str] = "pgemm"
    m: str
    n: str
    k: str
    lda: str
    a: str
    b: str
    c: str
    bias: str
    fold: bool
    batch: GemmBatch
    mat_c: str
    #: The epilogue enum constant (RLX_EPI_NONE, RLX_EPI_GELU, ...).
    epi: str


@dataclass(frozen=True, kw_only=True)
class SwigluArgs(CpuArgs):
    """silu(x @ Wg) * (x @ Wu), blocked over rows (macro `swiglu`)."""

    macro: ClassVar[str] = "swiglu"
    m: str
    n: str
    k: str
    x: str
    wg: str
    wu: str
    tg: bool
    tu: bool
    ldg: str
    ldu: str
    c: str
    #: Rows per step (the up-projection block lives in shared scratch).
    block: int
    batch: GemmBatch
    fold: bool
    mat_c: str
    grain: int


@dataclass(frozen=True, kw_only=True)
class ReduceArgs(CpuArgs):
    """A reduction over kept/reduced axis groups (macro `reduce`)."""

    macro: ClassVar[str] = "reduce"
    fn: str
    #: The pattern is [K] R [K]: outer x count x inner loops; else the generic kept/red strides.
    simple: bool
    outer: str
    inner: str
    count: str
    kept: tuple[tuple[str, str], ...]
    red: tuple[tuple[str, str], ...]
    red_count: str
    out_count: str
    x: str
    y: str
    dtype: str
    ctype: str
    stype: str
    acc: str
    is_float: bool
    grain: int


@dataclass(frozen=True, kw_only=True)
class SoftmaxArgs(CpuArgs):
    """Softmax over one axis of an [outer, n, inner] view (macro `softmax`)."""

    macro: ClassVar[str] = "softmax"
    outer: str
    n: str
    inner: str
    x: str
    y: str
    grain: int


@dataclass(frozen=True, kw_only=True)
class NormArgs(CpuArgs):
    """LayerNorm / RMSNorm over rows, optionally after a fused residual (+ bias) add (macro `norm`)."""

    macro: ClassVar[str] = "norm"
    rms: bool
    x: str
    #: Empty when absent.
    residual: str
    bias: str
    gamma: str
    beta: str
    y: str
    rows: str
    n: str
    eps: str
    grain: int


@dataclass(frozen=True, kw_only=True)
class CopyArgs(CpuArgs):
    """A byte copy (reshape of a node that is not a view; macro `copy`)."""

    macro: ClassVar[str] = "copy"
    src: str
    dst: str
    nbytes: str


@dataclass(frozen=True, kw_only=True)
class TransposeArgs(CpuArgs):
    """A strided gather of the input into dense output order (macro `transpose`)."""

    macro: ClassVar[str] = "transpose"
    rank: int
    dims: tuple[str, ...]
    strides: tuple[str, ...]
    rows: str
    inner: str
    ctype: str
    x: str
    y: str
    grain: int


@dataclass(frozen=True, kw_only=True)
class NarrowArgs(CpuArgs):
    """A slice along one axis: `outer` row copies, byte offsets (macro `narrow`)."""

    macro: ClassVar[str] = "narrow"
    outer: str
    src_row: str
    dst_row: str
    start: str
    src: str
    dst: str


@dataclass(frozen=True)
class ConcatPart:
    """One input of a concat: its base, row bytes and byte offset in the output row."""

    src: str
    row: str
    offset: str


@dataclass(frozen=True, kw_only=True)
class ConcatArgs(CpuArgs):
    """Concatenation along one axis (macro `concat`)."""

    macro: ClassVar[str] = "concat"
    outer: str
    dst_row: str
    parts: tuple[ConcatPart, ...]
    dst: str


@dataclass(frozen=True, kw_only=True)
class GatherArgs(CpuArgs):
    """Rows of a table selected by an index tensor, indices bounds-checked (macro `gather`)."""

    macro: ClassVar[str] = "gather"
    outer: str
    n: str
    count: str
    inner_bytes: str
    table: str
    idx: str
    idx_type: str
    dst: str
    grain: int


@dataclass(frozen=True)
class AttentionMask:
    """The attention mask: kind, and for padding/bias masks its pointer (and type or strides)."""

    kind: str
    ptr: str = ""
    ctype: str = ""
    strides: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class AttentionArgs(CpuArgs):
    """Multi-head (grouped-query) attention in query blocks (macro `attention`)."""

    macro: ClassVar[str] = "attention"
    q: str
    k: str
    v: str
    o: str
    batch: str
    sq: str
    skv: str
    heads: int
    kv_heads: int
    group: int
    hd: int
    scale: str
    mask: AttentionMask
    qblock: int
    #: Byte offsets in the per-thread scratch: packed K^T, packed V, the mask row.
    kp_offset: int
    vp_offset: int
    row_offset: int


@dataclass(frozen=True, kw_only=True)
class RopeArgs(CpuArgs):
    """Rotary position embedding over [batch, seq, width] (macro `rope`)."""

    macro: ClassVar[str] = "rope"
    x: str
    cos: str
    sin: str
    y: str
    batch: str
    seq: str
    width: int
    hd: int
    half: int
    rot: int
    neox: bool
    #: cos/sin tables per batch row ([batch, seq, rot/2]) rather than shared ([seq, rot/2]).
    per_row: bool
    grain: int


def _c_int(value: int) -> str:
    return f"{value}LL" if value > _INT32_MAX else str(value)


def _float_literal(v: float) -> str:
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return repr(float(v))


class _Planner:
    """Turns one LirModule into the template context (used only by `c_context`)."""

    def __init__(self, lir: LirModule, target: CTarget) -> None:
        from rlx.codegen.cpu import rule_table  # the package lists the rule modules (they import this one)

        self.lir = lir
        self.target = target
        self.rules = rule_table()
        self.graph = lir.graph
        self.sym_index = {name: i for i, (name, _) in enumerate(lir.symbols)}
        self.param_offsets: dict[int, int] = {}
        self.scratch_per_thread = 0  # bytes each thread may use (attention tiles)
        self.scratch_shared = 0  # bytes used outside parallel regions (swiglu blocks)
        # The LIR's decisions (rlx.opt.lowering): transposes folded into GEMMs, params stored packed.
        self.absorbed: dict[NodeId, NodeId] = {d.node: d.source for d in lir.decided(AbsorbedTranspose)}
        self.packed: dict[NodeId, bool] = {d.node: d.transposed for d in lir.decided(PackedParam)}
        self.int8: dict[NodeId, Int8Param] = {d.node: d for d in lir.decided(Int8Param)}
        # nodes a decode GEMV group computes in small steps (their own kernels run in larger ones)
        self.decode_skips: dict[NodeId, QuantGemvGroup] = {
            nid: d for d in lir.decided(QuantGemvGroup) for nid in d.skipped()}
        # f16/bf16 params stored widened at set_param: param -> the cast that reads the widened copy
        self.widened: dict[NodeId, NodeId] = {d.node: d.cast for d in lir.decided(WidenedParam)}
        self.widened_cast: dict[NodeId, NodeId] = {c: p for p, c in self.widened.items()}
        self.packed_mat: dict[NodeId, int] = {}  # floats of packed storage per K x N matrix
        self.gemm_acts: set[str] = set()  # activations fused into packed GEMMs

    # ── expressions ────────────────────────────────────────────────────

    def dim(self, d: Dim) -> str:
        return dim_expr(d, self.sym_index, _c_int)

    def numel(self, dims: Sequence[Dim]) -> str:
        return self.dim(product(dims))

    def base(self, nid: NodeId) -> str:
        """C expression (char *) of where node `nid`'s value starts."""
        if nid in self.widened_cast:  # the cast of a widened param: the param's f32 storage
            return self.base(self.widened_cast[nid])
        b = self.lir.buffers[nid]
        if b.storage == "input":
            return f"((const char *)in[{b.slot}])"
        if b.storage == "output":
            return f"((char *)out[{b.slot}])"
        if b.storage == "param":
            return f"(ctx->params + {self.param_offsets[b.slot]})"
        if b.storage == "const":
            return f"((const char *)rlx_const_{b.slot})"
        if b.storage == "arena":
            return f"(ctx->arena + {b.offset})" if b.offset else "ctx->arena"
        if b.storage == "view":
            src = self.base(b.source)
            return f"({src} + {b.offset})" if b.offset else src
        raise BuildError(f"node %{nid}: unknown storage {b.storage!r}")

    def read_only(self, nid: NodeId) -> bool:
        if nid in self.widened_cast:
            return True
        root = nid
        while self.lir.buffers[root].storage == "view":
            root = self.lir.buffers[root].source
        return self.lir.buffers[root].storage in ("input", "param", "const")

    def ptr(self, nid: NodeId, const: bool = True) -> str:
        ctype = self.node(nid).shape.dtype.c_type
        qual = "const " if const else ""
        return f"(({qual}{ctype} *){self.base(nid)})"

    def node(self, nid: NodeId) -> Node:
        return self.graph.node(nid)

    # ── helpers ────────────────────────────────────────────────────────

    def header(self, node: Node) -> str:
        return node_header(node, 80)

    # ── schedule ───────────────────────────────────────────────────────

    def plan_params(self) -> tuple[list[dict], int]:
        params = []
        offset = 0
        for slot, spec in enumerate(self.lir.params):
            node = self.node(spec.node)
            stored = node.shape
            nbytes = stored.max_nbytes
            self.param_offsets[slot] = offset
            user_dims = spec.shape.static_dims
            layout = spec.layout or tuple(range(len(user_dims)))
            user_strides = [math.prod(user_dims[i + 1:]) for i in range(len(user_dims))]
            permuted = spec.layout is not None and list(spec.layout) != list(range(len(user_dims)))
            dims = list(stored.static_dims)
            src_strides = [user_strides[p] for p in layout]
            storage = nbytes
            mode, note = ("permute", " (re-laid out on set)") if permuted else ("copy", "")
            if spec.node in self.packed:
                # dims/strides of the GEMM's right operand B[..., K, N] (the param, or its transpose)
                if self.packed[spec.node]:
                    dims[-2], dims[-1] = dims[-1], dims[-2]
                    src_strides[-2], src_strides[-1] = src_strides[-1], src_strides[-2]
                k, n = dims[-2], dims[-1]
                # f16/bf16 weights keep their precision, K padded to pairs (kernels/gemm_bf16.h)
                narrow = stored.dtype in (DType.F16, DType.BF16)
                mat = (round_up(k, 2) if narrow else k) * round_up(n, PACK_NR_MAX)
                self.packed_mat[spec.node] = mat
                storage = math.prod(dims[:-2]) * mat * stored.dtype.itemsize
                mode = f"pack_{stored.dtype.value}" if narrow else "pack"
                note = " (packed for the GEMM kernel on set)"
            elif spec.node in self.int8:
                # an int8_matmul weight [K, N]: quantized per column into int8 panels on set (int8_gemm.h)
                storage = self.int8[spec.node].storage_bytes
                mode, note = "int8", " (quantized to int8 per output channel on set)"
            elif spec.node in self.widened:
                # read only through one cast to f32: stored as that f32 value (exact), cast once on set
                storage = math.prod(dims or [1]) * 4
                mode, note = f"widen_{stored.dtype.value}", " (widened to f32 on set)"
            params.append({
                "slot": slot, "offset": offset, "nbytes": nbytes, "name": c_string(spec.name),
                "comment": comment(spec.name, 60), "shape": comment(str(stored), 60),
                "mode": mode, "note": note, "rank": max(len(user_dims), 1), "elsize": stored.dtype.itemsize,
                "dims": dims or [1], "src_strides": src_strides or [0],
            })
            offset += (storage + 63) // 64 * 64
        return params, offset

    def plan_constants(self) -> list[dict]:
        out = []
        for slot, nid in enumerate(self.lir.constants):
            data = self.node(nid).op.data
            rows = [", ".join(f"0x{b:02x}" for b in data[i:i + 24]) for i in range(0, len(data), 24)]
            out.append({"slot": slot, "nbytes": max(len(data), 1), "rows": rows or ["0"],
                        "comment": comment(str(self.node(nid).shape))})
        return out

    def kernels(self) -> list[Kernel]:
        """One Kernel record per scheduled node, from the CPU rule table."""
        out = []
        for nid in self.lir.schedule:
            node = self.node(nid)
            note = None
            if self.lir.buffers[nid].storage == "view":
                note = f"aliases %{self.lir.buffers[nid].source}"
            elif nid in self.absorbed:
                note = "folded into the GEMMs that read it (BLAS transpose flag)"
            elif nid in self.widened_cast:
                note = f"%{self.widened_cast[nid]} widened once at set_param: its readers read that copy"
            if note is not None:
                out.append(Kernel(nid, "", "", NoteArgs(note=note), header=self.header(node)))
                continue
            reason = self.rules.why_not(self.graph, node)
            if reason is not None:
                raise BuildError(f"{reason} (node {node.label}) — insert a cast")
            kernel = self.rules.rule(node.kind).emit(self, node)
            group = self.decode_skips.get(nid)
            if group is not None:
                lead = self.node(group.members[0])
                rows = self.numel(self.node(lead.inputs[0]).shape.dims[:-1])
                # (the note names no node: the layers' copies of the body stay one shared function)
                kernel = replace(kernel, skip_when=f"{rows} <= {group.max_rows}",
                                 skip_note="computed by its decode GEMV group (QuantGemvGroup)")
            self.scratch_per_thread = max(self.scratch_per_thread, kernel.scratch_per_thread)
            self.scratch_shared = max(self.scratch_shared, kernel.scratch_shared)
            out.append(kernel)
        return out

    def kernel(self, node: Node, macro: str, template: str, args: CpuArgs | Mapping[str, Any], *,
               headers: tuple[str, ...] = (), scratch_per_thread: int = 0, scratch_shared: int = 0) -> Kernel:
        """The Kernel record of `node`: `macro` from `template` renders `args` with the node's label.

        `args` is the rule's frozen dataclass (a `CpuArgs`); a plain mapping is still accepted
        and handed to the template read-only.
        """
        label = c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))
        if is_dataclass(args):
            args = replace(args, label=label)
        else:
            args = MappingProxyType({**args, "label": label})
        return Kernel(node.id, macro, template, args, headers=headers, header=self.header(node),
                      func=f"rlx_op_{node.id}", label=label, scratch_per_thread=scratch_per_thread,
                      scratch_shared=scratch_shared)

    # ── elementwise ────────────────────────────────────────────────────

    def elementwise(self, node: Node) -> ElementwiseArgs:
        op = node.op
        in_shapes = [self.node(i).shape for i in node.inputs]
        if isinstance(op, O.ElementwiseRegion):
            steps = list(op.steps)
            shapes = op.step_shapes(in_shapes)
        elif isinstance(op, O.Expand):
            steps = [None]
            shapes = [*in_shapes, node.shape]
        else:
            steps = [O.RegionStep(op, tuple(range(len(node.inputs))))]
            shapes = [*in_shapes, node.shape]
        n_in = len(node.inputs)
        out_dims = node.shape.dims

        # Each input read as the output's shape (broadcast axes have stride 0), then the loop nest
        # collapsed to as few axes as every input allows.
        views = [View.dense(sh.dims).broadcast_to(out_dims) for sh in in_shapes]
        dims, collapsed = collapse(out_dims, *views)
        strides = [[self.dim(st) for st in v.strides] for v in collapsed]

        inputs = []
        for j, i in enumerate(node.inputs):
            dt = in_shapes[j].dtype
            inner = strides[j][-1] if dims else "0"
            inputs.append(EwInput(ptr=self.ptr(i), dtype=dt.value, var=f"v{j}", ctype=_COMPUTE[dt],
                                  stype=dt.c_type, strides=tuple(strides[j]), inner=inner,
                                  scalar=all(s == "0" for s in strides[j])))
        step_ctx = []
        checks = False
        for si, step in enumerate(steps):
            dt = shapes[n_in + si].dtype
            var = f"v{n_in + si}"
            if step is None:  # expand: a plain copy of the broadcast input
                step_ctx.append(EwStep(var=var, kind="copy", fn="", args=("v0",), dtype=dt.value,
                                       ctype=_COMPUTE[dt], arg_ctype=_COMPUTE[dt], arg_dtype=dt.value))
                continue
            arg_dts = [shapes[a].dtype for a in step.args]
            sop = step.op
            fn = getattr(sop, "fn", "")
            if isinstance(sop, O.Cast):
                fn = DType.parse(sop.dtype).value
            if isinstance(sop, O.Binary) and fn in ("div", "pow") and dt.is_int:
                checks = True
            step_ctx.append(EwStep(var=var, kind=sop.kind, fn=fn, args=tuple(f"v{a}" for a in step.args),
                                   dtype=dt.value, ctype=_COMPUTE[dt], arg_ctype=_COMPUTE[arg_dts[-1]],
                                   arg_dtype=arg_dts[-1].value))
        out_dt = node.shape.dtype
        return ElementwiseArgs(
            rank=len(dims),
            dims=tuple(self.dim(d) for d in dims),
            outer_dims=tuple(self.dim(d) for d in dims[:-1]),
            total=self.numel(dims) if dims else "1",
            inner=self.dim(dims[-1]) if dims else "1",
            rows=self.numel(dims[:-1]) if len(dims) > 1 else "1",
            inputs=tuple(inputs),
            steps=tuple(step_ctx),
            result=step_ctx[-1].var,
            out=self.ptr(node.id, const=False),
            out_dtype=out_dt.value,
            out_stype=out_dt.c_type,
            checks=checks,
            grain=GRAIN,
        )

    # ── GEMM family ────────────────────────────────────────────────────

    def gemm_operand(self, nid: NodeId) -> tuple[str, bool]:
        """(pointer, transposed) for a GEMM operand, seeing through absorbed transposes."""
        if nid in self.absorbed:
            return self.ptr(self.absorbed[nid]), True
        return self.ptr(nid), False

    def _check_gemm_dims(self, node: Node, *dims: Dim) -> None:
        for d in dims:
            if d.max > _INT32_MAX:
                raise BuildError(f"node {node.label}: GEMM dimension {d} (max {d.max}) exceeds the 32-bit BLAS limit")

    def _batch(self, a: Shape, b: Shape, out: Shape, b_mat: int | None = None) -> GemmBatch:
        """Batch loop of a batched GEMM: per-operand element strides of the broadcast batch axes.

        `b_mat`: floats per matrix of b when it is stored packed (padded), not K * N.
        """
        batch = out.dims[:-2]
        nb = len(batch)

        def batch_strides(s: Shape, packed: int | None = None) -> tuple[str, ...]:
            # The operand's batch axes (matrices of `mat` elements) read as the output's batch.
            mat = Dim(packed) if packed is not None else s.dims[-2] * s.dims[-1]
            own = s.dims[:-2]
            view = View(own, tuple(st * mat for st in dense_strides(own))).broadcast_to(batch)
            return tuple(self.dim(st) for st in view.strides)

        return GemmBatch(dims=tuple(self.dim(d) for d in batch), count=self.numel(batch) if batch else "1",
                         a_strides=batch_strides(a), b_strides=batch_strides(b, b_mat), rank=nb)

    def gemm(self, node: Node) -> GemmArgs | PgemmArgs:
        a_id, b_id = node.inputs[:2]
        a, b = self.node(a_id).shape, self.node(b_id).shape
        out = node.shape
        m, k, n = out.dims[-2], a.dims[-1], out.dims[-1]
        self._check_gemm_dims(node, m * product(out.dims[:-2]), k, n)
        a_ptr, ta = self.gemm_operand(a_id)
        b_ptr, tb = self.gemm_operand(b_id)
        bias = self.ptr(node.inputs[2]) if len(node.inputs) == 3 else ""
        act = getattr(node.op, "activation", None) or ""
        b_param = self.absorbed.get(b_id, b_id)
        if b_param in self.packed:
            return self.pgemm(node, a, b, b_param, a_ptr, bias, act)
        # A 2-D right operand with an unbroadcast left batch folds the batch into M: one GEMM.
        fold = b.rank == 2 and not ta
        batch = self._batch(a, b, out)
        rows = self.dim(product(out.dims[:-1])) if fold else self.dim(m)
        return GemmArgs(
            m=rows, n=self.dim(n), k=self.dim(k),
            a=a_ptr, b=b_ptr, c=self.ptr(node.id, const=False), ta=ta, tb=tb,
            lda=self.dim(m if ta else k), ldb=self.dim(k if tb else n),
            batch=batch, fold=fold or batch.rank == 0,
            bias=bias, act=act, epilogue=bool(bias or act),
            mat_c=self.dim(m * n), block=0, grain=GRAIN,
        )

    def pgemm(self, node: Node, a: Shape, b: Shape, b_param: NodeId, a_ptr: str, bias: str,
              act: str) -> PgemmArgs:
        """A GEMM whose right operand is a packed param (see find_packed_params)."""
        out = node.shape
        m, k, n = out.dims[-2], a.dims[-1], out.dims[-1]
        fold = b.rank == 2
        if act:
            self.gemm_acts.add(act)
        return PgemmArgs(
            m=self.dim(product(out.dims[:-1]) if fold else m), n=self.dim(n),
            k=self.dim(k), lda=self.dim(k), a=a_ptr, b=self.ptr(b_param),
            c=self.ptr(node.id, const=False), bias=bias, fold=fold,
            batch=self._batch(a, b, out, self.packed_mat[b_param]), mat_c=self.dim(m * n),
            epi=f"RLX_EPI_{act.upper()}" if act else "RLX_EPI_NONE",
        )

    def swiglu(self, node: Node) -> SwigluArgs:
        x_id, g_id, u_id = node.inputs
        x, wg = self.node(x_id).shape, self.node(g_id).shape
        out = node.shape
        m, k, n = out.dims[-2], x.dims[-1], out.dims[-1]
        self._check_gemm_dims(node, m * product(out.dims[:-2]), k, n)
        g_ptr, tg = self.gemm_operand(g_id)
        u_ptr, tu = self.gemm_operand(u_id)
        fold = wg.rank == 2
        rows_dim = product(out.dims[:-1]) if fold else m
        # rows per step: the up-projection block (block x N floats of scratch) stays within ~1 MiB
        block = max(16, min(512, (1 << 18) // max(n.max, 1)))
        block = max(1, min(block, rows_dim.max))
        self.scratch_shared = max(self.scratch_shared, block * n.max * 4)
        return SwigluArgs(
            m=self.dim(rows_dim), n=self.dim(n), k=self.dim(k),
            x=self.ptr(x_id), wg=g_ptr, wu=u_ptr, tg=tg, tu=tu,
            ldg=self.dim(k if tg else n), ldu=self.dim(k if tu else n),
            c=self.ptr(node.id, const=False), block=block,
            batch=self._batch(x, wg, out), fold=fold or len(out.dims) == 2,
            mat_c=self.dim(m * n), grain=GRAIN,
        )

    # ── reductions and normalization ───────────────────────────────────

    def reduce(self, node: Node) -> ReduceArgs:
        op: O.Reduce = node.op  # type: ignore[assignment]
        x = self.node(node.inputs[0]).shape
        axes = set(op.normalized_axes(x.rank))
        # Collapse into alternating kept/reduced groups, dropping static 1s.
        groups: list[tuple[Dim, bool]] = []
        for i, d in enumerate(x.dims):
            if d == 1:
                continue
            red = i in axes
            if groups and groups[-1][1] == red:
                groups[-1] = (groups[-1][0] * d, red)
            else:
                groups.append((d, red))
        pattern = "".join("R" if r else "K" for _, r in groups)
        # Generic fallback for patterns other than [K] R [K]: reduced groups and kept groups with strides.
        strides = dense_strides([d for d, _ in groups])
        kept = tuple((self.dim(d), self.dim(s)) for (d, r), s in zip(groups, strides) if not r)
        red = tuple((self.dim(d), self.dim(s)) for (d, r), s in zip(groups, strides) if r)
        simple = pattern in ("", "R", "KR", "RK", "KRK", "K")
        outer = inner = "1"
        count = "1"
        if simple:
            idx = pattern.find("R")
            if idx >= 0:
                outer = self.numel([d for d, _ in groups[:idx]]) if idx > 0 else "1"
                count = self.dim(groups[idx][0])
                inner = self.numel([d for d, _ in groups[idx + 1:]]) if idx + 1 < len(groups) else "1"
            else:
                outer = self.numel([d for d, _ in groups]) if groups else "1"
        red_count = self.numel([d for d, r in groups if r]) if any(r for _, r in groups) else "1"
        dt = x.dtype
        acc_type = "double" if dt.is_float else ("int64_t" if op.fn in ("sum", "prod") else _COMPUTE[dt])
        if op.fn == "mean":
            acc_type = "double"
        if op.fn in ("max", "min"):
            acc_type = _COMPUTE[dt]
        return ReduceArgs(
            fn=op.fn, simple=simple, outer=outer, inner=inner, count=count,
            kept=kept, red=red, red_count=red_count, out_count=self.numel(node.shape.dims),
            x=self.ptr(node.inputs[0]), y=self.ptr(node.id, const=False), dtype=dt.value,
            ctype=_COMPUTE[dt], stype=dt.c_type, acc=acc_type, is_float=dt.is_float, grain=GRAIN,
        )

    def softmax(self, node: Node) -> SoftmaxArgs:
        x = node.shape
        axis = node.op.axis % x.rank
        return SoftmaxArgs(outer=self.numel(x.dims[:axis]), n=self.dim(x.dims[axis]),
                           inner=self.numel(x.dims[axis + 1:]), x=self.ptr(node.inputs[0]),
                           y=self.ptr(node.id, const=False), grain=GRAIN)

    def norm(self, node: Node) -> NormArgs:
        n = norm_inputs(node)
        x = node.shape
        return NormArgs(rms=n.rms, x=self.ptr(n.x), residual=self.ptr(n.residual) if n.residual is not None else "",
                        bias=self.ptr(n.bias) if n.bias is not None else "", gamma=self.ptr(n.gamma),
                        beta=self.ptr(n.beta) if n.beta is not None else "", y=self.ptr(node.id, const=False),
                        rows=self.numel(x.dims[:-1]), n=self.dim(x.dims[-1]), eps=_float_literal(node.op.eps),
                        grain=GRAIN)

    # ── data movement ──────────────────────────────────────────────────

    def copy(self, node: Node) -> CopyArgs:
        return CopyArgs(src=self.base(node.inputs[0]), dst=self.base(node.id),
                        nbytes=f"({self.numel(node.shape.dims)}*{node.shape.dtype.itemsize})")

    def transpose(self, node: Node) -> TransposeArgs:
        x = self.node(node.inputs[0]).shape
        # The input read through the transpose's View; output axes that are neighbours in the
        # input too merge (collapse), size-1 axes drop.
        view = movement_view(node.op, x, node.shape)
        dims, (read,) = collapse(node.shape.dims, view)
        strides = list(read.strides)
        esize = x.dtype.itemsize
        if not dims:
            dims, strides = [Dim(1)], [Dim(1)]
        return TransposeArgs(rank=len(dims), dims=tuple(self.dim(d) for d in dims),
                             strides=tuple(self.dim(s) for s in strides),
                             rows=self.numel(dims[:-1]) if len(dims) > 1 else "1",
                             inner=self.dim(dims[-1]), ctype=_elem_type(esize),
                             x=f"((const {_elem_type(esize)} *){self.base(node.inputs[0])})",
                             y=f"(({_elem_type(esize)} *){self.base(node.id)})", grain=GRAIN)

    def narrow(self, node: Node) -> NarrowArgs:
        op: O.Narrow = node.op  # type: ignore[assignment]
        x = self.node(node.inputs[0]).shape
        axis = op.axis % x.rank
        inner = product(x.dims[axis + 1:])
        size = x.dtype.itemsize
        return NarrowArgs(outer=self.numel(x.dims[:axis]),
                          src_row=f"({self.dim(x.dims[axis] * inner)}*{size})",
                          dst_row=f"({self.dim(inner * op.length)}*{size})",
                          start=f"({self.dim(inner * op.start)}*{size})",
                          src=self.base(node.inputs[0]), dst=self.base(node.id))

    def concat(self, node: Node) -> ConcatArgs:
        axis = node.op.axis % node.shape.rank
        size = node.shape.dtype.itemsize
        out_row = product(node.shape.dims[axis:])
        parts = []
        offset = Dim(0)
        for i in node.inputs:
            s = self.node(i).shape
            row = product(s.dims[axis:])
            parts.append(ConcatPart(src=self.base(i), row=f"({self.dim(row)}*{size})",
                                    offset=f"({self.dim(offset)}*{size})" if offset.coeff else "0"))
            offset = _add_rows(offset, row)
        return ConcatArgs(outer=self.numel(node.shape.dims[:axis]),
                          dst_row=f"({self.dim(out_row)}*{size})", parts=tuple(parts), dst=self.base(node.id))

    def gather(self, node: Node) -> GatherArgs:
        table_id, idx_id = node.inputs
        table, idx = self.node(table_id).shape, self.node(idx_id).shape
        axis = node.op.axis % table.rank
        size = table.dtype.itemsize
        return GatherArgs(outer=self.numel(table.dims[:axis]), n=self.dim(table.dims[axis]),
                          count=self.numel(idx.dims), inner_bytes=f"({self.numel(table.dims[axis + 1:])}*{size})",
                          table=self.base(table_id), idx=self.ptr(idx_id), idx_type=idx.dtype.c_type,
                          dst=self.base(node.id), grain=GRAIN)

    # ── transformer blocks ─────────────────────────────────────────────

    def attention(self, node: Node) -> AttentionArgs:
        op: O.Attention = node.op  # type: ignore[assignment]
        q, k = self.node(node.inputs[0]).shape, self.node(node.inputs[1]).shape
        h, hkv, d = op.num_heads, op.kv_heads, op.head_dim
        skv_max = k.dims[1].max
        # per thread: the score tile, K^T and V of one head in panels padded to PACK_NR_MAX, a mask row
        kp_offset = align64(ATTN_QBLOCK * skv_max * 4)
        vp_offset = kp_offset + align64(d * round_up(skv_max, PACK_NR_MAX) * 4)
        row_offset = vp_offset + align64(skv_max * round_up(d, PACK_NR_MAX) * 4)
        scratch = row_offset + align64(skv_max * 4)
        self.scratch_per_thread = max(self.scratch_per_thread, scratch)
        mask = AttentionMask(op.mask)
        if op.mask == "padding":
            m_id = node.inputs[3]
            mask = AttentionMask(op.mask, ptr=self.ptr(m_id), ctype=self.node(m_id).shape.dtype.c_type)
        elif op.mask == "bias":
            m_id = node.inputs[3]
            ms = self.node(m_id).shape
            if ms.dtype is not DType.F32:
                raise BuildError(f"the CPU backend needs an f32 attention bias (node {node.label}), got {ms.dtype}")
            target = (q.dims[0], Dim(h), q.dims[1], k.dims[1])
            st = tuple(self.dim(d) for d in View.dense(ms.dims).broadcast_to(target).strides)
            mask = AttentionMask(op.mask, ptr=self.ptr(m_id), strides=st)
        return AttentionArgs(q=self.ptr(node.inputs[0]), k=self.ptr(node.inputs[1]),
                             v=self.ptr(node.inputs[2]), o=self.ptr(node.id, const=False),
                             batch=self.dim(q.dims[0]), sq=self.dim(q.dims[1]), skv=self.dim(k.dims[1]),
                             heads=h, kv_heads=hkv, group=h // hkv, hd=d, scale=_float_literal(op.softmax_scale),
                             mask=mask, qblock=ATTN_QBLOCK, kp_offset=kp_offset, vp_offset=vp_offset,
                             row_offset=row_offset)

    def rope(self, node: Node) -> RopeArgs:
        op: O.Rope = node.op  # type: ignore[assignment]
        x = node.shape
        return RopeArgs(x=self.ptr(node.inputs[0]), cos=self.ptr(node.inputs[1]),
                        sin=self.ptr(node.inputs[2]), y=self.ptr(node.id, const=False),
                        batch=self.dim(x.dims[0]), seq=self.dim(x.dims[1]), width=x.dims[2].value,
                        hd=op.head_dim, half=op.rot // 2, rot=op.rot, neox=op.variant == "neox",
                        per_row=self.node(node.inputs[1]).shape.rank == 3, grain=GRAIN)


# ── the CPU rule table ─────────────────────────────────────────────────────

#: Template file of each kernel macro, and the fixed kernel headers its code calls into.
MACRO_TEMPLATES = {
    "elementwise": "elementwise.c.j2", "gemm": "gemm.c.j2", "pgemm": "gemm.c.j2", "swiglu": "gemm.c.j2",
    "norm": "norm.c.j2", "softmax": "norm.c.j2", "reduce": "reduce.c.j2", "copy": "movement.c.j2",
    "transpose": "movement.c.j2", "narrow": "movement.c.j2", "concat": "movement.c.j2",
    "gather": "movement.c.j2", "attention": "attention.c.j2", "rope": "attention.c.j2",
}
MACRO_HEADERS = {
    "pgemm": ("kernels/packed_gemm.h",),
    "attention": ("kernels/packed_gemm.h", "kernels/attention.h"),
}
#: Headers every generated file includes (small inline helpers; the ABI uses copy and gemm).
BASE_HEADERS = ("kernels/threads.h", "kernels/half.h", "kernels/scalar.h", "kernels/copy.h", "kernels/gemm.h")


def _emit_with(method: str) -> Callable[[_Planner, Node], Kernel]:
    """A rule that renders a node with the planner method `method` (its result's class names the macro)."""

    def emit(em: _Planner, node: Node) -> Kernel:
        args: CpuArgs = getattr(em, method)(node)
        macro = args.macro
        return em.kernel(node, macro, MACRO_TEMPLATES[macro], args, headers=MACRO_HEADERS.get(macro, ()))

    emit.__name__ = f"emit_{method}"
    return emit


def _attention_dtypes(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    # q, k, v by position (they may be one node): f32; a padding mask may be any dtype, a bias is f32.
    data = in_dtypes[:3] + (in_dtypes[3:] if getattr(op, "mask", "") == "bias" else ())
    return float32_only(op, data, out_dtype)


def _no_bool(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return "on bool" if DType.BOOL in in_dtypes else None


RULES.register("activation", "binary", "compare", "where", "cast", "expand", "elementwise_region")(
    _emit_with("elementwise"))
# f32 GEMMs render with the planner's `gemm`; f32 activations x f16/bf16 weights with c_half's kernels
RULES.register("matmul", "fused_matmul_bias_act", accepts=c_half.gemm_dtypes, mixed=True)(
    c_half.gemm_rule(_emit_with("gemm")))
RULES.register("fused_swiglu", accepts=float32_only)(_emit_with("swiglu"))
RULES.register("reduce", accepts=_no_bool)(_emit_with("reduce"))
RULES.register("softmax", accepts=float32_only)(_emit_with("softmax"))
RULES.register("layer_norm", "rms_norm", "fused_residual_layer_norm", "fused_residual_rms_norm",
             accepts=float32_only)(_emit_with("norm"))
RULES.register("transpose")(_emit_with("transpose"))
RULES.register("narrow")(_emit_with("narrow"))
RULES.register("concat")(_emit_with("concat"))
RULES.register("reshape")(_emit_with("copy"))
RULES.register("gather")(_emit_with("gather"))
RULES.register("attention", accepts=_attention_dtypes)(_emit_with("attention"))
RULES.register("rope", accepts=float32_only)(_emit_with("rope"))


def _add_rows(offset: Dim, row: Dim) -> Dim:
    """offset + row where both are multiples of the same symbolic factor (concat rows share trailing dims)."""
    if offset.coeff == 0:
        return row
    if offset.symbols != row.symbols:
        raise BuildError("concat rows with different dynamic factors")
    return Dim(offset.coeff + row.coeff, offset.symbols)




def _elem_type(size: int) -> str:
    return {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}[size]


def c_context(lir: LirModule, target: CTarget, manifest: dict) -> dict:
    """The template context for `lir` (pure: same inputs, same context)."""
    require_decided(lir, "cpu")
    p = _Planner(lir, target)
    params, params_bytes = p.plan_params()
    kernels = p.kernels()
    headers = list(dict.fromkeys(h for k in kernels for h in k.headers if h not in BASE_HEADERS))
    copies = []
    for slot, nid in lir.output_copies:
        shape = p.node(nid).shape
        copies.append({"slot": slot, "src": p.base(nid),
                       "nbytes": f"({p.numel(shape.dims)}*{shape.dtype.itemsize})"})
    manifest_text = json.dumps(manifest, sort_keys=True, ensure_ascii=True, allow_nan=False)
    return {
        "name": comment(lir.name, 80),
        "lir_hash": lir.hash(),
        "abi_version": ABI_VERSION,
        "codegen_version": CODEGEN_VERSION,
        "target": target,
        "symbols": [{"index": i, "name": c_string(n), "max": m, "comment": comment(n)}
                    for i, (n, m) in enumerate(lir.symbols)],
        "inputs": [{"slot": i, "name": c_string(s.name), "comment": comment(s.name, 60),
                    "shape": comment(str(s.shape), 60)} for i, s in enumerate(lir.inputs)],
        "outputs": [{"slot": i, "name": c_string(s.name), "comment": comment(s.name, 60),
                     "shape": comment(str(s.shape), 60)} for i, s in enumerate(lir.outputs)],
        "params": params,
        "params_bytes": params_bytes,
        "constants": p.plan_constants(),
        "arena_bytes": lir.arena_bytes,
        "scratch_per_thread": (p.scratch_per_thread + 63) // 64 * 64,
        "scratch_shared": (p.scratch_shared + 63) // 64 * 64,
        "kernels": kernels,
        "base_headers": BASE_HEADERS,
        "headers": headers,
        "gemm_acts": sorted(p.gemm_acts),
        "copies": copies,
        "context_bytes": context_record_bytes(len(lir.params), headers, target.profile),
        "manifest": c_string_lines(manifest_text),
        **observe_context(p, kernels, target),
    }


def context_record_bytes(n_params: int, headers: Sequence[str], profile: bool) -> int:
    """sizeof(rlx_ctx) (templates/cpu/prelude.c.j2) of a program with `n_params` params, its kernel `headers`,
    profiled or not. The rendered source asserts it (`_Static_assert`), so a change to the record that is not
    made here too fails every build instead of skewing `Session.estimate`."""
    # three pointers, three int32 (nthreads, scratch_threads, spins), param_set[N + 1], err[512], padded to 8;
    # then the transport pointer (collectives) and a profiled build's span ring
    record = -(-(3 * 8 + 3 * 4 + n_params + 1 + 512) // 8) * 8
    if "kernels/collectives.h" in headers:
        record += 8
    return record + (PROFILE_RING_BYTES if profile else 0)


def memory_plan(lir: LirModule, *, profile: bool = False) -> dict[str, int]:
    """What the CPU code generator sizes for `lir` (no rendering): arena, params, scratch, the context
    record, and what the caller owns (state, inputs, outputs), every dynamic dim at its bound.

    An input marked `state` (persistent buffers such as a KV cache) counts as state.
    """
    ctx = c_context(lir, CTarget(), {})
    graph = lir.graph
    record = context_record_bytes(len(lir.params), ctx["headers"], profile)
    state_inputs = {s.node for s in lir.inputs if s.state}
    state = sum(graph.node(nid).shape.max_nbytes for nid in state_inputs)
    return {
        "arena": ctx["arena_bytes"], "params": ctx["params_bytes"], "scratch_shared": ctx["scratch_shared"],
        "scratch_per_thread": ctx["scratch_per_thread"], "context": record, "state": state,
        "inputs": sum(graph.node(s.node).shape.max_nbytes for s in lir.inputs if s.node not in state_inputs),
        "outputs": sum(graph.node(s.node).shape.max_nbytes for s in lir.outputs),
    }


def render_c(lir: LirModule, target: CTarget, manifest: dict, *, bytecode_dir: Path | None = None) -> str:
    """The complete C source of `lir` (one translation unit exporting the RLX C ABI).

    `bytecode_dir`: a private directory where compiled templates are kept between processes
    (`rlx.codegen.template_cache`; the toolchain passes one in the AOT cache root).
    """
    ctx = c_context(lir, target, manifest)
    try:
        source = environment("cpu", bytecode_dir).get_template("model.c.j2").render(**ctx)
    except jinja2.TemplateError as exc:
        raise BuildError(f"rendering the CPU template failed: {type(exc).__name__}: {exc}") from exc
    # repeated layers: one function per distinct kernel, not one per node (compile time)
    return share_kernels(source)

"""LIR → template context for the CPU backend, and the rendering of one C file.

`c_context(lir, target, manifest)` is a pure function: the `CpuEmitter` asks each
scheduled node's rule (`rlx.codegen.cpu.rules` and the other rule modules, listed by
`rlx.codegen.cpu.rule_table`) which kernel template renders it and with which C
expressions (pointers, dims as expressions of the run-time `sym[]` array, strides),
and returns plain data. All C text lives in `templates/cpu/`; this module only
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import jinja2

from rlx.abi_version import ABI_VERSION
from rlx.codegen.common import dim_expr, require_decided
from rlx.codegen.cpu.base import (
    c_string,
    c_string_lines,
    comment,
    node_header,
)
from rlx.codegen.cpu.observe import PROFILE_RING_BYTES, observe_context
from rlx.codegen.cpu.params import param_layout
from rlx.codegen.cpu.share import share_kernels
from rlx.codegen.registry import Kernel, user_code_of
from rlx.codegen.template_cache import environment
from rlx.errors import BuildError
from rlx.ir.decisions import AbsorbedTranspose, GemmSiblings, HugePageArena, PackedParam, ResidentTable, WidenedParam
from rlx.ir.decisions_conv import ConvInputScale, ConvResidual
from rlx.ir.decisions_int8 import Int8Param
from rlx.ir.decisions_quant import QuantGemvGroup
from rlx.ir.graph import Node, NodeId
from rlx.ir.lir import LirModule
from rlx.ir.shape import Dim, Shape, product
from rlx.ir.view import View, dense_strides

#: Bumped whenever generated code changes for the same LIR and templates (part of the cache key).
CODEGEN_VERSION = "cpu-3"
_INT32_MAX = (1 << 31) - 1

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
# `CpuEmitter.kernel`.


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
class GemmBatch:
    """The batch loop of a batched GEMM: dims and per-operand element strides (0 = broadcast)."""

    dims: tuple[str, ...]
    count: str
    a_strides: tuple[str, ...]
    b_strides: tuple[str, ...]
    rank: int


def _c_int(value: int) -> str:
    return f"{value}LL" if value > _INT32_MAX else str(value)



class CpuEmitter:
    """What the CPU rules see: C expressions for pointers and dims of one decided LIR, and its decisions.

    `kernels()` asks each scheduled node's rule (`rlx.codegen.cpu.rule_table`) for its `Kernel`; the
    rules keep the largest scratch they need here (`scratch_per_thread`, `scratch_shared`) and the
    activations fused into packed GEMMs (`gemm_acts`). Param storage comes from `param_layout`.
    """

    def __init__(self, lir: LirModule, target: CTarget) -> None:
        from rlx.codegen.cpu import rule_table  # the package lists the rule modules (they import this one)

        self.lir = lir
        self.target = target
        self.rules = rule_table()
        self.graph = lir.graph
        self.sym_index = {name: i for i, (name, _) in enumerate(lir.symbols)}
        self.params = param_layout(lir)
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
        # residual adds a conv computes in its store: add -> the decision
        self.conv_stored: dict[NodeId, ConvResidual] = {d.add: d for d in lir.decided(ConvResidual)}
        # squeeze-excite products a pointwise conv computes in its weight: mul -> the decision
        self.conv_scaled: dict[NodeId, ConvInputScale] = {d.mul: d for d in lir.decided(ConvInputScale)}
        #: GEMMs run by their sibling group's first member (`GemmSiblings`), and each group by its first member
        self.sibling_lead: dict[NodeId, NodeId] = {m: d.members[0] for d in lir.decided(GemmSiblings)
                                                    for m in d.members[1:]}
        self.siblings: dict[NodeId, tuple[NodeId, ...]] = {d.members[0]: d.members for d in lir.decided(GemmSiblings)}
        self.packed_mat: Mapping[NodeId, int] = self.params.packed_floats  # elements per packed K x N matrix
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
            return f"ctx->param_at[{b.slot}]"  # its slot in ctx->params, or memory bound by rlx_bind_param
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
            elif nid in self.conv_stored:
                note = f"computed in the store of %{self.conv_stored[nid].node} conv (ConvResidual)"
            elif nid in self.conv_scaled:
                note = f"computed in the weight of %{self.conv_scaled[nid].node} conv (ConvInputScale)"
            elif nid in self.sibling_lead:
                note = f"computed in the parallel region of %{self.sibling_lead[nid]} (GemmSiblings)"
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
    # ── GEMM operands ─────────────────────────────────────────────────

    def gemm_operand(self, nid: NodeId) -> tuple[str, bool]:
        """(pointer, transposed) for a GEMM operand, seeing through absorbed transposes."""
        if nid in self.absorbed:
            return self.ptr(self.absorbed[nid]), True
        return self.ptr(nid), False

    def check_gemm_dims(self, node: Node, *dims: Dim) -> None:
        for d in dims:
            if d.max > _INT32_MAX:
                raise BuildError(f"node {node.label}: GEMM dimension {d} (max {d.max}) exceeds the 32-bit BLAS limit")

    def gemm_batch(self, a: Shape, b: Shape, out: Shape, b_mat: int | None = None) -> GemmBatch:
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

#: Headers every generated file includes (small inline helpers; the ABI uses copy and gemm).
BASE_HEADERS = ("kernels/threads.h", "kernels/half.h", "kernels/scalar.h", "kernels/narrow.h", "kernels/copy.h",
                "kernels/gemm.h")


def c_context(lir: LirModule, target: CTarget, manifest: dict) -> dict:
    """The template context for `lir` (pure: same inputs, same context)."""
    require_decided(lir, "cpu")
    p = CpuEmitter(lir, target)
    params, params_bytes = list(p.params.slots), p.params.nbytes
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
        "arena_huge_run": max((d.run_bytes for d in lir.decided(HugePageArena)), default=0),
        "resident_tables": resident_table_calls(lir, p),
        "scratch_per_thread": (p.scratch_per_thread + 63) // 64 * 64,
        "scratch_shared": (p.scratch_shared + 63) // 64 * 64,
        "kernels": kernels,
        "base_headers": BASE_HEADERS,
        "headers": headers,
        "user_code": user_code_of(kernels),
        "gemm_acts": sorted(p.gemm_acts),
        "copies": copies,
        "context_bytes": context_record_bytes(len(lir.params), headers, target.profile),
        "manifest": c_string_lines(manifest_text),
        **observe_context(p, kernels, target),
    }


def resident_table_calls(lir: LirModule, emitter: CpuEmitter) -> list[dict[str, object]]:
    """The run's `rlx_resident_table` calls, one a `ResidentTable`: its param slot, the C expression of the rows its
    gathers read this run (their index counts), the rows from which a run copies it."""
    slots = {spec.node: i for i, spec in enumerate(lir.params)}
    calls = []
    for d in lir.decided(ResidentTable):
        rows = " + ".join(emitter.numel(emitter.node(emitter.node(g).inputs[1]).shape.dims) for g in d.gathers)
        calls.append({"slot": slots[d.node], "rows": f"({rows})", "min_rows": d.min_rows,
                      "comment": comment(lir.params[slots[d.node]].name, 60)})
    return calls


def context_record_bytes(n_params: int, headers: Sequence[str], profile: bool) -> int:
    """sizeof(rlx_ctx) (templates/cpu/prelude.c.j2) of a program with `n_params` params, its kernel `headers`,
    profiled or not. The rendered source asserts it (`_Static_assert`), so a change to the record that is not
    made here too fails every build instead of skewing `Session.estimate`."""
    # two pointers, param_at[N + 1], the scratch pointer, four int32 (nthreads, scratch_threads, spins, arena_huge),
    # param_set[N + 1], err[512], padded to 8; then the transport pointer (collectives) and a profiled build's span ring
    record = -(-(3 * 8 + (n_params + 1) * 8 + 4 * 4 + n_params + 1 + 512) // 8) * 8
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

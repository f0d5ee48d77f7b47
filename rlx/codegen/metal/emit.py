"""LIR → template context for the Metal backend, and the rendering of one .metal file.

`render_metal(lir, target, manifest)` reads the LIR decided for Metal (its one-buffer
`MetalLayout`, a decision of `rlx.opt.lowering_metal`), asks the rule of each
scheduled node's op kind (`rlx.codegen.metal.rules`, registered in
`rlx.codegen.metal.rule_table()`) for its `Kernel`, renders `templates/metal/model.metal.j2`
and returns the Metal Shading Language source together with its *dispatch
manifest*: the kernels of one run in order, each with its threadgroup size and
its grid as expressions of the dynamic dims (the host evaluates them per run).

Every kernel has one signature: the program buffer at `[[buffer(0)]]`, the
symbol values (dynamic dims, `long`) as a constant buffer at `[[buffer(1)]]`,
and its position in the grid. Pointers are the buffer plus a static byte
offset; dims are expressions of `sym[k]`. All MSL text lives in
`templates/metal/`; this module supplies identifiers, numbers and index
arithmetic only.

The backend's entry point is `rlx.codegen.metal` (its `rule_table()` lists the rule modules).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import jinja2

from rlx.abi_version import ABI_VERSION
from rlx.codegen.activations import install
from rlx.codegen.common import dim_expr, require_decided
from rlx.codegen.registry import Kernel, user_code_of
from rlx.codegen.template_cache import header_text
from rlx.codegen.text import comment, node_header
from rlx.errors import BuildError
from rlx.ir.decisions_metal import MetalLayout
from rlx.ir.dtype import DType
from rlx.ir.graph import Node, NodeId
from rlx.ir.lir import LirModule
from rlx.ir.shape import Dim, Shape, product
from rlx.ir.view import View, collapse
from rlx.templates_path import templates_dir

#: Bumped whenever generated code changes for the same LIR and templates (part of the cache key).
CODEGEN_VERSION = "metal-1"
#: The Metal Shading Language version the source is written for (bfloat needs 3.1).
MSL_VERSION = "3.1"
#: Fixed kernel code, in the order it appears in the .metal (each only when some kernel needs it).
KERNEL_HEADERS = ("metal/kernels/copy.metal", "metal/kernels/rows.metal", "metal/kernels/gemm.metal",
                  "metal/kernels/attention.metal", "metal/kernels/quant.metal", "metal/kernels/user_op.metal")
_INT32_LIMIT = (1 << 31) - 1
#: The error flag a user op's kernel sets when its function returns a nonzero status: this plus the node's id
#: (the manifest's `flag_errors` names the op; flags below it are RLX's own, `metal_host.FLAG_ERRORS`).
USER_OP_FLAG = 1000

#: Storage types in device memory (bool is one byte; MSL has no 64-bit float).
MSL_TYPE = {DType.F32: "float", DType.F16: "half", DType.BF16: "bfloat", DType.I8: "char", DType.I32: "int",
            DType.I64: "long", DType.U8: "uchar", DType.BOOL: "uchar", DType.I16: "short",
            DType.U16: "ushort", DType.U32: "uint", DType.U64: "ulong",
            **{d: "uchar" for d in DType if d.is_narrow}}  # storage formats: bytes a view may pass through
#: Types values are computed in (narrow floats in float).
VALUE_TYPE = {DType.F32: "float", DType.F16: "float", DType.BF16: "float", DType.I8: "char", DType.I32: "int",
              DType.I64: "long", DType.U8: "uchar", DType.BOOL: "bool", DType.I16: "short",
              DType.U16: "ushort", DType.U32: "uint", DType.U64: "ulong",
              **{d: "uchar" for d in DType if d.is_narrow}}
PRECISIONS = (DType.F32, DType.F16, DType.BF16)


def category(dt: DType) -> str:
    """How generated code treats values of `dt`: float, int or bool."""
    if dt in (DType.F32, DType.F16, DType.BF16, DType.F64):
        return "float"
    return "bool" if dt is DType.BOOL else "int"


def float_literal(v: float) -> str:
    """An MSL float literal of `v` (non-finite attributes cannot be compiled)."""
    if not math.isfinite(v):
        raise BuildError(f"non-finite attribute {v!r} cannot be compiled")
    text = repr(float(v))
    return (text if ("e" in text or "." in text) else text + ".0") + "f"


@dataclass(frozen=True)
class MetalTarget:
    """What the generated .metal assumes: the MSL version (3.1: bfloat) and threads per 1-D threadgroup."""

    msl: str = MSL_VERSION
    threads: int = 256

    def __post_init__(self) -> None:
        if self.msl not in ("3.0", "3.1", "3.2"):
            raise BuildError(f"Metal language version must be 3.0, 3.1 or 3.2, got {self.msl!r}")
        if self.threads not in (32, 64, 128, 256, 512, 1024):
            raise BuildError(f"threads per threadgroup must be a power of two in 32..1024, got {self.threads}")

    def identity(self) -> str:
        return f"msl={self.msl} threads={self.threads}"


@dataclass(frozen=True)
class GridAxis:
    """Threadgroups along one grid axis: ceil(`dim` / `div`), `dim` a product of the dynamic dims."""

    dim: Dim
    div: int = 1

    def to_json(self) -> list:
        return [self.dim.coeff, [name for name, _ in self.dim.symbols], self.div]


@dataclass(frozen=True)
class Dispatch:
    """One kernel launch: its function, grid of threadgroups and threads per threadgroup.

    `sync`: the kernel uses threadgroup barriers or simdgroup functions (its threads must run together).
    """

    kernel: str
    grid: tuple[GridAxis, GridAxis, GridAxis]
    threads: tuple[int, int, int]
    sync: bool = False

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "grid": [a.to_json() for a in self.grid], "threads": list(self.threads),
                "sync": self.sync}


def grid_1d(n: Dim, threads: int) -> tuple[GridAxis, GridAxis, GridAxis]:
    """A 1-D grid covering `n` threads in threadgroups of `threads`."""
    return (GridAxis(n, threads), GridAxis(Dim(1)), GridAxis(Dim(1)))


@dataclass(frozen=True, kw_only=True)
class MetalArgs:
    """What every Metal kernel record has: its comment line and its launches."""

    comment: str
    launches: tuple[Dispatch, ...] = ()


@dataclass(frozen=True, kw_only=True)
class NoWork(MetalArgs):
    """A view of another node's storage: nothing runs."""


@dataclass(frozen=True)
class Nd:
    """A collapsed iteration space: dims with source and destination element strides (MSL expressions)."""

    rank: int
    dims: tuple[str, ...]
    istride: tuple[str, ...]
    ostride: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class CopyNd(MetalArgs):
    """dst[walk(dst strides)] = src[walk(src strides)] over an n-d space (movement ops, output copies)."""

    name: str
    t: str
    src: str
    dst: str
    n: str
    nd: Nd


class MetalEmitter:
    """What the Metal rules see: MSL expressions for pointers and dims of one lowered LIR."""

    def __init__(self, lir: LirModule, target: MetalTarget) -> None:
        self.lir = lir
        self.target = target
        self.graph = lir.graph
        self.sym_index = {name: i for i, (name, _) in enumerate(lir.symbols)}
        layouts = lir.decided(MetalLayout)
        if len(layouts) != 1:
            raise BuildError("the LIR has no Metal layout: decide it with rlx.pipeline.decide(lir, 'metal')")
        self.layout: MetalLayout = layouts[0]

    def node(self, nid: NodeId) -> Node:
        return self.graph.node(nid)

    def dtype(self, nid: NodeId) -> DType:
        return self.node(nid).shape.dtype

    def mtype(self, nid: NodeId) -> str:
        return MSL_TYPE[self.dtype(nid)]

    def dim(self, d: Dim | None) -> str:
        """MSL `long` expression of a dim (`sym[k]` for dynamic ones); None is a zero stride."""
        if d is None:
            return "0"
        return dim_expr(d, self.sym_index, lambda v: str(v) if v <= _INT32_LIMIT else f"{v}L", "sym")

    def numel(self, dims: Sequence[Dim]) -> str:
        return self.dim(product(dims))

    def offset(self, nid: NodeId) -> int:
        """Byte offset of node `nid`'s first element in the program buffer."""
        b = self.lir.buffers[nid]
        lay = self.layout
        if b.storage == "input":
            return lay.inputs[b.slot]
        if b.storage == "output":
            return lay.outputs[b.slot]
        if b.storage == "param":
            return lay.params[b.slot]
        if b.storage == "const":
            return lay.constants[b.slot]
        if b.storage == "arena":
            return lay.arena + b.offset
        if b.storage == "view":
            return self.offset(b.source) + b.offset
        raise BuildError(f"node %{nid}: unknown storage {b.storage!r}")

    def ptr(self, nid: NodeId) -> str:
        return f"RLX_P({self.mtype(nid)}, {self.offset(nid)})"

    def flag(self) -> str:
        return f"RLX_P(int, {self.layout.flag})"

    def header(self, node: Node) -> str:
        return node_header(node, 90)

    def idx_type(self, *shapes: Shape) -> str:
        biggest = max((s.max_numel for s in shapes), default=0)
        return "int" if biggest <= _INT32_LIMIT else "long"

    def kernel_name(self, node: Node, suffix: str = "") -> str:
        return f"rlx_k{node.id}{suffix}"

    def nd(self, dims: Sequence[Dim], src: View, dst: View) -> Nd:
        """The collapsed iteration space copying `src` to `dst` (both viewed over `dims`)."""
        cdims, (cs, cd) = collapse(list(dims), src, dst)
        if not cdims:
            return Nd(1, ("1",), ("0",), ("0",))
        if len(cdims) > 16:
            raise BuildError(f"iteration space of rank {len(cdims)} exceeds 16")
        return Nd(len(cdims), tuple(self.dim(d) for d in cdims), tuple(self.dim(s) for s in cs.strides),
                  tuple(self.dim(s) for s in cd.strides))

    def copy(self, node: Node, name: str, src: str, dst: str, dims: tuple[Dim, ...], src_view: View,
             dst_view: View, what: str | None = None) -> CopyNd:
        """A strided copy kernel over `dims` (one thread per element)."""
        n = product(dims)
        return CopyNd(comment=what or self.header(node), name=name, t=self.mtype(node.id), src=src, dst=dst,
                      n=self.dim(n), nd=self.nd(dims, src_view, dst_view),
                      launches=(Dispatch(name, grid_1d(n, self.target.threads), (self.target.threads, 1, 1)),))

    # ── one kernel per scheduled node ──────────────────────────────────

    def kernel(self, nid: NodeId) -> Kernel:
        """The `Kernel` of one scheduled node: its op kind's rule, or no work for views."""
        node = self.node(nid)
        if self.lir.buffers[nid].storage == "view":
            return Kernel(nid, "block_view", OPS_TEMPLATE, NoWork(comment=self.header(node)))
        from rlx.codegen.metal import rule_table  # the package lists the rule modules (they import this one)

        rules = rule_table()
        reason = rules.why_not(self.graph, node)
        if reason is not None:
            raise BuildError(f"{reason} (node {node.label})")
        return rules.rule(node.kind).emit(self, node)

    def output_copy(self, slot: int, nid: NodeId) -> Kernel:
        """Output `slot` is node `nid` stored elsewhere (a param, an input, a view): copy it at the end."""
        node = self.node(nid)
        dims = tuple(node.shape.dims)
        dense = View.dense(dims)
        name = f"rlx_out{slot}"
        args = self.copy(node, name, self.ptr(nid), f"RLX_P({self.mtype(nid)}, {self.layout.outputs[slot]})",
                         dims, dense, dense, comment(f"output {slot} is %{nid}: copy it"))
        return Kernel(nid, "block_copy_nd", OPS_TEMPLATE, args, headers=(COPY_HEADER,))


OPS_TEMPLATE = "metal/ops.metal.j2"
COPY_HEADER = "metal/kernels/copy.metal"


@dataclass(frozen=True)
class MetalProgram:
    """A rendered Metal program: the .metal source and the dispatch manifest the host runs it by."""

    source: str
    manifest: dict


def metal_context(lir: LirModule, target: MetalTarget) -> tuple[dict, list[Dispatch]]:
    """The template context for `lir` (plain data and the kernel records) and its dispatches in order."""
    require_decided(lir, "metal")
    e = MetalEmitter(lir, target)
    kernels = [e.kernel(nid) for nid in lir.schedule]
    kernels += [e.output_copy(slot, nid) for slot, nid in lir.output_copies]
    used = {h for k in kernels for h in k.headers}
    unknown = used - set(KERNEL_HEADERS)
    if unknown:
        raise BuildError(f"kernels name unknown headers {sorted(unknown)}")
    syms = ", ".join(f"{n}<={m}" for n, m in lir.symbols) or "none"
    ctx = {
        "name_comment": comment(lir.name, 80),
        "msl": target.msl,
        "abi_version": ABI_VERSION,
        "symbols_comment": comment(syms, 120),
        "layout_comment": comment(e.layout.describe(), 200),
        "kernels": kernels,
        "headers": [header_text(h) for h in KERNEL_HEADERS if h in used],
        "prelude": header_text("metal/kernels/prelude.metal"),
        "user_code": user_code_of(kernels),  # user ops' headers (rlx.custom_op), each once
    }
    return ctx, [d for k in kernels for d in k.args.launches]


def program_manifest(lir: LirModule, io_manifest: dict, dispatches: Sequence[Dispatch]) -> dict:
    """What the host needs besides the source: the IO manifest, the buffer layout, constants, dispatches."""
    lay = require_decided(lir, "metal").decided(MetalLayout)[0]
    user_ops = [(nid, lir.graph.node(nid).op) for nid in lir.schedule if lir.graph.node(nid).kind == "user_op"]
    constants = []
    for slot, nid in enumerate(lir.constants):
        # the constant's own row-major bytes in its dtype: exactly what the kernels read
        constants.append({"offset": lay.constants[slot], "hex": lir.graph.node(nid).op.data.hex()})
    return {
        **io_manifest,
        "backend": "metal",
        "codegen": CODEGEN_VERSION,
        "abi_version": ABI_VERSION,
        "layout": {"total": lay.total, "params": list(lay.params), "inputs": list(lay.inputs),
                   "outputs": list(lay.outputs), "arena": lay.arena, "flag": lay.flag},
        "constants": constants,
        "dispatches": [d.to_json() for d in dispatches],
        # what the error flags of user ops' kernels mean (only where the program has some)
        **({"flag_errors": {str(USER_OP_FLAG + nid): f"user_op {op.name}: custom op {op.name} returned a nonzero "
                                                     f"status" for nid, op in user_ops}} if user_ops else {}),
    }



@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    # One environment per process: its templates compile once (the loader reloads a file that changed).
    return install(jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    ))


def render_metal(lir: LirModule, target: MetalTarget, manifest: dict) -> MetalProgram:
    """The Metal source of `lir` (one kernel per scheduled node) and its program manifest."""
    ctx, dispatches = metal_context(lir, target)
    try:
        source = _environment().get_template("metal/model.metal.j2").render(**ctx)
    except jinja2.TemplateError as exc:
        raise BuildError(f"rendering the Metal template failed: {type(exc).__name__}: {exc}") from exc
    return MetalProgram(source, program_manifest(lir, manifest, dispatches))

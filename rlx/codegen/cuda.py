"""LIR → template context for the CUDA backend, and the rendering of one .cu file.

`cuda_context(lir, target, manifest)` is a pure function deciding, for every
scheduled node, which kernel (or cuBLASLt call) runs it and with which C
expressions: device pointers are one base plus a static offset (the whole
program lives in a single `cudaMalloc`), dims are expressions of the run-time
symbol values (`S[k]` on the host, `sy.v[k]` inside generated kernels). All
CUDA text lives in `templates/cuda/`; this module supplies identifiers,
numbers and index arithmetic only.

Precision: tensors declared f32 are *stored and computed* in the session
precision (f32, f16 or bf16) on the device, with f32 accumulation
everywhere; the C ABI keeps the declared dtypes, so inputs, outputs and
params cross the boundary as f32 and are converted on the device (params
once, at `rlx_set_param`).

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> g = Graph("demo")
>>> x = g.input("x", [4, 8])
>>> g.set_outputs([g.activation("relu", x)])
>>> src = render_cuda(plan(g), CudaTarget(), {"name": "demo"})
>>> "rlx_run_device" in src and "rlx_relu" in src
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
import numpy as np

from rlx.abi_version import ABI_VERSION
from rlx.codegen.c import c_string, c_string_lines, comment, node_header
from rlx.codegen.common import dim_expr
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.dtype import DType, f32_to_bf16
from rlx.ir.graph import Node, NodeId
from rlx.ir.lir import LirModule
from rlx.ir.shape import Dim, Shape, product
from rlx.templates_path import templates_dir

#: Bumped whenever generated code changes for the same LIR and templates (part of the cache key).
CODEGEN_VERSION = "cuda-1"
PRECISIONS = (DType.F32, DType.F16, DType.BF16)
GEMM_MODES = ("cublaslt", "builtin")
#: cuBLASLt workspace (Hopper kernels want up to 32 MiB).
LT_WORKSPACE = 32 << 20
#: Most KV splits of the decode attention path (its partials live in the scratch region).
ATTN_MAX_SPLITS = 64
_ALIGN = 256
_INT32_LIMIT = (1 << 31) - 1

_CTYPE = {DType.F32: "float", DType.F16: "__half", DType.BF16: "rlx_bf16", DType.F64: "double",
          DType.I8: "int8_t", DType.I32: "int32_t", DType.I64: "int64_t", DType.U8: "uint8_t",
          DType.BOOL: "uint8_t"}
_VTYPE = {DType.F32: "float", DType.F16: "float", DType.BF16: "float", DType.F64: "double",
          DType.I8: "int8_t", DType.I32: "int32_t", DType.I64: "int64_t", DType.U8: "uint8_t",
          DType.BOOL: "bool"}
_CUDA_TYPE = {DType.F32: "CUDA_R_32F", DType.F16: "CUDA_R_16F", DType.BF16: "CUDA_R_16BF"}
_RED = {"sum": "RLX_RED_SUM", "mean": "RLX_RED_MEAN", "max": "RLX_RED_MAX", "min": "RLX_RED_MIN",
        "prod": "RLX_RED_PROD"}
_MASK = {"none": "RLX_MASK_NONE", "causal": "RLX_MASK_CAUSAL", "padding": "RLX_MASK_PADDING",
         "bias": "RLX_MASK_BIAS"}
_LT_FUSABLE_ACTS = ("relu", "gelu_tanh")


def category(dt: DType) -> str:
    """How generated code treats values of `dt`: float, double, int or bool."""
    if dt in (DType.F32, DType.F16, DType.BF16):
        return "float"
    if dt is DType.F64:
        return "double"
    return "bool" if dt is DType.BOOL else "int"


def _act(fn: str | None) -> str:
    return "RLX_ACT_NONE" if fn is None else "RLX_ACT_" + fn.upper()


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
    #: Keys per tile of the tensor-core attention kernel (64 or 128); 0 picks by head_dim.
    attn_bk: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", DType.parse(self.precision))
        if self.precision not in PRECISIONS:
            raise BuildError(f"CUDA precision must be one of {[p.value for p in PRECISIONS]}, got {self.precision}")
        if self.attn_bk not in (0, 64, 128):
            raise BuildError(f"attn_bk must be 0, 64 or 128, got {self.attn_bk!r}")
        if self.gemm not in GEMM_MODES:
            raise BuildError(f"CUDA gemm provider must be one of {GEMM_MODES}, got {self.gemm!r}")

    def identity(self) -> str:
        return (f"arch={self.arch} precision={self.precision.value} gemm={self.gemm} "
                f"lt_gelu={int(self.lt_gelu_epilogue)} attn_bk={self.attn_bk}")


@dataclass
class _Regions:
    """Byte layout of the one device allocation."""

    total: int = 0
    spans: list[tuple[str, int, int]] = field(default_factory=list)

    def alloc(self, group: str, nbytes: int) -> int:
        offset = (self.total + _ALIGN - 1) // _ALIGN * _ALIGN
        self.total = offset + max(int(nbytes), 0)
        self.spans.append((group, offset, int(nbytes)))
        return offset

    def summary(self) -> list[dict]:
        out: dict[str, list[int]] = {}
        for group, offset, nbytes in self.spans:
            if group not in out:
                out[group] = [offset, 0]
            out[group][1] = offset + nbytes - out[group][0]
        return [{"name": k, "offset": v[0], "nbytes": v[1]} for k, v in out.items()]


def dense_strides(dims: Sequence[Dim]) -> list[Dim]:
    """Row-major element strides of `dims` as Dims."""
    out: list[Dim] = []
    acc = Dim(1)
    for d in reversed(dims):
        out.append(acc)
        acc = acc * d
    return out[::-1]


def collapse(dims: Sequence[Dim], *strides: Sequence[Dim | None]) -> tuple[list[Dim], list[list[Dim | None]]]:
    """Drop size-1 dims and merge neighbours that are contiguous in every stride list (None = broadcast)."""
    keep = [i for i, d in enumerate(dims) if d != 1]
    out_dims = [dims[i] for i in keep]
    out_strides = [[s[i] for i in keep] for s in strides]
    k = len(out_dims) - 2
    while k >= 0:
        d_next = out_dims[k + 1]
        ok = True
        for s in out_strides:
            a, b = s[k], s[k + 1]
            if (a is None) != (b is None) or (a is not None and a != b * d_next):
                ok = False
                break
        if ok:
            out_dims[k] = out_dims[k] * d_next
            for s in out_strides:
                s[k] = s[k + 1]
                del s[k + 1]
            del out_dims[k + 1]
        k -= 1
    return out_dims, out_strides


class _Planner:
    """Turns one LirModule into the CUDA template context (used only by `cuda_context`)."""

    def __init__(self, lir: LirModule, target: CudaTarget) -> None:
        self.lir = lir
        self.target = target
        self.graph = lir.graph
        self.sym_index = {name: i for i, (name, _) in enumerate(lir.symbols)}
        self.regions = _Regions()
        self.in_dev: dict[int, int] = {}
        self.out_dev: dict[int, int] = {}
        self.param_dev: dict[int, int] = {}
        self.const_dev: dict[int, int] = {}
        self.arena_off = 0
        self.params_end = 0
        self.scratch_bytes = 0
        self.uses_lt = False
        self.uses_flag = False
        self.smem_attrs: dict[str, str] = {}
        self.region_kernels: list[dict] = []
        #: Horizontal GEMM groups (see `find_gemm_groups`): leader node -> members, member -> leader.
        self.groups: dict[NodeId, list[NodeId]] = {}
        self.group_of: dict[NodeId, NodeId] = {}
        #: Nodes whose value is a column slice of a wider row-major buffer: node -> row stride (elements).
        self.row_stride: dict[NodeId, int] = {}
        self.strided_off: dict[NodeId, int] = {}
        #: Params stored as a column slice of a combined weight: slot -> (offset, row stride).
        self.param_slice: dict[int, tuple[int, int]] = {}
        self.qkv_bytes = 0

    # ── types and expressions ──────────────────────────────────────────

    def dev_dtype(self, dt: DType) -> DType:
        return self.target.precision if dt is DType.F32 else dt

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

    def offset(self, nid: NodeId) -> int:
        """Byte offset of node `nid`'s first element in the device allocation."""
        if nid in self.strided_off:
            return self.strided_off[nid]
        b = self.lir.buffers[nid]
        if b.storage == "input":
            return self.in_dev[b.slot]
        if b.storage == "output":
            return self.out_dev[b.slot]
        if b.storage == "param":
            return self.param_dev[b.slot]
        if b.storage == "const":
            return self.const_dev[b.slot]
        if b.storage == "arena":
            return self.arena_off + b.offset
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

    def base(self, node: Node) -> dict:
        return {"comment": self.header(node), "what": self.what(node)}

    # ── layout of the device allocation ────────────────────────────────

    def plan_memory_io(self) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
        params, constants, inputs, outputs = [], [], [], []
        staging_need = 0
        self.plan_gemm_groups()
        for slot, spec in enumerate(self.lir.params):
            node = self.node(spec.node)
            abi, dev = node.shape.dtype, self.dev_dtype(node.shape.dtype)
            stored = node.shape
            if slot in self.param_slice:
                self.param_dev[slot] = self.param_slice[slot][0]
            else:
                self.param_dev[slot] = self.regions.alloc("params", stored.max_numel * dev.itemsize)
            user_dims = list(spec.shape.dims)
            layout = list(spec.layout) if spec.layout is not None else list(range(len(user_dims)))
            permuted = layout != list(range(len(user_dims)))
            row = self.param_slice.get(slot, (0, 0))[1]
            direct = not permuted and abi is dev and not row
            entry = {
                "index": slot, "name_c": c_string(spec.name), "name_comment": comment(spec.name, 80),
                "abi_ctype": _CTYPE[abi], "dev_ctype": _CTYPE[dev], "abi_nbytes": spec.shape.max_nbytes,
                "dev_off": self.param_dev[slot], "direct": direct, "numel": stored.max_numel,
                "user_dims": comment(str(list(spec.shape.static_dims))),
                "dev_dims": comment(str(list(stored.static_dims))),
            }
            if not direct:
                staging_need = max(staging_need, spec.shape.max_nbytes)
                user_strides = dense_strides(user_dims)
                out_strides = dense_strides(stored.dims)
                if row:  # a column slice of a combined [K, sum(N)] weight
                    out_strides = [Dim(row), Dim(1)]
                entry["nd"] = self.nd(list(stored.dims), [user_strides[p] for p in layout], out_strides)
            params.append(entry)
        self.params_end = self.regions.total
        self.fix_qkv_region()
        for slot, nid in enumerate(self.lir.constants):
            node = self.node(nid)
            arr = node.op.array()
            dev = self.dev_dtype(node.shape.dtype)
            if dev is not node.shape.dtype:
                arr = arr.astype(np.float16) if dev is DType.F16 else f32_to_bf16(arr.astype(np.float32))
            data = np.ascontiguousarray(arr).tobytes()
            self.const_dev[slot] = self.regions.alloc("constants", len(data))
            rows = [", ".join(str(b) for b in data[i:i + 32]) for i in range(0, len(data), 32)]
            constants.append({"index": slot, "nbytes": len(data), "dev_off": self.const_dev[slot],
                              "bytes_c": (",\n    ".join(rows)) if rows else "0"})
        for slot, spec in enumerate(self.lir.inputs):
            abi = spec.shape.dtype
            dev = self.dev_dtype(abi)
            staging = self.regions.alloc("inputs", spec.shape.max_numel * abi.itemsize)
            self.in_dev[slot] = (staging if dev is abi
                                 else self.regions.alloc("inputs", spec.shape.max_numel * dev.itemsize))
            inputs.append({"index": slot, "name_c": c_string(spec.name), "name_comment": comment(spec.name, 80),
                           "abi_ctype": _CTYPE[abi], "dev_ctype": _CTYPE[dev], "convert": dev is not abi,
                           "staging_off": staging, "dev_off": self.in_dev[slot], "numel": self.numel(spec.shape.dims),
                           "abi_itemsize": abi.itemsize})
        for slot, spec in enumerate(self.lir.outputs):
            abi = spec.shape.dtype
            dev = self.dev_dtype(abi)
            self.out_dev[slot] = self.regions.alloc("outputs", spec.shape.max_numel * dev.itemsize)
            staging = (self.out_dev[slot] if dev is abi
                       else self.regions.alloc("outputs", spec.shape.max_numel * abi.itemsize))
            outputs.append({"index": slot, "name_c": c_string(spec.name), "name_comment": comment(spec.name, 80),
                            "abi_ctype": _CTYPE[abi], "dev_ctype": _CTYPE[dev], "convert": dev is not abi,
                            "staging_off": staging, "dev_off": self.out_dev[slot],
                            "numel": self.numel(spec.shape.dims), "abi_itemsize": abi.itemsize})
        # The arena doubles as the staging area of set_param (no run is in flight then).
        self.arena_off = self.regions.alloc("arena", max(self.lir.arena_bytes, staging_need))
        return params, constants, inputs, outputs

    def find_gemm_groups(self) -> list[list[NodeId]]:
        """GEMMs that read the same activation with their own weights, feeding only attention (Q, K, V).

        They run as one GEMM against a combined [K, sum(N)] weight (each param is stored as a column slice
        of it, written so at set_param); their outputs are column slices of one [M, sum(N)] buffer, which
        the attention kernels read through row strides. One launch instead of three, and a wider GEMM.
        """
        if self.target.gemm != "cublaslt":
            return []
        users = self.graph.users()
        outputs = set(self.graph.outputs)
        buckets: dict[tuple, list[NodeId]] = {}
        for nid in self.lir.schedule:
            n = self.node(nid)
            if not isinstance(n.op, (O.MatMul, O.FusedMatMulBiasAct)) or nid in outputs:
                continue
            if self.ddt(nid) not in _CUDA_TYPE or self.lir.buffers[nid].storage != "arena":
                continue
            a, w = n.inputs[0], n.inputs[1]
            bias = n.inputs[2] if len(n.inputs) == 3 else None
            ok = self.node(w).kind == "param" and self.node(w).shape.rank == 2 and users[w] == [nid]
            ok = ok and (bias is None or (self.node(bias).kind == "param" and users[bias] == [nid]))
            ok = ok and bool(users[nid]) and all(
                isinstance(self.node(u).op, O.Attention) and nid in self.node(u).inputs[:3]
                and nid not in self.node(u).inputs[3:] for u in users[nid])
            if not ok:
                continue
            act = getattr(n.op, "activation", None)
            key = (a, act, bias is not None, self.node(w).shape.dims[0], self.ddt(nid))
            buckets.setdefault(key, []).append(nid)
        return [members for members in buckets.values() if len(members) >= 2]

    def plan_gemm_groups(self) -> None:
        position = {nid: i for i, nid in enumerate(self.lir.schedule)}
        users = self.graph.users()
        pool: list[tuple[int, int, int]] = []  # (offset, nbytes, last schedule position using it)
        for members in self.find_gemm_groups():
            first = self.node(members[0])
            dt = self.ddt(members[0])
            K = self.node(first.inputs[1]).shape.dims[0].value
            widths = [self.node(self.node(m).inputs[1]).shape.dims[1].value for m in members]
            total = sum(widths)
            w_base = self.regions.alloc("params", K * total * dt.itemsize)
            has_bias = len(first.inputs) == 3
            b_base = self.regions.alloc("params", total * dt.itemsize) if has_bias else 0
            rows = first.shape.max_numel // widths[0]
            need = rows * total * dt.itemsize
            start = position[members[0]]
            last = max(position[u] for m in members for u in users[m])
            slot = next((i for i, (_, nb, end) in enumerate(pool) if nb >= need and end < start), None)
            if slot is None:  # offsets relative to the qkv region, placed after the params (see fix_qkv_region)
                pool.append((self.qkv_bytes, need, last))
                self.qkv_bytes += (need + _ALIGN - 1) // _ALIGN * _ALIGN
                slot = len(pool) - 1
            else:
                pool[slot] = (pool[slot][0], pool[slot][1], last)
            c_base = pool[slot][0]
            col = 0
            for m, width in zip(members, widths):
                node = self.node(m)
                self.param_slice[self.lir.buffers[node.inputs[1]].slot] = (w_base + col * dt.itemsize, total)
                if has_bias:
                    self.param_slice[self.lir.buffers[node.inputs[2]].slot] = (b_base + col * dt.itemsize, 0)
                self.strided_off[m] = c_base + col * dt.itemsize
                self.row_stride[m] = total
                self.group_of[m] = members[0]
                col += width
            self.groups[members[0]] = members

    def fix_qkv_region(self) -> None:
        """Allocate the group output buffers (after the params, so rlx_clone copies params only)."""
        if not self.groups:
            return
        base = self.regions.alloc("qkv", self.qkv_bytes)
        for m in self.strided_off:
            self.strided_off[m] += base

    def grouped_gemm(self, node: Node) -> dict:
        members = self.groups[node.id]
        dt = self.ddt(node.id)
        t = _CTYPE[dt]
        a = self.node(node.inputs[0]).shape
        total = self.row_stride[node.id]
        has_bias = len(node.inputs) == 3
        act = getattr(node.op, "activation", None)
        fuse_act = act == "relu" or (act == "gelu_tanh" and self.target.lt_gelu_epilogue)
        w_ptr = f"RLX_P({t}, {self.param_dev[self.lir.buffers[node.inputs[1]].slot]})"
        b_ptr = f"RLX_P({t}, {self.param_dev[self.lir.buffers[node.inputs[2]].slot]})" if has_bias else "nullptr"
        c_ptr = f"RLX_P({t}, {self.offset(node.id)})"
        self.uses_lt = True
        g = {"t": t, "a": self.ptr(node.inputs[0]), "b": w_ptr, "c": c_ptr, "m": self.numel(a.dims[:-1]),
             "n": f"(int64_t){total}", "k": self.dim(a.dims[-1]), "batch": "(int64_t)1", "mode": "lt",
             "cuda_type": _CUDA_TYPE[dt], "sa": "(int64_t)0", "sb": "(int64_t)0",
             "lt_bias": b_ptr if has_bias else "NULL", "lt_act": _act(act if fuse_act else None),
             "post_act": _act(act) if (act is not None and not fuse_act) else None, "post_bias_on": "false",
             "post_bias": "nullptr", "post_vec": 0, "full_act": _act(act), "full_bias_on": str(has_bias).lower(),
             "full_bias": b_ptr}
        names = ", ".join(f"%{m}" for m in members)
        return {**self.base(node), "kind": "gemm", "gemm": g,
                "comment": comment(f"%{node.id} and its siblings {names}: one GEMM against their combined "
                                   f"[K, {total}] weight; each output is a column slice (row stride {total})", 160)}

    def nd(self, dims: list[Dim], istride: list[Dim | None], ostride: list[Dim | None]) -> dict:
        cdims, (cis, cos) = collapse(dims, istride, ostride)
        if not cdims:
            cdims, cis, cos = [Dim(1)], [Dim(0)], [Dim(0)]
        if len(cdims) > 16:
            raise BuildError(f"iteration space of rank {len(cdims)} exceeds 16")
        return {"rank": len(cdims), "dims": [self.dim(d) for d in cdims], "istride": [self.dim(s) for s in cis],
                "ostride": [self.dim(s) for s in cos]}

    # ── one block per scheduled node ───────────────────────────────────

    def block(self, nid: NodeId) -> dict:
        node = self.node(nid)
        op = node.op
        if self.lir.buffers[nid].storage == "view":
            return {**self.base(node), "kind": "view"}
        if nid in self.groups:
            return self.grouped_gemm(node)
        if nid in self.group_of:
            return {**self.base(node), "kind": "none",
                    "comment": comment(f"%{nid}: computed by the combined GEMM of %{self.group_of[nid]}")}
        if op.elementwise or isinstance(op, O.ElementwiseRegion):
            return self.region(node)
        if isinstance(op, (O.MatMul, O.FusedMatMulBiasAct)):
            bias = node.inputs[2] if len(node.inputs) == 3 else None
            act = op.activation if isinstance(op, O.FusedMatMulBiasAct) else None
            g = self.gemm(node.inputs[0], node.inputs[1], self.ptr(nid), node.shape, bias, act,
                          self.offset(nid))
            return {**self.base(node), "kind": "gemm", "gemm": g}
        if isinstance(op, O.FusedSwiGLU):
            return self.swiglu(node)
        if isinstance(op, O.Reduce):
            return self.reduce(node)
        if isinstance(op, O.Softmax):
            return self.softmax(node)
        if isinstance(op, (O.LayerNorm, O.RmsNorm, O.FusedResidualLayerNorm, O.FusedResidualRmsNorm)):
            return self.norm(node)
        if isinstance(op, O.Transpose):
            return self.transpose(node)
        if isinstance(op, O.Expand):
            return self.expand(node)
        if isinstance(op, O.Narrow):
            return self.narrow(node)
        if isinstance(op, O.Concat):
            return self.concat(node)
        if isinstance(op, O.Reshape):
            return self.copy_all(node)
        if isinstance(op, O.Gather):
            return self.gather(node)
        if isinstance(op, O.Attention):
            return self.attention(node)
        if isinstance(op, O.Rope):
            return self.rope(node)
        raise BuildError(f"the CUDA backend has no kernel for {node.kind} (node {node.label})")

    # elementwise ────────────────────────────────────────────────────────

    def bcast_index(self, in_dims: Sequence[Dim], out_dims: Sequence[Dim], idx: str) -> str:
        """Index into an input of `in_dims` for flat output index `i` (numpy broadcasting)."""
        in_dims = [Dim(1)] * (len(out_dims) - len(in_dims)) + list(in_dims)
        if list(in_dims) == list(out_dims):
            return "i"
        if all(d == 1 for d in in_dims):
            return "0"
        axes = [k for k, d in enumerate(out_dims) if d != 1]
        groups: list[tuple[bool, list[int]]] = []
        for k in axes:
            flag = in_dims[k] == 1
            if groups and groups[-1][0] == flag:
                groups[-1][1].append(k)
            else:
                groups.append((flag, [k]))
        terms = []
        for gi, (bcast, ks) in enumerate(groups):
            if bcast:
                continue
            size = product(out_dims[k] for k in ks)
            ostride = product(out_dims[k] for k in range(ks[-1] + 1, len(out_dims)))
            istride = product(in_dims[k] for k in range(ks[-1] + 1, len(in_dims)))
            term = "i" if ostride == 1 else f"(i / ({idx}){self.dim(ostride, 'sy.v')})"
            if gi > 0:
                term = f"({term} % ({idx}){self.dim(size, 'sy.v')})"
            if istride != 1:
                term = f"{term} * ({idx}){self.dim(istride, 'sy.v')}"
            terms.append(term)
        return " + ".join(terms) if terms else "0"

    def region(self, node: Node) -> dict:
        op = node.op
        if isinstance(op, O.ElementwiseRegion):
            region = op
        else:
            region = O.ElementwiseRegion(steps=(O.RegionStep(op, tuple(range(len(node.inputs)))),))
        in_shapes = [self.node(i).shape for i in node.inputs]
        values = region.step_shapes(in_shapes)
        idx = self.idx_type(node.shape, *in_shapes)
        ins = []
        for j, i in enumerate(node.inputs):
            s = self.node(i).shape
            ins.append({"ctype": self.ctype(i), "vtype": _VTYPE[s.dtype], "cat": category(s.dtype),
                        "ptr": f"in{j}", "index": self.bcast_index(s.dims, node.shape.dims, idx)})
        steps = []
        n_in = len(node.inputs)
        for k, step in enumerate(region.steps):
            out = values[n_in + k]
            arg_dtypes = [values[a].dtype for a in step.args]
            entry = {"var": f"v{n_in + k}", "vtype": _VTYPE[out.dtype], "kind": step.op.kind,
                     "fn": getattr(step.op, "fn", ""), "args": [f"v{a}" for a in step.args],
                     "int": bool(arg_dtypes) and category(arg_dtypes[0]) == "int",
                     "to": out.dtype.value}
            if entry["int"] and entry["fn"] == "div":
                self.uses_flag = True
            steps.append(entry)
        name = f"rlx_region_{node.id}"
        self.region_kernels.append({
            "name": name, "comment": self.header(node), "idx": idx,
            "out": {"ctype": self.ctype(node.id), "cat": category(node.shape.dtype)},
            "ins": ins, "steps": steps, "result": f"v{len(values) - 1}",
        })
        return {**self.base(node), "kind": "region", "kernel": name, "idx": idx, "n": self.numel(node.shape.dims),
                "out": self.ptr(node.id), "ins": [self.ptr(i) for i in node.inputs]}

    # data movement ──────────────────────────────────────────────────────

    def copy_block(self, node: Node, src: str, dst: str, dims: list[Dim], istride: list[Dim | None],
                   ostride: list[Dim | None], shapes: Sequence[Shape]) -> dict:
        t = self.ctype(node.id)
        return {**self.base(node), "kind": "copy_nd", "src": src, "dst": dst, "ti": t, "to": t,
                "idx": self.idx_type(*shapes), "n": self.numel(dims), "nd": self.nd(dims, istride, ostride)}

    def transpose(self, node: Node) -> dict:
        src = self.node(node.inputs[0]).shape
        in_strides = dense_strides(src.dims)
        perm = node.op.perm
        return self.copy_block(node, self.ptr(node.inputs[0]), self.ptr(node.id), list(node.shape.dims),
                               [in_strides[p] for p in perm], dense_strides(node.shape.dims), [src, node.shape])

    def expand(self, node: Node) -> dict:
        src = self.node(node.inputs[0]).shape
        out = list(node.shape.dims)
        in_dims = [Dim(1)] * (len(out) - src.rank) + list(src.dims)
        dense = dense_strides(in_dims)
        istride: list[Dim | None] = [None if (d == 1 and o != 1) else s for d, o, s in zip(in_dims, out, dense)]
        return self.copy_block(node, self.ptr(node.inputs[0]), self.ptr(node.id), out, istride,
                               dense_strides(out), [src, node.shape])

    def narrow(self, node: Node) -> dict:
        src = self.node(node.inputs[0]).shape
        axis = node.op.axis % src.rank
        in_strides = dense_strides(src.dims)
        start = f"({self.ptr(node.inputs[0])} + {node.op.start} * {self.dim(in_strides[axis])})"
        return self.copy_block(node, start, self.ptr(node.id), list(node.shape.dims), list(in_strides),
                               dense_strides(node.shape.dims), [src, node.shape])

    def copy_all(self, node: Node) -> dict:
        src = self.node(node.inputs[0]).shape
        dense = dense_strides(node.shape.dims)
        return self.copy_block(node, self.ptr(node.inputs[0]), self.ptr(node.id), list(node.shape.dims),
                               list(dense), list(dense), [src, node.shape])

    def concat(self, node: Node) -> dict:
        axis = node.op.axis % node.shape.rank
        out_strides = dense_strides(node.shape.dims)
        pieces = []
        start = 0
        for i in node.inputs:
            s = self.node(i).shape
            dst = f"({self.ptr(node.id)} + {start} * {self.dim(out_strides[axis])})"
            piece = self.copy_block(node, self.ptr(i), dst, list(s.dims), list(dense_strides(s.dims)),
                                    list(out_strides), [s, node.shape])
            pieces.append(piece)
            start += s.dims[axis].value
        return {**self.base(node), "kind": "copies", "pieces": pieces}

    def gather(self, node: Node) -> dict:
        table, idx = (self.node(i).shape for i in node.inputs)
        axis = node.op.axis % table.rank
        self.uses_flag = True
        return {**self.base(node), "kind": "gather", "t": self.ctype(node.id), "it": _CTYPE[idx.dtype],
                "idx": self.idx_type(table, idx, node.shape),
                "table": self.ptr(node.inputs[0]), "index": self.ptr(node.inputs[1]), "out": self.ptr(node.id),
                "outer": self.numel(table.dims[:axis]), "rows": self.dim(table.dims[axis]),
                "nidx": self.numel(idx.dims), "inner": self.numel(table.dims[axis + 1:])}

    def rope(self, node: Node) -> dict:
        x = node.shape
        op = node.op
        hd = op.head_dim
        return {**self.base(node), "kind": "rope", "t": self.ctype(node.id), "neox": str(op.variant == "neox").lower(),
                "x": self.ptr(node.inputs[0]), "cos": self.ptr(node.inputs[1]), "sin": self.ptr(node.inputs[2]),
                "out": self.ptr(node.id), "rows": self.numel(x.dims[:2]), "seq": self.dim(x.dims[1]),
                "heads": x.dims[2].value // hd, "hd": hd, "rot": op.rot}

    # rows: norms, softmax, reductions ──────────────────────────────────

    @staticmethod
    def row_config(nmax: int) -> tuple[int, int]:
        """(threads per row, values cached per thread; 0 = stream the row) for rows of up to nmax elements."""
        if nmax <= 512:
            return 32, max(1, -(-nmax // 32))
        for tpr in (64, 128, 256, 512, 1024):
            if -(-nmax // tpr) <= 8:
                return tpr, -(-nmax // tpr)
        return 1024, 0

    def acc_type(self, nid: NodeId) -> str:
        return "double" if self.ddt(nid) is DType.F64 else "float"

    def norm(self, node: Node) -> dict:
        op = node.op
        x = node.shape
        n = x.dims[-1].value
        tpr, vpt = self.row_config(n)
        ins = list(node.inputs)
        rms = isinstance(op, (O.RmsNorm, O.FusedResidualRmsNorm))
        fused = isinstance(op, (O.FusedResidualLayerNorm, O.FusedResidualRmsNorm))
        res = ins[1] if fused else None
        n_params = 1 if rms else 2
        has_bias = fused and len(ins) == 2 + 1 + n_params
        bias = ins[2] if has_bias else None
        gamma = ins[-n_params]
        beta = None if rms else ins[-1]
        none = "nullptr"
        vec = 16 // self.ddt(node.id).itemsize
        ptrs = [i for i in (ins[0], res, bias, gamma, beta, node.id) if i is not None]
        cpt = 0
        if n % vec == 0 and all(self.offset(i) % 16 == 0 for i in ptrs):
            chunks = n // vec
            tpr = 32 if chunks <= 32 * 4 else min(1024, 1 << max(5, math.ceil(math.log2(-(-chunks // 4)))))
            cpt = -(-chunks // tpr)
        if cpt == 0 or cpt > 8:
            vec = cpt = 0
        return {**self.base(node), "kind": "norm", "t": self.ctype(node.id), "a": self.acc_type(node.id),
                "tpr": tpr, "vpt": vpt, "vec": vec, "cpt": cpt, "rms": str(rms).lower(),
                "res_on": str(res is not None).lower(),
                "bias_on": str(bias is not None).lower(), "x": self.ptr(ins[0]),
                "res": self.ptr(res) if res is not None else none, "bias": self.ptr(bias) if bias is not None else none,
                "gamma": self.ptr(gamma), "beta": self.ptr(beta) if beta is not None else none,
                "out": self.ptr(node.id), "rows": self.numel(x.dims[:-1]), "n": n, "eps": _float_c(op.eps)}

    def softmax(self, node: Node) -> dict:
        x = node.shape
        axis = node.op.axis % x.rank
        common = {**self.base(node), "t": self.ctype(node.id), "a": self.acc_type(node.id),
                  "x": self.ptr(node.inputs[0]), "out": self.ptr(node.id)}
        if axis == x.rank - 1:
            tpr, vpt = self.row_config(x.dims[-1].max)
            return {**common, "kind": "softmax_rows", "tpr": tpr, "vpt": vpt, "rows": self.numel(x.dims[:-1]),
                    "n": self.dim(x.dims[-1])}
        return {**common, "kind": "softmax_cols", "outer": self.numel(x.dims[:axis]), "n": self.dim(x.dims[axis]),
                "inner": self.numel(x.dims[axis + 1:])}

    def reduce(self, node: Node) -> dict:
        op = node.op
        x = self.node(node.inputs[0]).shape
        axes = op.normalized_axes(x.rank)
        common = {**self.base(node), "t": self.ctype(node.id), "fn": _RED[op.fn], "x": self.ptr(node.inputs[0]),
                  "out": self.ptr(node.id)}
        kept = [k for k in range(x.rank) if k not in axes]
        red_dims = [x.dims[k] for k in axes]
        nred = self.numel(red_dims)
        if tuple(axes) == tuple(range(x.rank - len(axes), x.rank)):
            tpr = 32 if product(red_dims).max <= 2048 else 256
            return {**common, "kind": "reduce_rows", "tpr": tpr, "rows": self.numel([x.dims[k] for k in kept]),
                    "nred": nred}
        strides = dense_strides(x.dims)
        kd, (ks,) = collapse([x.dims[k] for k in kept], [strides[k] for k in kept])
        rd, (rs,) = collapse(red_dims, [strides[k] for k in axes])
        return {**common, "kind": "reduce_generic", "nout": self.numel(kd), "nred": nred,
                "kept": [(self.dim(d), self.dim(s)) for d, s in zip(kd, ks)],
                "red": [(self.dim(d), self.dim(s)) for d, s in zip(rd, rs)]}

    # matrix products ────────────────────────────────────────────────────

    def gemm(self, a_id: NodeId, b_id: NodeId, out_ptr: str, out: Shape, bias: NodeId | None,
             act: str | None, out_off: int | None = None) -> dict:
        a, b = self.node(a_id).shape, self.node(b_id).shape
        dt = self.ddt(a_id)
        M, K, N = a.dims[-2], a.dims[-1], b.dims[-1]
        ob = list(out.dims[:-2])
        ab = [Dim(1)] * (len(ob) - (a.rank - 2)) + list(a.dims[:-2])
        bb = [Dim(1)] * (len(ob) - (b.rank - 2)) + list(b.dims[:-2])
        t = _CTYPE[dt]
        g: dict[str, Any] = {"t": t, "a": self.ptr(a_id), "b": self.ptr(b_id), "c": out_ptr, "k": self.dim(K),
                             "n": self.dim(N), "act": _act(act), "bias_on": str(bias is not None).lower(),
                             "bias": self.ptr(bias) if bias is not None else "nullptr",
                             "full_act": _act(act), "full_bias_on": str(bias is not None).lower(),
                             "full_bias": self.ptr(bias) if bias is not None else "nullptr"}
        mk, kn = M * K, K * N
        strided = None
        if all(d == 1 for d in bb) and ab == ob:
            # One B for every batch: fold the batch into M (A and C are contiguous).
            g.update(m=self.numel([*ob, M]), batch="(int64_t)1", folded=True)
            strided = (None, None)
        elif ab == ob and bb == ob:
            strided = (mk, kn)
        elif all(d == 1 for d in ab) and bb == ob:
            strided = (None, kn)
        if strided is not None and "m" not in g:
            g.update(m=self.dim(M), batch=self.numel(ob), folded=False)
        lt_ok = self.target.gemm == "cublaslt" and dt in _CUDA_TYPE and strided is not None
        if lt_ok:
            self.uses_lt = True
            sa, sb = strided
            fold = g["folded"]
            fuse_act = fold and (act == "relu" or (act == "gelu_tanh" and self.target.lt_gelu_epilogue))
            fuse_bias = fold and bias is not None
            post_act = act if (act is not None and not fuse_act) else None
            post_bias = bias is not None and not fuse_bias
            vec = 16 // dt.itemsize
            aligned = out_off is not None and out_off % 16 == 0 and (
                bias is None or self.offset(bias) % 16 == 0)
            post_vec = vec if (aligned and N.is_static and N.value % vec == 0) else 0
            g.update(mode="lt", cuda_type=_CUDA_TYPE[dt], sa=self.dim(sa) if sa is not None else "(int64_t)0",
                     sb=self.dim(sb) if sb is not None else "(int64_t)0",
                     lt_bias=g["bias"] if fuse_bias else "NULL", lt_act=_act(act if fuse_act else None),
                     post_act=_act(post_act) if (post_act is not None or post_bias) else None,
                     post_bias_on=str(post_bias).lower(), post_bias=g["bias"] if post_bias else "nullptr",
                     post_vec=post_vec)
            return g
        g["mode"] = "tiled"
        if strided is not None:
            sa, sb = strided
            g["bdims"] = [] if g["folded"] else [(g["batch"], self.dim(sa), self.dim(sb))]
            return g
        a_dense = dense_strides(ab)
        b_dense = dense_strides(bb)
        ast = [None if (d == 1 and o != 1) else s * mk for d, o, s in zip(ab, ob, a_dense)]
        bst = [None if (d == 1 and o != 1) else s * kn for d, o, s in zip(bb, ob, b_dense)]
        bd, (cas, cbs) = collapse(ob, ast, bst)
        g.update(m=self.dim(M), batch=self.numel(ob), folded=False,
                 bdims=[(self.dim(d), self.dim(x), self.dim(y)) for d, x, y in zip(bd, cas, cbs)])
        return g

    def swiglu(self, node: Node) -> dict:
        x, wg, wu = node.inputs
        up_bytes = node.shape.max_numel * self.ddt(node.id).itemsize
        self.scratch_bytes = max(self.scratch_bytes, up_bytes)
        upbuf = f"RLX_P({self.ctype(node.id)}, RLX_OFF_SCRATCH)"
        return {**self.base(node), "kind": "swiglu", "t": self.ctype(node.id),
                "gate": self.gemm(x, wg, self.ptr(node.id), node.shape, None, None),
                "up": self.gemm(x, wu, upbuf, node.shape, None, None),
                "out": self.ptr(node.id), "upbuf": upbuf, "n": self.numel(node.shape.dims)}

    # attention ──────────────────────────────────────────────────────────

    def attention(self, node: Node) -> dict:
        op = node.op
        q, k = (self.node(i).shape for i in node.inputs[:2])
        dt = self.ddt(node.id)
        t = _CTYPE[dt]
        D, H, Hkv = op.head_dim, op.num_heads, op.kv_heads
        mask_id = node.inputs[3] if len(node.inputs) > 3 else None
        mt = self.ctype(mask_id) if mask_id is not None else "uint8_t"
        bs = ["(int64_t)0"] * 4
        if op.mask == "bias" and mask_id is not None:
            m = self.node(mask_id).shape
            mdims = [Dim(1)] * (4 - m.rank) + list(m.dims)
            mstr = dense_strides(mdims)
            bs = [self.dim(s) if d != 1 else "(int64_t)0" for d, s in zip(mdims, mstr)]
        mma = dt in (DType.F16, DType.BF16) and D % 16 == 0 and D <= 128
        offs = [self.offset(i) for i in node.inputs[:3]] + [self.offset(node.id)]
        q_id, k_id, v_id = node.inputs[:3]
        q_rs = self.row_stride.get(q_id, H * D)
        k_rs = self.row_stride.get(k_id, Hkv * D)
        v_rs = self.row_stride.get(v_id, Hkv * D)
        vec = D % 8 == 0 and all(o % 16 == 0 for o in offs) and all(r % 8 == 0 for r in (q_rs, k_rs, v_rs))
        mask = _MASK[op.mask]
        # keys per tile: 64 measured faster than 128 on an H100 for BERT shapes (more blocks resident per SM)
        bk = 64 if D > 64 else (self.target.attn_bk or 64)
        if mma:
            for nw in (1, 4):
                self.smem_attrs[f"rlx_attn_fa<{t}, {mt}, {D}, {mask}, {str(vec).lower()}, {nw}, {bk}>"] = \
                    f"RlxFaSmem<{D}, {nw}, {bk}>::total"
        else:
            self.smem_attrs[f"rlx_attn_rows<{t}, {mt}, {D}, {mask}>"] = f"rlx_attn_rows_smem<{t}, {D}>()"
        self.scratch_bytes = max(self.scratch_bytes, q.dims[0].max * H * ATTN_MAX_SPLITS * (D + 2) * 4)
        return {**self.base(node), "kind": "attention", "t": t, "mt": mt, "D": D, "H": H, "Hkv": Hkv,
                "mask": mask, "mma": mma, "bk": bk, "vec": str(vec).lower(), "B": self.dim(q.dims[0]),
                "q_rs": q_rs, "k_rs": k_rs, "v_rs": v_rs,
                "Sq": self.dim(q.dims[1]), "Skv": self.dim(k.dims[1]), "scale": _float_c(op.softmax_scale),
                "bs": bs, "q": self.ptr(node.inputs[0]), "k": self.ptr(node.inputs[1]),
                "v": self.ptr(node.inputs[2]), "m": self.ptr(mask_id) if mask_id is not None else "nullptr",
                "out": self.ptr(node.id)}

    # output copies ──────────────────────────────────────────────────────

    def output_copy(self, slot: int, nid: NodeId) -> dict:
        node = self.node(nid)
        nbytes = f"{self.numel(node.shape.dims)} * {self.ddt(nid).itemsize}"
        return {"kind": "memcpy", "comment": comment(f"output {slot} is %{nid}: copy it"),
                "what": c_string(f"copying output {slot}"), "src": f"RLX_P(char, {self.offset(nid)})",
                "dst": f"RLX_P(char, {self.out_dev[slot]})", "nbytes": nbytes}


def cuda_context(lir: LirModule, target: CudaTarget, manifest: dict) -> dict:
    """The template context for `lir`: plain data (numbers, identifiers, C expressions)."""
    p = _Planner(lir, target)
    params, constants, inputs, outputs = p.plan_memory_io()
    blocks = [p.block(nid) for nid in lir.schedule]
    blocks += [p.output_copy(slot, nid) for slot, nid in lir.output_copies]
    scratch = p.regions.alloc("scratch", p.scratch_bytes)
    workspace_bytes = LT_WORKSPACE if p.uses_lt else 0
    workspace = p.regions.alloc("workspace", workspace_bytes)
    flag = p.regions.alloc("flag", _ALIGN)
    manifest_text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    syms = ", ".join(f"{n}<={m}" for n, m in lir.symbols) or "none"
    return {
        "name_comment": comment(lir.name, 80),
        "precision": target.precision.value,
        "gemm": target.gemm if p.uses_lt else "builtin",
        "arch": comment(target.arch, 20),
        "abi_version": ABI_VERSION,
        "symbols_comment": comment(syms, 120),
        "nsym": len(lir.symbols),
        "symbols": [{"name_c": c_string(n), "max": m} for n, m in lir.symbols],
        "total_bytes": p.regions.total,
        "params_bytes": p.params_end,
        "regions": p.regions.summary(),
        "off": {"arena": p.arena_off, "scratch": scratch, "workspace": workspace, "flag": flag},
        "workspace_bytes": workspace_bytes,
        "attn_max_splits": ATTN_MAX_SPLITS,
        "uses_flag": p.uses_flag,
        "params": params,
        "constants": constants,
        "inputs": inputs,
        "outputs": outputs,
        "blocks": blocks,
        "region_kernels": p.region_kernels,
        "smem_attrs": [{"kernel": k, "bytes": v} for k, v in p.smem_attrs.items()],
        "manifest_c": "\n    ".join(c_string_lines(manifest_text)),
    }


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_cuda(lir: LirModule, target: CudaTarget, manifest: dict) -> str:
    """The complete CUDA source of `lir` (one translation unit exporting the RLX C ABI)."""
    ctx = cuda_context(lir, target, manifest)
    try:
        return _environment().get_template("cuda/model.cu.j2").render(**ctx)
    except jinja2.TemplateError as exc:
        raise BuildError(f"rendering the CUDA template failed: {type(exc).__name__}: {exc}") from exc

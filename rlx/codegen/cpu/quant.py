"""CPU rules for GGUF-quantized weights: `dequant_matmul` and `dequantize`.

Registered into the CPU rule table when `rlx.codegen.cpu.emit` is imported (and so
by `rlx.codegen.backends`). The kernels read the 4/8-bit blocks directly: a
GEMV per weight row for few rows of activations (decode), and for more rows
(prefill) panels of the weight dequantized into per-thread scratch and
multiplied by the packed-GEMM micro-kernel. They are the kernel unit
`templates/cpu/kernels/quant.c` (declared in `kernels/quant.h`), compiled once
per toolchain and linked into every program using it (`rlx.toolchain.units`);
the generated code calls its entry points for the op's format
(`rlx_qgemv_q4_1`, ...), each compiled with the format as a constant.

>>> import rlx
>>> from rlx.ir.quant import row_bytes
>>> g = rlx.Graph("q")
>>> x = g.input("x", [1, 64])
>>> w = g.param("w", [8, row_bytes("q4_1", 64)], "u8")
>>> g.set_outputs([g.dequant_matmul(x, w, quant="q4_1")])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cpu")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import GRAIN, PACK_NR_MAX, align64, c_string, node_header
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir import ops as O
from rlx.ir.decisions_quant import INTERLEAVE_ROWS, InterleavedQuantParam, QuantGemvGroup
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.quant import Q8_ACT_FORMATS, quant_format
from rlx.ir.shape import product

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "quant.c.j2"
#: The kernel unit's entry points (quant.h), and the prefill panels' packed GEMM (which brings the epilogue).
HEADERS = ("kernels/packed_gemm.h", "kernels/quant.h", "kernels/qgemm_panels.h")
#: The format ids of kernels/quant.h (each format's entry points are named by its key).
FORMAT_IDS = {"q8_0": "RLX_Q8_0", "q4_0": "RLX_Q4_0", "q4_1": "RLX_Q4_1", "q5_0": "RLX_Q5_0",
              "q5_1": "RLX_Q5_1", "q4_k": "RLX_Q4_K", "q6_k": "RLX_Q6_K"}
#: The most rows of X the GEMV path takes (RLX_QDECODE_MAX_M in kernels/quant.h).
GEMV_MAX_M = 16


@dataclass(frozen=True)
class QuantGroupArgs:
    """A `QuantGemvGroup` led by this node: every member's weights and outputs (C expressions)."""

    weights: tuple[str, ...]
    rows: tuple[int, ...]
    outs: tuple[str, ...]
    #: The SwiGLU region's output when the group writes it (then `outs` are not written), else "".
    swiglu: str
    max_rows: int
    names: str


@dataclass(frozen=True)
class DequantMatMulArgs:
    """C expressions and sizes of one `dequant_matmul` kernel (macro `dequant_matmul`)."""

    label: str
    x: str
    w: str
    y: str
    m: str
    n: int
    k: int
    row_bytes: int
    #: The format's name (lower case): the suffix of the unit's entry points (`rlx_qgemv_q4_1`).
    quant: str
    fmt: str
    qk: int
    qb: int
    wrow_offset: int
    #: "f32", or "q8" / "q16": X quantized to int8 / int16 blocks in the shared scratch (then each
    #: block's scale and scale * sum of its integers, a pair of floats per block, at xds_offset).
    act: str = "f32"
    xds_offset: int = 0
    #: Decode steps: the GEMV group this node leads (it computes every member), or None.
    group: QuantGroupArgs | None = None
    #: The weight is stored interleaved by `interleave` rows (an `InterleavedQuantParam`), else 0.
    interleave: int = 0


@dataclass(frozen=True)
class DequantizeArgs:
    """C expressions and sizes of one `dequantize` kernel (macro `dequantize`)."""

    label: str
    x: str
    y: str
    rows: str
    k: int
    row_bytes: int
    quant: str
    fmt: str
    qk: int
    qb: int
    grain: int



def _label(node: Node) -> str:
    return c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))


def emit_dequant_matmul(em, node: Node) -> Kernel:
    """The `dequant_matmul` kernel of a node: GEMV for few rows, dequantized panels + GEMM for many."""
    op: O.DequantMatMul = node.op  # type: ignore[assignment]
    x_id, w_id = node.inputs
    x, w = em.node(x_id).shape, em.node(w_id).shape
    fmt = quant_format(op.quant)
    k, n = x.dims[-1].value, w.dims[0].value
    # per thread: a prefill panel (K x the widest packed panel, 64-byte aligned for the kernel's
    # aligned loads), then one dequantized weight row
    wrow_offset = align64(k * PACK_NR_MAX * 4)
    scratch = wrow_offset + align64(k * 4)
    # act="q8"/"q16", shared by the threads: for few rows the quantized activations (rows of int8, or of
    # int16 as two byte planes, then two floats per block); for more, the quantized values as floats
    rows_max = product(x.dims[:-1]).max
    gemv_rows = min(rows_max, GEMV_MAX_M)
    xds_offset = align64(gemv_rows * k * (2 if op.act == "q16" else 1))
    gemv_shared = xds_offset + align64(gemv_rows * (k // 32) * 8)
    shared = max(gemv_shared, align64(rows_max * k * 4) if rows_max > GEMV_MAX_M else 0) if op.act != "f32" else 0
    label = _label(node)
    group = _group_args(em, node)
    interleave = INTERLEAVE_ROWS if any(d.node == w_id for d in em.lir.decided(InterleavedQuantParam)) else 0
    if group is not None and group.swiglu and op.act == "f32":  # the decode pass's copy of X (quant.c.j2)
        shared = align64(gemv_rows * k * 4)
    args = DequantMatMulArgs(
        label=label, x=em.ptr(x_id), w=em.ptr(w_id), y=em.ptr(node.id, const=False),
        m=em.dim(product(x.dims[:-1])), n=n, k=k, row_bytes=w.dims[1].value, quant=fmt.name,
        fmt=FORMAT_IDS[fmt.name], qk=fmt.block_size, qb=fmt.block_bytes,
        wrow_offset=wrow_offset, act=op.act, xds_offset=xds_offset, group=group, interleave=interleave)
    return Kernel(node.id, "dequant_matmul", TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label, scratch_per_thread=scratch,
                  scratch_shared=shared)


def _group_args(em, node: Node) -> QuantGroupArgs | None:
    """The group this node leads in decode steps (a `QuantGemvGroup` decision of the LIR), or None."""
    group = next((d for d in em.lir.decided(QuantGemvGroup) if d.members[0] == node.id), None)
    if group is None:
        return None
    members = [em.node(m) for m in group.members]
    return QuantGroupArgs(
        weights=tuple(em.ptr(m.inputs[1]) for m in members),
        rows=tuple(em.node(m.inputs[1]).shape.dims[0].value for m in members),
        outs=tuple(em.ptr(m.id, const=False) for m in members),
        swiglu=em.ptr(group.swiglu[0], const=False) if group.swiglu else "", max_rows=group.max_rows,
        names=f"{len(members)} projections" + (" and their SwiGLU" if group.swiglu else ""))


def emit_dequantize(em, node: Node) -> Kernel:
    """The `dequantize` kernel: every row of blocks to f32, exactly as GGUF."""
    op: O.Dequantize = node.op  # type: ignore[assignment]
    x = em.node(node.inputs[0]).shape
    fmt = quant_format(op.quant)
    k = node.shape.dims[-1].value
    label = _label(node)
    args = DequantizeArgs(
        label=label, x=em.ptr(node.inputs[0]), y=em.ptr(node.id, const=False),
        rows=em.dim(product(x.dims[:-1])), k=k, row_bytes=x.dims[-1].value, quant=fmt.name,
        fmt=FORMAT_IDS[fmt.name], qk=fmt.block_size, qb=fmt.block_bytes, grain=GRAIN)
    return Kernel(node.id, "dequantize", TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label)


def _quant_dtypes(op: O.Op, in_dtypes: tuple, out_dtype) -> str | None:
    # the op's inference already fixes f32 activations and u8 blocks; the format needs a kernel
    if getattr(op, "quant", None) not in FORMAT_IDS:
        return f"in format {getattr(op, 'quant', None)!r}; it takes {sorted(FORMAT_IDS)}"
    act = getattr(op, "act", "f32")
    if act not in ("f32", "q8", "q16"):
        return f"with activations {act!r}"
    if act != "f32" and op.quant not in Q8_ACT_FORMATS:  # type: ignore[attr-defined]
        return (f"with act={act!r} in format {op.quant!r}: the CPU's integer kernels take "  # type: ignore[attr-defined]
                f"{'/'.join(Q8_ACT_FORMATS)}")
    if out_dtype is not DType.F32:
        return f"with a {out_dtype.value} result; it makes f32"
    return None


RULES.register("dequant_matmul", accepts=_quant_dtypes)(emit_dequant_matmul)
RULES.register("dequantize", accepts=_quant_dtypes)(emit_dequantize)

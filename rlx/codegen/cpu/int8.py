"""CPU rule for dynamic int8 linear layers: `int8_matmul` (`rlx.ir.ops_int8`).

Registered into the CPU rule table when `rlx.codegen` is imported. The
weight must be a param the LIR stores quantized (`Int8Param`, decided by
`rlx.opt.lowering_int8`): `rlx_set_param` quantizes the user's f32 weight per
output channel into int8 panels (`templates/cpu/kernels/int8_gemm.h`). At run
time each thread quantizes its rows of activations into its scratch (a short
product's few rows, split by panels instead, are quantized once for the team,
into thread 0's) and runs the `vpdpbusd` (AVX-512 VNNI) / `pmaddubsw` (AVX2) /
C tile kernel; the
epilogue dequantizes, adds the bias and applies the activation (GELU in the
tile's registers, any other through the shared packed-GEMM epilogue).

>>> import rlx
>>> g = rlx.Graph("q")
>>> x, w = g.input("x", [2, 64]), g.param("w", [64, 8])
>>> g.set_outputs([g.int8_matmul(x, w, activation="gelu")])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cpu")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import align64, c_string, node_header, round_up
from rlx.codegen.registry import Kernel, RuleSet
from rlx.errors import BuildError
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.ops_int8 import Int8MatMul
from rlx.ir.shape import product

#: This module's CPU rules (the CPU table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "int8.c.j2"
#: int8_gemm.h uses packed_gemm.h's activation epilogue and rlx_split.
HEADERS = ("kernels/packed_gemm.h", "kernels/int8_gemm.h")
#: Rows each thread quantizes and multiplies per block (RLX_I8_MC in kernels/int8_gemm.h).
I8_MC = 48


@dataclass(frozen=True)
class Int8MatMulArgs:
    """C expressions and sizes of one `int8_matmul` kernel (macro `int8_matmul`)."""

    label: str
    x: str
    w: str
    bias: str
    y: str
    m: str
    n: int
    k: int
    #: The epilogue enum constant (RLX_EPI_NONE, RLX_EPI_RELU, ...) of an activation other than gelu.
    epi: str
    #: 1: GELU applied by the kernel's own tile epilogue (rlx_i8_gelu16 on AVX-512), else 0.
    gelu: int = 0


def scratch_bytes(k: int) -> int:
    """Per-thread scratch of one kernel (rlx_i8_scratch_bytes): a block of quantized rows, their scales."""
    return align64(I8_MC * round_up(k, 4)) + I8_MC * 4


def emit_int8_matmul(em, node: Node) -> Kernel:
    """The `int8_matmul` kernel of a node whose weight the LIR stores as int8 (`Int8Param`)."""
    op: Int8MatMul = node.op  # type: ignore[assignment]
    x_id, w_id = node.inputs[:2]
    if w_id not in em.int8:
        raise BuildError(f"%{node.id} int8_matmul: the CPU needs its weight %{w_id} to be a 2-D f32 param read "
                         "only as the weight of int8_matmul nodes (it is quantized once, at set_param)")
    x = em.node(x_id).shape
    k, n = em.node(w_id).shape.static_dims
    gelu = op.activation == "gelu"  # the int8 kernel's own, in registers (kernels/int8_gemm.h)
    if op.activation and not gelu:
        em.gemm_acts.add(op.activation)  # one case of the shared packed-GEMM epilogue
    label = c_string(f"%{node.id} int8_matmul" + (f" ({node.name[:60]})" if node.name else ""))
    args = Int8MatMulArgs(
        label=label, x=em.ptr(x_id), w=em.ptr(w_id), bias=em.ptr(node.inputs[2]) if len(node.inputs) == 3 else "",
        y=em.ptr(node.id, const=False), m=em.dim(product(x.dims[:-1])), n=n, k=k,
        epi=f"RLX_EPI_{op.activation.upper()}" if op.activation and not gelu else "RLX_EPI_NONE", gelu=int(gelu))
    return Kernel(node.id, "int8_matmul", TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label, scratch_per_thread=scratch_bytes(k))


def _int8_dtypes(op: Int8MatMul, in_dtypes: tuple, out_dtype: DType) -> str | None:
    bad = sorted({d.value for d in (*in_dtypes, out_dtype) if d is not DType.F32})
    return f"on {'/'.join(bad)}; it takes f32 activations, weight and bias" if bad else None


RULES.register("int8_matmul", accepts=_int8_dtypes)(emit_int8_matmul)

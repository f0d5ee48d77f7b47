"""Metal rules for GGUF-quantized weights: `dequantize` and `dequant_matmul`.

Listed in the Metal table by `rlx.codegen.metal.rule_table`. The kernels
(`templates/metal/kernels/quant.metal`) read the 4/8-bit blocks directly: `dequantize`
is one thread per output value; `dequant_matmul` one simdgroup per output value (lanes
stride over K dequantizing on the fly, then `simd_sum`), the shape of a decode GEMV.

>>> import rlx
>>> from rlx.ir.quant import row_bytes
>>> g = rlx.Graph("q")
>>> x = g.input("x", [1, 64])
>>> w = g.param("w", [8, row_bytes("q4_k", 256)], "u8")
>>> g.set_outputs([g.dequantize(w, quant="q4_k")])
>>> from rlx.codegen.backends import supports
>>> supports(g, "metal")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.metal.emit import OPS_TEMPLATE, Dispatch, GridAxis, MetalArgs, MetalEmitter, grid_1d
from rlx.codegen.registry import Kernel, RuleSet
from rlx.ir.graph import Node
from rlx.ir.quant import quant_format
from rlx.ir.shape import Dim, product

QUANT = "metal/kernels/quant.metal"
#: The format ids of kernels/quant.metal.
FORMAT_IDS = {"q8_0": "RLX_Q8_0", "q4_0": "RLX_Q4_0", "q4_1": "RLX_Q4_1", "q5_0": "RLX_Q5_0",
              "q5_1": "RLX_Q5_1", "q4_k": "RLX_Q4_K", "q6_k": "RLX_Q6_K"}
#: This module's Metal rules (the table is made from them: `rlx.codegen.metal.rule_table`).
RULES = RuleSet("metal")


@dataclass(frozen=True, kw_only=True)
class Dequantize(MetalArgs):
    name: str
    fmt: str
    x: str
    y: str
    n: str
    k: int
    row_bytes: int


@dataclass(frozen=True, kw_only=True)
class DequantMatMul(MetalArgs):
    name: str
    fmt: str
    x: str
    w: str
    y: str
    n: int
    k: int
    row_bytes: int


@RULES.register("dequantize")
def dequantize(e: MetalEmitter, node: Node) -> Kernel:
    x = e.node(node.inputs[0]).shape
    k = node.shape.dims[-1].value
    name = e.kernel_name(node)
    n = product(node.shape.dims)
    t = e.target.threads
    args = Dequantize(comment=e.header(node), launches=(Dispatch(name, grid_1d(n, t), (t, 1, 1)),), name=name,
                      fmt=FORMAT_IDS[quant_format(node.op.quant).name], x=e.ptr(node.inputs[0]), y=e.ptr(node.id),
                      n=e.dim(n), k=k, row_bytes=x.dims[-1].value)
    return Kernel(node.id, "block_dequantize", OPS_TEMPLATE, args, headers=(QUANT,), header=args.comment,
                  label=node.label)


@RULES.register("dequant_matmul")
def dequant_matmul(e: MetalEmitter, node: Node) -> Kernel:
    x, w = (e.node(i).shape for i in node.inputs)
    rows = product(x.dims[:-1])
    n = w.dims[0].value
    name = e.kernel_name(node)
    grid = (GridAxis(Dim(n)), GridAxis(rows), GridAxis(Dim(1)))
    args = DequantMatMul(comment=e.header(node), launches=(Dispatch(name, grid, (32, 1, 1), True),), name=name,
                         fmt=FORMAT_IDS[quant_format(node.op.quant).name], x=e.ptr(node.inputs[0]),
                         w=e.ptr(node.inputs[1]), y=e.ptr(node.id), n=n, k=x.dims[-1].value,
                         row_bytes=w.dims[1].value)
    return Kernel(node.id, "block_dequant_matmul", OPS_TEMPLATE, args, headers=(QUANT,), header=args.comment,
                  label=node.label)

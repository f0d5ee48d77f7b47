"""CPU rule for GEMMs on half-precision weights: `matmul(f32 x, bf16 | f16 w) -> f32`.

`Session(Device.CPU, precision="bf16")` stores the weights narrow and leaves
every GEMM reading them as they are stored (`rlx.opt.precision`); this rule
renders those GEMMs without widening the weights in the graph:

- a packed param (`rlx.opt.lowering.pack_params`) is kept in its precision
  in 32-column panels (`templates/cpu/kernels/gemm_bf16.h`). bf16 on a build
  with AVX512_BF16 rounds the activations to bf16 per tile (nearest even) and
  multiplies pairs with `vdpbf16ps`, accumulating in f32 (with AMX-BF16 and
  K a multiple of 32: TDPBF16PS tiles, at every row count); f16 (and bf16
  elsewhere) widens each panel exactly into per-thread scratch and runs the
  f32 packed micro-kernel.
- any other narrow right operand is widened into the shared scratch per call
  and multiplied by the f32 GEMM.

f32 GEMMs go to `f32_emit` (the core rule of `rlx.codegen.cpu.emit`), which is how
this module is wired in: `c.py` registers `gemm_rule(its own emit)`.

>>> from rlx.ir.graph import Graph
>>> g = Graph("h")
>>> w = g.param("w", [8, 5], "bf16")
>>> g.set_outputs([g.matmul(g.input("x", [3, 8]), w)])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cpu")
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from rlx.codegen.cpu.base import align64, round_up
from rlx.codegen.registry import Kernel
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.shape import product

TEMPLATE = "gemm_half.c.j2"
#: The packed kernels reuse packed_gemm.h's f32 micro-kernel and epilogue.
HEADERS = ("kernels/packed_gemm.h", "kernels/gemm_bf16.h")
#: Weight dtypes this rule multiplies f32 activations with.
NARROW = (DType.F16, DType.BF16)
#: Rows per tile (a tile's bf16 rows of A, mc x K, stay in L2 while the panels pass by).
HALF_MC = 96
#: Columns per packed half panel (RLX_HNR in gemm_bf16.h).
HALF_NR = 32


@dataclass(frozen=True, kw_only=True)
class HgemmArgs:
    """C = A @ B (+ bias, act) with B an f16/bf16 param packed in its precision (macro `hgemm`)."""

    macro: ClassVar[str] = "hgemm"
    label: str = ""
    fmt: str
    #: bf16's pair layout (vdpbf16ps); f16 is stored row by row.
    pairs: bool
    m: str
    n: str
    k: str
    lda: str
    a: str
    b: str
    c: str
    bias: str
    fold: bool
    batch: Any
    mat_c: str
    epi: str
    mc: int
    #: Byte offset of the bf16 rows of A in a thread's scratch (the widened panel is at 0).
    a16_offset: int


@dataclass(frozen=True, kw_only=True)
class GemmWidenArgs:
    """B (f16/bf16, not packed) widened into the shared scratch, then the f32 GEMM (macro `gemm_widen`)."""

    macro: ClassVar[str] = "gemm_widen"
    label: str = ""
    fmt: str
    src: str
    count: str
    #: The f32 GEMM's arguments, its B the widened copy.
    gemm: Any


def gemm_dtypes(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    """`accepts` of the CPU GEMM rule: all f32, or f32 activations times f16/bf16 weights (f32 bias)."""
    if all(d is DType.F32 for d in (*in_dtypes, out_dtype)):
        return None
    a, b, *bias = in_dtypes
    if a is DType.F32 and b in NARROW and all(d is DType.F32 for d in bias) and out_dtype is DType.F32:
        return None
    got = "/".join(dict.fromkeys(d.value for d in (*in_dtypes, out_dtype)))
    return f"on {got}; it takes f32, or f32 activations with f16/bf16 weights (and an f32 bias)"


def gemm_rule(f32_emit: Callable[[Any, Node], Kernel],
              f32_args: Callable[[Any, Node], Any]) -> Callable[[Any, Node], Kernel]:
    """The CPU rule for matmul / fused_matmul_bias_act: `f32_emit` for f32 operands, else this module's kernels
    (`f32_args`: the f32 GEMM's arguments, run on weights widened into scratch when they are not packed)."""

    def emit_gemm(em: Any, node: Node) -> Kernel:
        if em.node(node.inputs[1]).shape.dtype not in NARROW:
            return f32_emit(em, node)
        return _emit_half(em, node, f32_args)

    return emit_gemm


def _emit_half(em: Any, node: Node, f32_args: Callable[[Any, Node], Any]) -> Kernel:
    a_id, b_id = node.inputs[:2]
    a, b = em.node(a_id).shape, em.node(b_id).shape
    out = node.shape
    fmt = b.dtype.value
    if b_id in em.packed:
        m, k, n = out.dims[-2], a.dims[-1], out.dims[-1]
        em.check_gemm_dims(node, m * product(out.dims[:-2]), k, n)
        act = getattr(node.op, "activation", None) or ""
        if act:
            em.gemm_acts.add(act)
        fold = b.rank == 2
        kmax = k.max
        # per thread: one widened panel (K x 32 floats), then mc x Kp bf16 rows of A
        a16_offset = align64(kmax * HALF_NR * 4)
        scratch = a16_offset + align64(HALF_MC * round_up(kmax, 2) * 2)
        args = HgemmArgs(
            fmt=fmt, pairs=b.dtype is DType.BF16,
            m=em.dim(product(out.dims[:-1]) if fold else m), n=em.dim(n), k=em.dim(k), lda=em.dim(k),
            a=em.ptr(a_id), b=em.ptr(b_id), c=em.ptr(node.id, const=False),
            bias=em.ptr(node.inputs[2]) if len(node.inputs) == 3 else "", fold=fold,
            batch=em.gemm_batch(a, b, out, em.packed_mat[b_id]), mat_c=em.dim(m * n),
            epi=f"RLX_EPI_{act.upper()}" if act else "RLX_EPI_NONE", mc=HALF_MC, a16_offset=a16_offset)
        return em.kernel(node, "hgemm", TEMPLATE, args, headers=HEADERS, scratch_per_thread=scratch)
    f32 = replace(f32_args(em, node), b="((const float *)ctx->scratch)")
    count = product(b.dims)
    args = GemmWidenArgs(fmt=fmt, src=em.ptr(b_id), count=em.dim(count), gemm=f32)
    return em.kernel(node, "gemm_widen", TEMPLATE, args, scratch_shared=count.max * 4)

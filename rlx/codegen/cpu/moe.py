"""CPU rules for the sparse mixture-of-experts ops of `rlx/ir/ops_moe.py`.

Registered into the CPU rule table when imported (by `rlx.codegen`). The loops are in
`templates/cpu/kernels/moe.h`; `moe_matmul` runs the path its `MoeExpertPlan` decision names
(`rlx.opt.lowering_moe`): one GEMV per (token, expert) pair, or pairs sorted by expert and one
GEMM per expert group, with a GEMV fallback for steps of few pairs.

>>> import rlx
>>> g = rlx.Graph("moe")
>>> x = g.input("x", [1, 64])
>>> ids, gate = g.moe_router(g.input("logits", [1, 8]), top_k=2, normalize=True)
>>> g.set_outputs([g.moe_matmul(x, ids, g.param("w", [8, 16, 64])), gate])
>>> from rlx.codegen.backends import supports
>>> supports(g, "cpu")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cpu.base import PACK_NR_MAX, align64, c_string, node_header
from rlx.codegen.registry import Kernel, RuleSet
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir import ops_moe as MOE
from rlx.ir.decisions_moe import MoeExpertPlan
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.quant import quant_format

#: This module's CPU rules (the table is made from them: `rlx.codegen.cpu.rule_table`).
RULES = RuleSet("cpu")

TEMPLATE = "moe.c.j2"
HEADERS = ("kernels/argmax.h", "kernels/packed_gemm.h", "kernels/quant.h", "kernels/qgemm_panels.h", "kernels/moe.h")
#: The weight-kind ids of kernels/moe.h (block formats use kernels/quant.h's format ids).
FLOAT_KINDS = {DType.F32: "RLX_MOE_F32", DType.F16: "RLX_MOE_F16", DType.BF16: "RLX_MOE_BF16"}
QUANT_KINDS = {"q8_0": "RLX_Q8_0", "q4_0": "RLX_Q4_0", "q4_1": "RLX_Q4_1", "q5_0": "RLX_Q5_0",
               "q5_1": "RLX_Q5_1", "q4_k": "RLX_Q4_K", "q6_k": "RLX_Q6_K"}


@dataclass(frozen=True)
class RouterArgs:
    """C expressions of one `moe_topk` / `moe_gate` kernel (`y` is "" for moe_topk)."""

    logits: str
    ids: str
    y: str
    tokens: str
    experts: int
    top_k: int
    normalize: bool


@dataclass(frozen=True)
class MoeMatMulArgs:
    """C expressions, sizes and the decided path of one `moe_matmul` kernel."""

    x: str
    ids: str
    w: str
    y: str
    tokens: str
    top_k: int
    experts: int
    n: int
    k: int
    row_bytes: int
    kind: str
    weights: str
    qk: int
    qb: int
    x_per_pair: bool
    path: str
    gemv_max_pairs: int
    chunk: int
    wrow_offset: int
    ys_offset: int
    start_offset: int
    order_offset: int


def _kernel(node: Node, macro: str, args: object, **scratch: int) -> Kernel:
    label = c_string(f"%{node.id} {node.kind}" + (f" ({node.name[:60]})" if node.name else ""))
    return Kernel(node.id, macro, TEMPLATE, args, headers=HEADERS, header=node_header(node, 80),
                  func=f"rlx_op_{node.id}", label=label, **scratch)


def emit_router(em, node: Node) -> Kernel:
    """The `moe_topk` or `moe_gate` kernel of a router node."""
    logits = em.node(node.inputs[0]).shape
    tokens, top_k = node.shape.dims
    gate = isinstance(node.op, MOE.MoeGate)
    args = RouterArgs(logits=em.ptr(node.inputs[0]),
                      ids=em.ptr(node.inputs[1]) if gate else em.ptr(node.id, const=False),
                      y=em.ptr(node.id, const=False) if gate else "", tokens=em.dim(tokens),
                      experts=logits.dims[1].value, top_k=top_k.value, normalize=gate and node.op.normalize)
    return _kernel(node, node.kind, args)


def emit_moe_matmul(em, node: Node) -> Kernel:
    """The `moe_matmul` kernel: the GEMV or grouped path its `MoeExpertPlan` names."""
    op: MOE.MoeMatMul = node.op  # type: ignore[assignment]
    x_id, ids_id, w_id = node.inputs
    x, w = em.node(x_id).shape, em.node(w_id).shape
    plan = next((d for d in em.lir.decided(MoeExpertPlan) if d.node == node.id), None)
    if plan is None:
        raise BuildError(f"node %{node.id} moe_matmul has no MoeExpertPlan decision: lower the LIR for the CPU")
    tokens, top_k, _ = node.shape.dims
    e, n, k = op.expert_dims(w)
    if op.quant is None:
        kind, weights, qk, qb = FLOAT_KINDS[w.dtype], w.dtype.value, 1, 1
    else:
        fmt = quant_format(op.quant)
        kind, weights, qk, qb = QUANT_KINDS[fmt.name], fmt.name, fmt.block_size, fmt.block_bytes
    # per thread: a prefill panel (K x the widest packed panel), one widened weight row
    wrow_offset = align64(k * PACK_NR_MAX * 4) if plan.path == "grouped" else 0
    per_thread = wrow_offset + align64(k * 4)
    # shared (grouped path): the sorted rows of X, their results, the groups' starts and the order
    chunk = plan.chunk_pairs
    ys_offset = align64(chunk * k * 4)
    start_offset = ys_offset + align64(chunk * n * 4)
    order_offset = start_offset + align64((e + 1) * 8)
    shared = order_offset + align64(chunk * 4) if plan.path == "grouped" else 0
    args = MoeMatMulArgs(
        x=em.ptr(x_id), ids=em.ptr(ids_id), w=em.ptr(w_id), y=em.ptr(node.id, const=False), tokens=em.dim(tokens),
        top_k=top_k.value, experts=e, n=n, k=k, row_bytes=w.dims[2].value * w.dtype.itemsize, kind=kind,
        weights=weights, qk=qk, qb=qb, x_per_pair=x.rank == 3, path=plan.path,
        gemv_max_pairs=plan.gemv_max_pairs, chunk=chunk, wrow_offset=wrow_offset,
        ys_offset=ys_offset, start_offset=start_offset, order_offset=order_offset)
    return _kernel(node, "moe_matmul", args, scratch_per_thread=per_thread, scratch_shared=shared)


def _router_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    return None if in_dtypes[0] is DType.F32 else f"on {in_dtypes[0].value} logits; it takes f32"


def _matmul_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    quant = getattr(op, "quant", None)
    if quant is not None and quant not in QUANT_KINDS:
        return f"in format {quant!r}; it takes {sorted(QUANT_KINDS)}"
    return None


RULES.register("moe_topk", "moe_gate", accepts=_router_accepts)(emit_router)
RULES.register("moe_matmul", accepts=_matmul_accepts)(emit_moe_matmul)

"""CUDA rules for the sparse mixture-of-experts ops (`rlx/ir/ops_moe.py`).

Registered into the CUDA rule table when imported (by `rlx.codegen.cuda`). Device code:
`templates/cuda/kernels/moe.cuh`; launches: `templates/cuda/moe.cu.j2`. The router runs one thread per
token; `moe_matmul` takes the path its `MoeExpertPlan` decision names (`rlx.opt.lowering_moe`): one warp
per (token, expert) pair and row of that pair's expert (decode, and any step of few pairs), or the pairs
sorted by expert in the scratch region and one tiled GEMM per expert group (prefill). Either way a step
reads only the chosen experts' weights. Experts in GGUF block formats are dequantized on chip
(`kernels/quant.cuh`'s `rlx_q_sub`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx.codegen.cuda.emit import CudaEmitter, Launch
from rlx.codegen.cuda.quant import FORMAT_IDS
from rlx.codegen.registry import Kernel, RuleSet
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir import ops_moe as MOE
from rlx.ir.decisions_moe import MoeExpertPlan
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.quant import quant_format

#: This module's CUDA rules (the table is made from them: `rlx.codegen.cuda.rule_table`).
RULES = RuleSet("cuda")

TEMPLATE = "cuda/moe.cu.j2"
HEADERS = ("cuda/kernels/quant.cuh", "cuda/kernels/moe.cuh")


@dataclass(frozen=True, kw_only=True)
class RouterLaunch(Launch):
    t: str
    to: str
    logits: str
    ids: str
    y: str
    tokens: str
    experts: int
    top_k: int
    normalize: bool


@dataclass(frozen=True, kw_only=True)
class MoeMatMulLaunch(Launch):
    t: str
    wt: str
    to: str
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
    x_per_pair: bool
    quant: bool
    fmt: str
    qk: int
    qb: int
    weights: str
    plan: str
    grouped: bool
    gemv_max_pairs: int


def router(e: CudaEmitter, node: Node) -> Kernel:
    tokens, top_k = node.shape.dims
    gate = isinstance(node.op, MOE.MoeGate)
    args = RouterLaunch(**e.base(node), t=e.ctype(node.inputs[0]), to=e.ctype(node.id), logits=e.ptr(node.inputs[0]),
                        ids=e.ptr(node.inputs[1]) if gate else e.ptr(node.id), y=e.ptr(node.id) if gate else "",
                        tokens=e.dim(tokens), experts=e.node(node.inputs[0]).shape.dims[1].value,
                        top_k=top_k.value, normalize=gate and node.op.normalize)  # type: ignore[attr-defined]
    return Kernel(node.id, f"block_{node.kind}", TEMPLATE, args, headers=HEADERS, header=args.comment,
                  label=node.label)


def moe_matmul(e: CudaEmitter, node: Node) -> Kernel:
    op: MOE.MoeMatMul = node.op  # type: ignore[assignment]
    x, ids, w = node.inputs
    plan = next((d for d in e.lir.decided(MoeExpertPlan) if d.node == node.id), None)
    if plan is None:
        raise BuildError(f"node %{node.id} moe_matmul has no MoeExpertPlan decision: lower the LIR for CUDA")
    tokens, top_k, _ = node.shape.dims
    wshape = e.node(w).shape
    experts, n, k = op.expert_dims(wshape)
    fmt = quant_format(op.quant) if op.quant else None
    args = MoeMatMulLaunch(**e.base(node), t=e.ctype(x), wt=e.ctype(w), to=e.ctype(node.id), x=e.ptr(x), ids=e.ptr(ids),
                           w=e.ptr(w), y=e.ptr(node.id), tokens=e.dim(tokens), top_k=top_k.value, experts=experts,
                           n=n, k=k, row_bytes=wshape.dims[2].value, x_per_pair=e.node(x).shape.rank == 3,
                           quant=fmt is not None, fmt=FORMAT_IDS[fmt.name] if fmt else "",
                           qk=fmt.block_size if fmt else 0, qb=fmt.block_bytes if fmt else 0,
                           weights=fmt.name if fmt else e.ctype(w), plan=plan.describe(),
                           grouped=plan.path == "grouped", gemv_max_pairs=plan.gemv_max_pairs)
    return Kernel(node.id, "block_moe_matmul", TEMPLATE, args, headers=HEADERS, header=args.comment,
                  label=node.label)


def _matmul_accepts(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    quant = getattr(op, "quant", None)
    if quant is not None and quant not in FORMAT_IDS:
        return f"in format {quant!r}; it takes {sorted(FORMAT_IDS)}"
    return None


RULES.register("moe_topk", "moe_gate")(router)
RULES.register("moe_matmul", accepts=_matmul_accepts)(moe_matmul)

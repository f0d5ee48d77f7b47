"""`rlx.opt.lowering_moe`: how each `moe_matmul` runs (`MoeExpertPlan`), recorded in the LIR for the CPU and CUDA."""

from __future__ import annotations

import pytest

import rlx
from rlx.ir.decisions_moe import MoeExpertPlan
from rlx.opt.lowering import lower_for
from rlx.opt.lowering_moe import CHUNK_PAIRS, GEMV_MAX_PAIRS, cuda_scratch_bytes, moe_plans
from rlx.opt.memplan import plan


def _lir(tokens: int | rlx.Dim, top_k: int, experts: int = 8):
    g = rlx.Graph("moe")
    ids, _ = g.moe_router(g.input("logits", [tokens, experts]), top_k=top_k, normalize=True)
    g.set_outputs([g.moe_matmul(g.input("x", [tokens, 32]), ids, g.param("w", [experts, 4, 32]))])
    return plan(g)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_plans_follow_the_largest_step(backend):
    decode = moe_plans(_lir(2, 8), backend)  # 16 pairs: a decode step of two tokens at top-8
    assert [(p.path, p.gemv_max_pairs, p.chunk_pairs) for p in decode] == [("gemv", GEMV_MAX_PAIRS, 0)]
    prefill = moe_plans(_lir(rlx.Dim.dynamic("t", 500), 2), backend)  # 1000 pairs
    chunk = 1000 if backend == "cuda" else CHUNK_PAIRS
    assert [(p.path, p.chunk_pairs) for p in prefill] == [("grouped", chunk)]
    # recorded by lower_for with the backend's other decisions
    assert lower_for(_lir(1, 2), backend).decided(MoeExpertPlan) == list(moe_plans(_lir(1, 2), backend))


def test_cuda_scratch_holds_the_sorted_pairs():
    lir = _lir(rlx.Dim.dynamic("t", 40), 2, experts=6)
    node = next(n for n in lir.graph.nodes if n.kind == "moe_matmul")
    assert cuda_scratch_bytes(lir.graph, node) == (2 * (6 + 1) + 80) * 4
    small = _lir(3, 2)
    assert cuda_scratch_bytes(small.graph, next(n for n in small.graph.nodes if n.kind == "moe_matmul")) == 0


def test_plan_paths_are_checked():
    with pytest.raises(ValueError, match="path must be one of"):
        MoeExpertPlan(1, "dense", 16, 0)

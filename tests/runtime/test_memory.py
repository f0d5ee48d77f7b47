"""Session.estimate (before any build) against what the compiled context allocates (rlx_memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlx
from rlx.errors import RlxError
from rlx.ir.decisions_metal import MetalLayout
from rlx.models import bert as B
from rlx.pipeline import stages_for
from rlx.runtime.memory import alloc_size

CFG = B.BertConfig(vocab_size=60, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                   max_position_embeddings=40)


def mlp() -> rlx.Graph:
    g = rlx.Graph("mem_mlp")
    x = g.input("x", [rlx.Dim.dynamic("batch", max=32), 48])
    h = g.activation("relu", g.matmul(x, g.param("w1", [48, 100])))  # 100: packed storage pads N
    g.set_outputs([g.add_(g.matmul(h, g.param("w2", [100, 8])), g.param("b", [8]))])
    return g


def within_one_percent(estimate: int, actual: int) -> bool:
    return abs(estimate - actual) <= 0.01 * actual


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("profile", [False, True])
@pytest.mark.parametrize("build", [mlp, lambda: B.build_bert(CFG, max_batch=4, max_seq=16)], ids=["mlp", "bert"])
def test_estimate_matches_the_allocation(build, profile: bool, threads: int):
    """Also at fewer threads than the machine's default (the context's scratch shrinks to the count set)."""
    session = rlx.Session(profile=profile)
    graph = build()
    est = session.estimate(graph, num_threads=threads)
    assert est.profiled is profile
    cg = session.compile(graph, num_threads=threads)
    got = cg.memory()
    assert within_one_percent(est.total, got["total"]), (est, got)
    for part in ("arena", "params", "scratch", "context"):
        assert within_one_percent(getattr(est, part), got[part]), (part, est, got)
    assert est.arena >= session.lower(graph).arena_bytes > 0


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_estimate_follows_the_session_precision(precision: str):
    """Params stored narrow (and bias vectors widened once at set_param) are what the estimate sizes."""
    session = rlx.Session(precision=precision)
    est = session.estimate(mlp(), num_threads=2)
    got = session.compile(mlp(), num_threads=2).memory()
    for part in ("arena", "params", "scratch", "context"):
        assert within_one_percent(getattr(est, part), got[part]), (part, est, got)
    assert est.params < rlx.Session().estimate(mlp(), num_threads=2).params * 0.6


def test_bert_estimate_parts():
    graph = B.build_bert(CFG, max_batch=4, max_seq=16)
    est = rlx.Session().estimate(graph, num_threads=3)
    assert est.scratch > 0  # attention tiles, one per thread
    assert est.threads == 3
    assert est.inputs == (4 * 16 + 4 * 16 + 16) * 8  # i64 ids and mask [batch, seq], position ids [seq]
    assert est.outputs == 4 * 32 * 4
    assert est.state == 0
    declared = sum(spec.shape.max_nbytes for spec in rlx.Session().lower(graph).params)
    assert declared <= est.params < 2 * declared  # stored: packed GEMM operands padded to their panels


def test_scratch_grows_with_threads():
    g = B.build_bert(CFG, max_batch=4, max_seq=16)
    one, four = (rlx.Session().estimate(g, num_threads=n) for n in (1, 4))
    assert four.scratch > one.scratch and four.arena == one.arena and four.params == one.params


def test_state_inputs_are_counted_as_state():
    g = rlx.Graph("kv")
    cache = g.state("k_cache", [2, 64, 32])
    x = g.input("x", [2, 64, 32])
    g.set_outputs([g.add_(x, cache)])
    est = rlx.Session().estimate(g)
    assert est.state == 2 * 64 * 32 * 4
    assert est.inputs == 2 * 64 * 32 * 4


def test_alloc_size_mirrors_rlx_alloc():
    assert [alloc_size(n) for n in (1, 64, 65, (2 << 20) - 1, 2 << 20, (2 << 20) + 1)] == [
        64, 64, 128, 2 << 20, 2 << 20, 4 << 20]


def test_estimate_of_the_metal_buffer_is_its_decided_layout():
    """Metal (and CUDA, below): `total` is the one allocation of the decided layout, params at least the params'
    bytes, and the caller's inputs and outputs are the CPU estimate's (the same graph at the same bounds)."""
    session = rlx.Session(rlx.Device.METAL)
    est = session.estimate(mlp())
    layout = session.render(mlp()).lir.decided(MetalLayout)[0]
    cpu = rlx.Session().estimate(mlp(), num_threads=1)
    assert est.total == layout.total and est.scratch == 0
    assert est.params >= (48 * 100 + 100 * 8 + 8) * 4 and est.arena > 0
    assert (est.inputs, est.outputs, est.state) == (cpu.inputs, cpu.outputs, cpu.state)


def test_estimate_of_the_cuda_allocation_is_its_decided_layout():
    import shutil

    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("nvcc is not installed (the CUDA target is resolved against the toolchain)")
    session = rlx.Session(rlx.Device.CUDA, target="cuda:sm_90")
    est = session.estimate(mlp())
    lir = session.render(mlp()).lir
    layout = next(d for d in lir.decisions if d.kind == "cuda_device_layout")
    assert est.total == layout.total
    assert est.params >= (48 * 100 + 100 * 8 + 8) * 4 and est.arena > 0 and est.context > 0
    assert est.inputs == rlx.Session().estimate(mlp()).inputs


def test_estimate_refuses_an_unknown_backend():
    with pytest.raises(RlxError, match="no backend 'tpu'"):
        stages_for("tpu", rlx.Config())

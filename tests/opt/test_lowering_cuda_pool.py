"""The PoolTail decision of the CUDA lowering (rlx/opt/lowering_cuda_pool.py): which sentence-embedding tails run as
one kernel, which are refused, and what the LIR says."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.driver import lower_to_lir, to_mir
from rlx.ir.decisions_cuda import PoolTail
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.models.bert import BertConfig, build_bert
from rlx.opt.lowering import lower_for
from rlx.opt.lowering_cuda_pool import find_pool_tails
from rlx.opt.memplan import plan
from tests.gpu.pool_common import pool_graph

TINY_BERT = BertConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _lir(graph, precision: str = "f16", **options):
    return lower_for(lower_to_lir(to_mir(graph), 2, backend="cuda"), "cuda", precision=precision, gemm="cublaslt",
                     **options)


def _tails(graph, **options) -> list[PoolTail]:
    return _lir(graph, **options).decided(PoolTail)


def test_bert_embeddings_tail_is_one_decision() -> None:
    lir = _lir(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="embeddings"))
    (tail,) = lir.decided(PoolTail)
    assert tail.normalized and tail.abi_output == 0 and len(tail.absorbed) == 9
    assert (tail.eps_count, tail.eps_norm) == pytest.approx((1e-9, 1e-12))
    assert "masked mean + L2 normalization of %" in lir.inspect()  # rlxc inspect --stage lir shows it
    # the tokens output (no pooling) and CLS pooling have none
    assert not _tails(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="tokens"))
    assert not _tails(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="embeddings", pooling="cls"))
    # the option turns it off (the LIR, and so the cache key, differ)
    assert not _tails(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="embeddings"), pool_tail=False)


def test_mean_only_and_refused_tails() -> None:
    (mean,) = _tails(pool_graph(normalize=False))
    assert not mean.normalized and mean.abi_output == 0 and len(mean.absorbed) == 5
    # the mean is a second output: the normalization stays separate kernels, the mean is written where it lives
    (leak,) = _tails(pool_graph(leak="mean"))
    assert not leak.normalized and leak.abi_output == -1
    # an intermediate read outside the tail: nothing fused
    assert not _tails(pool_graph(leak="count")) and not _tails(pool_graph(leak="sum"))


def test_the_norm_before_the_tail_is_taken_with_it() -> None:
    lir = _lir(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="embeddings"), pool_norm=True)
    (tail,) = lir.decided(PoolTail)
    (norm,) = tail.norm
    assert lir.graph.node(norm).kind == "fused_residual_layer_norm" and tail.hidden == norm
    assert tail.norm_max_seq == 64 and f"normalizes %{norm}'s inputs itself when seq <= 64" in lir.inspect()
    for kind in ("layer", "rms", "rms_res"):
        (t,) = _tails(pool_graph(norm=kind), pool_norm=True)
        assert t.norm == (t.hidden,)
    # off by default; a norm output read elsewhere (a second output) stays a kernel of its own
    assert _tails(build_bert(TINY_BERT, max_batch=2, max_seq=8, output="embeddings"))[0].norm == ()
    (leak,) = _tails(pool_graph(norm="layer", leak="norm"), pool_norm=True)
    assert leak.norm == () and leak.norm_max_seq == 0
    # no norm before the tail: nothing to take
    assert _tails(pool_graph(), pool_norm=True)[0].norm == ()


def test_bf16_constants_are_read_as_their_values() -> None:
    """A bf16 graph's eps constants are stored as bf16 bit patterns; the decision records their values."""
    g = Graph("pool_bf16")
    b, s = Dim.dynamic("b", 4), Dim.dynamic("s", 16)
    h, m = g.input("h", [b, s, 8], dtype="bf16"), g.input("m", [b, s], dtype="bf16")
    summed = g.reshape(g.matmul(g.reshape(m, [b, 1, s]), h), [b, 8])
    count = g.binary("max", g.reduce("sum", m, [1], keep_dim=True), g.constant(np.float32(1e-3), dtype="bf16"))
    g.set_outputs({"e": g.div(summed, count)})
    (tail,) = find_pool_tails(plan(g))
    assert tail.eps_count == pytest.approx(1e-3, rel=1e-2)  # bf16 keeps ~3 digits

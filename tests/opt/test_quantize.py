"""`rlx.quantize` / `rlx.opt.quantize`: which GEMMs become int8_matmul, and what stays."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import IRError
from rlx.ir.decisions_int8 import Int8Param
from rlx.ir.graph import Graph
from rlx.models.bert import BertConfig, bert_hir, build_bert, random_weights
from rlx.opt.lowering import lower_for
from rlx.opt.memplan import plan
from rlx.opt.pipeline import abi
from rlx.opt.quantize import quantize

CFG = BertConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32)


def test_every_bert_linear_becomes_int8_and_the_abi_stays() -> None:
    g = build_bert(CFG, max_batch=2, max_seq=8)
    q = quantize(g, "int8-dynamic")
    kinds = [n.kind for n in q.nodes]
    assert kinds.count("int8_matmul") == 6 * CFG.num_layers
    assert "fused_matmul_bias_act" not in kinds
    assert kinds.count("matmul") == 1  # the masked mean pooling stays f32
    assert [n.op.activation for n in q.nodes if n.kind == "int8_matmul"].count("gelu") == CFG.num_layers
    assert abi(q) == abi(rlx.optimize(g))  # same inputs, params (user layout) and outputs
    lir = lower_for(plan(q), "cpu")
    assert len(lir.decided(Int8Param)) == 6 * CFG.num_layers


def test_hir_module_and_reference_close_to_f32() -> None:
    h = bert_hir(CFG, max_batch=2, max_seq=8)
    q = rlx.quantize(h, "int8-dynamic")
    ids = np.array([[2, 7, 9, 3, 5, 1, 1, 4], [2, 5, 3, 8, 0, 0, 0, 0]])
    feed = {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64), "position_ids": np.arange(8)}
    w = random_weights(CFG)
    a = rlx.reference.run(build_bert(CFG, max_batch=2, max_seq=8), feed, w)[0]
    b = rlx.reference.run(q, feed, w)[0]
    assert ((a * b).sum(1) > 0.99).all()  # unit vectors: cosine


def test_shared_or_odd_weights_stay_f32() -> None:
    g = Graph("mixed")
    x = g.input("x", [4, 8])
    w = g.param("w", [8, 8])
    tied = g.matmul(g.matmul(x, w), w)  # read twice as a weight: both quantized
    other = g.param("v", [8, 8])
    g.set_outputs([tied, g.matmul(x, other), g.add_(other, other)])  # v is also read elementwise
    q = quantize(g)
    int8 = [n for n in q.nodes if n.kind == "int8_matmul"]
    assert len(int8) == 2 and all(q.node(n.inputs[1]).op.name == "w" for n in int8)
    batched = Graph("batched")
    bx = batched.input("x", [2, 4, 8])
    batched.set_outputs([batched.matmul(bx, batched.param("w", [2, 8, 3]))])  # a batch of weights
    assert "int8_matmul" not in [n.kind for n in quantize(batched).nodes]


def test_unknown_mode_and_hir_input() -> None:
    g = Graph("g")
    g.set_outputs([g.matmul(g.input("x", [2, 4]), g.param("w", [4, 4]))])
    with pytest.raises(IRError, match="unknown quantization mode 'int4'"):
        quantize(g, "int4")
    with pytest.raises(IRError, match="needs a MIR graph"):
        quantize(bert_hir(CFG, max_batch=1, max_seq=4))

"""`Int8Param`: which params the CPU stores quantized, and how many bytes."""

from __future__ import annotations

from rlx.ir.decisions_int8 import Int8Param
from rlx.ir.graph import Graph
from rlx.opt.lowering import lower_for
from rlx.opt.lowering_int8 import int8_params
from rlx.opt.memplan import plan


def test_only_params_read_solely_as_int8_weights() -> None:
    g = Graph("q")
    x = g.input("x", [2, 8])
    w, v, u = g.param("w", [8, 5]), g.param("v", [8, 8]), g.param("u", [8, 8])
    g.set_outputs([g.int8_matmul(x, w), g.int8_matmul(x, v), g.add_(v, v), g.int8_matmul(g.matmul(x, u), u)])
    got = int8_params(plan(g))
    assert [(d.k, d.n) for d in got] == [(8, 5)]
    lir = lower_for(plan(g), "cpu")
    assert [d.describe() for d in lir.decided(Int8Param)] == [got[0].describe()]
    assert "stored as int8" in lir.inspect()


def test_storage_bytes_pad_panels_and_groups() -> None:
    # 33 columns -> 2 panels of 32; K = 5 -> 8 rows in groups of 4; then scales and compensation terms
    assert Int8Param(0, 5, 33).storage_bytes == 64 * 8 + 8 * 64
    assert Int8Param(0, 384, 384).storage_bytes == 384 * 384 + 8 * 384

"""JSON round trips of LIR modules with their decisions (rlx/ir/serialize_lir.py), and malformed documents.

Whether the round trip keeps everything codegen reads is tests/codegen/test_render_roundtrip.py's question."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlx.errors import IRError
from rlx.ir.decisions import DECISION_KINDS, Decision, register_decision
from rlx.ir.decisions_cuda import DeviceLayout, PoolTail
from rlx.ir.decisions_cuda_kernels import GatherInRegion
from rlx.ir.graph import Graph
from rlx.ir.serialize_lir import DECISION_MODULES, lir_from_json, lir_to_json
from rlx.opt.lowering import lower_for
from rlx.opt.memplan import plan


def _graph() -> Graph:
    g = Graph("embed_pool")
    ids = g.input("ids", [2, 6], "i64")
    x = g.add_(g.gather(g.param("word", [50, 16]), ids), g.constant(np.full(16, 0.5, np.float32)))
    m = g.input("m", [2, 6])
    summed = g.reshape(g.matmul(g.reshape(m, [2, 1, 6]), x), [2, 16])
    count = g.binary("max", g.reduce("sum", m, [1], keep_dim=True), g.constant(np.float32(1e-9)))
    g.set_outputs({"e": g.div(summed, count)})
    return g


@pytest.mark.parametrize("backend", ["cpu", "cuda", "metal"])
def test_round_trip_keeps_every_field(backend: str) -> None:
    lir = lower_for(plan(_graph()), backend)
    back = lir_from_json(lir_to_json(lir))
    assert back.hash() == lir.hash() and back.inspect() == lir.inspect()
    assert back.decisions == lir.decisions and dict(back.buffers) == dict(lir.buffers)
    assert (back.inputs, back.outputs, back.params, back.constants) == (lir.inputs, lir.outputs, lir.params,
                                                                        lir.constants)
    assert (back.schedule, back.symbols, back.output_copies, back.workspaces) == (
        lir.schedule, lir.symbols, lir.output_copies, lir.workspaces)


def test_nested_records_and_floats_come_back_typed() -> None:
    lir = lower_for(plan(_graph()), "cuda")
    back = lir_from_json(lir_to_json(lir))
    (layout,) = back.decided(DeviceLayout)
    assert type(layout.regions[0]).__name__ == "Region" and isinstance(layout.params, tuple)
    (tail,) = back.decided(PoolTail)
    assert isinstance(tail.eps_count, float) and tail.eps_count == lir.decided(PoolTail)[0].eps_count
    assert back.decided(GatherInRegion)


def test_every_decision_kind_loads() -> None:
    """Every registered kind is defined in a module the loader imports (so a saved LIR always loads back)."""
    modules = {m.__name__ for m in DECISION_MODULES} | {"rlx.ir.decisions"}
    assert {cls.__module__ for cls in DECISION_KINDS.values()} <= modules


def test_a_kind_is_registered_once() -> None:
    class Other(Decision):
        kind = "cuda_gather_in_region"

    with pytest.raises(ValueError, match="taken by GatherInRegion"):
        register_decision(Other)


def test_malformed_documents_are_refused_with_a_reason() -> None:
    doc = json.loads(lir_to_json(lower_for(plan(_graph()), "cuda")))
    with pytest.raises(IRError, match="unknown decision kind 'cuda_wishful_thinking'"):
        lir_from_json(json.dumps({**doc, "decisions": [{"kind": "cuda_wishful_thinking", "node": 1}]}))
    gather = next(d for d in doc["decisions"] if d["kind"] == "cuda_gather_in_region")
    with pytest.raises(IRError, match="expected an integer"):
        lir_from_json(json.dumps({**doc, "decisions": [{**gather, "region": "9"}]}))
    with pytest.raises(IRError, match="unknown fields"):
        lir_from_json(json.dumps({**doc, "decisions": [{**gather, "extra": 1}]}))
    with pytest.raises(IRError, match="missing field 'region'"):
        lir_from_json(json.dumps({**doc, "decisions": [{k: v for k, v in gather.items() if k != "region"}]}))
    with pytest.raises(IRError, match="not an rlx LIR document"):
        lir_from_json(json.dumps({**doc, "format": "rlx-graph"}))
    with pytest.raises(IRError, match="version 2"):
        lir_from_json(json.dumps({**doc, "version": 2}))
    with pytest.raises(IRError, match="name every node"):
        lir_from_json(json.dumps({**doc, "buffers": doc["buffers"][1:]}))
    with pytest.raises(IRError, match="storage one of"):
        lir_from_json(json.dumps({**doc, "buffers": [[0, "heap", 8, 0, 0, -1], *doc["buffers"][1:]]}))
    with pytest.raises(IRError, match="missing keys \\['schedule'\\]"):
        lir_from_json(json.dumps({k: v for k, v in doc.items() if k != "schedule"}))
    with pytest.raises(IRError, match="not valid JSON"):
        lir_from_json("{")

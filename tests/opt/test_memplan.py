"""The memory planner: no two live arena buffers overlap, views alias, outputs are in place or copied.

Besides checking the plan's intervals, `execute_plan` runs a graph the way
generated code does: every value is written to and read back from the bytes
its `Buffer` names (a garbage-filled arena, caller-owned input/output
buffers, views reading their source's bytes). A plan that lets two live
values share bytes, or a view that does not alias what it claims, gives
different outputs than the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from graphs import Case, bert_graph, random_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx import reference
from rlx.errors import IRError
from rlx.ir.dtype import DType, bf16_to_f32, f32_to_bf16
from rlx.ir.graph import Graph, NodeId
from rlx.ir.lir import LirModule
from rlx.ir.shape import Dim
from rlx.opt.memplan import ALIGN, live_intervals, plan
from rlx.opt.pipeline import optimize

# ── helpers ────────────────────────────────────────────────────────────


def _to_bytes(value: np.ndarray, dtype: DType) -> np.ndarray:
    arr = reference.to_boundary(value, dtype)
    if dtype is DType.BF16:
        arr = f32_to_bf16(arr)
    return np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8)


def _from_bytes(raw: np.ndarray, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    arr = raw.view(dtype.np).reshape(shape)
    if dtype is DType.BF16:
        arr = bf16_to_f32(arr)
    return reference.to_compute(arr, dtype)


def execute_plan(lir: LirModule, inputs: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> list[np.ndarray]:
    graph = lir.graph
    symbols = reference.bind_symbols(graph, inputs)
    rng = np.random.default_rng(99)
    arena = rng.integers(0, 256, lir.arena_bytes, dtype=np.uint8)  # garbage, like fresh memory
    slots: dict[str, list[np.ndarray]] = {
        "input": [_to_bytes(reference.to_compute(inputs[s.name], s.shape.dtype), s.shape.dtype) for s in lir.inputs],
        "param": [],
        "const": [np.frombuffer(graph.node(c).op.data, np.uint8) for c in lir.constants],
        "output": [rng.integers(0, 256, graph.node(s.node).shape.max_nbytes, dtype=np.uint8) for s in lir.outputs],
    }
    for s in lir.params:
        arr = np.asarray(params[s.name])
        if s.layout is not None:
            arr = arr.transpose(s.layout)
        slots["param"].append(_to_bytes(reference.to_compute(arr, s.shape.dtype), s.shape.dtype))

    def where(nid: NodeId) -> tuple[np.ndarray, int]:
        b = lir.buffers[nid]
        if b.storage == "arena":
            return arena, b.offset
        if b.storage == "view":
            buf, off = where(b.source)
            return buf, off + b.offset
        return slots[b.storage][b.slot], 0

    def nbytes(nid: NodeId) -> int:
        s = graph.node(nid).shape
        return int(np.prod(s.concrete(symbols), dtype=np.int64)) * s.dtype.itemsize

    def read(nid: NodeId) -> np.ndarray:
        buf, off = where(nid)
        s = graph.node(nid).shape
        n = nbytes(nid)
        assert off + n <= len(buf), f"%{nid} reads past its storage"
        return _from_bytes(buf[off:off + n].copy(), s.concrete(symbols), s.dtype)

    for nid in lir.schedule:
        node = graph.node(nid)
        if lir.buffers[nid].storage == "view":
            continue  # the value already lives in its source's bytes
        args = [read(i) for i in node.inputs]
        value = reference.evaluate(node.op, args, node.shape, symbols, [graph.node(i).shape for i in node.inputs])
        buf, off = where(nid)
        raw = _to_bytes(value, node.shape.dtype)
        assert off + len(raw) <= len(buf)
        buf[off:off + len(raw)] = raw
    for slot, nid in lir.output_copies:
        raw = _to_bytes(read(nid), graph.node(nid).shape.dtype)
        slots["output"][slot][:len(raw)] = raw
    outs = []
    for slot, s in enumerate(lir.outputs):
        shape = graph.node(s.node).shape
        n = int(np.prod(shape.concrete(symbols), dtype=np.int64)) * shape.dtype.itemsize
        outs.append(reference.to_boundary(_from_bytes(slots["output"][slot][:n], shape.concrete(symbols),
                                                      shape.dtype), shape.dtype))
    return outs


def _expected_intervals(lir: LirModule) -> dict[NodeId, tuple[int, int]]:
    """Liveness recomputed from scratch: from a value's step to the last read of it or of any view of it."""
    graph = lir.graph
    pos = {nid: i for i, nid in enumerate(lir.schedule)}

    def owner(nid: NodeId) -> NodeId:
        while lir.buffers[nid].storage == "view":
            nid = lir.buffers[nid].source
        return nid

    out = {nid: (pos[nid], pos[nid]) for nid, b in lir.buffers.items() if b.storage == "arena"}
    for nid in lir.schedule:
        for i in graph.node(nid).inputs:
            o = owner(i)
            if o in out:
                out[o] = (out[o][0], max(out[o][1], pos[nid]))
    for _, nid in lir.output_copies:
        o = owner(nid)
        if o in out:
            out[o] = (out[o][0], len(lir.schedule))
    return out


def check_plan(lir: LirModule) -> None:
    """Structural invariants of a plan."""
    graph = lir.graph
    intervals = live_intervals(lir)
    assert {k: (v[2], v[3]) for k, v in intervals.items()} == _expected_intervals(lir)
    items = sorted(intervals.items())
    for i, (a, (oa, na, sa, ea)) in enumerate(items):
        assert oa % ALIGN == 0 and oa + na <= lir.arena_bytes
        assert na == graph.node(a).shape.max_nbytes
        for b, (ob, nb, sb, eb) in items[i + 1:]:
            if sa <= eb and sb <= ea and na and nb:
                assert oa + na <= ob or ob + nb <= oa, f"%{a} and %{b} are live together and overlap"
    # Views stay inside their source's storage.
    for nid, buf in lir.buffers.items():
        if buf.storage == "view":
            src = lir.buffers[buf.source]
            assert buf.source in graph.node(nid).inputs
            assert buf.offset + buf.nbytes <= src.nbytes
    # Each output slot is either computed in place or copied, exactly once.
    placed = {b.slot: nid for nid, b in lir.buffers.items() if b.storage == "output"}
    copied = dict(lir.output_copies)
    assert set(placed) | set(copied) == set(range(len(lir.outputs))) and not set(placed) & set(copied)
    for slot, s in enumerate(lir.outputs):
        assert placed.get(slot, copied.get(slot)) == s.node == graph.outputs[slot]
    assert lir.naive_bytes >= lir.arena_bytes


# ── random graphs ──────────────────────────────────────────────────────


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=random_cases(max_ops=14), level=st.sampled_from([0, 1, 2]))
def test_random_plans_are_sound(case: Case, level: int) -> None:
    graph = optimize(case.graph, level)
    lir = plan(graph)
    check_plan(lir)
    want = reference.run(graph, case.inputs, case.params)
    got = execute_plan(lir, case.inputs, case.params)
    for w, o in zip(want, got):
        np.testing.assert_array_equal(o, w)


def _chain(n: int, width: int = 64) -> Graph:
    g = Graph("chain")
    x = g.input("x", [width])
    vals = [x]
    for i in range(n):
        # Each step reads the previous value and one from three steps back: intervals of varied length.
        vals.append(g.add_(vals[-1], vals[max(0, len(vals) - 3)]) if i % 2 else g.activation("tanh", vals[-1]))
    g.set_outputs([vals[-1]])
    return g


def test_chain_reuses_memory() -> None:
    lir = plan(_chain(40))
    check_plan(lir)
    assert lir.reuse_ratio > 5
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    np.testing.assert_array_equal(execute_plan(lir, {"x": x}, {})[0], reference.run(lir.graph, {"x": x})[0])


# ── views and outputs ──────────────────────────────────────────────────


def test_views_alias_their_source() -> None:
    g = Graph("v")
    b = Dim.dynamic("b", max=4)
    x = g.input("x", [b, 6])
    t = g.activation("tanh", x)
    r = g.reshape(t, [b * 6])  # view, offset 0
    c = g.cast(t, "f32")  # same-dtype cast: a view
    row = g.narrow(g.activation("neg", x), 1, 2, 3)  # a dynamic outer dim: strided, so not a view
    flat = g.activation("exp", g.constant(np.arange(12, dtype=np.float32).reshape(1, 3, 4)))
    mid = g.narrow(flat, 1, 1, 2)  # outer dims 1, static inner: view at byte 1*4*4
    g.set_outputs([g.add_(g.reshape(r, [b, 6]), c), row, g.activation("relu", mid)])
    lir = plan(g)
    check_plan(lir)
    bufs = lir.buffers
    assert (bufs[r].storage, bufs[r].source, bufs[r].offset) == ("view", t, 0)
    assert (bufs[c].storage, bufs[c].source) == ("view", t)
    assert bufs[row].storage == "output"
    assert (bufs[mid].storage, bufs[mid].source, bufs[mid].offset) == ("view", flat, 16)
    xs = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    for got, want in zip(execute_plan(lir, {"x": xs}, {}), reference.run(g, {"x": xs})):
        np.testing.assert_array_equal(got, want)


def test_outputs_in_place_or_copied() -> None:
    g = Graph("o")
    x = g.input("x", [4])
    p = g.param("p", [4])
    y = g.activation("tanh", x)
    z = g.reshape(y, [2, 2])  # a view of an output: copied
    g.set_outputs({"y": y, "y_again": y, "x": x, "z": z, "p": p, "c": g.constant(np.ones(4, np.float32))})
    lir = plan(g)
    check_plan(lir)
    assert lir.buffers[y].storage == "output" and lir.buffers[y].slot == 0
    assert [slot for slot, _ in lir.output_copies] == [1, 2, 3, 4, 5]
    xs = np.arange(4, dtype=np.float32)
    ps = np.full(4, 7.0, np.float32)
    for got, want in zip(execute_plan(lir, {"x": xs}, {"p": ps}), reference.run(g, {"x": xs}, {"p": ps})):
        np.testing.assert_array_equal(got, want)


def test_copied_output_source_stays_live_to_the_end() -> None:
    g = Graph("late")
    x = g.input("x", [16])
    a = g.activation("tanh", x)
    view = g.reshape(a, [4, 4])  # output through a view: `a` must survive every later step
    y = x
    for _ in range(6):
        y = g.activation("sin", y)
    g.set_outputs([view, y])
    lir = plan(g)
    check_plan(lir)
    assert live_intervals(lir)[a][3] == len(lir.schedule)
    xs = np.linspace(0, 1, 16, dtype=np.float32)
    for got, want in zip(execute_plan(lir, {"x": xs}, {}), reference.run(g, {"x": xs})):
        np.testing.assert_array_equal(got, want)


def test_symbols_must_be_deducible() -> None:
    g = Graph("sym")
    n = Dim.dynamic("n", max=4)
    x = g.input("x", [n * 2])
    g.set_outputs([g.activation("neg", x)])
    with pytest.raises(IRError, match="cannot be known at run time"):
        plan(g)


# ── BERT ───────────────────────────────────────────────────────────────


def test_bert_arena_reuse() -> None:
    g = optimize(bert_graph(layers=6, hidden=384, heads=12, ffn=1536, max_batch=32, max_seq=128), 2)
    lir = plan(g)
    check_plan(lir)
    kinds = {n.kind for n in g.nodes}
    assert {"fused_matmul_bias_act", "fused_residual_layer_norm", "attention"} <= kinds
    assert lir.symbols == (("batch", 32), ("seq", 128))
    mib = 1 << 20
    print(f"\nBERT 6x384 (batch<=32, seq<=128): arena {lir.arena_bytes / mib:.1f} MiB, "
          f"naive {lir.naive_bytes / mib:.1f} MiB, reuse x{lir.reuse_ratio:.2f}")
    assert lir.reuse_ratio > 1
    # The biggest live set is one FFN intermediate plus a few hidden-sized values.
    ffn_bytes = 32 * 128 * 1536 * 4
    hidden_bytes = 32 * 128 * 384 * 4
    assert lir.arena_bytes <= ffn_bytes + 4 * hidden_bytes


def test_small_bert_runs_through_its_plan() -> None:
    g = bert_graph(layers=2, hidden=16, heads=4, ffn=32, vocab=20, max_batch=2, max_seq=6)
    rng = np.random.default_rng(5)
    params = {n.op.name: (rng.standard_normal(n.op.user_shape.static_dims) * 0.3).astype(np.float32)
              for n in g.params()}
    inputs = {"input_ids": rng.integers(0, 20, (2, 5)).astype(np.int32),
              "attention_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.float32),
              "position_ids": np.tile(np.arange(5, dtype=np.int32), (2, 1))}
    for level in (0, 2):
        opt = optimize(g, level)
        lir = plan(opt)
        check_plan(lir)
        np.testing.assert_array_equal(execute_plan(lir, inputs, params)[0], reference.run(opt, inputs, params)[0])


def test_checks_catch_an_overlapping_plan() -> None:
    """The checks above are not vacuous: put every arena value at offset 0 and both notice."""
    import dataclasses

    lir = plan(_chain(10))
    broken = dataclasses.replace(lir, buffers={
        nid: dataclasses.replace(b, offset=0) if b.storage == "arena" else b for nid, b in lir.buffers.items()})
    with pytest.raises(AssertionError, match="live together and overlap"):
        check_plan(broken)
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    assert not np.array_equal(execute_plan(broken, {"x": x}, {})[0], reference.run(lir.graph, {"x": x})[0])


def test_hold_norm_inputs_keeps_them_apart_from_the_gemm_after_the_norm() -> None:
    """memplan's hold_norm_inputs (the CUDA plan): a norm's inputs stay live through the GEMM that reads its output
    next, so that GEMM's output never takes their bytes (rlx_gemm_small computes the norm in its prologue, its
    blocks reading the inputs while others write); without it the planner may reuse them."""
    from rlx.opt.memplan import norm_gemm_pairs
    from tests.gpu.gemm_common import norm_graph

    g = norm_graph(keep_s=False)

    def span(lir, nid):
        b = lir.buffers[nid]
        return b.offset, b.offset + b.nbytes

    def clash(lir, norm, gemm) -> bool:
        w0, w1 = span(lir, gemm)
        return any(lir.buffers[i].storage == "arena" and span(lir, i)[0] < w1 and w0 < span(lir, i)[1]
                   for i in lir.graph.node(norm).inputs)

    loose, held = plan(g), plan(g, hold_norm_inputs=True)
    view_of = {n: (lir_b.source, lir_b.offset) for n, lir_b in held.buffers.items() if lir_b.storage == "view"}
    pairs = norm_gemm_pairs(held.graph, held.schedule, view_of)
    assert len(pairs) == 3  # layer norm, residual layer norm, RMS norm: each right before its GEMM
    assert any(clash(loose, n, m) for n, m in pairs)  # the residual norm's inputs are reused by its GEMM
    assert not any(clash(held, n, m) for n, m in pairs)
    assert held.arena_bytes >= loose.arena_bytes


def test_hold_norm_inputs_keeps_a_matmuls_input_apart_from_the_residual_add_after_it() -> None:
    """With hold_norm_inputs (the CUDA plan) a matmul's A stays live through the residual add scheduled right after it
    (`gemm_residual_pairs`): the add's output never takes A's bytes, so a one-row decode GEMV (CUDA's rlx_dgemv) may
    write the sum while other blocks still read A; without it the planner reuses them (A dies at the matmul)."""
    from rlx.opt.memplan import gemm_residual_pairs

    g = Graph("residual")
    x = g.input("x", [4, 64])
    a = g.activation("tanh", x)  # A: an arena value read by the matmul only
    y = g.add_(g.matmul(a, g.param("w", [64, 64])), x)
    g.set_outputs([g.activation("neg", g.mul(y, y))])

    def overlap(lir, p: int, q: int) -> bool:
        bp, bq = lir.buffers[p], lir.buffers[q]
        return bp.offset < bq.offset + bq.nbytes and bq.offset < bp.offset + bp.nbytes

    loose, held = plan(g), plan(g, hold_norm_inputs=True)
    pairs = gemm_residual_pairs(held.graph, held.schedule)
    assert len(pairs) == 1
    gemm, add = pairs[0]
    assert overlap(loose, held.graph.node(gemm).inputs[0], add)
    assert not overlap(held, held.graph.node(gemm).inputs[0], add)

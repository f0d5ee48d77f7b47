"""`ResidentTable`: which gathered-from params the CPU lowering keeps in the context's own pages, that such a table
bound in place is read there by runs of few rows and copied into its slot by the first run gathering many, and that
every run computes what the reference computes, bit for bit what a build reading the table in place computes."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.driver import Session
from rlx.ir.decisions import ResidentTable
from rlx.opt import lowering
from rlx.opt.lowering import RESIDENT_TABLE_MIN_ROWS, lower_for
from rlx.opt.memplan import plan


def _embed(rows: int, vocab: int = 1000, width: int = 48, name: str = "embed") -> rlx.Graph:
    """Token embeddings plus a small position table, then a layer norm: BERT's embedding block."""
    g = rlx.Graph(name)
    ids = g.input("ids", [rlx.Dim.dynamic("rows", max=rows)], "i64")
    positions = g.input("positions", [rlx.Dim.dynamic("rows", max=rows)], "i64")
    x = g.add_(g.gather(g.param("table", [vocab, width]), ids), g.gather(g.param("pos", [8, width]), positions))
    g.set_outputs([g.layer_norm(x, g.param("gamma", [width]), g.param("beta", [width]))])
    return g


def _resident(g: rlx.Graph) -> dict[str, ResidentTable]:
    lir = lower_for(plan(g), "cpu")
    names = {spec.node: spec.name for spec in lir.params}
    return {names[d.node]: d for d in lir.decided(ResidentTable)}


def test_tables_gathered_a_batch_at_a_time_are_kept_resident():
    got = _resident(_embed(RESIDENT_TABLE_MIN_ROWS))
    assert set(got) == {"table", "pos"} and got["table"].rows == RESIDENT_TABLE_MIN_ROWS
    assert _resident(_embed(RESIDENT_TABLE_MIN_ROWS - 1)) == {}  # a decode step's few rows: read in place


def test_large_tables_long_rows_and_other_readers_stay_in_place(monkeypatch):
    # a table whose copy would cost more than its page walks (an 8B decoder's 1-2 GiB)
    monkeypatch.setattr(lowering, "RESIDENT_TABLE_MAX_BYTES", 1000 * 48 * 4 - 1)
    assert set(_resident(_embed(256))) == {"pos"}
    monkeypatch.undo()
    # rows of a page or more: their TLB misses are a small part of their reads
    assert _resident(_embed(256, vocab=100, width=1024)) == {}
    # a quantized table (a GGUF decoder's token_embd.weight.rows): its steps stream far more weight bytes
    g = rlx.Graph("q")
    rows = g.gather(g.param("rows", [1000, 20], "u8"), g.input("ids", [rlx.Dim.dynamic("rows", max=256)], "i64"))
    g.set_outputs([g.dequantize(rows, quant="q4_1")])
    assert _resident(g) == {}
    # a table that a GEMM also reads (a tied head): the GEMM's own layout decides
    g = rlx.Graph("tied")
    table = g.param("table", [1000, 48])
    h = g.gather(table, g.input("ids", [rlx.Dim.dynamic("rows", max=256)], "i64"))
    g.set_outputs([g.matmul(h, g.transpose(table, [1, 0]))])
    assert _resident(g) == {}


def _read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def _params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"table": rng.standard_normal((1000, 48)).astype(np.float32),
            "pos": rng.standard_normal((8, 48)).astype(np.float32),
            "gamma": (rng.standard_normal(48) + 1).astype(np.float32),
            "beta": rng.standard_normal(48).astype(np.float32)}


def _stored(cg, name: str) -> np.ndarray | None:
    """Param `name` as the context holds it in its own slot, or None while it is bound elsewhere."""
    from rlx.runtime.abi import ffi

    data = ffi.new("const void **")
    size = cg._lib.rlx_param_stored(cg._ctx, cg.param_names.index(name), data)
    return None if size < 0 else np.frombuffer(ffi.buffer(data[0], size), np.uint8).copy()


def test_a_bound_table_is_copied_by_the_first_wide_run_and_computes_the_same(monkeypatch):
    rng = np.random.default_rng(7)
    params = _params(rng)
    cg = Session(rlx.Device.CPU).compile(_embed(256))
    assert [d.min_rows for d in cg.lir.decided(ResidentTable)] == [RESIDENT_TABLE_MIN_ROWS] * 2
    assert "first run gathering >= 64 rows" in cg.lir.inspect()
    entry = next(line for line in cg.source.splitlines() if line.lstrip().startswith('{"table",'))
    assert "RLX_PARAM_RESIDENT" in entry and "rlx_resident_table(ctx, 0, " in cg.source
    for name, value in params.items():
        cg.set_param(name, _read_only(value))
    assert cg.params_in_place == ("table", "pos", "gamma", "beta") and cg.params_stored == ()
    monkeypatch.setattr(lowering, "RESIDENT_TABLE_MIN_ROWS", 1 << 40)
    in_place = Session(rlx.Device.CPU).compile(_embed(256, name="embed_in_place"))
    assert not in_place.lir.decided(ResidentTable)
    for name, value in params.items():
        in_place.set_param(name, _read_only(value))
    copied = None
    for rows in (1, RESIDENT_TABLE_MIN_ROWS - 1, RESIDENT_TABLE_MIN_ROWS, 3, 256):
        feeds = {"ids": rng.integers(0, 1000, rows), "positions": rng.integers(0, 8, rows)}
        got = cg.run(**feeds)[0]
        if rows < RESIDENT_TABLE_MIN_ROWS and copied is None:
            assert _stored(cg, "table") is None  # still read where it is bound
        else:  # the first wide run copied it into its slot (64-byte padded)
            copied = _stored(cg, "table")
            assert copied is not None and copied[:params["table"].nbytes].tobytes() == params["table"].tobytes()
        np.testing.assert_array_equal(got, in_place.run(**feeds)[0])
        np.testing.assert_allclose(got, rlx.reference.run(_embed(256), feeds, params)[0], rtol=1e-5, atol=1e-5)
    # a clone copies the slot with the context's other ones
    np.testing.assert_array_equal(cg.clone().run(**feeds)[0], got)
    # binding another table reads that one, until a wide run copies it in turn
    other = dict(params, table=params["table"][::-1].copy())
    cg.set_param("table", _read_only(other["table"]))
    assert _stored(cg, "table") is None
    for rows in (5, 100):
        feeds = {"ids": rng.integers(0, 1000, rows), "positions": rng.integers(0, 8, rows)}
        np.testing.assert_allclose(cg.run(**feeds)[0], rlx.reference.run(_embed(256), feeds, other)[0],
                                   rtol=1e-5, atol=1e-5)
    assert _stored(cg, "table")[:other["table"].nbytes].tobytes() == other["table"].tobytes()


def test_a_writable_table_is_copied_at_set_param():
    rng = np.random.default_rng(3)
    params = _params(rng)
    cg = Session(rlx.Device.CPU).compile(_embed(256, name="embed_writable"))
    for name, value in params.items():
        cg.set_param(name, value)
    assert cg.params_in_place == () and _stored(cg, "table")[:params["table"].nbytes].tobytes() == params[
        "table"].tobytes()
    feeds = {"ids": rng.integers(0, 1000, 100), "positions": rng.integers(0, 8, 100)}
    np.testing.assert_allclose(cg.run(**feeds)[0], rlx.reference.run(_embed(256), feeds, params)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [-1, 1000])
def test_a_bad_index_into_a_resident_table_is_a_clear_error(bad):
    cg = Session(rlx.Device.CPU).compile(_embed(256, name="embed_bad"))
    for name, value in _params(np.random.default_rng(1)).items():
        cg.set_param(name, value)
    with pytest.raises(rlx.errors.ExecutionError, match="gather index"):
        cg.run(ids=np.array([3, bad, 4]), positions=np.array([0, 1, 2]))

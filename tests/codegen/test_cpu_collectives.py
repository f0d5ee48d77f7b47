"""Compiled CPU collectives: ranks as threads over the shared-memory transport equal the reference."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.errors import ExecutionError
from rlx.ir import ops as O
from rlx.runtime.transport import ShmRegion, attach_shm

TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "cpu"


def _collectives_graph(world: int) -> rlx.Graph:
    g = rlx.Graph(f"collectives{world}")
    x = g.input("x", [6, rlx.Dim.dynamic("n", max=5), 6])
    outs = [
        g.activation("relu", g.add(O.AllReduce(world=world), [x])),  # followed by an ordinary kernel
        g.add(O.AllReduce(world=world, reduce="max"), [x]),
        g.add(O.AllGather(world=world, axis=0), [x]),  # rank-major: written in place
        g.add(O.AllGather(world=world, axis=2), [x]),  # rows before the axis: interleaved
        g.add(O.ReduceScatter(world=world, axis=0), [x]),
        g.add(O.ReduceScatter(world=world, reduce="max", axis=2), [x]),
    ]
    g.set_outputs(outs)
    return g


def run_threads(world: int, fn):
    """fn(rank) on `world` threads; results in rank order, the first error re-raised."""
    results, errors = [None] * world, []

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as exc:  # handed to the caller
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("world", [2, 3])
def test_compiled_collectives_equal_the_reference(rng, world):
    g = _collectives_graph(world)
    first = rlx.Session().compile(g, num_threads=1)
    graphs = [first] + [first.clone() for _ in range(world - 1)]
    region = ShmRegion.local(world, slot_bytes=64 * world * 2)  # tiny slots: every collective goes in chunks
    for r, cg in enumerate(graphs):
        attach_shm(cg, region, r, timeout_s=30)
    feeds = [{"x": rng.standard_normal((6, 4, 6)).astype(np.float32)} for _ in range(world)]
    want = reference.run_ranks(g, feeds)
    for _ in range(2):  # the barrier's phases carry on across runs
        got = run_threads(world, lambda r: graphs[r].run(feeds[r]))
        for r in range(world):
            for a, b in zip(got[r], want[r]):
                np.testing.assert_array_equal(a, b)  # same rank-order reduction: the same bits


def test_no_transport_is_a_clear_error():
    g = _collectives_graph(2)
    cg = rlx.Session().compile(g, num_threads=1)
    with pytest.raises(ExecutionError, match="no transport; a graph with collectives runs once per rank"):
        cg.run(x=np.ones((6, 2, 6), np.float32))


def test_a_missing_rank_times_out_and_abort_releases_the_others():
    g = _collectives_graph(2)
    cg = rlx.Session().compile(g, num_threads=1)
    region = ShmRegion.local(2)
    attach_shm(cg, region, 0, timeout_s=0.3)
    t0 = time.perf_counter()
    with pytest.raises(ExecutionError, match="rank 0 of 2: timed out waiting for the other ranks"):
        cg.run(x=np.ones((6, 2, 6), np.float32))
    assert time.perf_counter() - t0 < 10
    assert region.aborted  # the timed-out rank raised the flag for the others
    with pytest.raises(ExecutionError, match="another rank failed"):
        cg.run(x=np.ones((6, 2, 6), np.float32))


def test_graphs_without_collectives_are_unchanged():
    from rlx.codegen.cpu.emit import CTarget
    from rlx.opt.memplan import plan
    from rlx.pipeline.cpu import render_c

    g = rlx.Graph("plain")
    g.set_outputs([g.activation("relu", g.input("x", [4]))])
    src = render_c(plan(g), CTarget(), {"name": "plain"})
    assert "transport" not in src.lower()
    cg = rlx.Session().compile(g)
    with pytest.raises(ExecutionError, match="has no collective ops, so it takes no transport"):
        cg.set_transport(None)
    coll = render_c(plan(_collectives_graph(2)), CTarget(), {"name": "c"})
    assert "const struct RlxTransport *transport;" in coll and "rlx_set_transport" in coll


def test_the_transport_table_is_declared_once():
    """kernels/transport.h is the one declaration: rlx.h includes it (an artifact's copy inlines it)
    and the cffi declaration is read from it."""
    from rlx.runtime.abi import CDEF, standalone_header

    table = (TEMPLATES / "kernels" / "transport.h").read_text()
    rlx_h = (TEMPLATES / "rlx.h").read_text()
    assert "typedef struct RlxTransport" not in rlx_h and '#include "kernels/transport.h"' in rlx_h
    assert table.rstrip("\n") in standalone_header(TEMPLATES / "rlx.h")
    assert "typedef struct RlxTransport" in CDEF and "rlx_set_transport" in CDEF
    assert not any(line.lstrip().startswith("#") for line in CDEF.splitlines())


def test_support_and_legalized_half():
    g = rlx.Graph("half")
    x = g.input("x", [4], "f16")
    g.set_outputs([g.add(O.AllReduce(world=2), [x])])
    assert rlx.Session().first_unsupported_op(g) is None  # f16 reduces in f32 between casts
    cgs = [rlx.Session().compile(g, num_threads=1) for _ in range(2)]
    region = ShmRegion.local(2)
    for r in range(2):
        attach_shm(cgs[r], region, r, timeout_s=30)
    feeds = [{"x": np.array([1, 2, 3, 4], np.float16) * (r + 1)} for r in range(2)]
    got = run_threads(2, lambda r: cgs[r].run(feeds[r])[0])
    np.testing.assert_array_equal(got[0], reference.run_ranks(g, feeds)[0][0])


def test_a_saved_artifact_takes_a_transport(tmp_path, rng):
    g = _collectives_graph(2)
    rlx.Session().compile(g, num_threads=1).save(tmp_path / "art")
    graphs = [rlx.load(tmp_path / "art") for _ in range(2)]  # no code generator: the library's own exports
    region = ShmRegion.local(2)
    for r, cg in enumerate(graphs):
        cg.num_threads = 1
        attach_shm(cg, region, r, timeout_s=30)
    feeds = [{"x": rng.standard_normal((6, 3, 6)).astype(np.float32)} for _ in range(2)]
    got = run_threads(2, lambda r: graphs[r].run(feeds[r]))
    for a, b in zip(got[1], reference.run_ranks(g, feeds)[1]):
        np.testing.assert_array_equal(a, b)

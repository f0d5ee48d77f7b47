"""CUDA `cond` and `while_loop` on a real GPU: only the branch the device predicate picks runs, the loop runs only
the trips its cond allows, and the values equal rlx.reference's.

Each feed runs three times. A graph's first run is eager (the host reads the predicate back and branches) and is then
captured as a CUDA graph (cond: two IF nodes, while_loop: a WHILE node; CUDA 12.3+), which every later run replays
(`captured_graphs` checks the capture held: a failed one would leave the runs eager, and still right).
The graphs (tests/gpu/control_common.py) gather out of range in exactly the work that must not run, which raises
the device error flag ("gather index out of range") if it does: the select / masked-scan fallback that ran before
fails these feeds, so passing them shows the untaken branch and the trips past the cond never ran.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx import reference
from rlx.driver import Device, Session
from rlx.toolchain.cuda import visible_gpu_arch
from tests.gpu.control_common import (
    ROWS,
    control_decisions,
    guarded_cond_feeds,
    guarded_cond_graph,
    guarded_while_feed,
    guarded_while_graph,
    nested_while_graph,
)

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases", Path(__file__).parent / "cases.py")
cases = importlib.util.module_from_spec(_spec)
sys.modules["rlx_cuda_cases"] = cases
_spec.loader.exec_module(cases)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]


def _runs(cg, graph, feed: dict, what: str) -> np.ndarray:
    """The graph's one output over three runs of `feed` (eager, capture, replay), each equal to the reference."""
    ref = reference.run(graph, feed, {})[0]
    outs = [cg.run(feed)[0] for _ in range(3)]
    for k, out in enumerate(outs):
        np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6, err_msg=f"{what}: run {k} vs the reference")
    return ref


def test_cond_runs_only_the_taken_branch() -> None:
    g = guarded_cond_graph()
    cg = Session(Device.CUDA).compile(g)
    assert [d.how for d in control_decisions(g)] == ["branch"]
    feeds = guarded_cond_feeds()
    # true branch: the false branch's gather reads rows 1000, -7, ... (it would raise if it ran)
    ref = _runs(cg, g, feeds[0], "true branch")
    np.testing.assert_allclose(ref, np.tanh(feeds[0]["x"]) * 2, rtol=1e-6)
    # false branch: its gather is in range; alternate the outcomes on the same captured graph
    _runs(cg, g, feeds[1], "false branch")
    _runs(cg, g, feeds[0], "true branch again")
    assert cg.captured_graphs == 1, "the run with IF nodes was not captured (runs went eager: CUDA runtime < 12.3?)"


@pytest.mark.parametrize("max_trips", [None, 8, 2])
def test_while_loop_runs_only_the_trips_its_cond_allows(max_trips: int | None) -> None:
    g = guarded_while_graph(max_trips)
    assert [d.how for d in control_decisions(g)] == ["loop"]
    cg = Session(Device.CUDA).compile(g)
    for limit in (0, 1, 3, ROWS, 2.5):  # ROWS: one more trip would gather row ROWS, out of range
        ref = _runs(cg, g, guarded_while_feed(limit), f"max_trips={max_trips} limit={limit}")
        trips = min(int(np.ceil(limit)), ROWS if max_trips is None else max_trips)
        assert ref[0] == trips
    assert cg.captured_graphs == 1, "the run with a WHILE node was not captured (runs went eager: CUDA runtime < 12.3?)"


def test_the_fallback_would_have_run_the_untaken_work() -> None:
    """The control: the same loop bounded by max_trips, forced through the masked scan (a body holding a scan is
    not taken by the rule), runs the guarded body past the cond and raises; the rule's loop does not."""
    from rlx.errors import RlxError

    g = nested_while_graph()
    assert [d.how for d in control_decisions(g)] == ["masked scan"]
    cg = Session(Device.CUDA).compile(g)
    with pytest.raises(RlxError, match="gather index out of range"):
        cg.run(guarded_while_feed(ROWS))


def test_control_flow_case_with_a_gemm_branch() -> None:
    """tests/gpu/cases.py's control_flow (a GEMM branch, a bounded loop), both branches, eager then replayed."""
    case = cases.CASES["control_flow"]()
    cg = Session(Device.CUDA).compile(case.graph)
    for i, feed in enumerate(case.feeds):
        refs = reference.run(case.graph, feed, case.params)
        for k in range(3):
            for o, r in zip(cg.run(feed), refs):
                np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5, err_msg=f"feed {i} run {k}")

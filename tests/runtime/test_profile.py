"""The profiled build variant: spans per kernel and per OpenMP thread, chrome-trace JSON, top ops."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.errors import ExecutionError
from rlx.runtime.profile import chrome_trace, top_ops


def mlp_graph() -> rlx.Graph:
    g = rlx.Graph("prof_mlp")
    x = g.input("x", [rlx.Dim.dynamic("n", max=64), 128])
    h = g.activation("gelu", g.matmul(x, g.param("w1", [128, 256])))
    y = g.softmax(g.matmul(h, g.param("w2", [256, 64])), -1)
    g.set_outputs([g.reduce("sum", g.mul(y, y), [1])])
    return g


PARAMS = {"w1": np.random.default_rng(0).standard_normal((128, 256)).astype(np.float32) * 0.1,
          "w2": np.random.default_rng(1).standard_normal((256, 64)).astype(np.float32) * 0.1}


@pytest.fixture(scope="module")
def profiled() -> rlx.CompiledGraph:
    cg = rlx.Session(profile=True).compile(mlp_graph(), num_threads=2)
    for k, v in PARAMS.items():
        cg.set_param(k, v)
    return cg


def kernel_count(cg) -> int:
    from rlx.runtime.profile import profile_info

    return len(profile_info(cg._lib)["kernels"])


def test_profiled_build_computes_what_the_reference_does(profiled):
    x = np.random.default_rng(2).standard_normal((48, 128)).astype(np.float32)
    (got,) = profiled.run(x=x)
    (want,) = reference.run(mlp_graph(), {"x": x}, PARAMS)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_one_span_per_kernel_per_run_in_schedule_order(profiled):
    profiled.trace(clear=True)
    runs = 3
    for _ in range(runs):
        profiled.run(x=np.ones((64, 128), np.float32))
    spans = profiled.trace()
    kernels = [s for s in spans if s.thread == -1]
    n = kernel_count(profiled)
    assert n >= 3 and len(kernels) == runs * n
    by_run: dict[int, list] = {}
    for s in kernels:
        by_run.setdefault(s.run, []).append(s)
    assert len(by_run) == runs
    previous_end = 0
    for run in sorted(by_run):
        seq = by_run[run]
        assert [s.kernel for s in seq] == list(range(n))  # each kernel once, in schedule order
        for s in seq:
            assert previous_end <= s.start_ns <= s.end_ns  # timestamps never go back
            previous_end = s.end_ns
    # per-thread spans lie inside their kernel's span, on real OpenMP thread numbers
    threads = [s for s in spans if s.thread >= 0]
    assert threads, "the parallel regions of the GEMMs record per-thread spans"
    for t in threads:
        k = next(s for s in kernels if s.run == t.run and s.kernel == t.kernel)
        assert k.start_ns <= t.start_ns <= t.end_ns <= k.end_ns
        assert 0 <= t.thread < 2


def test_costs_follow_the_dynamic_dims(profiled):
    profiled.trace(clear=True)
    profiled.run(x=np.ones((8, 128), np.float32))
    profiled.run(x=np.ones((16, 128), np.float32))
    first_gemm = [s for s in profiled.trace() if s.thread == -1 and s.kernel == 0]
    assert [s.flops for s in first_gemm] == [2 * 8 * 128 * 256 + 8 * 256, 2 * 16 * 128 * 256 + 16 * 256]
    assert first_gemm[1].bytes == 4 * (16 * 128 + 128 * 256 + 16 * 256)


def test_chrome_trace_is_valid_and_complete(profiled, tmp_path: Path):
    profiled.trace(clear=True)
    profiled.run(x=np.ones((32, 128), np.float32))
    path = profiled.save_trace(tmp_path / "t.json")
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(profiled.trace())
    for e in events:  # the fields the Trace Event Format requires of these phases
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["name"], str) and e["name"]
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] >= 0 and e["ts"] >= 0
            assert isinstance(e["args"]["node"], int)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "kernels" in names
    kernel_events = [e for e in complete if e["tid"] == 0]
    assert len(kernel_events) == kernel_count(profiled)


def test_top_ops_shares(profiled):
    profiled.trace(clear=True)
    for _ in range(2):
        profiled.run(x=np.ones((64, 128), np.float32))
    rows = top_ops(profiled.trace())
    assert len(rows) == kernel_count(profiled)
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    assert all(r.calls == 2 for r in rows)
    assert rows == sorted(rows, key=lambda r: -r.seconds)
    gemm = next(r for r in rows if r.flops > 0 and "matmul" in r.label)
    assert gemm.flop_rate > 0 and gemm.byte_rate > 0


def test_pooled_contexts_are_traced_too(profiled):
    from concurrent.futures import ThreadPoolExecutor

    profiled.trace(clear=True)
    x = np.ones((4, 128), np.float32)
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda _: profiled.run(x=x), range(6)))
    kernels = [s for s in profiled.trace() if s.thread == -1]
    assert len(kernels) == 6 * kernel_count(profiled)


def test_normal_build_has_no_profiling_code():
    normal = rlx.Session().compile(mlp_graph())
    prof = rlx.Session(profile=True).compile(mlp_graph())
    assert normal.key != prof.key
    assert not normal.profiled and prof.profiled
    src = normal.source
    for token in ("rlx_prof", "rlx_tspan", "rlx_now_ns", "kernels/profile.h", "rlx_profile_"):
        assert token not in src
    assert "rlx_prof_record" in prof.source and "reduction(rlx_prof:rlx_ts)" in prof.source
    with pytest.raises(ExecutionError, match="not built profiled"):
        normal.trace()


def test_profile_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RLX_PROFILE", "1")
    assert rlx.Session().compile(mlp_graph()).profiled
    monkeypatch.setenv("RLX_PROFILE", "0")
    assert not rlx.Session().compile(mlp_graph()).profiled
    assert rlx.Session(profile=True).config.profile  # the argument overrides the environment


def test_chrome_trace_of_nothing():
    doc = chrome_trace([], name="empty")
    assert [e["ph"] for e in doc["traceEvents"]] == ["M", "M"]


def test_top_ops_busy_share_of_the_threads(profiled):
    """`busy` is the threads' span time over (threads x the kernel's span): within (0, 1] for the GEMMs'
    parallel regions, absent for ops that record no per-thread spans."""
    profiled.trace(clear=True)
    profiled.run(x=np.ones((64, 128), np.float32))
    spans = profiled.trace()
    rows = top_ops(spans)
    threaded = {s.kernel for s in spans if s.thread >= 0}
    assert threaded, "the GEMMs' parallel regions record per-thread spans"
    kernel_of = {s.node: s.kernel for s in spans if s.thread == -1}
    for r in rows:
        if kernel_of[r.node] in threaded:
            assert r.busy is not None and 0.0 < r.busy <= 1.0
            k = next(s for s in spans if s.thread == -1 and s.node == r.node)
            ts = [s for s in spans if s.thread >= 0 and s.kernel == k.kernel]
            assert r.busy == pytest.approx(sum(t.duration_ns for t in ts) / (len(ts) * k.duration_ns))
        else:
            assert r.busy is None

"""The profiled CUDA build on a real GPU: one cudaEvent span per timed kernel per run, chrome-trace JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx import reference
from rlx.driver import Device, Session
from rlx.runtime.profile import profile_info, top_ops
from rlx.toolchain.cuda import visible_gpu_arch

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases_gpu_profile", Path(__file__).parent / "cases.py")
cases = importlib.util.module_from_spec(_spec)
sys.modules["rlx_cuda_cases_gpu_profile"] = cases
_spec.loader.exec_module(cases)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]


def test_profiled_cuda_trace(tmp_path: Path):
    case = cases.CASES["minilm_like"]()
    cg = Session(Device.CUDA, profile=True).compile(case.graph)
    assert cg.profiled
    for k, v in case.params.items():
        cg.set_param(k, v)
    runs = 3
    for _ in range(runs):
        outs = cg.run(case.feeds[0])
    want = reference.run(case.graph, case.feeds[0], case.params)
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.sqrt(np.mean(ref ** 2)) + 1e-6))
    n = len(profile_info(cg._lib)["kernels"])
    spans = cg.trace()
    assert len(spans) == runs * n and all(s.thread == -1 for s in spans)
    by_run: dict[int, list] = {}
    for s in spans:
        by_run.setdefault(s.run, []).append(s)
    previous = 0
    for run in sorted(by_run):
        seq = by_run[run]
        assert [s.kernel for s in seq] == list(range(n))
        for s in seq:
            assert previous <= s.start_ns <= s.end_ns
            previous = s.end_ns
    assert sum(r.share for r in top_ops(spans)) == pytest.approx(1.0)
    doc = json.loads(cg.save_trace(tmp_path / "cuda.json").read_text())
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "X") == runs * n


def test_normal_cuda_build_is_not_profiled():
    case = cases.CASES["minilm_like"]()
    cg = Session(Device.CUDA).compile(case.graph)
    assert not cg.profiled and "prof_ev" not in cg.source

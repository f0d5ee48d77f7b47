"""Shared helpers for CPU backend tests: compile a graph, run it, compare with the reference."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.config import Config
from rlx.driver import Session
from rlx.runtime.compiled import CompiledGraph

REPO = Path(__file__).resolve().parents[2]

#: One float32 rounding (unit roundoff 2^-24): the reference rounds every f32 op once.
U32 = 2.0 ** -24


def session(**changes: object) -> Session:
    import dataclasses

    return Session(rlx.Device.CPU, dataclasses.replace(Config.from_env(), **changes))


def compile_graph(g: rlx.Graph, params: Mapping[str, np.ndarray] | None = None, *, opt_level: int = 0,
                  **config: object) -> CompiledGraph:
    """Compile `g` as written (opt_level 0 unless asked) and set its params."""
    cg = session(**config).compile(g, opt_level=opt_level)
    for name, value in (params or {}).items():
        cg.set_param(name, value)
    return cg


def check(g: rlx.Graph, inputs: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray] | None = None, *,
          rtol: float, atol: float, cg: CompiledGraph | None = None, opt_level: int = 0) -> list[np.ndarray]:
    """Run `g` compiled and through the reference; every output must agree within rtol/atol."""
    cg = cg or compile_graph(g, params, opt_level=opt_level)
    got = cg.run(dict(inputs))
    want = rlx.reference.run(g, dict(inputs), dict(params or {}))
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, f"output {i}: shape {a.shape} vs reference {b.shape}"
        assert a.dtype == b.dtype, f"output {i}: dtype {a.dtype} vs reference {b.dtype}"
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, b, err_msg=f"output {i} ({g.output_names[i]})")
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {i} ({g.output_names[i]})")
    return got


def gemm_bound(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """Forward error bound of an f32 dot-product accumulation: k * u * (|a| @ |b|) (Higham, Thm 3.5)."""
    return (k + 2) * U32 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))


def assert_within(got: np.ndarray, want: np.ndarray, bound: np.ndarray | float, what: str = "") -> None:
    """|got - want| <= bound elementwise, with a readable report of the worst element."""
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    excess = err - bound
    if np.any(excess > 0) or np.any(np.isnan(got) != np.isnan(want)):
        i = np.unravel_index(np.nanargmax(excess), excess.shape)
        b = bound[i] if isinstance(bound, np.ndarray) else bound
        raise AssertionError(f"{what}: {int(np.sum(excess > 0))} elements exceed the bound; worst at {i}: "
                             f"got {got[i]!r}, want {want[i]!r}, |err| {err[i]:.3g} > bound {b:.3g}")


def sanitizer_env(kind: str, options: dict[str, str], *extra_paths: Path) -> dict[str, str]:
    """The environment of a child Python whose generated libraries build with `-fsanitize=kind`.

    The sanitizer runtime must be the first library loaded, so it is preloaded; skips (the only
    reason being a missing optional tool) when there is no C compiler or it lacks that runtime.
    `options` are the sanitizer's `*_OPTIONS` variables; `extra_paths` go on PYTHONPATH after the repo.
    """
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler")
    runtime = {"address": "libasan.so", "thread": "libtsan.so"}[kind]
    lib = subprocess.run([cc, f"-print-file-name={runtime}"], capture_output=True, text=True).stdout.strip()
    if not lib or not Path(lib).is_absolute() or not Path(lib).exists():
        pytest.skip(f"the C compiler has no {runtime}")
    env = dict(os.environ)
    paths = [str(REPO), *map(str, extra_paths), env.get("PYTHONPATH", "")]
    # The suite's cache (RLX_CACHE_DIR or the per-user default), not one of the test's own: sanitized
    # builds have keys of their own (the flags), and the kernel units every sanitized program links
    # (kernels/quant.c: ~2 minutes of gcc under ASan) are then built once a run, not once a test.
    env.update({"RLX_SANITIZE": kind, "LD_PRELOAD": lib, **options, "PYTHONPATH": os.pathsep.join(paths)})
    return env


def run_with_two_spinning_threads_under_asan(script: str, ok: str, here: Path) -> None:
    """Run `script` in a child Python whose generated libraries build with AddressSanitizer and whose OpenMP threads
    spin (RLX_OMP_WAIT=active, so that small products really split over two threads); `here` goes on its path
    (the test module it imports from). It must print `ok` and exit 0; else its stderr's tail is the failure."""
    env = sanitizer_env("address", {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "RLX_OMP_WAIT": "active"}, here)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and ok in proc.stdout, proc.stderr[-6000:]


def cpu_flags() -> set[str]:
    """The CPU feature flags /proc/cpuinfo lists (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def x86_targets(*levels: str) -> list:
    """`cpu_target`s to build a test's graph for: "native", then each x86-64 level of `levels` ("x86-64",
    "x86-64-v3", "x86-64-v4"), a level this CPU lacks a feature of skipped with the reason (a level's build is
    refused there); only "native" off x86-64."""
    if os.uname().machine not in ("x86_64", "AMD64"):
        return ["native"]
    from rlx.toolchain.isa import X86_LEVELS, cpu_flags

    have = cpu_flags() or frozenset()
    what = {"x86-64-v3": "AVX2/FMA", "x86-64-v4": "AVX-512"}
    return ["native", *(pytest.param(level, marks=pytest.mark.skipif(
        not set(X86_LEVELS.get(level, ())) <= have, reason=f"this CPU has no {what.get(level, level)}"))
        for level in levels)]


def compiled_with(g: rlx.Graph, params: Mapping[str, np.ndarray], **changes: object) -> CompiledGraph:
    """`g` compiled by `session(**changes)`, with `params` set."""
    cg = session(**changes).compile(g)
    for name, value in params.items():
        cg.set_param(name, value)
    return cg


def match_reference_at(cg: CompiledGraph, g: rlx.Graph, params: Mapping[str, np.ndarray],
                       shapes: Mapping[str, tuple[int, ...]], batches: tuple[int, ...]) -> None:
    """Run `cg` at each batch size on random inputs of `shapes` (one image's): every output equals rlx.reference's
    within f32 rounding (rtol 1e-5, atol 1e-5 of the output's largest value)."""
    for batch in batches:
        rng = np.random.default_rng(batch)
        feeds = {k: rng.standard_normal((batch, *s)).astype(np.float32) for k, s in shapes.items()}
        got = cg.run(**feeds)
        want = rlx.reference.run(g, feeds, params)
        for name, a, b in zip(g.output_names, got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()), err_msg=name)

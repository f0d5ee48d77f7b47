"""`HugePageArena`: which arenas the CPU lowering sends to 2 MiB pages, and that runs before and after the arena's
pages change (the first run using enough of it drops its 4 KiB pages and advises huge ones) compute what the
reference computes, bit for bit what a build without the decision computes."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.driver import Session
from rlx.ir.decisions import HugePageArena
from rlx.opt import lowering
from rlx.opt.lowering import HUGE_ARENA_MIN_BYTES, lower_for
from rlx.opt.memplan import plan


def _ffn(rows_max: int, name: str = "ffn") -> rlx.Graph:
    """x @ w1 + b1, erf GELU, @ w2, relu: an FFN whose hidden activation dominates the arena (rows x 1024 floats)."""
    g = rlx.Graph(name)
    x = g.input("x", [rlx.Dim.dynamic("rows", max=rows_max), 256])
    h = g.activation("gelu", g.add_(g.matmul(x, g.param("w1", [256, 1024])), g.param("b1", [1024])))
    g.set_outputs([g.activation("relu", g.matmul(h, g.param("w2", [1024, 256])))])
    return g


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"w1": (rng.standard_normal((256, 1024)) / 16).astype(np.float32),
            "b1": rng.standard_normal(1024).astype(np.float32),
            "w2": (rng.standard_normal((1024, 256)) / 32).astype(np.float32)}


def test_only_arenas_of_the_tlb_reach_and_more_go_to_huge_pages():
    big, small = plan(_ffn(2048)), plan(_ffn(512))
    assert big.arena_bytes >= HUGE_ARENA_MIN_BYTES > small.arena_bytes
    assert lower_for(big, "cpu").decided(HugePageArena) == [HugePageArena(big.arena_bytes, HUGE_ARENA_MIN_BYTES)]
    assert lower_for(small, "cpu").decided(HugePageArena) == []


def _compiled(params: dict[str, np.ndarray], name: str = "ffn") -> rlx.runtime.compiled.CompiledGraph:
    cg = Session(rlx.Device.CPU).compile(_ffn(2048, name))
    for name, value in params.items():
        cg.set_param(name, value)
    return cg


def test_runs_across_the_change_of_pages_match_the_reference_and_a_build_without_it(monkeypatch):
    params = _params()
    with_huge = _compiled(params)
    assert with_huge.lir.decided(HugePageArena)
    monkeypatch.setattr(lowering, "HUGE_ARENA_MIN_BYTES", 1 << 62)
    without = _compiled(params, "ffn_small_pages")  # another graph name: not the first build's compile-index entry
    assert not without.lir.decided(HugePageArena)
    rng = np.random.default_rng(5)
    # 16 rows use a 128th of the arena (4 KiB pages stay), 2048 all of it (the pages change before that run's kernels),
    # then small and big runs again on the changed arena
    for rows in (16, 16, 2048, 16, 1500, 2048):
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        got = with_huge.run(x=x)[0]
        np.testing.assert_array_equal(got, without.run(x=x)[0])
        want = rlx.reference.run(_ffn(2048), {"x": x}, params)[0]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("rows", [1, 2048])
def test_a_clone_changes_its_own_arena(rows):
    """Each context has its own arena and flag: a clone (fresh arena, 4 KiB pages) computes the same after the
    original's arena changed pages."""
    params = _params()
    cg = _compiled(params)
    x = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float32)
    first = cg.run(x=np.ones((2048, 256), np.float32))[0]
    twin = cg.clone()
    np.testing.assert_array_equal(twin.run(x=x)[0], cg.run(x=x)[0])
    np.testing.assert_array_equal(twin.run(x=np.ones((2048, 256), np.float32))[0], first)

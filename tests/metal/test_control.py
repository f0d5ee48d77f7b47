"""Control flow on Metal: `cond` runs lowered to a select (through the emulator, against the reference);
`while_loop` lowers to a scan, which Metal has no rule for, so it is refused before any build, naming the loop."""

from __future__ import annotations

import numpy as np
import pytest
from emulator import emulate, have_compiler

import rlx
from rlx.codegen.backends import first_unsupported_op


def _cond(t):
    x, w = t.input("x", [2, 8]), t.input("w", [8, 4])
    return t.cond(x.sum() > 0, lambda v, u: (v @ u).tanh(), lambda v, u: (v * 0.5).exp().sum(-1, keepdim=True)
                  * u.sum(0, keepdim=True), x, w)


@pytest.mark.skipif(not have_compiler(), reason="no C++ compiler for the Metal emulator")
def test_cond_runs_lowered_and_matches_the_reference() -> None:
    g = rlx.trace("metal_cond", _cond)
    m = emulate(g, opt_level=2)
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((8, 4)) * 0.3).astype(np.float32)
    for sign in (1.0, -1.0):
        x = (sign * (np.abs(rng.standard_normal((2, 8))) + 0.1)).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x, "w": w})[0], rlx.reference.run(g, {"x": x, "w": w})[0],
                                   rtol=1e-5, atol=1e-6)


def test_while_loop_is_refused_before_any_build() -> None:
    def fn(t):
        return t.while_loop(lambda c: c.sum() < 9.0, lambda c: c * 2.0, t.input("x", [4]), max_trips=5)

    g = rlx.trace("metal_while", fn)
    lowered = rlx.Session(rlx.Device.METAL).lower(g).graph
    node, reason = first_unsupported_op(lowered, "metal")
    assert "no rule for scan" in reason and "while_loop" in node.label
    with pytest.raises(rlx.BuildError, match="no rule for scan"):
        emulate(g)

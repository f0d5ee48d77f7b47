"""rlx.ir.norms: the one reading of the four norm kinds' inputs."""

from __future__ import annotations

import pytest

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.graph import Graph
from rlx.ir.norms import NORM_KINDS, is_norm, norm_inputs


def _graph():
    g = Graph("norms")
    return g, g.input("x", [2, 8]), g.input("r", [2, 8]), g.input("b", [8]), g.input("w", [8]), g.input("c", [8])


@pytest.mark.parametrize(("op", "extra", "rms", "res", "bias"), [
    (O.LayerNorm(1e-5), ("w", "c"), False, False, False),
    (O.RmsNorm(1e-6), ("w",), True, False, False),
    (O.FusedResidualLayerNorm(1e-5), ("r", "w", "c"), False, True, False),
    (O.FusedResidualLayerNorm(1e-5), ("r", "b", "w", "c"), False, True, True),
    (O.FusedResidualRmsNorm(1e-6), ("r", "w"), True, True, False),
    (O.FusedResidualRmsNorm(1e-6), ("r", "b", "w"), True, True, True),
])
def test_roles_of_every_norm_kind(op, extra, rms, res, bias):
    g, x, r, b, w, c = _graph()
    ids = {"r": r, "b": b, "w": w, "c": c}
    y = g.add(op, [x, *(ids[k] for k in extra)])
    n = norm_inputs(g.node(y))
    assert is_norm(g.node(y)) and g.node(y).kind in NORM_KINDS
    assert (n.rms, n.x, n.residual, n.bias) == (rms, x, r if res else None, b if bias else None)
    assert n.params == ((w,) if rms else (w, c))
    assert n.kernel_kind == (2 if rms else 1)


def test_a_non_norm_is_refused():
    g, x, *_ = _graph()
    y = g.activation("relu", x)
    assert not is_norm(g.node(y))
    with pytest.raises(IRError, match="is not a norm"):
        norm_inputs(g.node(y))

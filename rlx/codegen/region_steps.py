"""The steps of an elementwise region as the GPU templates render them (one builder for CUDA and Metal).

A region kernel loads its inputs into values v0..v{n-1}, then computes one value per step in registers;
`region_steps` gives each step its variable, its value type in the backend's language (`vtype`), what it
computes and from which values. `as_region` reads a lone elementwise op as a region of one step, so one rule
renders both.

>>> from rlx.ir.graph import Graph
>>> g = Graph("r")
>>> x = g.input("x", [4])
>>> y = g.activation("silu", g.add_(x, x))
>>> g.set_outputs([y])
>>> node = g.node(y)
>>> reg = as_region(node)
>>> values = reg.step_shapes([g.node(i).shape for i in node.inputs])
>>> region_steps(reg, values, len(node.inputs), {d: "float" for d in (v.dtype for v in values)})
(RegionStep(var='v1', vtype='float', kind='activation', fn='silu', args=('v0',), integer=False, to='f32'),)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Node
from rlx.ir.shape import Shape


@dataclass(frozen=True)
class RegionStep:
    """One step of a region kernel: `var = kind/fn(args)` in value type `vtype`."""

    var: str
    vtype: str
    kind: str
    fn: str
    args: tuple[str, ...]
    #: Integer arguments (integer division and power have their own helpers).
    integer: bool
    #: The step's result dtype (a cast's target).
    to: str


def as_region(node: Node) -> O.ElementwiseRegion:
    """`node`'s op as a region: itself when fused, else a region of the one step it is."""
    op = node.op
    if isinstance(op, O.ElementwiseRegion):
        return op
    return O.ElementwiseRegion(steps=(O.RegionStep(op, tuple(range(len(node.inputs)))),))


def region_steps(reg: O.ElementwiseRegion, values: Sequence[Shape], n_in: int,
                 vtype: Mapping[DType, str]) -> tuple[RegionStep, ...]:
    """The steps of `reg` whose `values` (`reg.step_shapes`: the n_in inputs, then one per step) are typed
    by `vtype` (the backend's value type of each dtype)."""
    steps = []
    for k, step in enumerate(reg.steps):
        out = values[n_in + k]
        integer = bool(step.args) and values[step.args[0]].dtype.is_int
        steps.append(RegionStep(f"v{n_in + k}", vtype[out.dtype], step.op.kind, getattr(step.op, "fn", ""),
                                tuple(f"v{a}" for a in step.args), integer, out.dtype.value))
    return tuple(steps)

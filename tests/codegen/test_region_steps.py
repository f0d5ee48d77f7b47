"""rlx.codegen.region_steps: the one region-step builder of the CUDA and Metal rules."""

from __future__ import annotations

from rlx.codegen.cuda.emit import _VTYPE as CUDA_VTYPE
from rlx.codegen.metal.emit import VALUE_TYPE as METAL_VTYPE
from rlx.codegen.region_steps import as_region, region_steps
from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph


def _steps(g: Graph, out: int, vtype):
    node = g.node(out)
    reg = as_region(node)
    return region_steps(reg, reg.step_shapes([g.node(i).shape for i in node.inputs]), len(node.inputs), vtype)


def test_a_lone_op_is_a_region_of_one_step():
    g = Graph("one")
    a, b = g.input("a", [3], "i32"), g.input("b", [3], "i32")
    (step,) = _steps(g, g.binary("div", a, b), CUDA_VTYPE)
    assert (step.var, step.kind, step.fn, step.args, step.integer, step.to) == ("v2", "binary", "div", ("v0", "v1"),
                                                                               True, "i32")


def test_a_fused_region_types_its_values_per_backend():
    g = Graph("fused")
    x = g.input("x", [3], "f16")
    steps = (O.RegionStep(O.Activation("mish"), (0,)), O.RegionStep(O.Cast(DType.F32), (1,)),
             O.RegionStep(O.Compare("gt"), (2, 2)))
    y = g.add(O.ElementwiseRegion(steps=steps), [x])
    cuda, metal = _steps(g, y, CUDA_VTYPE), _steps(g, y, METAL_VTYPE)
    assert [s.var for s in cuda] == ["v1", "v2", "v3"] and [s.args for s in cuda] == [("v0",), ("v1",), ("v2", "v2")]
    assert [s.to for s in cuda] == ["f16", "f32", "bool"] and not any(s.integer for s in cuda)
    assert [(s.kind, s.fn) for s in cuda] == [(s.kind, s.fn) for s in metal]
    assert [s.vtype for s in cuda] == [CUDA_VTYPE[d] for d in (DType.F16, DType.F32, DType.BOOL)]

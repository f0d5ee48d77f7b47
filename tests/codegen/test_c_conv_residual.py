"""Residual adds computed in a conv's store (`ConvResidual`, `rlx/opt/lowering_conv_residual.py`) against the numpy
reference: every conv plan's store (with and without an activation after the add, a dynamic batch), the cases where
the fusion must not apply, and the memory rules the lowering checks (`store_may_write`) on hand-made plans.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cpu_helpers import compiled_with, match_reference_at, session, x86_targets

import rlx
from rlx.ir.decisions_conv import ConvPlan, ConvResidual
from rlx.ir.lir import Buffer
from rlx.ir.ops_conv import Conv
from rlx.ir.shape import Shape
from rlx.opt.fusion import fuse
from rlx.opt.lowering_conv import conv_plans
from rlx.opt.lowering_conv_residual import conv_residuals, store_may_write
from rlx.opt.memplan import plan

BATCH = rlx.Dim.dynamic("b", max=3)

#: name -> (input [C, H, W], weight [O, C/g, kh, kw], conv keywords, activation after the add): one per conv plan
#: (with 16-float vectors the 14-wide and stride-2 3 x 3 convs take the lanes, with 8-float ones F(2x2) and phases)
CASES = {
    "winograd4": ((32, 30, 30), (32, 32, 3, 3), {"pads": (1, 1, 1, 1)}, "relu"),
    "winograd2_or_lanes": ((32, 14, 14), (32, 32, 3, 3), {"pads": (1, 1, 1, 1)}, None),
    "lanes_wide": ((64, 14, 14), (64, 64, 3, 3), {"pads": (1, 1, 1, 1)}, "relu"),
    "lanes_stem": ((3, 20, 37), (32, 3, 7, 7), {"strides": (2, 2), "pads": (3, 3, 3, 3)}, "relu"),
    "phases": ((7, 9, 31), (13, 7, 3, 3), {"pads": (1, 1, 1, 1)}, "hardswish"),
    "nhwc_tiles": ((16, 7, 7), (384, 16, 3, 3), {"pads": (1, 1, 1, 1)}, "relu"),
    "nchw_tiles": ((5, 11, 10), (7, 5, 3, 3), {"strides": (2, 1), "pads": (1, 2, 0, 1)}, "relu"),
    "panels": ((40, 20, 26), (13, 40, 1, 1), {}, None),
    "panels_strided": ((40, 20, 26), (14, 40, 1, 1), {"strides": (2, 2)}, "relu"),
    "pointwise_blas": ((40, 7, 16), (24, 40, 1, 1), {}, None),
    "depthwise": ((5, 40, 40), (5, 1, 5, 5), {"groups": 5, "pads": (2, 2, 2, 2)}, "relu"),
    "depthwise_rows": ((3, 5, 36), (3, 1, 3, 3), {"groups": 3, "strides": (2, 2), "pads": (1, 1, 1, 1)}, None),
    "depthwise_shifts": ((4, 6, 7), (4, 1, 5, 5), {"groups": 4, "pads": (1, 2, 3, 1)}, "relu"),
}


def _graph(block_out: bool = False) -> tuple[rlx.Graph, dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
    """One residual block per case: ``act(conv(x) + bias + r)``; `r` is a graph input, or (block_out) the output of
    an activation of another input (computed in the arena before the conv)."""
    rng = np.random.default_rng(3)
    g = rlx.Graph("residuals")
    params: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    outs = {}
    for name, (xs, ws, kw, act) in CASES.items():
        x = g.input(f"x_{name}", [BATCH, *xs])
        params[f"w_{name}"] = (rng.standard_normal(ws) * 0.3).astype(np.float32)
        params[f"b_{name}"] = (rng.standard_normal(ws[0]) * 0.3).astype(np.float32)
        w, b = g.param(f"w_{name}", list(ws)), g.param(f"b_{name}", [ws[0]])
        shape = Conv(**kw).infer([Shape.of([1, *xs]), Shape.of(list(ws))]).static_dims[1:]
        r = g.input(f"r_{name}", [BATCH, *shape])
        shapes[f"x_{name}"], shapes[f"r_{name}"] = xs, shape
        if block_out:  # a value of the arena, computed before the conv, read by another output too
            r = g.activation("tanh", r)
            outs[f"{name}_t"] = g.activation("exp", r)
        y = g.conv(x, w, b, **kw)
        s = g.add_(r, y) if name.startswith("p") else g.add_(y, r)  # either operand order
        outs[name] = g.activation(act, s) if act else s
    g.set_outputs(outs)
    return g, params, shapes


@pytest.mark.parametrize("target", x86_targets("x86-64-v3", "x86-64-v4"))
@pytest.mark.parametrize("block_out", [False, True])
def test_residual_adds_in_every_conv_store_match_the_reference(target: str, block_out: bool) -> None:
    g, params, shapes = _graph(block_out)
    cg = compiled_with(g, params, cpu_target=target)
    decided = cg.lir.decided(ConvResidual)
    plans = {d.node: (d.algorithm, d.layout) for d in cg.lir.decided(ConvPlan)}
    # every block's add is in its conv's store, the activation after it with it; the adds run no pass
    assert len(decided) == len(CASES)
    assert sorted(str(d.activation) for d in decided) == sorted(str(c[3]) for c in CASES.values())
    assert {"pointwise", "depthwise", "direct", "winograd", "implicit_gemm"} <= {plans[d.node][0] for d in decided}
    assert "the residual add in the conv's store" in cg.lir.inspect()
    assert cg.source.count("(ConvResidual)") >= len(CASES)
    match_reference_at(cg, g, params, shapes, (3, 1))


def test_residual_add_stays_a_pass_where_the_store_may_not_compute_it() -> None:
    """No fusion when the conv's value has another reader, is a graph output, when the conv has an activation of its
    own, when the residual is computed after the conv, or when it broadcasts; the results still match."""
    rng = np.random.default_rng(5)
    g = rlx.Graph("no_fusion")
    x = g.input("x", [2, 8, 10, 10])
    params = {f"w{i}": (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32) for i in range(5)}

    def conv(i: int, src: int, **kw: object) -> int:
        return g.conv(src, g.param(f"w{i}", [8, 8, 3, 3]), pads=(1, 1, 1, 1), **kw)

    read_twice = conv(0, x)
    later = conv(1, x)
    late_residual = g.activation("tanh", x)  # scheduled after `later`: not there yet when the conv runs
    own_act = conv(2, x, activation="relu")
    shown = conv(3, x)
    bias_like = conv(4, x)
    g.set_outputs({"two_readers": g.add_(read_twice, x), "also": g.mul(read_twice, x),
                   "late": g.activation("relu", g.add_(later, late_residual)),
                   "own_act": g.add_(own_act, x), "shown": shown, "shown_add": g.add_(shown, x),
                   "broadcast": g.add_(bias_like, g.input("s", [2, 8, 1, 1]))})
    cg = session().compile(g)
    for name, value in params.items():
        cg.set_param(name, value)
    assert cg.lir.decided(ConvResidual) == []
    feeds = {"x": rng.standard_normal((2, 8, 10, 10)).astype(np.float32),
             "s": rng.standard_normal((2, 8, 1, 1)).astype(np.float32)}
    for name, a, b in zip(g.output_names, cg.run(**feeds), rlx.reference.run(g, feeds, params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()), err_msg=name)


def _block() -> rlx.Graph:
    """``conv3(relu(conv2(relu(conv1(x))) + t))`` with ``t = tanh(x)`` read once more after conv2 (by `u`)."""
    g = rlx.Graph("block")
    x = g.input("x", [1, 8, 10, 10])
    t = g.activation("tanh", x)
    h = g.conv(x, g.param("w1", [8, 8, 3, 3]), pads=(1, 1, 1, 1), activation="relu")
    y = g.conv(h, g.param("w2", [8, 8, 1, 1]))
    u = g.activation("exp", t)  # reads the residual between the conv and the add
    z = g.activation("relu", g.add_(y, t))  # in the arena: a conv reads it
    g.set_outputs({"y": g.conv(z, g.param("w3", [8, 8, 1, 1])), "u": u})
    return g


def test_store_may_write_only_where_no_value_in_between_needs_the_adds_bytes() -> None:
    """The lowering's memory rules on hand-made plans: the add's buffer must not be the conv's input or any bytes a
    node between the conv and the add reads; the add in place on its residual only for a kernel that writes each
    value once, and only when nothing in between still reads the residual."""
    lir = plan(fuse(_block()), early_residual_adds=True)
    graph = lir.graph
    conv = next(n for n in graph.nodes if n.kind == "conv" and graph.node(n.inputs[1]).op.name == "w2")
    add = graph.users()[conv.id][0]
    t = next(n.id for n in graph.nodes if n.kind == "activation" and n.op.fn == "tanh")
    assert [(d.node, d.add, d.residual) for d in conv_residuals(lir, conv_plans(lir))] == [(conv.id, add, t)]
    assert store_may_write(lir, conv.id, add, t, store_once=False)

    def moved(**buffers: Buffer) -> object:
        return dataclasses.replace(lir, buffers={**lir.buffers, **{int(k[1:]): v for k, v in buffers.items()}})

    arena = lir.buffers[add]
    # the add's bytes where the conv's input lies: the conv would overwrite its own input
    src = lir.buffers[conv.inputs[0]]
    assert not store_may_write(moved(**{f"n{add}": dataclasses.replace(arena, offset=src.offset)}), conv.id, add, t,
                               store_once=True)
    # in place on the residual, which `u` still reads after the conv: never
    on_t = moved(**{f"n{add}": dataclasses.replace(arena, offset=lir.buffers[t].offset)})
    assert not store_may_write(on_t, conv.id, add, t, store_once=True)
    # in place on a residual that nothing reads between the conv and the add
    g = rlx.Graph("in_place")
    x = g.input("x", [1, 8, 10, 10])
    t2 = g.conv(x, g.param("w0", [8, 8, 1, 1]))
    y2 = g.conv(g.conv(x, g.param("w1", [8, 8, 3, 3]), pads=(1, 1, 1, 1)), g.param("w2", [8, 8, 3, 3]),
                pads=(1, 1, 1, 1))
    g.set_outputs([g.conv(g.add_(y2, t2), g.param("w3", [8, 8, 1, 1]))])
    lir2 = plan(fuse(g))
    add2 = next(n.id for n in lir2.graph.nodes if n.kind == "binary")
    conv2, res2 = lir2.graph.node(add2).inputs
    assert lir2.buffers[res2].storage == lir2.buffers[add2].storage == "arena"
    same = dataclasses.replace(lir2, buffers={**lir2.buffers, add2: lir2.buffers[res2]})
    assert store_may_write(same, conv2, add2, res2, store_once=True)  # each value read, then written once
    assert not store_may_write(same, conv2, add2, res2, store_once=False)  # a kernel accumulating in the output

"""Automatic differentiation as graph → graph transformations over MIR (the core; `rlx.opt.autodiff` is
the public module, which also loads the rules of scan and custom_fn).

`vjp`, `grad`, `jvp` and `jacfwd` take a MIR graph and return a new,
ordinary MIR graph computing the original outputs together with their
derivatives; it optimizes, compiles and caches like any other graph.
Composite ops on the path being differentiated are first rebuilt from
primitives (`rlx.opt.ad_expand`), then every primitive is differentiated by
its rule (`rlx.opt.ad_rules`: one table entry per op kind, reverse and
forward mode). Gradients are taken with respect to inputs and params, named
by `wrt` (default: every float input and param).

>>> import numpy as np
>>> from rlx.ir.graph import Graph
>>> from rlx import reference
>>> g = Graph("sq")
>>> x = g.input("x", [3])
>>> g.set_outputs({"loss": g.reduce("sum", g.mul(x, x))})
>>> dg = grad(g)
>>> dg.output_names
['loss', 'grad_x']
>>> reference.run(dg, {"x": np.array([1.0, 2.0, 3.0], np.float32)})[1].tolist()
[2.0, 4.0, 6.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.graph import Graph, NodeId
from rlx.opt.ad_expand import EXPANSIONS
from rlx.opt.ad_rules import JVP, VJP, Ct, add, zeros
from rlx.opt.rewrite import require_mir

#: Largest input a `jacfwd` graph unrolls one tangent per element for.
JACFWD_MAX_ELEMENTS = 4096


def _leaf_name(g: Graph, nid: NodeId) -> str | None:
    op = g.node(nid).op
    return op.name if isinstance(op, (O.Input, O.Param)) else None


def _wrt_ids(graph: Graph, wrt: Sequence[str] | str | None) -> list[NodeId]:
    leaves = {n.op.name: n.id for n in graph.nodes if isinstance(n.op, (O.Input, O.Param))}
    if wrt is None:
        return [n.id for n in graph.nodes if isinstance(n.op, (O.Input, O.Param))
                and n.shape.dtype.is_float and not getattr(n.op, "state", False)]
    names = [wrt] if isinstance(wrt, str) else list(wrt)
    out = []
    for name in names:
        if name not in leaves:
            raise IRError(f"autodiff: {name!r} is not an input or param of graph {graph.name!r} "
                          f"(it has {sorted(leaves)})")
        if not graph.node(leaves[name]).shape.dtype.is_float:
            raise IRError(f"autodiff: {name!r} is {graph.node(leaves[name]).shape}; only float values have "
                          f"derivatives")
        out.append(leaves[name])
    return out


def _active(graph: Graph, sources: Sequence[NodeId], sinks: Sequence[NodeId]) -> set[NodeId]:
    """Nodes on some path from a source to a sink (where derivatives flow)."""
    fwd = set(sources)
    for n in graph.nodes:
        if any(i in fwd for i in n.inputs):
            fwd.add(n.id)
    back = set(sinks)
    for n in reversed(graph.nodes):
        if n.id in back:
            back.update(n.inputs)
    return fwd & back


def _expanded_copy(graph: Graph, wrt: list[NodeId]) -> tuple[Graph, dict[NodeId, NodeId]]:
    """A copy of `graph` whose differentiated composite nodes are rebuilt from primitives."""
    require_mir(graph, "autodiff")
    graph.verify()
    active = _active(graph, wrt, graph.outputs)
    g = Graph(graph.name)
    env: dict[NodeId, NodeId] = {}
    for n in graph.nodes:
        args = [env[i] for i in n.inputs]
        if n.id in active and n.kind in EXPANSIONS:
            env[n.id] = EXPANSIONS[n.kind](g, n, args)
        else:
            env[n.id] = g.add(n.op, args, name=n.name)
    return g, env


def _backprop(g: Graph, seeds: dict[NodeId, NodeId], wrt: list[NodeId]) -> dict[NodeId, Ct]:
    """Reverse sweep over the (expanded) graph `g`: cotangent of every wrt leaf."""
    active = _active(g, wrt, list(seeds))
    ct: dict[NodeId, Ct] = dict(seeds)
    for nid in sorted(active, reverse=True):
        node = g.node(nid)
        if node.kind in O.LEAF_KINDS or ct.get(nid) is None:
            continue
        rule = VJP.get(node.kind)
        if rule is None:
            raise IRError(f"autodiff: no gradient rule for {node.label} {node.kind}")
        ins = rule(g, node, list(node.inputs), nid, ct[nid])  # type: ignore[arg-type]
        for i, c in zip(node.inputs, ins):
            if c is not None and i in active:
                ct[i] = add(g, ct.get(i), c)
    return {w: ct.get(w) for w in wrt}


def _unique(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def _names(graph: Graph) -> set[str]:
    return {n.op.name for n in graph.nodes if isinstance(n.op, (O.Input, O.Param))} | set(graph.output_names)


def _finish(g: Graph, graph: Graph, env: dict[NodeId, NodeId], extra: list[tuple[str, NodeId]]) -> Graph:
    outs = {name: env[o] for name, o in zip(graph.output_names, graph.outputs)}
    outs.update(extra)
    g.set_outputs(outs)
    g.verify()
    return g


def vjp(graph: Graph, wrt: Sequence[str] | str | None = None) -> Graph:
    """Reverse mode: a graph taking one more input per output, its cotangent `d_<output>`, and returning
    the original outputs plus `grad_<name>` for every `wrt` input/param.

    >>> g = Graph("lin")
    >>> x = g.input("x", [2])
    >>> g.set_outputs({"y": g.mul(x, g.constant(np.float32(3)))})
    >>> vjp(g).output_names, [n.op.name for n in vjp(g).inputs()]
    (['y', 'grad_x'], ['x', 'd_y'])
    """
    ids = _wrt_ids(graph, wrt)
    g, env = _expanded_copy(graph, ids)
    taken = _names(graph)
    seeds: dict[NodeId, NodeId] = {}
    for name, o in zip(graph.output_names, graph.outputs):
        c = g.input(_unique(f"d_{name}", taken), g.shape(env[o]))
        seeds[env[o]] = add(g, seeds.get(env[o]), c)  # type: ignore[assignment]
    return _finish(g, graph, env, _grad_outputs(g, graph, env, seeds, ids, taken))


def _grad_outputs(g: Graph, graph: Graph, env: dict[NodeId, NodeId], seeds: dict[NodeId, NodeId],
                  ids: list[NodeId], taken: set[str]) -> list[tuple[str, NodeId]]:
    cts = _backprop(g, seeds, [env[i] for i in ids])
    out = []
    for i in ids:
        c = cts[env[i]]
        out.append((_unique(f"grad_{_leaf_name(graph, i)}", taken), c if c is not None else zeros(g, env[i])))
    return out


def grad(graph: Graph, wrt: Sequence[str] | str | None = None, output: int | str = 0) -> Graph:
    """Gradient of a scalar output: the graph returns that output and `grad_<name>` for every `wrt`.

    The output must hold one element (a loss); the others are dropped.
    """
    idx = graph.output_names.index(output) if isinstance(output, str) else output
    if not 0 <= idx < len(graph.outputs):
        raise IRError(f"autodiff: graph {graph.name!r} has no output {output!r}")
    o = graph.outputs[idx]
    shape = graph.node(o).shape
    if not shape.is_static or int(np.prod(shape.static_dims)) != 1 or not shape.dtype.is_float:
        raise IRError(f"grad: output {graph.output_names[idx]!r} must be one float value (a loss), got {shape}; "
                      f"use vjp for other outputs")
    single = graph.copy()
    single.set_outputs({graph.output_names[idx]: o})
    ids = _wrt_ids(single, wrt)
    g, env = _expanded_copy(single, ids)
    taken = _names(single)
    seed = g.constant(np.ones(shape.static_dims), shape.dtype)
    return _finish(g, single, env, _grad_outputs(g, single, env, {env[o]: seed}, ids, taken))


def _forward_tangents(g: Graph, tangents: dict[NodeId, NodeId], sinks: list[NodeId]) -> dict[NodeId, Ct]:
    active = _active(g, list(tangents), sinks)
    tan: dict[NodeId, Ct] = dict(tangents)
    for nid in sorted(active):
        node = g.node(nid)
        if node.kind in O.LEAF_KINDS:
            continue
        ts = [tan.get(i) for i in node.inputs]
        if all(t is None for t in ts):
            continue
        rule = JVP.get(node.kind)
        if rule is None:
            raise IRError(f"autodiff: no forward-mode rule for {node.label} {node.kind}")
        tan[nid] = rule(g, node, list(node.inputs), nid, ts)
    return tan


def jvp(graph: Graph, wrt: Sequence[str] | str | None = None) -> Graph:
    """Forward mode: a graph taking a tangent `t_<name>` per `wrt` input/param and returning the original
    outputs plus each output's tangent `t_<output>`."""
    ids = _wrt_ids(graph, wrt)
    g, env = _expanded_copy(graph, ids)
    taken = _names(graph)
    tangents = {env[i]: g.input(_unique(f"t_{_leaf_name(graph, i)}", taken), g.shape(env[i])) for i in ids}
    tan = _forward_tangents(g, tangents, [env[o] for o in graph.outputs])
    extra = []
    for name, o in zip(graph.output_names, graph.outputs):
        t = tan.get(env[o])
        if t is not None and g.shape(t) != g.shape(env[o]):
            t = g.expand(t, g.shape(env[o]).dims)
        extra.append((_unique(f"t_{name}", taken), t if t is not None else zeros(g, env[o])))
    return _finish(g, graph, env, extra)


def jacfwd(graph: Graph, wrt: str, output: int | str = 0) -> Graph:
    """Jacobian of one output with respect to one static input/param, by forward mode, one tangent per
    element: returns that output and `jac_<name>` of shape `output.shape + wrt.shape` (JAX's layout)."""
    idx = graph.output_names.index(output) if isinstance(output, str) else output
    (wid,) = _wrt_ids(graph, [wrt])
    ws = graph.node(wid).shape
    if not ws.is_static or int(np.prod(ws.static_dims)) > JACFWD_MAX_ELEMENTS:
        raise IRError(f"jacfwd: {wrt!r} must be static with at most {JACFWD_MAX_ELEMENTS} elements, got {ws}")
    single = graph.copy()
    o = graph.outputs[idx]
    single.set_outputs({graph.output_names[idx]: o})
    g, env = _expanded_copy(single, [wid])
    os_ = g.shape(env[o])
    n = int(np.prod(ws.static_dims))
    cols = []
    for k in range(n):
        basis = np.zeros(n)
        basis[k] = 1.0
        t = g.constant(basis.reshape(ws.static_dims), ws.dtype)
        tan = _forward_tangents(g, {env[wid]: t}, [env[o]]).get(env[o])
        col = g.expand(tan, os_.dims) if tan is not None else zeros(g, env[o])
        cols.append(g.reshape(col, [*list(os_.dims), 1]))
    jac = cols[0] if n == 1 else g.concat(cols, os_.rank)
    jac = g.reshape(jac, list(os_.dims) + list(ws.dims))
    return _finish(g, single, env, [(_unique(f"jac_{wrt}", _names(single)), jac)])

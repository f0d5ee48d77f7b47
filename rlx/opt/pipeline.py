"""The pass manager: named pipelines per optimization level, with a report of what each pass did.

| level | passes |
| --- | --- |
| 0 | verify only |
| 1 | bodies (optimize scan/cond/while bodies; inline custom_fn), fold (+ constant predicates), simplify, cse, dce|
| 2 | level 1, then layout and the fusions (swiglu, matmul epilogue, residual norm, elementwise) |
| 3 | same as 2 |

With `debug` (default: `RLX_DEBUG`), the graph is verified after every pass
and checked to keep its ABI: the same inputs and params (names, order,
user-facing shapes and dtypes) and the same outputs (names, order, shapes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlx.config import Config
from rlx.errors import IRError
from rlx.ir.graph import Graph
from rlx.opt.bodies import optimize_bodies
from rlx.opt.control import fold_control
from rlx.opt.cse import cse
from rlx.opt.dce import dce
from rlx.opt.fold import fold
from rlx.opt.fusion import FUSIONS
from rlx.opt.layout import prepack_params
from rlx.opt.rewrite import require_mir
from rlx.opt.simplify import simplify

Pass = Callable[[Graph], Graph]

#: Every pass by name.
def _bodies(graph: Graph) -> Graph:
    """Pass "bodies": scan bodies through the full pipeline (recursively), custom_fn inlined."""
    return optimize_bodies(graph, lambda body: optimize(body, level=2, debug=False))


def _fold(graph: Graph) -> Graph:
    """Pass "fold": constant subgraphs folded, then control flow on constant predicates (rlx/opt/control.py)."""
    return fold_control(fold(graph))


PASSES: dict[str, Pass] = {
    "bodies": _bodies,
    "fold": _fold,
    "simplify": simplify,
    "cse": cse,
    "dce": dce,
    "layout": prepack_params,
    **dict(FUSIONS),
}

_CLEANUP = ("bodies", "fold", "simplify", "cse", "dce")
_FULL = (*_CLEANUP, "layout", *(name for name, _ in FUSIONS))

#: The pipeline of each optimization level.
PIPELINES: dict[int, tuple[str, ...]] = {0: (), 1: _CLEANUP, 2: _FULL, 3: _FULL}


@dataclass(frozen=True)
class PassRecord:
    """What one pass did: node counts, op kinds created and removed (kind, count), and the MIR after it."""

    name: str
    nodes_before: int
    nodes_after: int
    created: tuple[tuple[str, int], ...]
    removed: tuple[tuple[str, int], ...]
    changed: bool
    mir: str

    def summary(self) -> str:
        def fmt(items: tuple[tuple[str, int], ...]) -> str:
            return ", ".join(f"{k} x{n}" for k, n in items) or "-"

        state = "" if self.changed else "  (no change)"
        return (f"{self.name:<22} {self.nodes_before:>5} -> {self.nodes_after:<5} "
                f"+[{fmt(self.created)}] -[{fmt(self.removed)}]{state}")


@dataclass(frozen=True)
class PassReport:
    """The record of one `optimize_with_report` run."""

    level: int
    passes: tuple[PassRecord, ...]
    input_mir: str
    nodes_before: int

    @property
    def nodes_after(self) -> int:
        return self.passes[-1].nodes_after if self.passes else self.nodes_before

    def summary(self) -> str:
        """One line per pass."""
        lines = [f"optimize level {self.level}: {self.nodes_before} -> {self.nodes_after} nodes"]
        lines += ["  " + p.summary() for p in self.passes]
        return "\n".join(lines)

    def inspect(self) -> str:
        """The summary, then the input MIR and the MIR after every pass that changed it."""
        parts = [self.summary(), "", "── input ──", self.input_mir]
        for p in self.passes:
            if p.changed:
                parts += ["", f"── after {p.name} ──", p.mir]
        return "\n".join(parts)


def optimize(graph: Graph, level: int | None = 2, *, debug: bool | None = None) -> Graph:
    """Run the pipeline of `level` (None: `RLX_OPT_LEVEL`) and return the optimized graph.

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("mlp")
    >>> x, w, b = g.input("x", [4, 8]), g.param("w", [16, 8]), g.param("b", [16])
    >>> h = g.add_(g.matmul(x, g.transpose(w, [1, 0])), b)
    >>> g.set_outputs([g.activation("gelu", h)])
    >>> [n.kind for n in optimize(g).nodes]
    ['input', 'param', 'param', 'fused_matmul_bias_act']
    """
    return optimize_with_report(graph, level, debug=debug)[0]


def optimize_with_report(graph: Graph, level: int | None = 2, *, debug: bool | None = None,
                         passes: Sequence[str | tuple[str, Pass]] | None = None) -> tuple[Graph, PassReport]:
    """`optimize`, also returning a `PassReport`. `passes` replaces the level's pipeline
    (pass names from `PASSES`, or `(name, function)` pairs).

    >>> from rlx.ir.graph import Graph
    >>> g = Graph("r")
    >>> x = g.input("x", [2])
    >>> g.set_outputs([g.mul(x, g.constant(1.0))])
    >>> out, report = optimize_with_report(g, 1)
    >>> [(p.name, p.nodes_before, p.nodes_after) for p in report.passes if p.changed]
    [('simplify', 3, 2), ('dce', 2, 1)]
    """
    cfg = Config.from_env() if level is None or debug is None else None
    if level is None:
        level = cfg.opt_level
    if debug is None:
        debug = cfg.debug
    if isinstance(level, bool) or not isinstance(level, int) or level not in PIPELINES:
        raise IRError(f"optimization level must be one of {sorted(PIPELINES)}, got {level!r}")
    require_mir(graph, "optimize")
    graph.verify()
    steps = _resolve(PIPELINES[level] if passes is None else passes)
    records = []
    input_mir = str(graph)
    current, text = graph, input_mir
    for name, fn in steps:
        after = fn(current)
        if after is current:
            raise IRError(f"pass {name!r} returned its input graph; passes must build a new one")
        if debug:
            _check(name, current, after)
        after_text = str(after)
        created, removed = _kind_delta(current, after)
        records.append(PassRecord(name, len(current), len(after), created, removed, after_text != text, after_text))
        current, text = after, after_text
    if current is graph:
        current = graph.copy()
    return current, PassReport(level, tuple(records), input_mir, len(graph))


def _resolve(passes: Sequence[str | tuple[str, Pass]]) -> list[tuple[str, Pass]]:
    out = []
    for p in passes:
        if isinstance(p, str):
            if p not in PASSES:
                raise IRError(f"unknown pass {p!r}; known passes: {sorted(PASSES)}")
            out.append((p, PASSES[p]))
        else:
            name, fn = p
            out.append((str(name), fn))
    return out


def _kind_delta(before: Graph, after: Graph) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    b = Counter(n.kind for n in before.nodes)
    a = Counter(n.kind for n in after.nodes)
    return tuple(sorted((a - b).items())), tuple(sorted((b - a).items()))


def abi(graph: Graph) -> tuple:
    """What callers and the C ABI see: inputs, params (user layout), outputs, in order."""
    ins = tuple((n.op.name, n.op.shape) for n in graph.inputs())
    params = tuple((n.op.name, n.op.user_shape) for n in graph.params())
    outs = tuple((name, graph.node(o).shape) for name, o in zip(graph.output_names, graph.outputs))
    return ins, params, outs


def _check(name: str, before: Graph, after: Graph) -> None:
    if not isinstance(after, Graph) or after.stage != "mir":
        raise IRError(f"pass {name!r} did not return a MIR graph (got {type(after).__name__})")
    try:
        after.verify()
    except IRError as exc:
        raise type(exc)(f"after pass {name!r}: {exc}") from None
    if after.name != before.name:
        raise IRError(f"pass {name!r} renamed the graph {before.name!r} to {after.name!r}")
    old, new = abi(before), abi(after)
    for what, o, n in zip(("inputs", "params", "outputs"), old, new):
        if o != n:
            raise IRError(f"pass {name!r} changed the graph's {what}: {_fmt(o)} became {_fmt(n)}")


def _fmt(items: tuple) -> str:
    return "[" + ", ".join(f"{n}:{s}" for n, s in items) + "]"

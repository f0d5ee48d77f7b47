"""`GraphModule`: one handle over a program at its HIR, MIR or LIR stage.

A module is built at one stage and moved forward with `lower()`:
HIR (`HirModule`, blocks) → MIR (`Graph`) → LIR (`LirModule`, optimized and
memory-planned). Lowering returns a new module and leaves the old one as it
was; a stage never goes backwards.

>>> m = GraphModule.define("mlp", lambda h: h.linear(h.input("x", [2, 8]), h.param("w", [8, 4]), activation="relu"))
>>> m.stage
'hir'
>>> mir = m.lower()
>>> mir.stage, [n.kind for n in mir.graph.nodes]
('mir', ['input', 'param', 'matmul', 'activation'])
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from rlx.errors import IRError
from rlx.ir.graph import Graph, NodeId
from rlx.ir.hir import HirModule
from rlx.ir.lir import LirModule
from rlx.ir.lir_lowering import LirLowering, lir_lowering, register_lir_lowering  # noqa: F401 - re-exported

STAGES = ("hir", "mir", "lir")

# The MIR -> LIR lowering lives in rlx.ir.lir_lowering (registered by rlx.driver: the optimizer sits
# above the IR).

Outputs = NodeId | Sequence[NodeId] | Mapping[str, NodeId] | None


class _ClassOrInstance:
    """`Cls.attr(...)` calls a constructor; `obj.attr` reads an accessor.

    Lets ``GraphModule.hir("name")`` make an empty HIR module while
    ``module.hir`` returns the HIR module a module holds.
    """

    def __init__(self, constructor: Callable, accessor: Callable) -> None:
        self._constructor = constructor
        self._accessor = accessor
        self.__doc__ = constructor.__doc__

    def __get__(self, obj: object, owner: type):
        if obj is None:
            return functools.partial(self._constructor, owner)
        return self._accessor(obj)


def _new_hir(cls: type[GraphModule], name: str) -> GraphModule:
    """An empty HIR-stage module (``GraphModule.hir(name)``); build it through ``module.hir``."""
    return cls(HirModule(name))


class GraphModule:
    """A program at one stage of the pipeline.

    >>> m = GraphModule.mir("id")
    >>> x = m.graph.input("x", [3])
    >>> m.graph.set_outputs([m.graph.activation("relu", x)])
    >>> m.stage, m.name
    ('mir', 'id')
    >>> h = GraphModule.hir("block")
    >>> x = h.hir.input("x", [2, 4])
    >>> h.hir.set_outputs([h.hir.rms_norm(x, h.hir.param("g", [4]))])
    >>> h.graph
    Traceback (most recent call last):
    ...
    rlx.errors.IRError: GraphModule 'block' is at the HIR stage, not MIR; call .lower() first
    """

    def __init__(self, value: HirModule | Graph | LirModule) -> None:
        if isinstance(value, HirModule):
            self._stage = "hir"
        elif isinstance(value, Graph):
            self._stage = "mir"
        elif isinstance(value, LirModule):
            self._stage = "lir"
        else:
            raise IRError(f"GraphModule holds a HirModule, Graph or LirModule, got {type(value).__name__}")
        self._value = value

    # ── construction ──────────────────────────────────────────────────

    @classmethod
    def define(cls, name: str, build_fn: Callable[[HirModule], Outputs]) -> GraphModule:
        """Build a HIR module: `build_fn` gets an empty `HirModule` and returns its output(s).

        The return value may be one node id, a list/tuple of ids (named out0,
        out1…), a dict name → id, or None when `build_fn` set the outputs itself.
        """
        hir = HirModule(name)
        outputs = build_fn(hir)
        if outputs is None:
            if not hir.outputs:
                raise IRError(f"define({name!r}): the build function returned no outputs and set none")
        elif isinstance(outputs, Mapping):
            hir.set_outputs(dict(outputs))
        elif isinstance(outputs, (list, tuple)):
            hir.set_outputs(list(outputs))
        elif isinstance(outputs, int) and not isinstance(outputs, bool):
            hir.set_outputs([outputs])
        else:
            raise IRError(f"define({name!r}): the build function must return node id(s), got {outputs!r}")
        return cls(hir)

    @classmethod
    def mir(cls, name: str) -> GraphModule:
        """An empty MIR-stage module; build it through `module.graph`."""
        return cls(Graph(name))

    @classmethod
    def from_graph(cls, graph: Graph) -> GraphModule:
        """Wrap an existing graph: a `HirModule` gives the HIR stage, any other `Graph` MIR."""
        if not isinstance(graph, Graph):
            raise IRError(f"from_graph takes a Graph, got {type(graph).__name__}")
        return cls(graph)

    @classmethod
    def from_lir(cls, lir: LirModule) -> GraphModule:
        if not isinstance(lir, LirModule):
            raise IRError(f"from_lir takes a LirModule, got {type(lir).__name__}")
        return cls(lir)

    # ── stage and accessors ───────────────────────────────────────────

    @property
    def stage(self) -> str:
        """'hir', 'mir' or 'lir'."""
        return self._stage

    @property
    def name(self) -> str:
        return self._value.name

    def _wrong_stage(self, want: str, hint: str) -> IRError:
        return IRError(f"GraphModule {self.name!r} is at the {self._stage.upper()} stage, not {want}; {hint}")

    @property
    def graph(self) -> Graph:
        """The MIR graph: at the MIR stage, or the optimized graph a LIR was planned from."""
        if isinstance(self._value, LirModule):
            return self._value.graph
        if self._stage == "hir":
            raise self._wrong_stage("MIR", "call .lower() first")
        return self._value

    def _hir_module(self) -> HirModule:
        if self._stage != "hir":
            raise self._wrong_stage("HIR", "HIR is only available before lowering")
        return self._value

    hir = _ClassOrInstance(_new_hir, _hir_module)

    @property
    def lir(self) -> LirModule:
        """The planned program, once `plan()` / `lower(to="lir")` has run."""
        if self._stage != "lir":
            raise self._wrong_stage("LIR", "call .plan() (or .lower(to='lir')) first")
        return self._value

    # ── moving forward ────────────────────────────────────────────────

    def lower(self, to: str = "mir", *, level: int | None = None) -> GraphModule:
        """A module at stage `to` ('mir' or 'lir'); this one is unchanged.

        Reaching LIR runs the optimizer (`rlx.opt.pipeline.optimize`) at `level`
        (None: RLX_OPT_LEVEL, default 2) and then the memory planner (`rlx.opt.memplan.plan`),
        through the lowering `rlx.driver` registers (see `register_lir_lowering`).
        Lowering to the current stage returns `self`.
        """
        if to not in STAGES:
            raise IRError(f"lower(to={to!r}): stage must be one of {STAGES}")
        if STAGES.index(to) < STAGES.index(self._stage):
            raise IRError(f"GraphModule {self.name!r} is at the {self._stage.upper()} stage and cannot go back "
                          f"to {to.upper()}")
        if to == self._stage:
            return self
        graph = self._value.lower_to_mir() if isinstance(self._value, HirModule) else self._value
        if to == "mir":
            return GraphModule(graph)
        return GraphModule(_plan(graph, level))

    def plan(self, *, level: int | None = None) -> GraphModule:
        """Shorthand for ``lower(to="lir", level=level)``."""
        return self.lower("lir", level=level)

    # ── display ───────────────────────────────────────────────────────

    def inspect(self) -> str:
        """Readable text of the current stage."""
        if self._stage == "lir":
            lir = self._value
            return f"lir {self.name}: hash {lir.hash()[:16]}\n{lir.inspect()}"
        if self._stage == "hir":
            return f"{self._value.summary()}\n{self._value}"
        counts = Counter(n.kind for n in self._value.nodes)
        hist = ", ".join(f"{k} x{c}" for k, c in sorted(counts.items()))
        return f"mir {self.name}: {len(self._value.nodes)} nodes ({hist})\n{self._value}"

    def __str__(self) -> str:
        return self.inspect()

    def __repr__(self) -> str:
        size = len(self._value.graph.nodes) if self._stage == "lir" else len(self._value.nodes)
        return f"<GraphModule {self.name!r} stage={self._stage} nodes={size}>"


def _plan(graph: Graph, level: int | None) -> LirModule:
    lowering = lir_lowering()
    if lowering is None:
        raise IRError("lowering to LIR needs the optimizer, which rlx.driver registers: import rlx (or rlx.driver)")
    return lowering(graph, level)

"""The rule registry: `(op kind, backend) → rule`, and what each rule returns.

A backend is a table of rules. A rule takes the backend's emitter (which
knows pointers, dims and the LIR's decisions) and one scheduled node, and
returns a `Kernel`: a frozen record naming the template macro that renders
the node, the fixed kernel headers that code needs, and the macro's
arguments. Codegen never branches on op types: it looks the rule up here.

A rule may cover only some variants of its op (an activation function, a
dtype): `accepts(op, in_dtypes, out_dtype)` answers that before any build,
so `supports(graph, backend)` and `first_unsupported_op` report a missing
combination without rendering anything.

>>> from rlx.ir.graph import Graph
>>> g = Graph("demo")
>>> x = g.input("x", [4])
>>> g.set_outputs([g.activation("relu", x)])
>>> from rlx.codegen.backends import supports  # builds the CPU table (`rlx.codegen.cpu.rule_table`)
>>> supports(g, "cpu")
True

Rules are declared, not installed: a rule module collects its rules in a
`RuleSet` (its `RULES`), and a backend's `RuleTable` is made from the sets of
the modules its package lists (`rule_table()` in `rlx/codegen/<backend>/__init__.py`).
Importing a module registers nothing anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlx.ir import ops as O
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph, Node, NodeId

#: Backends that have rule tables (a new backend adds its name here and a package `rlx.codegen.<name>`).
BACKENDS = ("cpu", "cuda", "metal")


@dataclass(frozen=True)
class Kernel:
    """The code of one scheduled node: `macro(args)` from `template`, needing `headers`.

    `args` is the rule's own frozen dataclass (or a read-only mapping) of C
    expressions and numbers; `headers` are fixed kernel headers (paths under
    the backend's templates directory) included once, only when some kernel
    of the graph needs them.
    """

    node: NodeId
    macro: str
    template: str
    args: Any
    headers: tuple[str, ...] = ()
    header: str = ""
    func: str = ""
    label: str = ""
    #: Per-thread / shared scratch bytes the kernel uses (the backend sizes its scratch to the maximum).
    scratch_per_thread: int = 0
    scratch_shared: int = 0
    #: Code defined before this kernel's function: a loop body's constants and kernels (see c_scan).
    subprogram: Any = None
    #: A C condition under which the node's function returns at once, and why (another kernel
    #: computed its value in that case: a CPU `QuantGemvGroup` in decode steps).
    skip_when: str = ""
    skip_note: str = ""
    #: Code from outside RLX that the kernel calls (a user op's header, `rlx.custom_op`): (comment, text)
    #: pairs, each placed once in the source, after the fixed kernel headers.
    user_code: tuple[tuple[str, str], ...] = ()


def user_code_of(kernels: Sequence[Kernel]) -> list[tuple[str, str]]:
    """The `user_code` of `kernels` and of the loop bodies they hold (`subprogram`), each once, in order."""
    found: dict[tuple[str, str], None] = {}
    for k in kernels:
        found.update(dict.fromkeys(k.user_code))
        # one body (a scan's: an object with `kernels`), several (a cond's), or the kernels themselves
        subs = k.subprogram if isinstance(k.subprogram, (tuple, list)) else (k.subprogram,)
        for sub in subs:
            inner = getattr(sub, "kernels", None)
            if inner is None and isinstance(sub, Kernel):
                inner = (sub,)
            if inner:
                found.update(dict.fromkeys(user_code_of(inner)))
    return list(found)


Accepts = Callable[[O.Op, tuple[DType, ...], DType], str | None]


def accepts_all(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    """The default `accepts`: every variant and dtype the op's inference allows."""
    return None


def float32_only(op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    """`accepts` for kernels written for f32 data only."""
    bad = sorted({d.value for d in (*in_dtypes, out_dtype) if d is not DType.F32})
    return f"on {'/'.join(bad)}; it takes f32" if bad else None


#: Element types a backend stores (its type tables name them) but whose kernels were never written or
#: checked for them: every rule of that backend but a view's refuses them. The CPU computes every dtype;
#: Metal's templates are checked on the unsigned ones through its emulator (tests/metal/test_ops.py), CUDA's
#: are not yet; neither has the storage formats' conversions (`DType.is_narrow`, the CPU's kernels/narrow.h).
_NARROW_DTYPES = frozenset(d for d in DType if d.is_narrow)
UNCOMPUTED_DTYPES: dict[str, frozenset[DType]] = {
    "cuda": frozenset({DType.U16, DType.U32, DType.U64}) | _NARROW_DTYPES,
    "metal": _NARROW_DTYPES,
}


@dataclass(frozen=True)
class Rule:
    """How one backend renders one op kind."""

    kind: str
    backend: str
    emit: Callable[[Any, Node], Kernel]
    #: None when the op variant and dtypes are supported, else what is not ("on f16; it takes f32").
    accepts: Accepts = accepts_all
    #: The rule renders GEMMs of mixed float operands (f32 x bf16 weights); others refuse them, so
    #: legalization widens the narrow operand (`rlx.opt.legalize`).
    mixed: bool = False
    #: Storage-only dtypes this rule's kernels do read (its `accepts` says where): exempt from the backend's
    #: UNCOMPUTED_DTYPES (the CUDA cached attention's f8e4m3fn caches).
    narrow: frozenset[DType] = frozenset()

    def check(self, op: O.Op, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
        """None when this rule takes `op` with these dtypes, else why not."""
        lacking = sorted({d.value for d in (*in_dtypes, out_dtype)
                          if d in UNCOMPUTED_DTYPES.get(self.backend, ()) and d not in self.narrow})
        if lacking and self.kind not in O.VIEW_KINDS:  # a view renames memory: no kernel reads its dtype
            return f"on {'/'.join(lacking)}; the {self.backend} kernels were not written for it"
        floats = {d for d in in_dtypes if d.is_float}
        if len(floats) > 1 and self.kind in O.NARROW_WEIGHT_KINDS and not self.mixed:
            return f"on mixed {'/'.join(sorted(d.value for d in floats))} operands"
        return self.accepts(op, in_dtypes, out_dtype)



def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


@dataclass
class RuleSet:
    """The rules one module declares for one backend (the module's `RULES`), in declaration order.

    >>> RULES = RuleSet("cpu")
    >>> @RULES.register("softmax", accepts=float32_only)
    ... def emit_softmax(emitter, node): ...
    >>> [(r.kind, r.emit.__name__) for r in RULES.rules]
    [('softmax', 'emit_softmax')]
    """

    backend: str
    rules: list[Rule] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_backend(self.backend)

    def register(self, *kinds: str, accepts: Accepts = accepts_all, mixed: bool = False,
                 narrow: frozenset[DType] = frozenset()) -> Callable[[Callable], Callable]:
        """Decorator: `emit` renders every op kind in `kinds` on this backend (`mixed`, `narrow`: see `Rule`)."""

        def wrap(emit: Callable[[Any, Node], Kernel]) -> Callable[[Any, Node], Kernel]:
            for kind in kinds:
                if kind not in O.OPS:
                    raise TypeError(f"no MIR op kind {kind!r} to register a {self.backend} rule for")
                self.rules.append(Rule(kind, self.backend, emit, accepts, mixed, narrow))
            return emit

        return wrap


@dataclass
class RuleTable:
    """The rules of one backend, by op kind: made from its rule modules' sets (`RuleTable.of`)."""

    backend: str
    rules: dict[str, Rule] = field(default_factory=dict)

    @classmethod
    def of(cls, backend: str, sets: Iterable[RuleSet]) -> RuleTable:
        """The table of `backend` holding every rule of `sets`; two rules for one op kind are an error.

        >>> a, b = RuleSet("cuda"), RuleSet("cuda")
        >>> _ = a.register("softmax")(lambda e, n: None)
        >>> _ = b.register("softmax")(lambda e, n: None)
        >>> RuleTable.of("cuda", [a, b])
        Traceback (most recent call last):
        ...
        TypeError: cuda has two rules for 'softmax'
        """
        _check_backend(backend)
        rules: dict[str, Rule] = {}
        for rule_set in sets:
            if rule_set.backend != backend:
                raise TypeError(f"a {rule_set.backend} rule set in the {backend} table")
            for rule in rule_set.rules:
                if rule.kind in rules:
                    raise TypeError(f"{backend} has two rules for {rule.kind!r}")
                rules[rule.kind] = rule
        return cls(backend, rules)

    def rule(self, kind: str) -> Rule | None:
        return self.rules.get(kind)

    def accepts(self, node: Node, in_dtypes: tuple[DType, ...], out_dtype: DType) -> bool:
        """True when this backend has a rule for `node` taking these dtypes (legalization asks this)."""
        rule = self.rules.get(node.kind)
        return rule is not None and rule.check(node.op, in_dtypes, out_dtype) is None

    def why_not(self, graph: Graph, node: Node) -> str | None:
        """None when this backend can render `node`, else the reason it cannot."""
        rule = self.rules.get(node.kind)
        name = self.backend.upper()
        if rule is None:
            return f"the {name} backend has no rule for {node.kind}"
        in_dtypes = tuple(graph.node(i).shape.dtype for i in node.inputs)
        reason = rule.check(node.op, in_dtypes, node.shape.dtype)
        return None if reason is None else f"the {name} backend does not support {node.kind} {reason}"

    def first_refusal(self, graph: Graph) -> tuple[Node, str] | None:
        """The first scheduled node of `graph` this backend cannot render, with the reason; None when none."""
        for node in graph.nodes:
            if node.kind in O.LEAF_KINDS:
                continue
            reason = self.why_not(graph, node)
            if reason is not None:
                return node, reason
        return None

"""Every backend's rules loaded, and the questions asked of them before any build.

`rlx.codegen.registry` holds the tables; this module imports each backend's rules
module (which fills its table) and answers: `supports(graph, backend)`,
`first_unsupported_op(graph, backend)` and the op × backend `support_table()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rlx.codegen import c, cuda, metal
from rlx.codegen.registry import BACKENDS, RuleTable, table
from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node

#: The module that registers each backend's rules (imported above, so the tables are full).
RULE_MODULES = {"cpu": c, "cuda": cuda, "metal": metal}


def load_rules(backend: str) -> RuleTable:
    # The rules of a backend register when its codegen module is imported.
    if backend == "cpu":
        import rlx.codegen.c
    elif backend == "cuda":
        import rlx.codegen.cuda
    elif backend == "metal":
        import rlx.codegen.metal  # noqa: F401
    return table(backend)


def first_unsupported_op(graph: Graph, backend: str) -> tuple[Node, str] | None:
    """The first scheduled node `backend` cannot render, with the reason; None when all are supported."""
    rules = load_rules(backend)
    for node in graph.nodes:
        if node.kind in O.LEAF_KINDS:
            continue
        reason = rules.why_not(graph, node)
        if reason is not None:
            return node, reason
    return None


def supports(graph: Graph, backend: str) -> bool:
    """True when every op of `graph` (as the backend will see it) has a rule accepting it."""
    return first_unsupported_op(graph, backend) is None


def support_table(backends: Iterable[str] = BACKENDS) -> Mapping[str, Mapping[str, bool]]:
    """op kind → backend → has a rule (the `rlxc inspect --support` table)."""
    tables = {b: load_rules(b) for b in backends}
    return {kind: {b: kind in t.rules for b, t in tables.items()}
            for kind in sorted(O.OPS) if kind not in O.LEAF_KINDS}

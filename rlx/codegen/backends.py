"""Every backend's rule table, and the questions asked of them before any build.

`rlx.codegen.registry` defines tables; each backend package makes its own (`rule_table()`, from the
rule modules it lists). This module finds a backend's package and answers: `supports(graph, backend)`,
`first_unsupported_op(graph, backend)` and the op × backend `support_table()`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

from rlx.codegen.registry import BACKENDS, RuleTable
from rlx.ir import ops as O
from rlx.ir.graph import Graph, Node

#: The package of each backend, whose `rule_table()` makes its table; imported by `load_rules` when that
#: backend is first asked about (a CPU compile never imports the CUDA or Metal code generators: cold-build time).
BACKEND_PACKAGES = {"cpu": "rlx.codegen.cpu", "cuda": "rlx.codegen.cuda", "metal": "rlx.codegen.metal"}


def load_rules(backend: str) -> RuleTable:
    """The rule table of `backend` (`rlx.codegen.<backend>.rule_table()`)."""
    if backend not in BACKEND_PACKAGES:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    return importlib.import_module(BACKEND_PACKAGES[backend]).rule_table()


def first_unsupported_op(graph: Graph, backend: str) -> tuple[Node, str] | None:
    """The first scheduled node `backend` cannot render, with the reason; None when all are supported."""
    return load_rules(backend).first_refusal(graph)


def supports(graph: Graph, backend: str) -> bool:
    """True when every op of `graph` (as the backend will see it) has a rule accepting it."""
    return first_unsupported_op(graph, backend) is None


def support_table(backends: Iterable[str] = BACKENDS) -> Mapping[str, Mapping[str, bool]]:
    """op kind → backend → has a rule (the `rlxc inspect --support` table)."""
    tables = {b: load_rules(b) for b in backends}
    return {kind: {b: kind in t.rules for b, t in tables.items()}
            for kind in sorted(O.OPS) if kind not in O.LEAF_KINDS}

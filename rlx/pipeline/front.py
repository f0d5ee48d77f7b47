"""The target-independent stages of the pipeline and the two that ask a backend's rules.

Each is a function from one value to the next: `optimize` (MIR → MIR, `rlx.opt.pipeline`),
`precision` (f32 params stored in bf16/f16, `rlx.opt.precision`), `legalize` (f16/bf16 ops the
backend lacks run in f32 between casts, `rlx.opt.legalize`), `decompose` (ops the backend has no
rule for become primitives it has, `rlx.opt.decompose`) and `plan` (MIR → LIR, `rlx.opt.memplan`).
`legalize` and `decompose` read the backend's rule table, so they import that backend's codegen
module (never on the compile index's warm path).

>>> from rlx.ir.graph import Graph
>>> g = Graph("front")
>>> g.set_outputs([g.activation("relu", g.matmul(g.input("x", [2, 4]), g.param("w", [4, 3])))])
>>> lir = lower_to_lir(g, 2, backend="cpu")
>>> lir.backend, [n.kind for n in lir.graph.nodes][-1]
('', 'fused_matmul_bias_act')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: a warm compile loads this module and no graph
    from rlx.ir.graph import Graph, Node
    from rlx.ir.lir import LirModule

# The optimizer loads in the stages that run it, not with this module: a warm cache hit never optimizes
# and loads no rlx.opt module (tests/models/test_embedder.py).


def optimize(mir: Graph, level: int | None, *, debug: bool | None = None) -> Graph:
    """MIR → optimized MIR at `level` (`rlx.opt.pipeline.optimize`, looked up at call time, so a
    patched optimizer is the one that runs)."""
    from rlx.opt import pipeline as opt_pipeline

    return opt_pipeline.optimize(mir, level=level, debug=debug)


def precision(mir: Graph, params_in: str) -> Graph:
    """f32 params stored in `params_in` ("bf16", "f16") and widened where read, GEMM weights excepted
    (`rlx.opt.precision`); the identity for "f32". Runs after optimizing, so the layout pass has folded
    weight transposes into the params already."""
    if params_in == "f32":
        return mir
    from rlx.opt.precision import store_params_in

    return store_params_in(mir, params_in)


def rules_of(backend: str) -> Any:
    """The rule table of `backend`, with its rules registered (imports that backend's codegen)."""
    from rlx.codegen import backends

    return backends.load_rules(backend)


def legalize(mir: Graph, backend: str) -> Graph:
    """f16/bf16 ops `backend` lacks run in f32 between casts (`rlx.opt.legalize`)."""
    from rlx.opt.legalize import legalize as legalize_graph

    return legalize_graph(mir, rules_of(backend).accepts)


def decompose(mir: Graph, backend: str) -> Graph:
    """Ops `backend` has no rule for decompose into primitives it has (`rlx.opt.decompose`)."""
    from rlx.opt.decompose import decompose as decompose_graph

    rules = rules_of(backend)
    return decompose_graph(mir, lambda g, node: rules.why_not(g, node) is None, rules.why_not)


def plan(mir: Graph, *, hold_norm_inputs: bool = False, early_residual_adds: bool = False) -> LirModule:
    """MIR → LIR: every value placed in the arena (`rlx.opt.memplan.plan`)."""
    from rlx.opt.memplan import plan as plan_memory

    return plan_memory(mir, hold_norm_inputs=hold_norm_inputs, early_residual_adds=early_residual_adds)


def legalize_for(mir: Graph, backend: str) -> Graph:
    """`mir` as `backend` can build it: the `legalize` stage, then `decompose`."""
    return decompose(legalize(mir, backend), backend)


def lower_to_lir(graph: Graph, level: int | None = None, *, debug: bool | None = None,
                 backend: str | None = None, params_in: str = "f32",
                 hold_norm_inputs: bool | None = None) -> LirModule:
    """MIR → LIR (undecided): `optimize`, `precision`, `legalize`, `decompose` (with `backend`), `plan`.

    `hold_norm_inputs` (None: for the CUDA backend only): `rlx.opt.memplan.plan`'s option, which lets
    CUDA's small GEMMs compute the norm before them in their prologue. The CPU's plan takes memplan's
    `early_residual_adds` (its convs compute residual adds in their store).
    """
    mir = precision(optimize(graph, level, debug=debug), params_in)
    if backend is not None:
        mir = legalize_for(mir, backend)
    hold = backend == "cuda" if hold_norm_inputs is None else hold_norm_inputs
    return plan(mir, hold_norm_inputs=hold, early_residual_adds=backend == "cpu")


def first_unsupported_op(graph: Graph, backend: str) -> tuple[Node, str] | None:
    """The first node of `graph` `backend` has no rule for, with why (`rlx.codegen.backends`)."""
    from rlx.codegen.backends import first_unsupported_op as first

    return first(graph, backend)


def support_table() -> Any:
    """op kind → backend → has a rule (`rlxc inspect --support`)."""
    from rlx.codegen.backends import support_table as table

    return table()


__all__ = ["decompose", "first_unsupported_op", "legalize", "legalize_for", "lower_to_lir", "optimize", "plan",
           "precision", "rules_of", "support_table"]

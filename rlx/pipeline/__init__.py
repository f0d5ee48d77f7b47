"""The compiler pipeline the driver holds: one module per stage family, every stage a value.

    optimize → precision → legalize → decompose → plan → decide → render → build → load

- `rlx.pipeline.front`: the target-independent stages (MIR → MIR, MIR → LIR) and `lower_to_lir`.
- `rlx.pipeline.decide`: LIR → decided LIR (`rlx.opt.lowering.lower_for`, scan bodies included).
- `rlx.pipeline.cpu`, `.cuda`, `.metal`: each backend's decide, render, build, load and estimate.
- `rlx.pipeline.core`: `Pipeline`, which runs them, and `stages_for`.

This is the one place below the driver that imports `rlx.codegen` (an import-linter contract): the
toolchain builds rendered source text, the runtime loads what was built, and codegen renders a
decided LIR and decides nothing. Codegen is imported lazily, by the stages that render (or ask a
backend's rules), so a compile-index hit never loads it or jinja2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlx.lazy import lazy_names

# Not lazy: `decide` is also a submodule's name, whose import would bind the module here (it loads no IR).
from rlx.pipeline.decide import decide

if TYPE_CHECKING:
    from rlx.pipeline.core import BACKENDS, Pipeline, stages_for
    from rlx.pipeline.front import first_unsupported_op, legalize_for, lower_to_lir, support_table
    from rlx.pipeline.values import Built, Rendered

#: Public names, loaded on first use (PEP 562): a warm compile loads `core` and its backend's stages,
#: not the IR's graphs. name -> module.
_LAZY = {"BACKENDS": "rlx.pipeline.core", "Pipeline": "rlx.pipeline.core", "stages_for": "rlx.pipeline.core",
         "first_unsupported_op": "rlx.pipeline.front",
         "legalize_for": "rlx.pipeline.front", "lower_to_lir": "rlx.pipeline.front",
         "support_table": "rlx.pipeline.front", "Built": "rlx.pipeline.values", "Rendered": "rlx.pipeline.values"}


# Not cached (rlx.lazy): rlx.pristine watches a compiler package's globals.
__getattr__, __dir__ = lazy_names(globals(), _LAZY, cache=False)


__all__ = ["BACKENDS", "Built", "Pipeline", "Rendered", "decide", "first_unsupported_op", "legalize_for",
           "lower_to_lir", "stages_for", "support_table"]

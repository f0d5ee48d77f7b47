"""The Metal backend: `render_metal(lir, target, manifest)` renders one .metal file and its dispatch manifest.

The emitter and template context live in `rlx.codegen.metal.emit`, the per-op rules in the rule
modules listed by `rule_table()` (`rules`, `quant` for GGUF-quantized weights and `user_op` for
user-defined ops), each declaring
its rules in its `RULES`.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> from rlx.pipeline import decide  # the pipeline decides, codegen renders
>>> g = Graph("demo")
>>> x = g.input("x", [4, 8])
>>> g.set_outputs([g.activation("relu", x)])
>>> prog = render_metal(decide(plan(g), "metal"), MetalTarget(), {"name": "demo"})
>>> "kernel void rlx_k1" in prog.source and "rlx_relu" in prog.source
True
>>> prog.manifest["dispatches"][0]["kernel"]
'rlx_k1'
>>> sorted(rule_table().rules)[:3]
['activation', 'argmax', 'attention']
"""

from __future__ import annotations

import functools

from rlx.codegen.metal.emit import (
    CODEGEN_VERSION,
    MSL_VERSION,
    Dispatch,
    MetalEmitter,
    MetalProgram,
    MetalTarget,
    metal_context,
    render_metal,
)
from rlx.codegen.registry import RuleTable


@functools.cache
def rule_table() -> RuleTable:
    """The Metal rule table: every rule of the Metal rule modules (made once per process)."""
    from rlx.codegen.metal import quant, rules, user_op

    return RuleTable.of("metal", (m.RULES for m in (rules, quant, user_op)))


__all__ = ["CODEGEN_VERSION", "MSL_VERSION", "Dispatch", "MetalEmitter", "MetalProgram", "MetalTarget",
           "metal_context", "render_metal", "rule_table"]

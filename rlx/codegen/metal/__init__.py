"""The Metal backend: `render_metal(lir, target, manifest)` renders one .metal file and its dispatch manifest.

This module is the backend's entry point: the emitter and template context live in
`rlx.codegen.metal.emit`, the per-op rules in `rlx.codegen.metal.rules` and, for GGUF-quantized
weights, `rlx.codegen.metal.quant` (registered in `table("metal")` when imported here), so importing
`rlx.codegen.metal` gives a ready backend.

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
"""

from __future__ import annotations

from rlx.codegen.metal import quant as metal_quant
from rlx.codegen.metal import rules as metal_rules
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

__all__ = ["CODEGEN_VERSION", "MSL_VERSION", "Dispatch", "MetalEmitter", "MetalProgram", "MetalTarget",
           "metal_context", "metal_quant", "metal_rules", "render_metal"]

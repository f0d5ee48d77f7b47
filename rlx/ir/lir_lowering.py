"""Where the MIR → LIR lowering `GraphModule.plan()` calls is registered (by `rlx.driver`).

The optimizer and planner sit above the IR (rlx.opt imports rlx.ir), so `rlx.ir.module` cannot import
them. The layer that owns the pipeline, rlx.driver, registers the lowering when it is imported
(`import rlx` always imports it); Session.lower uses the same function, so `GraphModule.plan()` and
`Session.compile()` always agree on the LIR. This module imports nothing, so the driver registers
without loading the IR's graphs (a warm start never builds one).

A dict, mutated in place, rather than a rebound global: the driver watches module globals for
monkeypatches.

>>> from rlx.ir.lir_lowering import lir_lowering
>>> import rlx  # registers the driver's lowering
>>> callable(lir_lowering())
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: MIR -> LIR: `fn(graph, level)` optimizes at `level` (None: RLX_OPT_LEVEL) and plans memory.
LirLowering = Callable[[Any, "int | None"], Any]

_LIR_LOWERING: dict[str, LirLowering] = {}


def register_lir_lowering(fn: LirLowering) -> None:
    """Install the MIR -> LIR lowering `GraphModule.lower(to="lir")` calls (done by `rlx.driver`)."""
    _LIR_LOWERING["lir"] = fn


def lir_lowering() -> LirLowering | None:
    """The registered lowering, or None before `rlx.driver` loaded."""
    return _LIR_LOWERING.get("lir")


__all__ = ["LirLowering", "lir_lowering", "register_lir_lowering"]

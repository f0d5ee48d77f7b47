"""Automatic differentiation: `vjp`, `grad`, `jvp`, `jacfwd` (graph → graph; see `rlx.opt.ad_core`).

Importing this module registers every derivative rule: the primitives'
(`rlx.opt.ad_rules`), the composite expansions (`rlx.opt.ad_expand`) and those
of the ops holding bodies (`rlx.opt.ad_scan`, `rlx.opt.ad_control`), which build on the core.

>>> import numpy as np
>>> from rlx.ir.graph import Graph
>>> from rlx import reference
>>> g = Graph("sq")
>>> x = g.input("x", [3])
>>> g.set_outputs({"loss": g.reduce("sum", g.mul(x, x))})
>>> reference.run(grad(g), {"x": np.array([1.0, 2.0, 3.0], np.float32)})[1].tolist()
[2.0, 4.0, 6.0]
"""

from __future__ import annotations

from rlx.opt import ad_control, ad_scan  # noqa: F401  (registers the scan, custom_fn, cond, while_loop rules)
from rlx.opt.ad_core import JACFWD_MAX_ELEMENTS, grad, jacfwd, jvp, vjp

__all__ = ["JACFWD_MAX_ELEMENTS", "grad", "jacfwd", "jvp", "vjp"]

"""The observed CPU build variants: what the profiled and NaN-checked sources add, as template data.

`observe_context(emitter, kernels, target)` returns the extra template context
of `templates/cpu/observe.c.j2`: per kernel, the C expressions of its cost
(`rlx.ir.cost`, evaluated from the run's `sym[]`) and of its output (pointer,
element count, dtype, a printf format of its concrete shape), plus the JSON
table of kernels the profiled library exports (`rlx_profile_info`). The
normal build gets `profile=False, check_nans=False` and an empty table, so
none of it is rendered.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.memplan import plan
>>> from rlx.pipeline import decide
>>> from rlx.codegen.cpu.emit import CTarget, render_c
>>> g = Graph("demo")
>>> g.set_outputs([g.activation("log", g.input("x", [4]))])
>>> lir = decide(plan(g), "cpu")  # what the pipeline hands codegen
>>> "rlx_prof" in render_c(lir, CTarget(), {"name": "demo"})
False
>>> src = render_c(lir, CTarget(profile=True, check_nans=True), {"name": "demo"})
>>> "rlx_prof_record" in src and "rlx_first_nonfinite_f32" in src
True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rlx.codegen.common import cost_expr
from rlx.codegen.cpu.base import c_string, c_string_lines
from rlx.ir.cost import node_cost
from rlx.ir.dtype import DType

#: What each profile span field is (rlx_profile_read writes them in this order).
SPAN_FIELDS = ("t0", "t1", "kernel", "thread", "run", "flops", "bytes")
#: The reduction clause a profiled parallel region carries (declared in kernels/profile.h).
OMP_PROF_CLAUSE = " reduction(rlx_prof:rlx_ts)"
#: sizeof the span ring of a profiled context (kernels/profile_ring.h: three int64, RLX_PROF_CAP spans of 48 B).
PROFILE_RING_BYTES = 24 + (1 << 14) * 48
_CHECKED = {DType.F32: "f32", DType.F64: "f64", DType.F16: "f16", DType.BF16: "bf16"}
_VALUE = {"f32": "(double)((const float *){ptr})[rlx_bad]", "f64": "((const double *){ptr})[rlx_bad]",
          "f16": "(double)rlx_h2f(((const uint16_t *){ptr})[rlx_bad])",
          "bf16": "(double)rlx_bf2f(((const uint16_t *){ptr})[rlx_bad])"}


def observe_context(em: Any, kernels: Sequence[Any], target: Any) -> dict:
    """The template data of the observed variants (`target.profile` / `target.check_nans`)."""
    profile, check = bool(getattr(target, "profile", False)), bool(getattr(target, "check_nans", False))
    observed: dict[str, dict] = {}
    table = []
    if profile or check:
        for index, k in enumerate(kk for kk in kernels if kk.macro):
            node = em.node(k.node)
            cost = node_cost(em.graph, node)
            entry: dict[str, Any] = {"index": index, "flops": cost_expr(cost.flops, em.sym_index),
                                     "bytes": cost_expr(cost.bytes, em.sym_index), "nan": None}
            dt = _CHECKED.get(node.shape.dtype)
            if check and dt is not None:
                ptr = em.base(node.id)
                dims = [em.dim(d) for d in node.shape.dims]
                fmt = f"{node.shape.dtype.value}[{','.join(['%lld'] * len(dims))}]"
                entry["nan"] = {"dtype": dt, "ptr": f"((const void *){ptr})", "count": em.numel(node.shape.dims),
                                "value": _VALUE[dt].format(ptr=ptr), "dims": dims,
                                "fmt": c_string(f"{fmt} (declared {node.shape})")}
            observed[k.func] = entry
            table.append({"index": index, "node": node.id, "kind": node.kind, "name": node.name or "",
                          "op": node.op.describe()[:200], "shape": str(node.shape), "func": k.func})
    info = json.dumps({"fields": list(SPAN_FIELDS), "kernels": table}, sort_keys=True, ensure_ascii=True)
    return {"profile": profile, "check_nans": check, "observed": observed,
            "omp_prof": OMP_PROF_CLAUSE if profile else "", "profile_info": c_string_lines(info)}


__all__ = ["OMP_PROF_CLAUSE", "PROFILE_RING_BYTES", "SPAN_FIELDS", "cost_expr", "observe_context"]

"""The compile report: what the compiler did to one graph, as one self-contained HTML page.

`build_report_data(graph)` runs the pipeline up to the rendered C source (no
C compiler runs) and collects, as plain JSON-able data:

- the graph at each stage: HIR (when the graph was given as HIR), MIR (before
  the optimizer) and LIR (optimized, decomposed for the CPU, memory-planned),
  every node with its op, shape, source name, inputs and cost at the dims'
  bounds; LIR nodes that fuse several ops (elementwise regions, fused GEMM /
  norm / SwiGLU kernels) carry the ops they fuse, drawn as an outlined group;
- the generated C source, and for every LIR node the line its code starts on
  (the generated code heads each kernel with a comment naming its node);
- the memory plan: every arena buffer's offset, size and lifetime (schedule
  steps from its definition to its last use);
- with a chrome trace (`CompiledGraph.save_trace` / `rlxc bench --profile --trace`),
  each LIR node's kernel time and share.

`render_report(data)` fills `templates/report/report.html.j2` (the page's
script and style are `templates/report/report.js` / `report.css`, inlined):
no network access, the graphs are drawn into inline SVG by the page's script.

>>> import rlx
>>> g = rlx.Graph("r")
>>> x = g.input("x", [2, 8])
>>> g.set_outputs([g.activation("relu", g.matmul(x, g.param("w", [8, 4])))])
>>> data = build_report_data(g)
>>> [s["name"] for s in data["stages"]], len(data["source"]) > 10
(['MIR', 'LIR'], True)
>>> "<svg" in render_report(data) or "rlx-data" in render_report(data)
True
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from rlx.config import Config
from rlx.driver import Device, Session, to_mir
from rlx.errors import RlxError
from rlx.ir import ops as O
from rlx.ir.cost import at_bounds, node_cost
from rlx.ir.graph import Graph, Node
from rlx.ir.lir import LirModule
from rlx.templates_path import templates_dir

#: Fused kinds drawn as a group: what each one fuses (elementwise regions list their steps).
FUSED = {
    "fused_matmul_bias_act": ("matmul", "add bias", "activation"),
    "fused_residual_layer_norm": ("add residual", "layer_norm"),
    "fused_residual_rms_norm": ("add residual", "rms_norm"),
    "fused_swiglu": ("matmul gate", "matmul up", "silu", "mul"),
}
_KERNEL_HEAD = re.compile(r"^/\* %(\d+) ")


def _fused_parts(node: Node) -> list[str]:
    if isinstance(node.op, O.ElementwiseRegion):
        return [step.op.describe() for step in node.op.steps]
    parts = list(FUSED.get(node.kind, ()))
    act = getattr(node.op, "activation", "missing")
    if node.kind == "fused_matmul_bias_act":
        parts = ["matmul"] + (["add bias"] if len(node.inputs) == 3 else []) + ([act] if act else [])
    return parts


def _stage(name: str, graph: Graph, bounds: Mapping[str, int]) -> dict:
    nodes = []
    for n in graph.nodes:
        cost = node_cost(graph, n)
        nodes.append({"id": n.id, "kind": n.kind, "op": n.op.describe()[:160], "name": n.name or "",
                      "shape": str(n.shape), "inputs": list(n.inputs),
                      "flops": at_bounds(cost.flops, bounds), "bytes": at_bounds(cost.bytes, bounds),
                      "group": _fused_parts(n)})
    return {"name": name, "nodes": nodes, "outputs": list(graph.outputs)}


def _lifetimes(lir: LirModule) -> list[dict]:
    """Every arena buffer: offset, size, and the schedule steps [start, end] it is live for."""
    pos = {nid: i for i, nid in enumerate(lir.schedule)}
    end = len(lir.schedule)

    def root(nid: int) -> int:
        while lir.buffers[nid].storage == "view":
            nid = lir.buffers[nid].source
        return nid

    last: dict[int, int] = {}
    for n in lir.graph.nodes:
        for i in n.inputs:
            r = root(i)
            last[r] = max(last.get(r, 0), pos.get(n.id, 0))
    for _, nid in lir.output_copies:
        last[root(nid)] = end
    out = []
    for nid in lir.schedule:
        b = lir.buffers[nid]
        if b.storage != "arena":
            continue
        node = lir.graph.node(nid)
        out.append({"id": nid, "kind": node.kind, "name": node.name or "", "shape": str(node.shape),
                    "offset": b.offset, "bytes": b.nbytes, "start": pos[nid], "end": max(last.get(nid, pos[nid]),
                                                                                        pos[nid])})
    return out


def _kernel_lines(source: str) -> dict[int, int]:
    """LIR node id -> 1-based line of the comment heading its kernel in the generated C."""
    lines: dict[int, int] = {}
    for i, line in enumerate(source.splitlines(), 1):
        m = _KERNEL_HEAD.match(line)
        if m and int(m.group(1)) not in lines:
            lines[int(m.group(1))] = i
    return lines


def trace_times(trace: Mapping[str, Any]) -> dict[int, float]:
    """Kernel time (microseconds) per node id from a chrome-trace document written by RLX.

    Only complete ("X") events on the kernel track (tid 0) with a node id count.

    >>> trace_times({"traceEvents": [{"ph": "X", "tid": 0, "dur": 2.5, "args": {"node": 4}},
    ...                              {"ph": "X", "tid": 1, "dur": 9.0, "args": {"node": 4}}]})
    {4: 2.5}
    """
    events = trace.get("traceEvents") if isinstance(trace, Mapping) else None
    if not isinstance(events, list):
        raise RlxError("not a chrome-trace document (no traceEvents list)")
    out: dict[int, float] = {}
    for e in events:
        if not isinstance(e, Mapping) or e.get("ph") != "X" or e.get("tid") != 0:
            continue
        node = (e.get("args") or {}).get("node")
        if isinstance(node, int) and isinstance(e.get("dur"), (int, float)):
            out[node] = out.get(node, 0.0) + float(e["dur"])
    return out


def build_report_data(graph: Any, *, config: Config | None = None, trace: Mapping[str, Any] | None = None) -> dict:
    """Everything the report page shows about `graph` (a HIR module or MIR graph), as JSON-able data."""
    from rlx.toolchain.cache import cache_key

    config = config or Config.from_env()
    stages = []
    hir = graph if getattr(graph, "stage", None) == "hir" and isinstance(graph, Graph) else None
    mir = to_mir(graph)
    bounds = mir.symbols()
    if hir is not None:
        stages.append(_stage("HIR", hir, bounds))
    stages.append(_stage("MIR", mir, bounds))
    # the CPU session's pipeline up to render: the decided LIR and the source a compile builds
    rendered = Session(Device.CPU, config=config).render(mir)
    lir = rendered.lir
    source = rendered.with_key(cache_key(rendered.components))
    lir_stage = _stage("LIR", lir.graph, bounds)
    lines = _kernel_lines(source)
    for n in lir_stage["nodes"]:
        b = lir.buffers[n["id"]]
        n["line"] = lines.get(n["id"])
        n["storage"] = b.storage
    stages.append(lir_stage)
    times = trace_times(trace) if trace is not None else {}
    total = sum(times.values())
    return {
        "name": mir.name,
        "opt_level": config.opt_level,
        "symbols": [[k, v] for k, v in bounds.items()],
        "stages": stages,
        "source": source.splitlines(),
        "memory": {"arena_bytes": lir.arena_bytes, "naive_bytes": lir.naive_bytes, "steps": len(lir.schedule),
                   "buffers": _lifetimes(lir)},
        "trace": {"times_us": {str(k): v for k, v in times.items()}, "total_us": total} if trace is not None else None,
    }


def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir() / "report")),
                              undefined=jinja2.StrictUndefined, autoescape=True, keep_trailing_newline=True)


def _script_json(data: Mapping[str, Any]) -> str:
    """JSON safe inside a <script> element (no `</`, no `<!--`)."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_report(data: Mapping[str, Any]) -> str:
    """The report page of `data` (from `build_report_data`): HTML with its script, style and data inline."""
    env = _environment()
    return env.get_template("report.html.j2").render(
        title=f"RLX report: {data['name']}", data_json=Markup(_script_json(data)),
        script=Markup(env.loader.get_source(env, "report.js")[0]),
        style=Markup(env.loader.get_source(env, "report.css")[0]))


def write_report(graph: Any, path: str | Path, *, config: Config | None = None,
                 trace: str | Path | Mapping[str, Any] | None = None) -> Path:
    """Build the report of `graph` and write it to `path`; `trace`: a chrome-trace file or document."""
    if trace is not None and not isinstance(trace, Mapping):
        try:
            trace = json.loads(Path(trace).read_text())
        except (OSError, ValueError) as exc:
            raise RlxError(f"cannot read the trace {trace}: {exc}") from None
    path = Path(path)
    path.write_text(render_report(build_report_data(graph, config=config, trace=trace)))
    return path


__all__ = ["build_report_data", "render_report", "trace_times", "write_report"]

"""Versioned JSON documents for LIR modules: the planned graph with its buffers, IO and decisions.

A document is one JSON object::

    {"format": "rlx-lir", "version": 1, "name": ..., "graph": <an rlx-graph document>,
     "schedule": [...], "buffers": [[node, storage, nbytes, slot, offset, source], ...],
     "inputs" / "outputs" / "params": [{"name", "node", "shape", "layout", "state"}, ...],
     "constants": [...], "symbols": [[name, max], ...], "arena_bytes", "naive_bytes",
     "output_copies": [[slot, node], ...], "backend": "", "decisions": [{"kind": ..., fields}, ...],
     "workspaces": [[node, offset, bytes], ...]}

The graph is written by `rlx.ir.serialize` (and loaded back through it, every shape inferred again). A decision
is its record's fields, rebuilt by kind from `rlx.ir.decisions.DECISION_KINDS` with each field decoded by its
type hint (nested records such as a `DeviceLayout`'s regions included). What a backend renders from a loaded
LIR is what it renders from the original (`tests/codegen/test_render_roundtrip.py`): codegen reads nothing but
the LIR and the target. Anything malformed raises `IRError`.

>>> from rlx.ir.graph import Graph
>>> from rlx.opt.lowering import lower_for
>>> from rlx.opt.memplan import plan
>>> g = Graph("mlp")
>>> g.set_outputs([g.matmul(g.input("x", [4, 8]), g.param("w", [8, 16]))])
>>> lir = lower_for(plan(g), "cpu")
>>> back = lir_from_json(lir_to_json(lir))
>>> back.hash() == lir.hash(), back.decisions
(True, (PackedParam(node=1, transposed=False),))
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from rlx.errors import IRError
from rlx.ir import (
    decisions_conv,
    decisions_cuda,
    decisions_cuda_kernels,
    decisions_int8,
    decisions_metal,
    decisions_moe,
    decisions_quant,
    serialize,
)
from rlx.ir.decisions import DECISION_KINDS, Decision
from rlx.ir.encode import decode_value, shape_from_json, shape_to_json
from rlx.ir.graph import Graph
from rlx.ir.lir import STORAGES, Buffer, LirModule, TensorSpec
from rlx.ir.ops_control import step_bodies

FORMAT = "rlx-lir"
VERSION = 1
#: The modules defining decision kinds: each registers its kinds when imported, and a loader must know them all.
DECISION_MODULES = (decisions_conv, decisions_cuda, decisions_cuda_kernels, decisions_int8, decisions_metal,
                    decisions_moe, decisions_quant)
_KEYS = ("format", "version", "name", "graph", "schedule", "buffers", "inputs", "outputs", "params", "constants",
         "symbols", "arena_bytes", "naive_bytes", "output_copies", "backend", "decisions", "workspaces", "bodies")


# ── writing ─────────────────────────────────────────────────────────────


def _record_to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _record_to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_record_to_json(v) for v in value]
    return value


def _spec_to_json(s: TensorSpec) -> dict[str, Any]:
    return {"name": s.name, "node": s.node, "shape": shape_to_json(s.shape),
            "layout": list(s.layout) if s.layout is not None else None, "state": s.state}


def lir_to_document(lir: LirModule) -> dict[str, Any]:
    """`lir` as a JSON-compatible dict."""
    buffers = [[nid, b.storage, b.nbytes, b.slot, b.offset, b.source] for nid, b in sorted(lir.buffers.items())]
    return {
        "format": FORMAT, "version": VERSION, "name": lir.name, "graph": serialize.to_document(lir.graph),
        "schedule": list(lir.schedule), "buffers": buffers,
        "inputs": [_spec_to_json(s) for s in lir.inputs], "outputs": [_spec_to_json(s) for s in lir.outputs],
        "params": [_spec_to_json(s) for s in lir.params], "constants": list(lir.constants),
        "symbols": [list(s) for s in lir.symbols], "arena_bytes": lir.arena_bytes, "naive_bytes": lir.naive_bytes,
        "output_copies": [list(c) for c in lir.output_copies], "backend": lir.backend,
        "decisions": [{"kind": d.kind, **_record_to_json(d)} for d in lir.decisions],
        "workspaces": [list(w) for w in lir.workspaces],
        # decided scan bodies (rlx.pipeline.decide): each a LIR document of its own, under its scan's node
        "bodies": [[nid, lir_to_document(body)] for nid, body in lir.bodies],
    }


def lir_to_json(lir: LirModule) -> str:
    """Serialize `lir` (planned, lowered or not) to JSON text."""
    return json.dumps(lir_to_document(lir), allow_nan=False, separators=(",", ":"))


# ── reading ─────────────────────────────────────────────────────────────


def _record_from_json(cls: type, doc: Any, where: str) -> Any:
    """A frozen record of dataclass `cls` from its fields' JSON, each decoded by its type hint."""
    if not isinstance(doc, dict):
        raise IRError(f"{where}: expected an object, got {_short(doc)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise IRError(f"{where}: unknown fields {unknown}")
    kwargs = {}
    for name, f in fields.items():
        if name not in doc:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise IRError(f"{where}: missing field {name!r}")
            continue
        kwargs[name] = _field_from_json(hints[name], doc[name], f"{where} field {name!r}")
    return cls(**kwargs)


def _field_from_json(hint: Any, value: Any, where: str) -> Any:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and args and dataclasses.is_dataclass(args[0]):
        if not isinstance(value, list):
            raise IRError(f"{where}: expected a list, got {_short(value)}")
        return tuple(_record_from_json(args[0], v, where) for v in value)
    if dataclasses.is_dataclass(hint):
        return _record_from_json(hint, value, where)
    return decode_value(hint, value, where)


def _decision_from_json(doc: Any, index: int) -> Decision:
    where = f"decision {index}"
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        raise IRError(f"{where}: expected an object with a 'kind' string, got {_short(doc)}")
    cls = DECISION_KINDS.get(doc["kind"])
    if cls is None:
        raise IRError(f"{where}: unknown decision kind {doc['kind']!r}")
    return _record_from_json(cls, {k: v for k, v in doc.items() if k != "kind"}, f"{where} ({doc['kind']})")


def _spec_from_json(doc: Any, where: str) -> TensorSpec:
    if not isinstance(doc, dict) or set(doc) != {"name", "node", "shape", "layout", "state"}:
        raise IRError(f"{where}: bad tensor spec {_short(doc)}")
    layout = None if doc["layout"] is None else decode_value(tuple[int, ...], doc["layout"], where)
    return TensorSpec(decode_value(str, doc["name"], where), decode_value(int, doc["node"], where),
                      shape_from_json(doc["shape"]), layout, decode_value(bool, doc["state"], where))


def _int_rows(value: Any, width: int, where: str) -> list[tuple[int, ...]]:
    rows = decode_value(tuple[tuple[int, ...], ...], value, where)
    if any(len(r) != width for r in rows):
        raise IRError(f"{where}: every entry must hold {width} integers")
    return list(rows)


def lir_from_document(doc: Any) -> LirModule:
    """Rebuild a LIR from a parsed document (see the module docstring for its form)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        what = doc.get("format") if isinstance(doc, dict) else doc
        raise IRError(f"not an rlx LIR document (format is {_short(what)}, expected {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise IRError(f"LIR document has version {_short(doc.get('version'))}; this rlx reads "
                                f"version {VERSION}")
    missing, unknown = [k for k in _KEYS if k not in doc], sorted(k for k in doc if k not in _KEYS)
    if missing or unknown:
        raise IRError(f"LIR document: missing keys {missing}, unknown keys {[_short(k) for k in unknown[:5]]}")
    graph = serialize.from_document(doc["graph"], Graph)
    if not isinstance(graph, Graph):
        raise IRError("the LIR's graph must be a MIR graph")
    buffers: dict[int, Buffer] = {}
    for entry in decode_value(tuple[tuple[Any, ...], ...], doc["buffers"], "LIR buffers"):
        if len(entry) != 6 or entry[1] not in STORAGES:
            raise IRError(f"LIR buffer {_short(entry)}: expected [node, storage, nbytes, slot, "
                                    f"offset, source] with storage one of {STORAGES}")
        nid, storage, *rest = entry
        nid, *numbers = (decode_value(int, v, "LIR buffer") for v in (nid, *rest))
        buffers[nid] = Buffer(storage, *numbers)
    if sorted(buffers) != [n.id for n in graph.nodes]:
        raise IRError("LIR buffers must name every node of the graph once")
    copies = _int_rows(doc["output_copies"], 2, "LIR output copies")
    workspaces = _int_rows(doc["workspaces"], 3, "LIR workspaces")
    symbols = decode_value(tuple[tuple[Any, ...], ...], doc["symbols"], "LIR symbols")
    if not all(len(s) == 2 and isinstance(s[0], str) and type(s[1]) is int for s in symbols):
        raise IRError("LIR symbols must be [name, max] pairs")
    decisions = doc["decisions"]
    if not isinstance(decisions, list):
        raise IRError("LIR decisions must be a list")
    bodies = []
    for entry in _list(doc["bodies"], "bodies"):
        if not (isinstance(entry, list) and len(entry) == 2):
            raise IRError(f"LIR body {_short(entry)}: expected [scan node, LIR document]")
        nid = decode_value(int, entry[0], "LIR body node")
        if nid not in buffers or not step_bodies(graph.node(nid).op):
            raise IRError(f"LIR body of %{nid}: not a scan, cond or while_loop node of the graph")
        bodies.append((nid, lir_from_document(entry[1])))
    return LirModule(
        name=decode_value(str, doc["name"], "LIR name"), graph=graph,
        schedule=decode_value(tuple[int, ...], doc["schedule"], "LIR schedule"), buffers=buffers,
        inputs=tuple(_spec_from_json(s, f"LIR input {i}") for i, s in enumerate(_list(doc["inputs"], "inputs"))),
        outputs=tuple(_spec_from_json(s, f"LIR output {i}") for i, s in enumerate(_list(doc["outputs"], "outputs"))),
        params=tuple(_spec_from_json(s, f"LIR param {i}") for i, s in enumerate(_list(doc["params"], "params"))),
        constants=decode_value(tuple[int, ...], doc["constants"], "LIR constants"),
        symbols=tuple((str(n), int(m)) for n, m in symbols),
        arena_bytes=decode_value(int, doc["arena_bytes"], "LIR arena_bytes"),
        naive_bytes=decode_value(int, doc["naive_bytes"], "LIR naive_bytes"),
        output_copies=tuple((k, n) for k, n in copies), backend=decode_value(str, doc["backend"], "LIR backend"),
        decisions=tuple(_decision_from_json(d, i) for i, d in enumerate(decisions)),
        workspaces=tuple((n, off, size) for n, off, size in workspaces), bodies=tuple(bodies))


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise IRError(f"LIR {what} must be a list, got {_short(value)}")
    return value


def lir_from_json(text: str | bytes, *, max_bytes: int = serialize.MAX_DOCUMENT_BYTES) -> LirModule:
    """Rebuild a LIR from `lir_to_json` text; raises `IRError` on anything malformed."""
    return lir_from_document(serialize.parse(text, max_bytes=max_bytes))

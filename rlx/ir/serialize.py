"""Versioned JSON documents for MIR graphs and HIR modules.

A document is one JSON object::

    {"format": "rlx-graph", "version": 1, "stage": "mir" | "hir", "name": ...,
     "nodes": [{"id": 0, "op": {...}, "inputs": [...], "name": ..., "shape": {...}}, ...],
     "outputs": [node ids], "output_names": [names]}

Ops and shapes use `rlx.ir.encode` (the encoding the LIR hash uses too).
Loading rebuilds the graph op by op through `Graph.add`, so every shape is
inferred again and compared with the stored one; then `Graph.verify` runs.
The class is picked by the document's stage (`HirModule` for "hir").

Anything malformed or hostile raises `IRError` naming the problem. Loading
never allocates much more than the document itself; the limits are:

- `MAX_DOCUMENT_BYTES` (256 MiB, the `max_bytes` argument raises it): the
  text, checked before parsing. Big constants are the only legitimate
  reason to come near it.
- `MAX_JSON_VALUES` (4 million): an upper bound on the number of JSON values
  (counted from `,` `[` `{` before parsing), so the parsed Python objects
  stay within a few hundred MiB whatever the document holds (about 350 MiB
  for the worst case, millions of tiny strings; a real graph needs ~18 per node).
- `MAX_NODES` (200 000): far above any real model (a 100-layer decoder is a
  few thousand nodes) and far below what would exhaust memory.
- `MAX_NAME_CHARS` (1024): graph, node, output, input and param names.
- Nesting deeper than the interpreter's recursion limit, `NaN`/`Infinity`
  literals (non-finite floats are written as `{"float": "nan"}`) and
  duplicate object keys are refused.

>>> from rlx.ir.graph import Graph
>>> g = Graph("tiny")
>>> x = g.input("x", [2, 3])
>>> g.set_outputs([g.activation("relu", x)])
>>> text = to_json(g)
>>> str(from_json(text)) == str(g)
True
>>> from_json('{"format": "rlx-graph", "version": 9}')
Traceback (most recent call last):
...
rlx.errors.IRError: graph document has version 9; this rlx reads version 1
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.encode import op_from_json, op_to_json, shape_from_json, shape_to_json

FORMAT = "rlx-graph"
VERSION = 1
STAGES = ("mir", "hir")
MAX_DOCUMENT_BYTES = 256 << 20
MAX_JSON_VALUES = 4_000_000
MAX_NODES = 200_000
MAX_NAME_CHARS = 1024

class Graph(Protocol):
    """What this module needs of a graph: `rlx.ir.graph.Graph` and `HirModule` are such graphs.

    This module sits below rlx.ir.graph (Graph's to_json/from_json call it), so it never imports
    the graph classes: it builds the class registered for a document's stage (`register`).
    """

    stage: ClassVar[str]
    op_registry: ClassVar[dict[str, type[O.Op]]]
    name: str
    nodes: list[Any]
    outputs: list[int]
    output_names: list[str]

    def __init__(self, name: str) -> None: ...
    def add(self, op: O.Op, inputs: Sequence[int] = (), name: str = "") -> int: ...
    def set_outputs(self, outputs: Sequence[int], names: Sequence[str] | None = None) -> None: ...
    def verify(self) -> None: ...


#: The graph class of each stage ("mir": Graph, "hir": HirModule). The classes register themselves
#: (`register`, called where they are defined), which keeps this module free of imports of them.
_CLASSES: dict[str, type[Graph]] = {}
#: Where the class of each stage is defined: imported by name when a document of that stage is loaded
#: before its class (`import rlx` does not load the IR's graphs).
_DEFINED_IN = {"mir": "rlx.ir.graph", "hir": "rlx.ir.hir"}

_TOP_KEYS = ("format", "version", "stage", "name", "nodes", "outputs", "output_names")
_NODE_KEYS = ("id", "op", "inputs", "name", "shape")


G = TypeVar("G", bound=Graph)


def register(cls: type[G]) -> type[G]:
    """Record `cls` as the class documents of stage `cls.stage` load into (usable as a class decorator)."""
    _CLASSES[cls.stage] = cls
    return cls


def _stage_class(stage: str) -> type[Graph]:
    if stage not in _CLASSES and stage in _DEFINED_IN:
        importlib.import_module(_DEFINED_IN[stage])  # registers the class as it loads
    try:
        return _CLASSES[stage]
    except KeyError:
        raise IRError(f"cannot load a {stage} document: no graph class is registered for that stage "
                      f"(import the module defining it, e.g. rlx.ir.hir)") from None


# ── writing ─────────────────────────────────────────────────────────────


def to_document(graph: Graph) -> dict[str, Any]:
    """The graph as a JSON-compatible dict (verified first, so it always loads back)."""
    graph.verify()
    if graph.stage not in STAGES:
        raise IRError(f"cannot serialize a graph of stage {graph.stage!r}; expected one of {STAGES}")
    _check_name("graph name", graph.name)
    for name in graph.output_names:
        _check_name("output name", name)
    nodes = []
    for n in graph.nodes:
        _check_name(f"node %{n.id} name", n.name)
        op_name = getattr(n.op, "name", None)
        if isinstance(op_name, str):
            _check_name(f"node %{n.id} {n.kind} name", op_name)
        nodes.append({"id": n.id, "op": op_to_json(n.op), "inputs": list(n.inputs), "name": n.name,
                      "shape": shape_to_json(n.shape)})
    return {"format": FORMAT, "version": VERSION, "stage": graph.stage, "name": graph.name, "nodes": nodes,
            "outputs": list(graph.outputs), "output_names": list(graph.output_names)}


def to_json(graph: Graph) -> str:
    """Serialize `graph` (MIR or HIR) to JSON text, one node per line."""
    doc = to_document(graph)
    head = {k: v for k, v in doc.items() if k != "nodes"}
    lines = [json.dumps(node, allow_nan=False, separators=(",", ":")) for node in doc["nodes"]]
    head_text = json.dumps(head, allow_nan=False)
    # Splice the node list in after the header fields so the file diffs line by line.
    return head_text[:-1] + ', "nodes": [\n' + ",\n".join(lines) + "\n]}\n"


def save(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write `graph` to `path` atomically (a reader never sees half a file)."""
    text = to_json(graph)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ── reading ─────────────────────────────────────────────────────────────


def from_json(text: str | bytes, expected: type[Graph] | None = None, *,
              max_bytes: int = MAX_DOCUMENT_BYTES) -> Graph:
    """Rebuild a graph from JSON text; raises `IRError` on anything malformed.

    `expected` is the class the caller asked for (`Graph.from_json` passes
    its `cls`): `Graph` accepts either stage and picks the class by stage;
    a subclass accepts only documents of its own stage.
    """
    return from_document(parse(text, max_bytes=max_bytes), expected)


def load(path: str | os.PathLike[str], expected: type[Graph] | None = None, *,
         max_bytes: int = MAX_DOCUMENT_BYTES) -> Graph:
    """Read a graph saved with `save`. A missing file raises the usual `OSError`."""
    p = Path(path)
    size = p.stat().st_size
    if size > max_bytes:
        raise IRError(f"{p}: graph document is {size} bytes, over the limit of {max_bytes}")
    try:
        return from_json(p.read_bytes(), expected, max_bytes=max_bytes)
    except IRError as exc:
        raise IRError(f"{p}: {exc}") from None


def parse(text: str | bytes, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Parse JSON text within the document limits (no graph checks yet)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        if len(text) > max_bytes:
            raise IRError(f"graph document is {len(text)} bytes, over the limit of {max_bytes}")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IRError(f"graph document is not valid UTF-8: {exc}") from None
    if not isinstance(text, str):
        raise IRError(f"graph document must be str or bytes, got {type(text).__name__}")
    if len(text) > max_bytes:
        raise IRError(f"graph document is {len(text)} characters, over the limit of {max_bytes}")
    # Every JSON value but the first follows a ',' or opens/sits in a container, so this
    # overcounts (separators inside strings count too) and bounds what parsing allocates.
    values = text.count(",") + text.count("[") + text.count("{")
    if values > MAX_JSON_VALUES:
        raise IRError(f"graph document holds about {values} JSON values, over the limit of {MAX_JSON_VALUES}")
    decoder = json.JSONDecoder(object_pairs_hook=_object_no_duplicates, parse_constant=_reject_constant)
    try:
        return decoder.decode(text)
    except IRError:
        raise
    except RecursionError:
        raise IRError("graph document is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and ints over Python's digit limit
        raise IRError(f"graph document is not valid JSON: {exc}") from None


def from_document(doc: Any, expected: type[Graph] | None = None) -> Graph:
    """Rebuild a graph from a parsed document (see the module docstring for its form)."""
    try:
        return _build(doc, expected or _stage_class("mir"))
    except RecursionError:
        raise IRError("graph document is nested too deeply") from None


def _build(doc: Any, expected: type[Graph]) -> Graph:
    if not isinstance(doc, dict):
        raise IRError(f"graph document must be a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise IRError(f"not an rlx graph document (format is {_short(doc.get('format'))}, expected {FORMAT!r})")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise IRError(f"graph document version must be an integer, got {_short(version)}")
    if version != VERSION:
        raise IRError(f"graph document has version {version}; this rlx reads version {VERSION}")
    _check_keys("graph document", doc, _TOP_KEYS)
    cls = _graph_class(doc["stage"], expected)
    _check_name("graph name", doc["name"])
    nodes = doc["nodes"]
    if not isinstance(nodes, list):
        raise IRError(f"graph 'nodes' must be a list, got {type(nodes).__name__}")
    if len(nodes) > MAX_NODES:
        raise IRError(f"graph has {len(nodes)} nodes, over the limit of {MAX_NODES}")
    graph = cls(doc["name"])
    for position, node in enumerate(nodes):
        _add_node(graph, position, node)
    outputs, names = doc["outputs"], doc["output_names"]
    if not isinstance(outputs, list) or not isinstance(names, list):
        raise IRError("graph 'outputs' and 'output_names' must be lists")
    for o in outputs:
        if isinstance(o, bool) or not isinstance(o, int) or not 0 <= o < len(graph.nodes):
            raise IRError(f"graph output {_short(o)} does not name a node")
    for name in names:
        _check_name("output name", name)
    graph.set_outputs(outputs, names)
    graph.verify()
    return graph


def _add_node(graph: Graph, position: int, node: Any) -> None:
    where = f"node %{position}"
    if not isinstance(node, dict):
        raise IRError(f"{where}: expected a JSON object, got {_short(node)}")
    _check_keys(where, node, _NODE_KEYS)
    node_id = node["id"]
    if isinstance(node_id, bool) or not isinstance(node_id, int):
        raise IRError(f"{where}: id must be an integer, got {_short(node_id)}")
    if node_id != position:
        what = "duplicate" if 0 <= node_id < position else "out-of-order"
        raise IRError(f"{where}: {what} node id {node_id} (ids must be 0, 1, 2… in order)")
    name = node["name"]
    _check_name(f"{where} name", name)
    inputs = node["inputs"]
    if not isinstance(inputs, list):
        raise IRError(f"{where}: inputs must be a list, got {_short(inputs)}")
    for i in inputs:
        if isinstance(i, bool) or not isinstance(i, int):
            raise IRError(f"{where}: input {_short(i)} is not a node id")
        if not 0 <= i < position:
            raise IRError(f"{where}: input %{i} is not an earlier node (references must point backwards)")
    try:
        op = op_from_json(node["op"], graph.op_registry)
        stored = shape_from_json(node["shape"])
    except IRError as exc:
        raise type(exc)(f"{where}: {exc}") from None
    op_name = getattr(op, "name", None)
    if isinstance(op_name, str):
        _check_name(f"{where} {op.kind} name", op_name)
    new_id = graph.add(op, inputs, name)  # re-infers the shape; errors name the node
    inferred = graph.nodes[new_id].shape
    if inferred != stored:
        raise IRError(f"{graph.nodes[new_id].label} {op.kind}: stored shape {stored} but inputs give {inferred}")


def _graph_class(stage: Any, expected: type[Graph]) -> type[Graph]:
    if stage not in STAGES:
        raise IRError(f"graph document stage must be one of {STAGES}, got {_short(stage)}")
    if expected.stage == stage:
        return expected
    if expected is not _stage_class("mir"):
        raise IRError(f"document holds a {stage} graph but {expected.__name__} "
                      f"(stage {expected.stage!r}) was asked for")
    return _stage_class(stage)


def _check_keys(where: str, obj: dict, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise IRError(f"{where}: missing {missing}")
    unknown = sorted(k for k in obj if k not in keys)
    if unknown:
        raise IRError(f"{where}: unknown keys {', '.join(_short(k) for k in unknown[:5])}")


def _check_name(what: str, name: Any) -> None:
    if not isinstance(name, str):
        raise IRError(f"{what} must be a string, got {_short(name)}")
    if len(name) > MAX_NAME_CHARS:
        raise IRError(f"{what} is {len(name)} characters long, over the limit of {MAX_NAME_CHARS}")


def _object_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise IRError(f"graph document repeats the key {_short(key)} in one object")
        obj[key] = value
    return obj


def _reject_constant(literal: str) -> Any:
    raise IRError(f"graph document contains {literal}, which is not JSON; "
                  'non-finite floats are written {"float": "nan"}')


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."

"""LoRA adapters for `CausalLM`: PEFT checkpoints loaded into slots of one compiled graph.

`with_lora(graph, slots=S, rank=R, roles=...)` rewrites a decoder graph (`rlx.models.llama.build_decoder`)
so that every targeted projection `y = x W^T` becomes `y + lora_matmul(x, A, B, scale, lora_index)`
(`rlx.ir.ops_lora`): per layer and role, params `blk.{l}.{role}.lora_a` `[S, R, in]` and `.lora_b`
`[S, out, R]`, one `lora_scale` `[S]`, and a run-time input `lora_index` i32 `[batch]` — each sequence's
slot, -1 for none. Loading an adapter writes a slot's params (`set_param`): nothing recompiles, and one
step may mix sequences of different adapters and none.

A PEFT adapter directory holds `adapter_config.json` (`r`, `lora_alpha`, `use_rslora`,
`target_modules`) and `adapter_model.safetensors` (`...layers.{l}.{self_attn|mlp}.{module}.lora_A.weight`
`[r, in]` and `lora_B.weight` `[out, r]`). The scaling is `lora_alpha / r` (rsLoRA: `lora_alpha /
sqrt(r)`); a rank below the slots' R is zero-padded. Dropout is a training-time setting and ignored.

>>> import numpy as np, rlx
>>> g = rlx.Graph("tiny")
>>> x = g.input("tokens", [rlx.Dim.dynamic("batch", 2), 4, 8])
>>> w = g.param("blk.0.attn_q.weight", [8, 6])
>>> g.set_outputs([g.matmul(x, w)])
>>> lg = with_lora(g, slots=2, rank=4, roles=("attn_q",))
>>> sorted(p.op.name for p in lg.params())
['blk.0.attn_q.lora_a', 'blk.0.attn_q.lora_b', 'blk.0.attn_q.weight', 'lora_scale']
>>> [n.op.name for n in lg.inputs()]
['tokens', 'lora_index']
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlx.errors import ArtifactError, IRError, RlxError
from rlx.ir import ops as O
from rlx.ir.graph import Graph
from rlx.ir.ops_lora import LoraMatMul

#: PEFT / Hugging Face module names -> the decoder's projection roles (GGUF tensor names).
MODULE_ROLES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
                "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
ROLES = tuple(MODULE_ROLES.values())
INDEX_INPUT = "lora_index"
SCALE_PARAM = "lora_scale"
_WEIGHT = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")
_PEFT_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight$")


def lora_param_names(layer: int, role: str) -> tuple[str, str]:
    """The A and B params of one projection: `blk.{layer}.{role}.lora_a` / `.lora_b`."""
    return f"blk.{layer}.{role}.lora_a", f"blk.{layer}.{role}.lora_b"


def with_lora(graph: Graph, *, slots: int, rank: int, roles: Sequence[str] = ROLES) -> Graph:
    """`graph` with a LoRA update on each projection of `roles` (see the module docstring)."""
    if slots < 1 or rank < 1:
        raise IRError(f"LoRA needs slots >= 1 and rank >= 1, got {slots}, {rank}")
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise IRError(f"unknown LoRA target role(s) {unknown}; expected some of {ROLES}")
    out = Graph(graph.name)
    new: dict[int, int] = {}
    index = scale = None
    for node in graph.nodes:
        args = [new[i] for i in node.inputs]
        new[node.id] = out.add(node.op, args, name=node.name)
        target = _target(graph, node, roles)
        if target is None:
            continue
        layer, role = target
        x = args[0]
        x_shape, y_shape = out.shape(x), out.shape(new[node.id])
        if index is None:
            index = out.input(INDEX_INPUT, [x_shape.dims[0]], "i32")
            scale = out.param(SCALE_PARAM, [slots])
        a_name, b_name = lora_param_names(layer, role)
        a = out.param(a_name, [slots, rank, x_shape.dims[-1].value])
        b = out.param(b_name, [slots, y_shape.dims[-1].value, rank])
        update = out.add(LoraMatMul(), [x, a, b, scale, index], name=f"blk.{layer}.{role}.lora")
        new[node.id] = out.add_(new[node.id], update)
    if index is None:
        raise IRError(f"no projection of {list(roles)} found in graph {graph.name!r}")
    out.set_outputs([new[o] for o in graph.outputs], list(graph.output_names))
    return out


def _target(graph: Graph, node: object, roles: Sequence[str]) -> tuple[int, str] | None:
    """(layer, role) when `node` is a projection of a targeted role (its weight is `blk.{l}.{role}.weight`)."""
    if not isinstance(node.op, (O.MatMul, O.DequantMatMul)) or len(node.inputs) != 2:
        return None
    w = graph.node(node.inputs[1])
    if not isinstance(w.op, O.Param):
        return None
    m = _WEIGHT.match(w.op.name)
    if m is None or m.group(2) not in roles:
        return None
    return int(m.group(1)), m.group(2)


@dataclass(frozen=True)
class Adapter:
    """A PEFT adapter read from disk: its scaling, rank and per-(layer, role) A `[r, in]` and B `[out, r]`."""

    rank: int
    scaling: float
    weights: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]


def read_peft_adapter(path: str | Path) -> Adapter:
    """An adapter directory (`adapter_config.json`, `adapter_model.safetensors`), checked for what RLX takes."""
    from rlx.models.weights import load_safetensors

    d = Path(path)
    config_path, weights_path = d / "adapter_config.json", d / "adapter_model.safetensors"
    for p in (config_path, weights_path):
        if not p.is_file():
            raise ArtifactError(f"{d} is not a PEFT LoRA adapter: {p.name} is missing")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read {config_path}: {exc}") from None
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ArtifactError(f"{config_path}: peft_type {config.get('peft_type')!r} is not LORA")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise ArtifactError(f"{config_path}: r must be a positive int and lora_alpha a number, got {rank!r}, {alpha!r}")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ArtifactError(f"{config_path}: per-module rank_pattern / alpha_pattern are not supported")
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    unknown = sorted(t for t in targets if t.split(".")[-1] not in MODULE_ROLES)
    if unknown:
        raise ArtifactError(f"{config_path}: target module(s) {unknown} are not supported; LoRA applies to "
                            f"{sorted(MODULE_ROLES)}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = load_safetensors(weights_path)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, arr in tensors.items():
        m = _PEFT_KEY.search(key)
        if m is None:
            raise ArtifactError(f"{weights_path}: tensor {key!r} is not a LoRA A/B weight of a decoder layer's "
                                f"projection ({sorted(MODULE_ROLES)})")
        module = m.group(2)
        if module not in MODULE_ROLES:
            raise ArtifactError(f"{weights_path}: tensor {key!r} targets module {module!r}; LoRA applies to "
                                f"{sorted(MODULE_ROLES)}")
        pairs.setdefault((int(m.group(1)), MODULE_ROLES[module]), {})[m.group(3)] = np.asarray(arr, np.float32)
    weights = {}
    for (layer, role), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise ArtifactError(f"{weights_path}: layer {layer} {role} has lora_{'A' if 'A' not in ab else 'B'} "
                                "missing")
        a, b = ab["A"], ab["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise ArtifactError(f"{weights_path}: layer {layer} {role}: lora_A {a.shape} and lora_B {b.shape} "
                                f"do not have rank r={rank} (A [r, in], B [out, r])")
        weights[(layer, role)] = (a, b)
    if not weights:
        raise ArtifactError(f"{weights_path} holds no LoRA weights")
    return Adapter(rank, float(scaling), weights)


def to_gguf_rows(adapter: Adapter, num_heads: int, num_kv_heads: int) -> Adapter:
    """`adapter` for a GGUF LLaMA: llama.cpp's converter reorders each head's q/k rows for its interleaved
    RoPE (pairs (2i, 2i+1) instead of Hugging Face's (i, i + d/2)), so the B rows of q and k, written
    for the Hugging Face model, move the same way (A, and every other projection, are unchanged).

    >>> b = np.arange(8, dtype=np.float32)[:, None]  # one head of 8 rows, rank 1
    >>> to_gguf_rows(Adapter(1, 1.0, {(0, "attn_q"): (np.ones((1, 4), np.float32), b)}), 1, 1
    ...              ).weights[(0, "attn_q")][1][:, 0].tolist()
    [0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]
    """
    weights = {}
    for (layer, role), (a, b) in adapter.weights.items():
        heads = {"attn_q": num_heads, "attn_k": num_kv_heads}.get(role)
        if heads is not None:
            if b.shape[0] % (2 * heads):
                raise RlxError(f"layer {layer} {role}: {b.shape[0]} rows do not split into {heads} heads of pairs")
            b = b.reshape(heads, 2, b.shape[0] // heads // 2, b.shape[1]).swapaxes(1, 2).reshape(b.shape)
        weights[(layer, role)] = (a, np.ascontiguousarray(b))
    return Adapter(adapter.rank, adapter.scaling, weights)


class AdapterSlots:
    """The LoRA params of one compiled decoder: host copies of every slot, written through `set_param`.

    `load(name, adapter)` checks everything against the graph before writing anything (nothing is half
    loaded), then fills a free slot; `unload(name)` zeroes it. `index(names)` is the `lora_index` of a
    step's rows.
    """

    def __init__(self, graph: Graph, set_param: object) -> None:
        self._set_param = set_param
        self.params: dict[str, np.ndarray] = {}
        for p in graph.params():
            name = p.op.name
            if name == SCALE_PARAM or name.endswith((".lora_a", ".lora_b")):
                self.params[name] = np.zeros(p.shape.static_dims, np.float32)
        if SCALE_PARAM not in self.params:
            raise RlxError("this graph has no LoRA slots (build it with max_adapters > 0)")
        self.slots = self.params[SCALE_PARAM].shape[0]
        self.rank = next(v.shape[1] for k, v in self.params.items() if k.endswith(".lora_a"))
        self.names: dict[str, int] = {}
        for name, value in self.params.items():
            set_param(name, value)

    def load(self, name: str, adapter: Adapter, source: str) -> None:
        if not isinstance(name, str) or not name or ":" in name:
            raise RlxError(f"an adapter name is a non-empty string without ':', got {name!r}")
        if name in self.names:
            raise RlxError(f"an adapter named {name!r} is already loaded; unload it first")
        free = sorted(set(range(self.slots)) - set(self.names.values()))
        if not free:
            raise RlxError(f"all {self.slots} adapter slots are in use ({sorted(self.names)}); unload one or "
                           "raise max_adapters")
        if adapter.rank > self.rank:
            raise RlxError(f"{source}: rank r={adapter.rank} exceeds the model's max_lora_rank {self.rank}")
        staged: list[tuple[str, np.ndarray]] = []
        for (layer, role), (a, b) in adapter.weights.items():
            a_name, b_name = lora_param_names(layer, role)
            if a_name not in self.params:
                raise RlxError(f"{source}: layer {layer} {role} has LoRA weights, but the model has no such "
                               "projection with a LoRA slot (wrong layer count, or a role outside lora_targets)")
            want_a, want_b = self.params[a_name].shape, self.params[b_name].shape
            if a.shape[1] != want_a[2] or b.shape[0] != want_b[1]:
                raise RlxError(f"{source}: layer {layer} {role}: lora_A {a.shape} / lora_B {b.shape} do not fit the "
                               f"base projection ({want_b[1]} outputs from {want_a[2]} inputs)")
            staged += [(a_name, a), (b_name, b)]
        slot = free[0]
        for pname, value in staged:  # checked: now write
            arr = self.params[pname]
            arr[slot] = 0.0
            if pname.endswith(".lora_a"):
                arr[slot, :value.shape[0], :] = value
            else:
                arr[slot, :, :value.shape[1]] = value
        for pname in {p for p, _ in staged}:
            self._set_param(pname, self.params[pname])
        self.params[SCALE_PARAM][slot] = adapter.scaling
        self._set_param(SCALE_PARAM, self.params[SCALE_PARAM])
        self.names[name] = slot

    def unload(self, name: str) -> None:
        if name not in self.names:
            raise RlxError(f"no adapter named {name!r} is loaded (loaded: {sorted(self.names)})")
        slot = self.names.pop(name)
        for pname, arr in self.params.items():  # the scale first: the slot is off from here on
            if pname == SCALE_PARAM or np.any(arr[slot]):
                arr[slot] = 0.0
                self._set_param(pname, arr)

    def index(self, names: Sequence[str | None], batch: int) -> np.ndarray:
        """`lora_index` for rows using adapters `names` (None: the base model), padded to `batch` with -1."""
        if len(names) > batch:
            raise RlxError(f"{len(names)} rows of adapters for a model of max_batch {batch}")
        out = np.full(batch, -1, np.int32)
        for row, name in enumerate(names):
            if name is None:
                continue
            if name not in self.names:
                raise RlxError(f"no adapter named {name!r} is loaded (loaded: {sorted(self.names)})")
            out[row] = self.names[name]
        return out


def adapter_rows(adapter: str | Sequence[str | None] | None, count: int) -> list[str | None]:
    """One adapter name (or None) per row: a single name for every row, or one per row."""
    if adapter is None or isinstance(adapter, str):
        return [adapter] * count
    rows = list(adapter)
    if len(rows) != count:
        raise RlxError(f"adapter= names {len(rows)} adapters for {count} prompts")
    return rows


__all__ = ["INDEX_INPUT", "MODULE_ROLES", "ROLES", "SCALE_PARAM", "Adapter", "AdapterSlots", "adapter_rows",
           "lora_param_names", "read_peft_adapter", "to_gguf_rows", "with_lora"]

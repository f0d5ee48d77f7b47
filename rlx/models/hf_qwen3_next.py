"""Load a transformers Qwen3-Next checkpoint directory (`model_type: "qwen3_next"`) into what `CausalLM` takes.

config.json is read as a Qwen3 decoder (`rlx.models.hf_config.decoder_config`: vocabulary, attention,
partial RoPE, FFN, norms) plus the linear-attention fields; every tensor is checked against the shape the
config implies before anything is compiled. The checkpoint's fused projections are split at load into
the rows the graph multiplies separately (copies of those rows only):

- `self_attn.q_proj` `[heads * 2 * head_dim, hidden]`, per head the query then its output gate, into
  `attn_q` and `attn_gate`;
- `linear_attn.in_proj_qkvz`, per key head its q, k, v and z rows, into `ssm_qkv` (all q, all k, all v:
  the conv's channel order) and `ssm_z`; `linear_attn.in_proj_ba`, per key head b then a, into
  `ssm_beta` and `ssm_alpha`.

Qwen3-Next's `(1 + w)` RMSNorm weights get their 1 added at load (the gated norm's weight is plain).
Sparse-MoE layers (`num_experts` > 0, outside `mlp_only_layers`, every `decoder_sparse_step`-th) read as
Qwen3-MoE's (`rlx.models.hf_load`: per-expert matrices stacked, the router f32) plus the shared expert and
its gate (f32).

>>> sorted(OFFSET_ROLES)[:3]
['attn_k_norm', 'attn_norm', 'attn_q_norm']
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ArtifactError
from rlx.models import hf_config as H
from rlx.models.hf_load import (
    Pretrained,
    _as_f32,
    check_load_options,
    checked_shape,
    conv1d_as_ours,
    finish_pretrained,
    missing_tensor,
    moe_tensors,
    stored_weight,
)
from rlx.models.hf_weights import StoredTensor, open_checkpoint
from rlx.models.llama import WeightSpec
from rlx.models.qwen3_next import LAYER_TYPES, Qwen3NextConfig, tensor_shapes
from rlx.models.weights import load_json

#: Norms stored as an offset from one.
OFFSET_ROLES = frozenset({"attn_norm", "ffn_norm", "output_norm", "attn_q_norm", "attn_k_norm"})
#: Plain tensors: our role -> the checkpoint's name inside `model.layers.N.`.
LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
               "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
               "attn_k_norm": "self_attn.k_norm", "ssm_conv1d": "linear_attn.conv1d", "ssm_norm": "linear_attn.norm",
               "ssm_out": "linear_attn.out_proj"}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
#: Per-head vectors stored without a `.weight` suffix.
BARE_NAMES = {"ssm_dt": "linear_attn.dt_bias", "ssm_a_log": "linear_attn.A_log"}
#: Matrices `quantize=` turns into blocks.
QUANTIZABLE_ROLES = ("attn_q", "attn_gate", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                     "ssm_qkv", "ssm_z", "ssm_out", "output")


def qwen3_next_config(raw: Mapping[str, Any], source: str = "config.json") -> Qwen3NextConfig:
    """The `Qwen3NextConfig` of a transformers config.json, checked."""
    layers = int(raw.get("num_hidden_layers") or 0)
    types = raw.get("layer_types")
    if not types:
        interval = int(raw.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if int(raw.get("linear_key_head_dim", 0)) != int(raw.get("linear_value_head_dim", -1)):
        raise ArtifactError(f"{source}: linear_key_head_dim {raw.get('linear_key_head_dim')} != linear_value_head_dim "
                            f"{raw.get('linear_value_head_dim')} is not supported (the delta rule's state is square)")
    if not set(types) <= set(LAYER_TYPES):
        raise ArtifactError(f"{source}: layer_types {types!r} name a kind other than {LAYER_TYPES}")
    # read as Qwen3-MoE where it has experts (the sparse layers as transformers picks them), else as Qwen3
    sparse = int(raw.get("num_experts") or 0) > 0
    base = H.decoder_config({**raw, "model_type": "qwen3_moe" if sparse else "qwen3", "layer_types": None}, source)
    try:
        return Qwen3NextConfig(base, tuple(types), linear_k_heads=int(raw["linear_num_key_heads"]),
                               linear_v_heads=int(raw["linear_num_value_heads"]),
                               linear_head_dim=int(raw["linear_key_head_dim"]),
                               linear_conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{source}: {exc!r} reading the linear-attention fields") from None


def _rows(t: StoredTensor, index: np.ndarray) -> StoredTensor:
    return StoredTensor(t.file, t.name, t.dtype, (len(index), t.shape[1]), np.ascontiguousarray(t.data[index]))


def _split_fused(stored: Mapping[str, StoredTensor], c: Qwen3NextConfig, layer: int, kind: str,
                 shapes: Mapping[str, tuple[int, ...]]) -> dict[str, StoredTensor]:
    """Our split matrices of one layer's fused projections, each checked first."""
    out = {}

    def fused(theirs: str, rows: int) -> StoredTensor:
        name = f"model.layers.{layer}.{theirs}.weight"
        want = (rows, c.base.hidden_size)
        if name not in stored:
            raise ArtifactError(f"the checkpoint has no tensor {name!r} (expected shape {list(want)} from config.json)")
        if stored[name].shape != want:
            raise ArtifactError(f"{stored[name].file}: tensor {name!r} has shape {list(stored[name].shape)}, expected "
                                f"{list(want)} from config.json")
        return stored[name]

    if kind == "full_attention":
        b = c.base
        t = fused("self_attn.q_proj", 2 * b.q_size)
        per_head = np.arange(2 * b.q_size).reshape(b.num_heads, 2, b.head_dim)
        out[f"blk.{layer}.attn_q.weight"] = _rows(t, per_head[:, 0].ravel())
        out[f"blk.{layer}.attn_gate.weight"] = _rows(t, per_head[:, 1].ravel())
        return out
    nk, n, rep = c.linear_k_heads, c.linear_head_dim, c.linear_v_heads // c.linear_k_heads
    width = 2 * n + 2 * rep * n
    t = fused("linear_attn.in_proj_qkvz", nk * width)
    blocks = np.arange(nk * width).reshape(nk, width)
    q, k = blocks[:, :n].ravel(), blocks[:, n:2 * n].ravel()
    v, z = blocks[:, 2 * n:2 * n + rep * n].ravel(), blocks[:, 2 * n + rep * n:].ravel()
    out[f"blk.{layer}.ssm_qkv.weight"] = _rows(t, np.concatenate([q, k, v]))
    out[f"blk.{layer}.ssm_z.weight"] = _rows(t, z)
    t = fused("linear_attn.in_proj_ba", 2 * c.linear_v_heads)
    ba = np.arange(2 * c.linear_v_heads).reshape(nk, 2 * rep)
    out[f"blk.{layer}.ssm_beta.weight"] = _rows(t, ba[:, :rep].ravel())
    out[f"blk.{layer}.ssm_alpha.weight"] = _rows(t, ba[:, rep:].ravel())
    return out


def _checkpoint_name(ours: str) -> str:
    parts = ours.split(".")
    if parts[0] != "blk":
        return f"{GLOBAL_NAMES[parts[0]]}.weight"
    layer, role = parts[1], parts[2]
    if role in BARE_NAMES:
        return f"model.layers.{layer}.{BARE_NAMES[role]}"
    return f"model.layers.{layer}.{LAYER_NAMES[role]}.weight"


def _prepare(ours: str, t: StoredTensor, dtype: str | None, quantize: str | None) -> tuple[WeightSpec, np.ndarray]:
    role = ours.split(".")[-2]
    if role in OFFSET_ROLES:
        return WeightSpec("f32", t.shape), _as_f32(t) + np.float32(1.0)
    return stored_weight(t, dtype, quantize, quantizable=role in QUANTIZABLE_ROLES, keep_f32=role == "ssm_conv1d")


def load_qwen3_next(path: str | Path, *, dtype: str | None = None, quantize: str | None = None) -> Pretrained:
    """Read and check a Qwen3-Next checkpoint directory (see the module docstring)."""
    d = Path(path)
    check_load_options(dtype, quantize)
    raw = load_json(d / "config.json")
    config = qwen3_next_config(raw, str(d / "config.json"))
    stored = open_checkpoint(d)
    shapes = tensor_shapes(config)
    split: dict[str, StoredTensor] = {}
    for layer, kind in enumerate(config.layer_types):
        split |= _split_fused(stored, config, layer, kind, shapes)
    tensors = moe_tensors(stored, config.base, H.FAMILIES["qwen3_moe"], dtype, quantize, d)
    for ours, shape in shapes.items():
        if ours in tensors:
            continue
        t = split.get(ours)
        if t is None:
            theirs = _checkpoint_name(ours)
            if theirs not in stored:
                raise missing_tensor(d, stored, theirs, shape)
            t = stored[theirs]
            # the conv weight [conv_dim, 1, k] as [k, conv_dim] (a view)
            t = conv1d_as_ours(t, shape) if ours.split(".")[-2] == "ssm_conv1d" else checked_shape(t, shape)
        tensors[ours] = _prepare(ours, t, dtype, quantize)
    return finish_pretrained(d, raw, config, tensors)

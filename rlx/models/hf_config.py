"""Hugging Face decoder families as data: one `Family` rule per `model_type`.

A rule says how a `config.json` maps onto `DecoderConfig` (defaults the family's config class
assumes, and which graph features it turns on) and how checkpoint tensor names map onto the
GGUF-style names `rlx.models.llama.build_decoder` reads (`blk.N.attn_q.weight`, ...), including
fused projections to split (Phi-3's `qkv_proj`, `gate_up_proj`) and norms stored as an offset
from one (Gemma's `(1 + w)` RMSNorm). Nothing here branches on a family's name: every difference
is a field of its rule.

>>> cfg = decoder_config({"model_type": "qwen3", "vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2,
...     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96})
>>> cfg.qk_norm, cfg.rope_variant, cfg.head_dim
(True, 'neox', 16)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rlx.errors import ArtifactError, IRError
from rlx.models.decoder_config import DecoderConfig
from rlx.models.moe import CHECKPOINT_EXPERTS, MoeConfig
from rlx.models.rope import RopeSpec

#: Checkpoint name (inside `model.layers.N.`) of each per-layer role of a LLaMA-style decoder.
LLAMA_LAYER = MappingProxyType({
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
})
#: Gemma's sandwich norms: the norm after attention, then one before and one after the FFN.
GEMMA_LAYER = MappingProxyType({
    **LLAMA_LAYER, "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
})
#: Phi-3: q, k, v in one matrix (rows in that order), gate and up in another (gate first).
PHI3_FUSED = MappingProxyType({"self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
                               "mlp.gate_up_proj": ("ffn_gate", "ffn_up")})
#: Model-level tensors: GGUF-style name -> checkpoint name.
GLOBAL_NAMES = MappingProxyType({"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                                 "output": "lm_head"})
#: config.json activation names -> `DecoderConfig.ffn_act`.
ACTIVATIONS = MappingProxyType({"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                                "gelu_tanh": "gelu_tanh"})
#: Norm roles (1-D weights an offset applies to).
NORM_ROLES = frozenset({"attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm", "attn_q_norm",
                        "attn_k_norm", "output_norm"})


def _gemma_layer_rope(cfg: Mapping[str, Any], n: int) -> tuple[str, ...]:
    """Gemma 3: "sliding_attention" layers use the local RoPE base, the others the global one."""
    types = cfg.get("layer_types")
    if types is None:  # older configs: every `sliding_window_pattern`-th layer is global
        pattern = int(cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6)))
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    return tuple("local" if t == "sliding_attention" else "global" for t in types)


def _nope_layer_rope(cfg: Mapping[str, Any], n: int) -> tuple[str, ...]:
    """SmolLM3: `no_rope_layers[i]` is 1 where layer i applies RoPE, 0 for a NoPE layer."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = int(cfg.get("no_rope_layer_interval", 4))
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    return tuple("global" if f else "none" for f in flags)


def _qwen3_moe_layers(cfg: Mapping[str, Any], n: int) -> tuple[bool, ...]:
    """Qwen3-MoE: layer i is sparse when it is not in `mlp_only_layers` and (i + 1) is a multiple of
    `decoder_sparse_step` (the others keep a dense MLP of `intermediate_size`)."""
    dense = {int(i) for i in cfg.get("mlp_only_layers") or ()}
    step = int(cfg.get("decoder_sparse_step") or 1)
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(n))


@dataclass(frozen=True)
class Family:
    """How one `model_type` loads: config defaults, features, and checkpoint names."""

    model_type: str
    #: Values the family's config class assumes when config.json omits them.
    defaults: Mapping[str, Any] = field(default_factory=dict)
    layer_names: Mapping[str, str] = field(default_factory=lambda: LLAMA_LAYER)
    #: Fused checkpoint matrices (name inside the layer) -> the roles their rows split into, in order.
    fused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Added to every norm weight at load (Gemma stores w and applies 1 + w).
    norm_offset: float = 0.0
    qk_norm: bool = False
    sandwich_norms: bool = False
    #: q/k/v carry biases whatever config.json says (Qwen2).
    qkv_bias: bool = False
    #: Gemma: embeddings times sqrt(hidden_size); attention scale from query_pre_attn_scalar.
    gemma_scaling: bool = False
    #: Per-layer RoPE kinds from the config (None: every layer the global RoPE).
    layer_rope: Callable[[Mapping[str, Any], int], tuple[str, ...]] | None = None
    #: The config key holding the local layers' RoPE base in older (pre rope_parameters) configs.
    local_base_key: str = ""
    #: Sparse MoE families: the block's module inside a layer (`model.layers.N.<moe_block>`; "" for a dense family),
    #: its per-expert (gate, up, down) matrix names (`rlx.models.moe.CHECKPOINT_EXPERTS`), the config key of each
    #: expert's FFN width, and of the top-k renormalization ("": always renormalized, as Mixtral).
    moe_block: str = ""
    expert_names: tuple[str, str, str] = ()
    expert_size_key: str = "intermediate_size"
    normalize_key: str = ""
    #: Which layers are sparse (None: all of them).
    moe_layers: Callable[[Mapping[str, Any], int], tuple[bool, ...]] | None = None


FAMILIES: Mapping[str, Family] = MappingProxyType({f.model_type: f for f in (
    Family("llama", {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"}),
    Family("mistral", {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"}),
    Family("qwen2", {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"}, qkv_bias=True),
    Family("qwen3", {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "head_dim": 128},
           qk_norm=True),
    Family("phi3", {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu"}, fused=PHI3_FUSED),
    Family("smollm3", {"rms_norm_eps": 1e-6, "rope_theta": 2000000.0, "hidden_act": "silu",
                       "tie_word_embeddings": True}, layer_rope=_nope_layer_rope),
    Family("gemma3_text", {"rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                           "hidden_activation": "gelu_pytorch_tanh", "head_dim": 256, "query_pre_attn_scalar": 256,
                           "tie_word_embeddings": True},
           layer_names=GEMMA_LAYER, norm_offset=1.0, qk_norm=True, sandwich_norms=True, gemma_scaling=True,
           layer_rope=_gemma_layer_rope, local_base_key="rope_local_base_freq"),
    # routing: softmax over all experts, the top_k largest, renormalized (Mixtral always, Qwen3-MoE as
    # norm_topk_prob says); no shared expert
    Family("mixtral", {"rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "hidden_act": "silu", "num_experts_per_tok": 2,
                       "num_local_experts": 8},
           moe_block="block_sparse_moe", expert_names=CHECKPOINT_EXPERTS["mixtral"]),
    Family("qwen3_moe", {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "num_experts_per_tok": 8,
                         "num_experts": 128, "moe_intermediate_size": 768, "intermediate_size": 6144,
                         "norm_topk_prob": False, "decoder_sparse_step": 1, "use_sliding_window": False},
           qk_norm=True, moe_block="mlp", expert_names=CHECKPOINT_EXPERTS["qwen3_moe"],
           expert_size_key="moe_intermediate_size", normalize_key="norm_topk_prob", moe_layers=_qwen3_moe_layers),
)})


def family(cfg: Mapping[str, Any], source: str = "config.json") -> Family:
    """The rule of `cfg`'s model_type; `ArtifactError` naming the supported ones otherwise."""
    model_type = cfg.get("model_type")
    if model_type not in FAMILIES:
        raise ArtifactError(f"{source}: model_type {model_type!r} is not supported; supported: "
                            f"{', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


def _int(cfg: Mapping[str, Any], key: str, source: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ArtifactError(f"{source}: {key} must be an integer, got {v!r}")
    return v


def _rope_spec(params: Mapping[str, Any], cfg: Mapping[str, Any], source: str) -> RopeSpec:
    kind = params.get("rope_type", params.get("type", "default"))
    keys = {"factor": "factor", "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
            "beta_fast": "beta_fast", "beta_slow": "beta_slow", "attention_factor": "attention_factor",
            "mscale": "mscale", "mscale_all_dim": "mscale_all_dim", "truncate": "truncate"}
    kw = {ours: params[theirs] for theirs, ours in keys.items() if params.get(theirs) is not None}
    if kind in ("llama3", "yarn"):
        kw["original_max_positions"] = int(params.get("original_max_position_embeddings")
                                           or cfg.get("original_max_position_embeddings")
                                           or cfg.get("max_position_embeddings", 0))
    if kind == "yarn" and "factor" not in kw:
        kw["factor"] = cfg.get("max_position_embeddings", 0) / kw["original_max_positions"]
    try:
        return RopeSpec(base=float(params["rope_theta"]), kind=kind, **kw)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{source}: cannot read the RoPE parameters {dict(params)!r}: {exc}") from None
    except ArtifactError as exc:
        raise ArtifactError(f"{source}: {exc}") from None


def _ropes(cfg: Mapping[str, Any], fam: Family, source: str) -> tuple[RopeSpec, RopeSpec | None]:
    """(global RoPE, local RoPE or None) from `rope_parameters` (flat, or nested by layer type) or from the
    older `rope_theta` / `rope_scaling` / local-base keys."""
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and "full_attention" in params:
        local = params.get("sliding_attention")
        return (_rope_spec(params["full_attention"], cfg, source),
                _rope_spec(local, cfg, source) if local is not None else None)
    if not isinstance(params, Mapping) or "rope_theta" not in params:
        params = {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg.get("rope_theta", fam.defaults["rope_theta"])}
    local = None
    if fam.local_base_key:
        local = RopeSpec(base=float(cfg.get(fam.local_base_key, fam.defaults[fam.local_base_key])))
    return _rope_spec(params, cfg, source), local


def _token_id(cfg: Mapping[str, Any], key: str, vocab: int) -> int:
    v = cfg.get(key)
    if isinstance(v, list):
        v = v[0] if v else None
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab else -1


def eos_ids(cfg: Mapping[str, Any]) -> frozenset[int]:
    """Every end-of-sequence id config.json names (an int or a list)."""
    v = cfg.get("eos_token_id")
    vals = v if isinstance(v, list) else [v]
    return frozenset(i for i in vals if isinstance(i, int) and not isinstance(i, bool) and i >= 0)


def _moe(cfg: Mapping[str, Any], fam: Family, hidden: int, layers: int,
         source: str) -> tuple[MoeConfig | None, tuple[bool, ...]]:
    """(the MoE block's config, which layers are sparse) of a MoE family; (None, ()) for a dense one."""
    if not fam.moe_block:
        return None, ()
    # transformers writes Qwen3-MoE's num_experts as num_local_experts (its attribute_map): either key
    experts = next((cfg[k] for k in ("num_local_experts", "num_experts") if cfg.get(k) is not None), 0)
    if experts == 0:  # transformers: no experts, every layer dense
        return None, ()
    sparse = fam.moe_layers(cfg, layers) if fam.moe_layers else ()
    if sparse and not any(sparse):
        return None, ()
    try:
        moe = MoeConfig(hidden_size=hidden, num_experts=experts, top_k=cfg.get("num_experts_per_tok"),
                        intermediate_size=cfg.get(fam.expert_size_key),
                        normalize=bool(cfg.get(fam.normalize_key)) if fam.normalize_key else True,
                        shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0))
    except IRError as exc:
        raise ArtifactError(f"{source}: {exc}") from None
    return moe, sparse


def decoder_config(raw: Mapping[str, Any], source: str = "config.json") -> DecoderConfig:
    """The `DecoderConfig` of a Hugging Face decoder's config.json (after its family's defaults)."""
    fam = family(raw, source)
    cfg = {**fam.defaults, **{k: v for k, v in raw.items() if v is not None or k not in fam.defaults}}
    for key, value in (("attn_logit_softcapping", None), ("use_bidirectional_attention", False)):
        if cfg.get(key, value) not in (value, False):
            raise ArtifactError(f"{source}: {key}={cfg[key]!r} is not supported")
    hidden, heads = _int(cfg, "hidden_size", source), _int(cfg, "num_attention_heads", source)
    head_dim = cfg.get("head_dim") or hidden // heads
    layers = _int(cfg, "num_hidden_layers", source)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act")
    if act not in ACTIVATIONS:
        raise ArtifactError(f"{source}: activation {act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    rope, rope_local = _ropes(cfg, fam, source)
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
    vocab = _int(cfg, "vocab_size", source)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if cfg.get("layer_types"):  # which layers slide (the others attend to every earlier key)
        windowed = tuple(t == "sliding_attention" for t in cfg["layer_types"])
    elif fam.layer_rope is _gemma_layer_rope:  # older Gemma 3 configs: the local-RoPE layers slide
        windowed = tuple(k == "local" for k in _gemma_layer_rope(cfg, layers))
    else:
        windowed = ()
    softcap = cfg.get("final_logit_softcapping")
    moe, moe_layers = _moe(cfg, fam, hidden, layers, source)
    try:
        return DecoderConfig(
            arch=fam.model_type, vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=int(head_dim),
            ffn_size=_int(cfg, "intermediate_size", source), rms_eps=float(cfg["rms_norm_eps"]),
            rope_base=rope.base, rope_variant="neox", n_rot=int(int(head_dim) * partial),
            context_length=int(cfg.get("max_position_embeddings") or 2048),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_id=_token_id(cfg, "bos_token_id", vocab), eos_id=_token_id(cfg, "eos_token_id", vocab),
            qkv_bias=fam.qkv_bias or bool(cfg.get("attention_bias", False)),
            rope=rope, rope_local=rope_local,
            layer_rope=fam.layer_rope(cfg, layers) if fam.layer_rope else (),
            qk_norm=fam.qk_norm, sandwich_norms=fam.sandwich_norms, ffn_act=ACTIVATIONS[act],
            embed_scale=math.sqrt(hidden) if fam.gemma_scaling else 1.0,
            attn_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5 if fam.gemma_scaling else None,
            final_softcap=float(softcap) if softcap else None,
            sliding_window=int(window or 0) if windowed != (False,) * layers else 0, windowed_layers=windowed,
            moe=moe, moe_layers=moe_layers,
            name=str(cfg.get("_name_or_path", "")))
    except ArtifactError as exc:
        raise ArtifactError(f"{source}: {exc}") from None


def tensor_names(config: DecoderConfig, fam: Family) -> dict[str, str]:
    """GGUF-style name -> checkpoint name of every tensor `build_decoder` may read (biases and optional
    norms included; the loader keeps those the checkpoint has). Fused matrices are listed by
    `fused_names`."""
    out = {f"{ours}.weight": f"{theirs}.weight" for ours, theirs in GLOBAL_NAMES.items()}
    for layer in range(config.num_layers):
        for role, theirs in fam.layer_names.items():
            for part in ("weight", "bias"):
                out[f"blk.{layer}.{role}.{part}"] = f"model.layers.{layer}.{theirs}.{part}"
    return out


def fused_names(config: DecoderConfig, fam: Family) -> dict[str, tuple[str, ...]]:
    """Checkpoint name of each fused matrix -> the GGUF-style names of its row blocks, in order."""
    out = {}
    for layer in range(config.num_layers):
        for theirs, roles in fam.fused.items():
            out[f"model.layers.{layer}.{theirs}.weight"] = tuple(f"blk.{layer}.{role}.weight" for role in roles)
    return out

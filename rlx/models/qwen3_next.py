"""Qwen3-Next hybrids (transformers' `Qwen3NextForCausalLM`): gated DeltaNet layers beside gated attention.

`build_qwen3_next` returns one decoder step with the interface of `rlx.models.llama.build_decoder`
(plus the ragged-step inputs of `rlx.models.mamba2`), so `CausalLM` drives it as any decoder. A cache
slot holds both kinds of layer state: the K/V rows of the `full_attention` layers
(`blk.N.k_cache`/`v_cache`, read at `positions`) and the fixed-size states of the `linear_attention`
layers (`recurrent_state_names`): the conv state `blk.N.conv_state` `[max_batch, d_conv-1, conv_dim]`
and the delta-rule state `blk.N.ssm_state` `[max_batch, value_heads, head_dim, head_dim]`.

A linear-attention layer: ``q|k|v = silu(conv1d(in_proj_qkv(h)))`` (carried conv state);
q, k L2-normalized per head and repeated over their value heads; ``beta = sigmoid(b)``,
``g = -exp(A_log) * softplus(a + dt_bias)`` (both zero on padding: the state then stays as it was);
the gated delta rule (`gated_delta_net`, carried state, scale 1/sqrt(head_dim)); per head
``rmsnorm(o) * w * silu(z)``; ``out_proj``. An attention layer: the q projection's per-head halves
are the query and an output gate (split at load), q/k RMSNorm, partial RoPE (neox), causal GQA over
the cache, ``* sigmoid(gate)``, ``o_proj``. Norms other than the gated one are Qwen3-Next's ``(1 + w)``
(the loader adds the 1). A layer's FFN is a dense SwiGLU, or where `base.layer_moe(layer)` (transformers'
`mlp_only_layers` / `decoder_sparse_step`) the sparse MoE block of `rlx.models.moe` with its shared expert
(`moe_block`: top-k router normalized as `norm_topk_prob` says, grouped expert matmuls, plus
``sigmoid(shared_expert_gate(h)) * shared_expert(h)``), its params under `blk.N.ffn_moe.` as for Qwen3-MoE.

>>> from rlx.models.decoder_config import DecoderConfig
>>> base = DecoderConfig(arch="qwen3", vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
...                      head_dim=16, ffn_size=48, rope_variant="neox", n_rot=4, qk_norm=True)
>>> cfg = Qwen3NextConfig(base, ("linear_attention", "full_attention"), linear_k_heads=1, linear_v_heads=2,
...                       linear_head_dim=16, linear_conv_kernel=4)
>>> g = build_qwen3_next(cfg, random_specs(cfg), max_batch=1, max_seq=4, capacity=8)
>>> cfg.recurrent_states()
['blk.0.conv_state', 'blk.0.ssm_state']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rlx.errors import ArtifactError, IRError
from rlx.ir.graph import Graph, NodeId
from rlx.ir.ops import ACT_MODES
from rlx.ir.ops_sample import SETTINGS as SAMPLE_SETTINGS
from rlx.ir.shape import Dim
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import (
    WeightSpec,
    _embedding,
    _head_norm,
    _linear,
    _moe_ffn,
    _spec,
    cache_names,
    layer_tensor,
    moe_shapes,
    output_weight_name,
    widened,
)
from rlx.models.mamba2 import LENGTHS_INPUT, MASK_INPUT

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class Qwen3NextConfig:
    """A Qwen3-Next decoder: `base` holds what a Qwen3 decoder reads (vocabulary, attention, RoPE, FFN,
    norms), the rest its linear-attention layers."""

    base: DecoderConfig
    layer_types: tuple[str, ...]
    linear_k_heads: int
    linear_v_heads: int
    linear_head_dim: int
    linear_conv_kernel: int
    arch: str = "qwen3_next"
    recurrent: bool = True

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.base.num_layers or not set(self.layer_types) <= set(LAYER_TYPES):
            raise ArtifactError(f"qwen3_next layer_types must name one of {LAYER_TYPES} for each of the "
                                f"{self.base.num_layers} layers, got {self.layer_types!r}")
        for key in ("linear_k_heads", "linear_v_heads", "linear_head_dim", "linear_conv_kernel"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArtifactError(f"qwen3_next {key} must be a positive int, got {v!r}")
        if self.linear_v_heads % self.linear_k_heads:
            raise ArtifactError(f"qwen3_next linear value heads {self.linear_v_heads} must be a multiple of the key "
                                f"heads {self.linear_k_heads}")
        if self.linear_conv_kernel < 2:
            raise ArtifactError(f"qwen3_next linear_conv_kernel_dim must be >= 2, got {self.linear_conv_kernel}")

    # what `CausalLM` reads of any config
    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size

    @property
    def bos_id(self) -> int:
        return self.base.bos_id

    @property
    def eos_id(self) -> int:
        return self.base.eos_id

    @property
    def context_length(self) -> int:
        return self.base.context_length

    @property
    def key_dim(self) -> int:
        return self.linear_k_heads * self.linear_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_v_heads * self.linear_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q, k, v."""
        return 2 * self.key_dim + self.value_dim

    def recurrent_states(self) -> list[str]:
        """The recurrent state inputs: each linear-attention layer's conv state and delta-rule state."""
        return [name for layer, kind in enumerate(self.layer_types) if kind == "linear_attention"
                for name in (f"blk.{layer}.conv_state", f"blk.{layer}.ssm_state")]


def tensor_shapes(c: Qwen3NextConfig) -> dict[str, tuple[int, ...]]:
    """GGUF-style name -> shape (matrices [out, in]; the conv weight `[d_conv, conv_dim]`) of every tensor."""
    b = c.base
    h, q, kv, f = b.hidden_size, b.q_size, b.kv_size, b.ffn_size
    out = {"token_embd.weight": (b.vocab_size, h), "output_norm.weight": (h,)}
    if not b.tie_embeddings:
        out["output.weight"] = (b.vocab_size, h)
    for layer, kind in enumerate(c.layer_types):
        roles: dict[str, tuple[int, ...]] = {"attn_norm": (h,), "ffn_norm": (h,), "ffn_gate": (f, h), "ffn_up": (f, h),
                                             "ffn_down": (h, f)}
        if kind == "full_attention":
            roles |= {"attn_q": (q, h), "attn_gate": (q, h), "attn_k": (kv, h), "attn_v": (kv, h),
                      "attn_output": (h, q), "attn_q_norm": (b.head_dim,), "attn_k_norm": (b.head_dim,)}
        else:
            roles |= {"ssm_qkv": (c.conv_dim, h), "ssm_z": (c.value_dim, h), "ssm_beta": (c.linear_v_heads, h),
                      "ssm_alpha": (c.linear_v_heads, h), "ssm_conv1d": (c.linear_conv_kernel, c.conv_dim),
                      "ssm_dt": (c.linear_v_heads,), "ssm_a_log": (c.linear_v_heads,),
                      "ssm_norm": (c.linear_head_dim,), "ssm_out": (h, c.value_dim)}
        if b.layer_moe(layer):  # the sparse MoE block's tensors replace the dense FFN's
            roles = {role: shape for role, shape in roles.items() if role not in DENSE_FFN}
            out |= moe_shapes(b, layer)
        out |= {layer_tensor(layer, role): shape for role, shape in roles.items()}
    return out


#: The dense FFN's roles, absent on a sparse-MoE layer.
DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")


def random_specs(c: Qwen3NextConfig) -> dict[str, WeightSpec]:
    """f32 weight specs of a model with config `c`: for tests and examples."""
    return {name: WeightSpec("f32", shape) for name, shape in tensor_shapes(c).items()}


def _vector(g: Graph, specs: Mapping[str, WeightSpec], name: str, width: int) -> NodeId:
    _spec(specs, name, (width,))
    return g.param(name, [width])


def _heads(g: Graph, x: NodeId, batch: Dim, seq: Dim, heads: int, dim: int) -> NodeId:
    return g.reshape(x, [batch, seq, Dim(heads), Dim(dim)])


def _linear_attention(g: Graph, h: NodeId, layer: int, specs: Mapping[str, WeightSpec], c: Qwen3NextConfig,
                      batch: Dim, seq: Dim, lengths: NodeId, mask: NodeId, qa: str, max_batch: int) -> NodeId:
    """One gated DeltaNet mixer over h `[batch, seq, hidden]` (its states updated in place)."""
    hidden, n, nk, nv = c.base.hidden_size, c.linear_head_dim, c.linear_k_heads, c.linear_v_heads
    qkv = _linear(g, h, specs, layer_tensor(layer, "ssm_qkv"), c.conv_dim, hidden, qa)
    conv_name = layer_tensor(layer, "ssm_conv1d")
    _spec(specs, conv_name, (c.linear_conv_kernel, c.conv_dim))
    conv_state = g.state(f"blk.{layer}.conv_state", [max_batch, c.linear_conv_kernel - 1, c.conv_dim])
    qkv = g.activation("silu", g.depthwise_conv1d_causal(
        qkv, g.param(conv_name, [c.conv_dim, c.linear_conv_kernel]), conv_state, lengths=lengths))
    # L2 norm per head, x * rsqrt(sum(x^2) + 1e-6): an RMSNorm with eps 1e-6/n and gain 1/sqrt(n)
    unit = g.constant(np.full(n, n ** -0.5, np.float32))
    rep = nv // nk

    def key_heads(start: int) -> NodeId:
        x = g.rms_norm(_heads(g, g.narrow(qkv, 2, start, c.key_dim), batch, seq, nk, n), unit, eps=1e-6 / n)
        if rep == 1:
            return x
        wide = g.expand(g.reshape(x, [batch, seq, Dim(nk), Dim(1), Dim(n)]), [batch, seq, Dim(nk), Dim(rep), Dim(n)])
        return g.reshape(wide, [batch, seq, Dim(nv), Dim(n)])  # each key head serves `rep` consecutive value heads

    q, k = key_heads(0), key_heads(c.key_dim)
    v = _heads(g, g.narrow(qkv, 2, 2 * c.key_dim, c.value_dim), batch, seq, nv, n)
    keep = g.reshape(mask, [batch, seq, Dim(1)])
    beta = g.mul(g.activation("sigmoid", _linear(g, h, specs, layer_tensor(layer, "ssm_beta"), nv, hidden, qa)), keep)
    a = _linear(g, h, specs, layer_tensor(layer, "ssm_alpha"), nv, hidden, qa)
    a = g.activation("softplus", g.add_(a, _vector(g, specs, layer_tensor(layer, "ssm_dt"), nv)))
    decay = g.activation("neg", g.activation("exp", _vector(g, specs, layer_tensor(layer, "ssm_a_log"), nv)))
    gate = g.mul(g.mul(a, decay), keep)
    state = g.state(f"blk.{layer}.ssm_state", [max_batch, nv, n, n])
    o = g.gated_delta_net(q, k, v, gate, beta, state=state, scale=n ** -0.5)
    o = g.rms_norm(o, _vector(g, specs, layer_tensor(layer, "ssm_norm"), n), eps=c.base.rms_eps)
    z = _heads(g, _linear(g, h, specs, layer_tensor(layer, "ssm_z"), c.value_dim, hidden, qa), batch, seq, nv, n)
    o = g.reshape(g.mul(o, g.activation("silu", z)), [batch, seq, Dim(c.value_dim)])
    return _linear(g, o, specs, layer_tensor(layer, "ssm_out"), hidden, c.value_dim, qa)


def _gated_attention(g: Graph, h: NodeId, layer: int, specs: Mapping[str, WeightSpec], c: Qwen3NextConfig,
                     batch: Dim, seq: Dim, positions: NodeId, cos: NodeId, sin: NodeId, qa: str, max_batch: int,
                     capacity: int) -> NodeId:
    b = c.base
    hidden, hd = b.hidden_size, b.head_dim
    q = _linear(g, h, specs, layer_tensor(layer, "attn_q"), b.q_size, hidden, qa)
    gate = _linear(g, h, specs, layer_tensor(layer, "attn_gate"), b.q_size, hidden, qa)
    k = _linear(g, h, specs, layer_tensor(layer, "attn_k"), b.kv_size, hidden, qa)
    v = _linear(g, h, specs, layer_tensor(layer, "attn_v"), b.kv_size, hidden, qa)
    q = _head_norm(g, q, layer_tensor(layer, "attn_q_norm"), batch, seq, b.num_heads, b)
    k = _head_norm(g, k, layer_tensor(layer, "attn_k_norm"), batch, seq, b.num_kv_heads, b)
    q = g.rope(q, cos, sin, head_dim=hd, n_rot=b.n_rot, variant=b.rope_variant)
    k = g.rope(k, cos, sin, head_dim=hd, n_rot=b.n_rot, variant=b.rope_variant)
    k_name, v_name = cache_names(layer)
    a = g.cached_attention(q, k, v, g.state(k_name, [max_batch, capacity, b.kv_size]),
                           g.state(v_name, [max_batch, capacity, b.kv_size]), positions, num_heads=b.num_heads,
                           head_dim=hd, num_kv_heads=b.num_kv_heads, scale=b.attn_scale)
    a = g.mul(a, g.activation("sigmoid", gate))
    return _linear(g, a, specs, layer_tensor(layer, "attn_output"), hidden, b.q_size, qa)


def build_qwen3_next(config: Qwen3NextConfig, specs: Mapping[str, WeightSpec], *, max_batch: int = 1,
                     max_seq: int = 256, capacity: int = 2048, name: str = "qwen3_next", tp: int = 1,
                     quant_act: str = "f32", narrow_weights: bool = False) -> Graph:
    """One Qwen3-Next step over its hybrid cache (see the module docstring); `tp` must be 1."""
    if capacity < 1 or max_seq < 1 or max_batch < 1:
        raise IRError(f"max_batch, max_seq and capacity must be >= 1, got {max_batch}, {max_seq}, {capacity}")
    if tp != 1:
        raise IRError(f"a Qwen3-Next decoder is not tensor-parallel (tp={tp!r})")
    if quant_act not in ACT_MODES:
        raise IRError(f"quant_act must be one of {ACT_MODES}, got {quant_act!r}")
    c, b = config, config.base
    specs = specs if narrow_weights else widened(specs)
    g = Graph(name)
    batch, seq = Dim(max_batch), Dim.dynamic("seq", max_seq)
    n_rows = Dim.dynamic("n_rows", max_batch * max_seq)
    tokens = g.input("tokens", [batch, seq], "i32")
    positions = g.input("positions", [batch], "i32")
    cos = g.input("rope_cos", [batch, seq, b.n_rot // 2])
    sin = g.input("rope_sin", [batch, seq, b.n_rot // 2])
    rows = g.input("rows", [n_rows], "i32")
    sample_u = g.input("sample_u", [n_rows], "f64")
    sample_settings = g.input("sample_settings", [len(SAMPLE_SETTINGS)], "f64")
    lengths = g.input(LENGTHS_INPUT, [batch], "i32")
    mask = g.input(MASK_INPUT, [batch, seq])
    x = _embedding(g, tokens, specs, b)
    for layer, kind in enumerate(c.layer_types):
        h = g.rms_norm(x, _vector(g, specs, layer_tensor(layer, "attn_norm"), b.hidden_size), eps=b.rms_eps)
        if kind == "linear_attention":
            mixed = _linear_attention(g, h, layer, specs, c, batch, seq, lengths, mask, quant_act, max_batch)
        else:
            mixed = _gated_attention(g, h, layer, specs, c, batch, seq, positions, cos, sin, quant_act, max_batch,
                                     capacity)
        x = g.add_(x, mixed)
        h = g.rms_norm(x, _vector(g, specs, layer_tensor(layer, "ffn_norm"), b.hidden_size), eps=b.rms_eps)
        if b.layer_moe(layer):
            x = g.add_(x, _moe_ffn(g, h, specs, b, layer))
            continue
        gate = _linear(g, h, specs, layer_tensor(layer, "ffn_gate"), b.ffn_size, b.hidden_size, quant_act)
        up = _linear(g, h, specs, layer_tensor(layer, "ffn_up"), b.ffn_size, b.hidden_size, quant_act)
        x = g.add_(x, _linear(g, g.mul(g.activation(b.ffn_act, gate), up), specs, layer_tensor(layer, "ffn_down"),
                              b.hidden_size, b.ffn_size, quant_act))
    flat = g.reshape(x, [batch * seq, b.hidden_size])
    h = g.rms_norm(g.gather(flat, rows), _vector(g, specs, "output_norm.weight", b.hidden_size), eps=b.rms_eps)
    logits = _linear(g, h, specs, output_weight_name(b, specs), b.vocab_size, b.hidden_size, quant_act)
    g.set_outputs({"logits": logits, "next_token": g.argmax(logits, axis=-1),
                   "sampled_token": g.sample_top_k(logits, sample_u, sample_settings)})
    return g

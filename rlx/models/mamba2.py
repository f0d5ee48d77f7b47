"""Mamba-2 decoders (transformers' `Mamba2ForCausalLM`) as one RLX graph over a recurrent cache.

`build_mamba2` returns a MIR graph with the step interface of `rlx.models.llama.build_decoder`
(`tokens`, `rows`, `sample_u`, `sample_settings` in; `logits`, `next_token`, `sampled_token` out),
so `CausalLM` runs prefill and decode through it the same way. Where a LLaMA layer keeps K/V rows
per token, a Mamba-2 layer keeps two fixed-size states per sequence (`recurrent_state_names`):

- `blk.N.conv_state` `[max_batch, d_conv-1, conv_dim]`: the last d_conv-1 inputs of the causal
  conv (`depthwise_conv1d_causal`'s carried form, which leaves each row's last real inputs there);
- `blk.N.ssm_state.G` `[max_batch, channels/groups, d_state]` per group G of B/C: the SSM state
  (`selective_scan`'s carried form, read and updated in place).

Both are state inputs updated by every step, prefill chunk or decode token alike. Two more
per-step inputs say which new tokens are real in a ragged batch: `seq_lengths` i32 `[batch]`
(each row's real tokens among the step's `seq`) and `seq_mask` f32 `[batch, seq]` (1 for those):
the time step is multiplied by the mask, and a step of delta 0 leaves an SSM state as it was,
so a row's right padding never reaches its state. The batch dimension is static (`max_batch`):
the states are whole slots the ops update in place; `CausalLM` pads a step's rows to it.

One layer (norm_before_gate=False, as the checkpoints): ``zxbcdt = in_proj(rmsnorm(x))``;
``xBC = silu(conv1d(xBC) + bias)``; ``dt = softplus(dt + dt_bias)``; per head h (A = -exp(A_log[h])
shared by its head_dim channels, B/C shared by the heads of a group) the selective scan; ``y += D * x``;
``y = rmsnorm_per_group(y * silu(z)) * w``; ``x += out_proj(y)``.

>>> cfg = Mamba2Config(vocab_size=64, hidden_size=16, num_layers=1, num_heads=4, head_dim=8, state_size=8,
...                    n_groups=1, conv_kernel=4, intermediate_size=32)
>>> g = build_mamba2(cfg, random_specs(cfg), max_batch=2, max_seq=8)
>>> sorted(recurrent_state_names(cfg))
['blk.0.conv_state', 'blk.0.ssm_state.0']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.errors import ArtifactError, IRError
from rlx.ir.graph import Graph, NodeId
from rlx.ir.ops import ACT_MODES
from rlx.ir.ops_sample import SETTINGS as SAMPLE_SETTINGS
from rlx.ir.shape import Dim
from rlx.models.llama import WeightSpec, _linear, _spec, layer_tensor, output_weight_name, widened

#: The per-step inputs of a recurrent graph that say which of a ragged step's tokens are real.
LENGTHS_INPUT, MASK_INPUT = "seq_lengths", "seq_mask"


@dataclass(frozen=True)
class Mamba2Config:
    """The hyper-parameters of a Mamba-2 decoder (transformers' `Mamba2Config`, the fields the graph reads)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    intermediate_size: int
    rms_eps: float = 1e-5
    use_conv_bias: bool = True
    tie_embeddings: bool = False
    context_length: int = 2048
    bos_id: int = -1
    eos_id: int = -1
    arch: str = "mamba2"
    #: Every layer is recurrent: the cache holds per-sequence states (`rlx.models.causal_lm.KvCache.recurrent`).
    recurrent: bool = True
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "head_dim", "state_size", "n_groups",
                    "conv_kernel", "intermediate_size", "context_length"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArtifactError(f"mamba2 config {key} must be a positive int, got {v!r}")
        if self.num_heads * self.head_dim != self.intermediate_size:
            raise ArtifactError(f"mamba2 config: num_heads {self.num_heads} x head_dim {self.head_dim} must equal "
                                f"the intermediate size {self.intermediate_size} (expand x hidden_size)")
        if self.num_heads % self.n_groups:
            raise ArtifactError(f"mamba2 config: n_groups {self.n_groups} must divide num_heads {self.num_heads}")
        if self.conv_kernel < 2:
            raise ArtifactError(f"mamba2 config conv_kernel must be >= 2, got {self.conv_kernel}")
        for key in ("bos_id", "eos_id"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or not -1 <= v < self.vocab_size:
                raise ArtifactError(f"mamba2 config {key} must be -1 (none) or a token id below vocab_size, got {v!r}")

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: x, then B and C of every group."""
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def in_proj_size(self) -> int:
        """Rows of in_proj: z, xBC, dt."""
        return self.intermediate_size + self.conv_dim + self.num_heads

    def recurrent_states(self) -> list[str]:
        """The state inputs of the graph (`recurrent_state_names`)."""
        return recurrent_state_names(self)


def _json_float(v: Any) -> float:
    """A float of config.json, where transformers writes infinity as {"__float__": "Infinity"}."""
    return float(v["__float__"]) if isinstance(v, Mapping) and "__float__" in v else float(v)


def mamba2_config(raw: Mapping[str, Any], source: str = "config.json") -> Mamba2Config:
    """The `Mamba2Config` of a transformers config.json (model_type "mamba2"), checked."""
    def get(key: str, default: Any = None) -> Any:
        v = raw.get(key, default)
        if v is None:
            raise ArtifactError(f"{source}: {key} is missing")
        return v

    hidden = int(get("hidden_size"))
    intermediate = int(float(get("expand", 2)) * hidden)
    limit = [_json_float(v) for v in (raw.get("time_step_limit") or (0.0, float("inf")))]
    if len(limit) != 2 or limit[0] > 0.0 or limit[1] != float("inf"):
        raise ArtifactError(f"{source}: time_step_limit={limit!r} is not supported (only the default (0, inf))")
    if raw.get("use_bias", False):
        raise ArtifactError(f"{source}: use_bias=True (biased in/out projections) is not supported")
    if raw.get("norm_before_gate", False):
        raise ArtifactError(f"{source}: norm_before_gate=True is not supported")
    vocab = int(get("vocab_size"))

    def token(key: str) -> int:
        v = raw.get(key)
        v = v[0] if isinstance(v, list) and v else v
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab else -1

    try:
        return Mamba2Config(
            vocab_size=vocab, hidden_size=hidden, num_layers=int(get("num_hidden_layers")),
            num_heads=int(get("num_heads")), head_dim=int(get("head_dim")), state_size=int(get("state_size")),
            n_groups=int(get("n_groups", 1)), conv_kernel=int(get("conv_kernel", 4)),
            intermediate_size=intermediate, rms_eps=float(get("layer_norm_epsilon", 1e-5)),
            use_conv_bias=bool(raw.get("use_conv_bias", True)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            context_length=int(raw.get("max_position_embeddings") or 2048),
            bos_id=token("bos_token_id"), eos_id=token("eos_token_id"), name=str(raw.get("_name_or_path", "")))
    except ArtifactError as exc:
        raise ArtifactError(f"{source}: {exc}") from None


def tensor_shapes(c: Mamba2Config) -> dict[str, tuple[int, ...]]:
    """GGUF-style name -> shape (as `CausalLM` takes it: matrices [out, in]) of every tensor the graph reads.

    The conv weight is `[d_conv, conv_dim]` (the checkpoint's `[conv_dim, 1, d_conv]` transposed, as
    llama.cpp stores `ssm_conv1d`): the loader transposes every matrix, so the graph reads `[conv_dim, d_conv]`.
    """
    h, n_heads = c.hidden_size, c.num_heads
    out = {"token_embd.weight": (c.vocab_size, h), "output_norm.weight": (h,)}
    if not c.tie_embeddings:
        out["output.weight"] = (c.vocab_size, h)
    for layer in range(c.num_layers):
        out |= {layer_tensor(layer, "attn_norm"): (h,), layer_tensor(layer, "ssm_in"): (c.in_proj_size, h),
                layer_tensor(layer, "ssm_conv1d"): (c.conv_kernel, c.conv_dim),
                layer_tensor(layer, "ssm_dt"): (n_heads,), layer_tensor(layer, "ssm_a_log"): (n_heads,),
                layer_tensor(layer, "ssm_d"): (n_heads,), layer_tensor(layer, "ssm_norm"): (c.intermediate_size,),
                layer_tensor(layer, "ssm_out"): (h, c.intermediate_size)}
        if c.use_conv_bias:
            out[f"blk.{layer}.ssm_conv1d.bias"] = (c.conv_dim,)
    return out


#: Our role -> the checkpoint's name inside `backbone.layers.N.` (transformers' Mamba2 layout).
CHECKPOINT_LAYER = {"attn_norm.weight": "norm.weight", "ssm_in.weight": "mixer.in_proj.weight",
                    "ssm_conv1d.weight": "mixer.conv1d.weight", "ssm_conv1d.bias": "mixer.conv1d.bias",
                    "ssm_dt.weight": "mixer.dt_bias", "ssm_a_log.weight": "mixer.A_log", "ssm_d.weight": "mixer.D",
                    "ssm_norm.weight": "mixer.norm.weight", "ssm_out.weight": "mixer.out_proj.weight"}
CHECKPOINT_GLOBAL = {"token_embd.weight": "backbone.embeddings.weight", "output_norm.weight": "backbone.norm_f.weight",
                     "output.weight": "lm_head.weight"}


def checkpoint_names(c: Mamba2Config) -> dict[str, str]:
    """GGUF-style name -> checkpoint tensor name, for every name of `tensor_shapes`."""
    out = {}
    for ours in tensor_shapes(c):
        if ours in CHECKPOINT_GLOBAL:
            out[ours] = CHECKPOINT_GLOBAL[ours]
        else:
            _, layer, role = ours.split(".", 2)
            out[ours] = f"backbone.layers.{layer}.{CHECKPOINT_LAYER[role]}"
    return out


def recurrent_state_names(c: Mamba2Config) -> list[str]:
    """The state inputs of the graph: each layer's conv state and one SSM state per group."""
    return [name for layer in range(c.num_layers)
            for name in (f"blk.{layer}.conv_state", *(f"blk.{layer}.ssm_state.{g}" for g in range(c.n_groups)))]


def random_specs(c: Mamba2Config, ggml_type: str = "f32") -> dict[str, WeightSpec]:
    """Weight specs of a model with config `c` (matrices of type `ggml_type`): for tests and examples."""
    return {name: WeightSpec("f32" if len(shape) == 1 or "conv1d" in name else ggml_type, shape)
            for name, shape in tensor_shapes(c).items()}


def _vector(g: Graph, specs: Mapping[str, WeightSpec], name: str, width: int) -> NodeId:
    _spec(specs, name, (width,))
    return g.param(name, [width])


def _per_channel(g: Graph, head_values: NodeId, batch_dims: list[Dim], c: Mamba2Config) -> NodeId:
    """`[..., heads]` -> `[..., heads*head_dim]`: each head's value repeated over its channels."""
    one = Dim(1)
    wide = g.expand(g.reshape(head_values, [*batch_dims, Dim(c.num_heads), one]),
                    [*batch_dims, Dim(c.num_heads), Dim(c.head_dim)])
    return g.reshape(wide, [*batch_dims, Dim(c.intermediate_size)])


def _mixer(g: Graph, h: NodeId, layer: int, specs: Mapping[str, WeightSpec], c: Mamba2Config, batch: Dim, seq: Dim,
           lengths: NodeId, mask: NodeId, qa: str, max_batch: int) -> NodeId:
    """One Mamba-2 mixer over h `[batch, seq, hidden]` (its states updated in place)."""
    inner, conv_dim, n, groups = c.intermediate_size, c.conv_dim, c.state_size, c.n_groups
    proj = _linear(g, h, specs, layer_tensor(layer, "ssm_in"), c.in_proj_size, c.hidden_size, qa)
    z = g.narrow(proj, 2, 0, inner)
    xbc = g.narrow(proj, 2, inner, conv_dim)
    dt = g.narrow(proj, 2, inner + conv_dim, c.num_heads)
    conv_name = layer_tensor(layer, "ssm_conv1d")
    _spec(specs, conv_name, (c.conv_kernel, conv_dim))
    conv_state = g.state(f"blk.{layer}.conv_state", [max_batch, c.conv_kernel - 1, conv_dim])
    xbc = g.depthwise_conv1d_causal(xbc, g.param(conv_name, [conv_dim, c.conv_kernel]), conv_state, lengths=lengths)
    if c.use_conv_bias:
        xbc = g.add_(xbc, _vector(g, specs, f"blk.{layer}.ssm_conv1d.bias", conv_dim))
    xbc = g.activation("silu", xbc)
    x = g.narrow(xbc, 2, 0, inner)
    # dt = softplus(dt + dt_bias), zero where the token is padding (the state then stays as it was)
    dt = g.activation("softplus", g.add_(dt, _vector(g, specs, layer_tensor(layer, "ssm_dt"), c.num_heads)))
    dt = g.mul(dt, g.reshape(mask, [batch, seq, Dim(1)]))
    dt_ch = _per_channel(g, dt, [batch, seq], c)
    a_heads = g.activation("neg", g.activation("exp", _vector(g, specs, layer_tensor(layer, "ssm_a_log"),
                                                              c.num_heads)))
    a_ch = g.expand(g.reshape(_per_channel(g, a_heads, [], c), [Dim(inner), Dim(1)]), [Dim(inner), Dim(n)])
    per_group = inner // groups
    ys = []
    for grp in range(groups):
        lo = grp * per_group
        bm = g.narrow(xbc, 2, inner + grp * n, n)
        cm = g.narrow(xbc, 2, inner + groups * n + grp * n, n)
        state = g.state(f"blk.{layer}.ssm_state.{grp}", [max_batch, per_group, n])
        ys.append(g.selective_scan(g.narrow(x, 2, lo, per_group), g.narrow(dt_ch, 2, lo, per_group),
                                   g.narrow(a_ch, 0, lo, per_group), bm, cm, state=state))
    y = ys[0] if groups == 1 else g.concat(ys, 2)
    d_ch = _per_channel(g, _vector(g, specs, layer_tensor(layer, "ssm_d"), c.num_heads), [], c)
    y = g.add_(y, g.mul(x, d_ch))
    # the gated RMSNorm: normalize y * silu(z) over each group's channels, then scale by the weight
    y = g.mul(y, g.activation("silu", z))
    if groups == 1:
        y = g.rms_norm(y, _vector(g, specs, layer_tensor(layer, "ssm_norm"), inner), eps=c.rms_eps)
    else:
        grouped = g.reshape(y, [batch, seq, Dim(groups), Dim(per_group)])
        normed = g.rms_norm(grouped, g.constant(np.ones(per_group, np.float32)), eps=c.rms_eps)
        y = g.mul(g.reshape(normed, [batch, seq, Dim(inner)]),
                  _vector(g, specs, layer_tensor(layer, "ssm_norm"), inner))
    return _linear(g, y, specs, layer_tensor(layer, "ssm_out"), c.hidden_size, inner, qa)


def build_mamba2(config: Mamba2Config, specs: Mapping[str, WeightSpec], *, max_batch: int = 1, max_seq: int = 256,
                 capacity: int = 2048, name: str = "mamba2", tp: int = 1, quant_act: str = "f32",
                 narrow_weights: bool = False) -> Graph:
    """One Mamba-2 step over the recurrent cache (see the module docstring). `capacity` is not read (the
    states do not grow with the sequence); `tp` must be 1."""
    if max_seq < 1 or max_batch < 1:
        raise IRError(f"max_batch and max_seq must be >= 1, got {max_batch}, {max_seq}")
    if tp != 1:
        raise IRError(f"a Mamba-2 decoder is not tensor-parallel (tp={tp!r})")
    if quant_act not in ACT_MODES:
        raise IRError(f"quant_act must be one of {ACT_MODES}, got {quant_act!r}")
    c = config
    specs = specs if narrow_weights else widened(specs)
    g = Graph(name)
    batch, seq = Dim(max_batch), Dim.dynamic("seq", max_seq)
    n_rows = Dim.dynamic("n_rows", max_batch * max_seq)
    tokens = g.input("tokens", [batch, seq], "i32")
    rows = g.input("rows", [n_rows], "i32")
    sample_u = g.input("sample_u", [n_rows], "f64")
    sample_settings = g.input("sample_settings", [len(SAMPLE_SETTINGS)], "f64")
    lengths = g.input(LENGTHS_INPUT, [batch], "i32")
    mask = g.input(MASK_INPUT, [batch, seq])
    emb_spec = _spec(specs, "token_embd.weight", (c.vocab_size, c.hidden_size))
    if emb_spec.quantized:
        raise IRError("a quantized token embedding is not supported for Mamba-2")
    x = g.gather(g.param("token_embd.weight.rows", [c.vocab_size, c.hidden_size], emb_spec.float_dtype), tokens)
    if emb_spec.float_dtype != "f32":
        x = g.cast(x, "f32")
    for layer in range(c.num_layers):
        h = g.rms_norm(x, _vector(g, specs, layer_tensor(layer, "attn_norm"), c.hidden_size), eps=c.rms_eps)
        x = g.add_(x, _mixer(g, h, layer, specs, c, batch, seq, lengths, mask, quant_act, max_batch))
    flat = g.reshape(x, [batch * seq, c.hidden_size])
    h = g.rms_norm(g.gather(flat, rows), _vector(g, specs, "output_norm.weight", c.hidden_size), eps=c.rms_eps)
    logits = _linear(g, h, specs, output_weight_name(c, specs), c.vocab_size, c.hidden_size, quant_act)  # type: ignore[arg-type]
    g.set_outputs({"logits": logits, "next_token": g.argmax(logits, axis=-1),
                   "sampled_token": g.sample_top_k(logits, sample_u, sample_settings)})
    return g

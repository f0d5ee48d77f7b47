"""The hyper-parameters of a LLaMA-style decoder (LLaMA, Mistral, SmolLM, Qwen2/3, Phi-3, Gemma 3, Mixtral, Qwen3-MoE).

One frozen record that every later stage (graph builder, KV cache, RoPE tables,
generation) reads, whatever file it came from. `rlx.models.gguf.read_gguf`
fills it from a GGUF file's metadata, `rlx.models.hf_config.decoder_config` from
a Hugging Face config.json; it can also be built by hand for a test.

>>> cfg = DecoderConfig(arch="llama", vocab_size=100, hidden_size=64, num_layers=2, num_heads=4,
...                     num_kv_heads=2, head_dim=16, ffn_size=128)
>>> cfg.q_size, cfg.kv_size, cfg.group_size, cfg.n_rot
(64, 32, 2, 16)
>>> cfg.rope_variant
'interleaved'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx.errors import ArtifactError
from rlx.models.moe import MoeConfig
from rlx.models.rope import RopeSpec

#: How RoPE pairs the values of a head. "interleaved" rotates adjacent pairs (x[2i], x[2i+1]) —
#: llama.cpp's NORM rope type, used by `llama` (LLaMA, Mistral, SmolLM files, whose converter
#: permutes the q/k rows to match). "neox" rotates (x[i], x[i + n_rot/2]) — llama.cpp's NEOX
#: type, used by `qwen2`.
ROPE_VARIANTS = ("interleaved", "neox")

#: llama.cpp's rope type per supported GGUF architecture (`llama_model_rope_type`).
ARCH_ROPE_VARIANT = {"llama": "interleaved", "qwen2": "neox"}

#: What a layer's attention does with positions (`DecoderConfig.layer_rope`): RoPE with `rope`
#: ("global"), with `rope_local` ("local": Gemma 3's sliding layers), or none ("none": SmolLM3's NoPE layers).
LAYER_ROPE_KINDS = ("global", "local", "none")
#: FFN gate activations (`DecoderConfig.ffn_act`): SwiGLU's silu, GeGLU's tanh-approximated gelu.
FFN_ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class DecoderConfig:
    """A pre-norm decoder: RMSNorm, GQA attention with RoPE, SwiGLU FFN, optional tied output head.

    `head_dim` may differ from `hidden_size / num_heads` (Mistral-Nemo style files say so with
    `attention.key_length`); `n_rot` is how many leading dims of each head RoPE rotates (all of
    them for every supported architecture, but files state it). `rope_scale` is linear position
    scaling (positions are divided by it). `qkv_bias` is True where q/k/v projections carry a
    bias (Qwen2). `bos_id`/`eos_id` are -1 when the file names none.
    """

    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    rms_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_variant: str = ""
    n_rot: int = 0
    context_length: int = 2048
    tie_embeddings: bool = False
    bos_id: int = -1
    eos_id: int = -1
    qkv_bias: bool = False
    rope_scale: float = 1.0
    #: RoPE scheme of the Hugging Face config (None: `rope_base` / `rope_scale`, as GGUF files give them).
    rope: RopeSpec | None = None
    #: A second scheme for "local" layers (Gemma 3's sliding-window layers have their own base).
    rope_local: RopeSpec | None = None
    #: Per layer, one of LAYER_ROPE_KINDS; empty: every layer "global".
    layer_rope: tuple[str, ...] = ()
    #: RMSNorm of each head's q and k (over head_dim) before RoPE (Qwen3, Gemma 3).
    qk_norm: bool = False
    #: Norms after attention and after the FFN too, before each residual add (Gemma 3).
    sandwich_norms: bool = False
    #: The sparse MoE feed-forward of MoE layers (Mixtral, Qwen3-MoE; `rlx.models.moe`); None: every layer dense.
    #: Its `quant` / `expert_dtype` are set by the graph builder from the expert tensors' types.
    moe: MoeConfig | None = None
    #: Per layer, whether its FFN is the MoE block (the others: the dense `ffn_size` SwiGLU, as Qwen3-MoE's
    #: `mlp_only_layers` / `decoder_sparse_step` say); empty with `moe` set: every layer.
    moe_layers: tuple[bool, ...] = ()
    ffn_act: str = "silu"
    #: The token embedding is multiplied by this (Gemma: sqrt(hidden_size)).
    embed_scale: float = 1.0
    #: Attention's softmax scale (None: 1/sqrt(head_dim)).
    attn_scale: float | None = None
    #: logits <- cap * tanh(logits / cap) where set (Gemma's final_logit_softcapping).
    final_softcap: float | None = None
    #: Sliding-window attention width (0: none): a query sees the last `sliding_window` keys.
    sliding_window: int = 0
    #: Per layer, whether it uses the sliding window; empty: every layer does (when sliding_window > 0).
    windowed_layers: tuple[bool, ...] = ()
    #: Model file name or other free text; not part of equality (two files of one shape compare equal).
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or not self.arch:
            raise ArtifactError(f"decoder config arch must be a non-empty string, got {self.arch!r}")
        # Fill the defaults that depend on other fields (frozen: through object.__setattr__).
        if self.rope_variant == "":
            if self.arch not in ARCH_ROPE_VARIANT:
                raise ArtifactError(f"decoder config: no default RoPE variant for arch {self.arch!r}; "
                                    f"pass rope_variant= one of {ROPE_VARIANTS}")
            object.__setattr__(self, "rope_variant", ARCH_ROPE_VARIANT[self.arch])
        if self.n_rot == 0 and isinstance(self.head_dim, int):
            object.__setattr__(self, "n_rot", self.head_dim)
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "ffn_size", "n_rot", "context_length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArtifactError(f"decoder config {name} must be a positive int, got {v!r}")
        for name in ("bos_id", "eos_id"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not -1 <= v < self.vocab_size:
                raise ArtifactError(f"decoder config {name} must be -1 (none) or a token id below vocab_size "
                                    f"{self.vocab_size}, got {v!r}")
        for name in ("rms_eps", "rope_base", "rope_scale", "embed_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or v != v or v == float("inf"):
                raise ArtifactError(f"decoder config {name} must be a positive finite number, got {v!r}")
        for name in ("tie_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ArtifactError(f"decoder config {name} must be a bool, got {getattr(self, name)!r}")
        if self.layer_rope and (len(self.layer_rope) != self.num_layers
                                or not set(self.layer_rope) <= set(LAYER_ROPE_KINDS)):
            raise ArtifactError(f"decoder config layer_rope must name one of {LAYER_ROPE_KINDS} for each of the "
                                f"{self.num_layers} layers, got {self.layer_rope!r}")
        if self.windowed_layers and len(self.windowed_layers) != self.num_layers:
            raise ArtifactError(f"decoder config windowed_layers must have one flag per layer ({self.num_layers}), "
                                f"got {self.windowed_layers!r}")
        if self.moe_layers and (len(self.moe_layers) != self.num_layers or self.moe is None):
            raise ArtifactError(f"decoder config moe_layers must have one flag per layer ({self.num_layers}) and "
                                f"come with a moe config, got {self.moe_layers!r} with moe={self.moe!r}")
        if self.moe is not None and self.moe.hidden_size != self.hidden_size:
            raise ArtifactError(f"decoder config moe hidden_size {self.moe.hidden_size} differs from the "
                                f"model's {self.hidden_size}")
        if "local" in self.layer_rope and self.rope_local is None:
            raise ArtifactError("decoder config: layers use a local RoPE but rope_local is not given")
        if self.ffn_act not in FFN_ACTIVATIONS:
            raise ArtifactError(f"decoder config ffn_act must be one of {FFN_ACTIVATIONS}, got {self.ffn_act!r}")
        for name in ("attn_scale", "final_softcap"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not v > 0):
                raise ArtifactError(f"decoder config {name} must be None or a positive number, got {v!r}")
        if isinstance(self.sliding_window, bool) or not isinstance(self.sliding_window, int) or self.sliding_window < 0:
            raise ArtifactError(f"decoder config sliding_window must be an int >= 0, got {self.sliding_window!r}")
        if self.rope_variant not in ROPE_VARIANTS:
            raise ArtifactError(f"decoder config rope_variant must be one of {ROPE_VARIANTS}, "
                                f"got {self.rope_variant!r}")
        if self.num_heads % self.num_kv_heads:
            raise ArtifactError(f"decoder config num_heads {self.num_heads} is not a multiple of "
                                f"num_kv_heads {self.num_kv_heads} (grouped-query attention needs whole groups)")
        if self.n_rot > self.head_dim or self.n_rot % 2:
            raise ArtifactError(f"decoder config n_rot {self.n_rot} must be even and at most head_dim "
                                f"{self.head_dim}")

    def layer_window(self, layer: int) -> int:
        """The sliding window of layer `layer` (0: full causal attention)."""
        if not self.sliding_window or (self.windowed_layers and not self.windowed_layers[layer]):
            return 0
        return self.sliding_window

    def layer_moe(self, layer: int) -> bool:
        """Whether layer `layer`'s FFN is the sparse MoE block (`moe`)."""
        if self.moe is None:
            return False
        return self.moe_layers[layer] if self.moe_layers else True

    def layer_rope_kind(self, layer: int) -> str:
        """"global", "local" or "none": which RoPE layer `layer` applies."""
        return self.layer_rope[layer] if self.layer_rope else "global"

    @property
    def q_size(self) -> int:
        """Width of the query projection's output (num_heads * head_dim)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (and value) projection's output (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads sharing one KV head."""
        return self.num_heads // self.num_kv_heads

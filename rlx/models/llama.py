"""LLaMA-family decoders (LLaMA, SmolLM, Qwen2, Mistral, and MoE ones) as one RLX graph over a KV cache.

`build_decoder` returns a MIR graph that runs one step of a decoder: a chunk
of `seq` new tokens for each of `batch` sequences, each row at its own
position in its own slot of the KV cache. Prefill (a whole prompt, or a chunk
of one) and decode (one token) are the same graph with a different `seq`, so
one compiled library and one copy of the weights serve both. Inputs:

- `tokens` i32 `[batch, seq]`; `positions` i32 `[batch]`: tokens each row's
  cache already holds (its new tokens go to cache rows `positions[b] + s`);
- `rope_cos`, `rope_sin` f32 `[batch, seq, n_rot/2]`: the rotary tables of
  each new token's position (`rope_tables`), computed on the host;
- `rows` i32 `[n_rows]`: which of the `batch*seq` new tokens (flat index
  `b*seq + s`) get logits — every position for `logits`, each row's last one
  for generation, so the vocabulary projection runs only where needed;
- states `blk.N.k_cache` / `blk.N.v_cache` `[max_batch, capacity, kv_heads*head_dim]`, f32 or the
  `kv_dtype` given (f16/bf16: values rounded when stored, as CUDA keeps them).

Outputs `logits` f32 `[n_rows, vocab]`, `next_token` i32 `[n_rows]`, the
argmax of each row's logits (greedy decoding reads only this), and
`sampled_token` i32 `[n_rows]`, each row's token sampled by `sample_top_k`
with inputs `sample_u` f64 `[n_rows]` (uniforms drawn on the host) and
`sample_settings` f64 `[3]` (temperature, top_k, top_p; `Sampler.settings`). Params keep the GGUF tensor names
(`blk.0.attn_q.weight`, ...). A layer whose FFN is a sparse mixture of experts (`DecoderConfig.layer_moe`:
Mixtral, Qwen3-MoE) runs `rlx.models.moe.moe_block` instead of the SwiGLU, its params under
`blk.N.ffn_moe.` (`moe_prefix`) in transformers' layout (router `[E, H]`, experts `[E, 2I, H]` and
`[E, H, I]`, float or GGUF blocks). A quantized weight stays in its GGUF blocks
and is multiplied by `dequant_matmul` (the kernels read the 4/8-bit blocks);
F32 weights are f32 matmuls; F16/BF16 matrices are f32 matmuls too, on weights either
widened to f32 at load or, with `narrow_weights=True` (the CPU), kept in their stored
precision (`matmul(f32 x, f16|bf16 w) -> f32`: half the bytes, f32 accumulation). The
token embedding is gathered as rows (a narrow one widened after the gather); a
quantized one is dequantized row by row after the gather.

>>> from rlx.models.decoder_config import DecoderConfig
>>> cfg = DecoderConfig(arch="llama", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
...                     num_kv_heads=2, head_dim=8, ffn_size=48, rms_eps=1e-5, rope_base=10000.0,
...                     rope_variant="interleaved", n_rot=8, context_length=64, tie_embeddings=True,
...                     bos_id=1, eos_id=2)
>>> specs = random_specs(cfg)
>>> g = build_decoder(cfg, specs, max_batch=1, max_seq=8, capacity=16)
>>> [n.op.name for n in g.inputs()][:5]
['tokens', 'positions', 'rope_cos', 'rope_sin', 'rows']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlx.errors import IRError
from rlx.ir import ops as O
from rlx.ir.dtype import bits_to_bfloat16
from rlx.ir.graph import Graph, Node, NodeId
from rlx.ir.ops import ACT_MODES
from rlx.ir.ops_sample import SETTINGS as SAMPLE_SETTINGS
from rlx.ir.shape import Dim
from rlx.models.decoder_config import DecoderConfig
from rlx.models.moe import moe_block, param_shapes
from rlx.models.transpose import converted_transpose

#: GGUF types that are plain float arrays (multiplied by f32 matmuls).
FLOAT_TYPES = ("f32", "f16", "bf16")
#: Float types a matrix may keep in memory under an f32 matmul (`build_decoder(narrow_weights=True)`).
NARROW_TYPES = ("f16", "bf16")


@dataclass(frozen=True)
class WeightSpec:
    """What the graph needs to know of one weight: its GGUF type and (rows, cols) shape."""

    ggml_type: str
    shape: tuple[int, ...]

    @property
    def quantized(self) -> bool:
        return self.ggml_type not in FLOAT_TYPES

    @property
    def float_dtype(self) -> str:
        """The param dtype of this float matrix: its own type (f16/bf16 multiplied as stored)."""
        return self.ggml_type if self.ggml_type in NARROW_TYPES and len(self.shape) == 2 else "f32"


def widened(specs: Mapping[str, WeightSpec]) -> dict[str, WeightSpec]:
    """`specs` with every F16/BF16 tensor read as f32 (`decoder_params` widens it at load).

    >>> widened({"w": WeightSpec("bf16", (4, 8)), "q": WeightSpec("q8_0", (4, 32))})["w"].ggml_type
    'f32'
    """
    return {n: WeightSpec("f32", s.shape) if s.ggml_type in NARROW_TYPES else s for n, s in specs.items()}


def layer_tensor(layer: int, role: str) -> str:
    """GGUF name of a per-layer tensor (`blk.3.attn_q.weight`)."""
    return f"blk.{layer}.{role}.weight"


def output_weight_name(config: DecoderConfig, specs: Mapping[str, WeightSpec]) -> str:
    """The vocabulary projection: `output.weight`, or the token embedding when they are tied."""
    if "output.weight" in specs:
        return "output.weight"
    if config.tie_embeddings or "output.weight" not in specs:
        return "token_embd.weight"
    raise IRError("the model has no output.weight and its embeddings are not tied")


#: The FFN role of a layer's sparse MoE block: its params are `blk.N.ffn_moe.<transformers' name>`.
MOE_ROLE = "ffn_moe"


def moe_prefix(layer: int) -> str:
    """The name prefix of layer `layer`'s MoE params (`blk.3.ffn_moe`)."""
    return f"blk.{layer}.{MOE_ROLE}"


def moe_shapes(config: DecoderConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """Name -> logical shape of layer `layer`'s MoE tensors: router `[E, H]`, experts `[E, 2I, H]`, `[E, H, I]`,
    and with a shared expert (Qwen3-Next) its three matrices and its gate `[1, H]` (none for a dense layer)."""
    m = config.moe
    if m is None or not config.layer_moe(layer):
        return {}
    p = moe_prefix(layer)
    return {name: shape for name, (shape, _) in param_shapes(m, p).items()}


def cache_names(layer: int) -> tuple[str, str]:
    return f"blk.{layer}.k_cache", f"blk.{layer}.v_cache"


def _spec(specs: Mapping[str, WeightSpec], name: str, shape: tuple[int, ...]) -> WeightSpec:
    if name not in specs:
        raise IRError(f"the model has no tensor {name!r}")
    spec = specs[name]
    if tuple(spec.shape) != shape:
        raise IRError(f"tensor {name!r} has shape {tuple(spec.shape)}, expected {shape} from the config")
    return spec


def _param(g: Graph, name: str, dims: list[int], dtype: str) -> NodeId:
    """The param `name`, created once: tied embeddings read one quantized table twice."""
    for node in g.params():
        if node.op.name == name:
            if list(node.shape.static_dims) != dims or node.shape.dtype.value != dtype:
                raise IRError(f"param {name!r} is used as {node.shape} and as {dtype}{dims}")
            return node.id
    return g.param(name, dims, dtype)


def _linear(g: Graph, x: NodeId, specs: Mapping[str, WeightSpec], name: str, n_out: int, n_in: int,
            act: str = "f32", act_formats: Sequence[str] | None = None) -> NodeId:
    """x @ W^T for a GGUF weight W `[n_out, n_in]`: on the raw blocks when quantized.

    `act` "q8"/"q16" quantizes x to int8/int16 blocks first for the formats that take it (`act_formats`, by
    default Q8_ACT_FORMATS: those every backend's integer kernels take); other formats multiply f32
    activations either way. An f16/bf16 weight stays in its precision (the matmul reads it as stored)."""
    spec = _spec(specs, name, (n_out, n_in))
    if spec.quantized:
        from rlx.ir import quant as Q

        takes = Q.Q8_ACT_FORMATS if act_formats is None else act_formats
        act = act if spec.ggml_type in takes and spec.ggml_type in Q.act_formats(act) else "f32"
        w = _param(g, name, [n_out, Q.row_bytes(spec.ggml_type, n_in)], "u8")
        return g.dequant_matmul(x, w, quant=spec.ggml_type, act=act)
    # float weights are stored transposed ([n_in, n_out]) by `decoder_params`, the layout matmul takes
    w = _param(g, name, [n_in, n_out], spec.float_dtype)
    return g.matmul(x, w)


def _biased(g: Graph, x: NodeId, specs: Mapping[str, WeightSpec], name: str, width: int) -> NodeId:
    """x + bias when the model has that bias (qwen2's q/k/v projections)."""
    if name not in specs:
        return x
    _spec(specs, name, (width,))
    return g.add_(x, g.param(name, [width]))


def _embedding(g: Graph, tokens: NodeId, specs: Mapping[str, WeightSpec], config: DecoderConfig,
               rows_param: bool = False) -> NodeId:
    """The token embeddings of `tokens`; `rows_param`: a quantized table's gather reads a param of its own
    (`token_embd.weight.rows`, the same tensor), not the one a tied vocabulary projection multiplies."""
    spec = _spec(specs, "token_embd.weight", (config.vocab_size, config.hidden_size))
    if spec.quantized:
        from rlx.ir.quant import row_bytes

        table = _param(g, "token_embd.weight.rows" if rows_param else "token_embd.weight",
                       [config.vocab_size, row_bytes(spec.ggml_type, config.hidden_size)], "u8")
        return g.dequantize(g.gather(table, tokens), quant=spec.ggml_type)
    dtype = spec.float_dtype
    rows = g.gather(g.param("token_embd.weight.rows", [config.vocab_size, config.hidden_size], dtype), tokens)
    return rows if dtype == "f32" else g.cast(rows, "f32")  # only the gathered rows are widened


def _moe_ffn(g: Graph, x: NodeId, specs: Mapping[str, WeightSpec], c: DecoderConfig, layer: int) -> NodeId:
    """Layer `layer`'s sparse MoE block (`moe_block`), its experts in the type their tensors have."""
    assert c.moe is not None
    shapes = moe_shapes(c, layer)
    specs_of = {name: _spec(specs, name, shape) for name, shape in shapes.items()}
    p = moe_prefix(layer)
    router, gate_up, down = (specs_of[f"{p}.{n}"] for n in ("gate.weight", "experts.gate_up_proj", "experts.down_proj"))
    narrow = [n for n, s in specs_of.items() if ".shared_expert" in n and s.ggml_type != "f32"]
    if narrow:
        raise IRError(f"layer {layer}'s shared expert tensors {narrow} must be f32 (the loader keeps them so)")
    if gate_up.ggml_type != down.ggml_type:
        raise IRError(f"layer {layer}'s experts are {gate_up.ggml_type} (gate/up) and {down.ggml_type} (down): "
                      "both must have one type")
    if router.quantized:
        raise IRError(f"layer {layer}'s router {moe_prefix(layer)}.gate.weight must be a float tensor, "
                      f"got {router.ggml_type}")
    kind = gate_up.ggml_type
    moe = dataclasses.replace(c.moe, quant=kind if gate_up.quantized else None,
                              expert_dtype="f32" if gate_up.quantized or kind not in NARROW_TYPES else kind)
    return moe_block(g, x, moe, moe_prefix(layer))


def _head_norm(g: Graph, x: NodeId, name: str, batch: Dim, seq: Dim, heads: int, c: DecoderConfig) -> NodeId:
    """RMSNorm of each head of x `[batch, seq, heads*head_dim]` over its head_dim values (q/k norm)."""
    per_head = g.reshape(x, [batch, seq, heads, c.head_dim])
    normed = g.rms_norm(per_head, g.param(name, [c.head_dim]), eps=c.rms_eps)
    return g.reshape(normed, [batch, seq, heads * c.head_dim])


def _summed(g: Graph, partial: NodeId, tp: int, name: str) -> NodeId:
    """A row-parallel linear's partial product summed over the `tp` ranks (itself when tp is 1)."""
    return partial if tp == 1 else g.add(O.AllReduce(world=tp), [partial], name=name + ".all_reduce")


#: The state of a decoder with token feedback (`build_decoder(token_feedback=True)`): the tokens its steps stored.
FEEDBACK_STATE = "last_tokens"
#: A paged decoder's input hinting that a step's rows are distinct sequences (`ops.CachedAttention`'s 8th input:
#: its length, 1 or 2, is the hint: 2 says they are).
ROWS_DISTINCT = "rows_distinct"


def layer_states(graph: Graph) -> list[Node]:
    """A decoder's state inputs that are its layers' caches (K / V, recurrent states): every state but the token
    feedback's (`FEEDBACK_STATE`, a token a slot, kept apart from them: `KvCache.tokens`)."""
    return [n for n in graph.inputs() if n.op.state and n.op.name != FEEDBACK_STATE]

#: Dtypes a decoder's KV cache may have (`build_decoder(kv_dtype=...)`).
KV_DTYPES = ("f32", "f16", "bf16", "f8e4m3fn")


def build_decoder(config: DecoderConfig, specs: Mapping[str, WeightSpec], *, max_batch: int = 1,
                  max_seq: int = 256, capacity: int = 2048, name: str = "decoder", tp: int = 1,
                  quant_act: str = "f32", narrow_weights: bool = False, kv_dtype: str = "f32",
                  page_size: int | None = None, kv_pages: int = 0,
                  quant_act_formats: Sequence[str] | None = None, embedding_rows_param: bool = False,
                  token_feedback: bool = False) -> Graph:
    """One decoder step over the KV cache (see the module docstring).

    `tp` > 1 builds one rank's share of a tensor-parallel decoder (`rlx.distributed.tp_decoder`
    slices the weights): `specs` then hold that rank's shapes — 1/tp of the heads and FFN columns —
    the attention output and FFN down projections are followed by an `all_reduce`, and a vocabulary
    projection split by rows (`output.weight` of vocab/tp rows) by an `all_gather` of the logits.
    `quant_act` is how matmuls on Q8_0/Q4_0/Q4_1 weights take their activations: "f32", "q8" (int8
    per block of 32, as llama.cpp) or "q16" (int16 per block; see `dequant_matmul`); `quant_act_formats` names
    the weight formats that take it instead (a backend's own: CUDA's int8 activations take Q4_K too).
    `narrow_weights`: F16/BF16 matrices are params of their own dtype, multiplied as stored
    (`matmul(f32, bf16) -> f32`) — for a backend with such GEMMs (the CPU); otherwise f32 params.
    `kv_dtype`: the KV cache states' dtype, "f32", "f16", "bf16" or "f8e4m3fn" (8 bits: half an f16 cache's bytes;
    CUDA runs the narrow ones).
    `page_size` (with `kv_pages`): the paged KV layout — each layer's caches are a pool of `kv_pages`
    pages of `page_size` tokens, and an i32 input `block_table` `[batch, capacity / page_size]` names
    each row's pages (`ops.CachedAttention`); `capacity` must then be a multiple of `page_size`, and an i32
    input `rows_distinct` of 1 or 2 elements (`ROWS_DISTINCT`) is the attentions' hint that a step's rows
    are distinct sequences (2 elements: CUDA stores each row's keys inside the attention kernel).
    `embedding_rows_param`: a quantized embedding table's gather reads its own param (`token_embd.weight.rows`,
    set from the same tensor), so that a tied vocabulary projection's param has no other reader and the CPU may
    store it in its decode GEMV's layout (`InterleavedQuantParam`) while the gather reads the rows as stored.
    `token_feedback`: device-side token feedback (`rlx.ir.ops_feedback`): an i32 state `last_tokens` `[max_batch]`
    (`FEEDBACK_STATE`), an input `token_src` i32 `[batch]` (row b's last token is ``last_tokens[token_src[b]]``
    where it names a slot, else `tokens`' own) and an input `token_dst` i32 `[n_rows]` (output row i's `next_token`
    is stored at ``last_tokens[token_dst[i]]`` where it names a slot): a step can take its tokens from the step
    before without their going through the host. With every src and dst -1 the step computes what it did without.
    """
    if kv_dtype not in KV_DTYPES:
        raise IRError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
    if capacity < 1 or max_seq < 1 or max_batch < 1:
        raise IRError(f"max_batch, max_seq and capacity must be >= 1, got {max_batch}, {max_seq}, {capacity}")
    if page_size is not None and (page_size < 1 or capacity % page_size or kv_pages < 1):
        raise IRError(f"a paged cache needs kv_pages >= 1 and a capacity ({capacity}) that is a multiple of "
                      f"page_size ({page_size}), got kv_pages={kv_pages}")
    if quant_act not in ACT_MODES:
        raise IRError(f"quant_act must be one of {ACT_MODES}, got {quant_act!r}")
    c = config
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or c.num_kv_heads % tp or c.ffn_size % tp:
        raise IRError(f"tp={tp!r} must be a positive int dividing the kv heads ({c.num_kv_heads}) and the FFN "
                      f"size ({c.ffn_size})")
    if c.moe is not None and tp != 1:
        raise IRError(f"a tensor-parallel (tp={tp}) decoder with MoE layers is not supported")
    hd, half = c.head_dim, c.n_rot // 2
    heads, kv_heads, ffn_size = c.num_heads // tp, c.num_kv_heads // tp, c.ffn_size // tp
    q_width, kv_width = heads * hd, kv_heads * hd
    qa, fa = quant_act, quant_act_formats
    specs = specs if narrow_weights else widened(specs)
    g = Graph(name)
    batch, seq = Dim.dynamic("batch", max_batch), Dim.dynamic("seq", max_seq)
    n_rows = Dim.dynamic("n_rows", max_batch * max_seq)
    tokens = g.input("tokens", [batch, seq], "i32")
    positions = g.input("positions", [batch], "i32")
    cos = g.input("rope_cos", [batch, seq, half])
    sin = g.input("rope_sin", [batch, seq, half])
    rows = g.input("rows", [n_rows], "i32")
    # for the sampled_token output: each row's uniform and the run-time settings (per-run inputs come first)
    sample_u = g.input("sample_u", [n_rows], "f64")
    sample_settings = g.input("sample_settings", [len(SAMPLE_SETTINGS)], "f64")
    block_table = g.input("block_table", [batch, capacity // page_size], "i32") if page_size is not None else None
    # the paged steps' hint that their rows are distinct sequences: its length (1 or 2) is the hint
    rows_distinct = g.input(ROWS_DISTINCT, [Dim.dynamic("distinct", 2)], "i32") if page_size is not None else None
    cache_shape = [max_batch, capacity] if page_size is None else [kv_pages, page_size]
    last_tokens = token_dst = None
    if token_feedback:  # the step's tokens may come from the last step's, stored on the device (see above)
        token_src = g.input("token_src", [batch], "i32")
        token_dst = g.input("token_dst", [n_rows], "i32")
        last_tokens = g.state(FEEDBACK_STATE, [max_batch], "i32")
        tokens = g.token_feed(tokens, token_src, last_tokens)
    x = _embedding(g, tokens, specs, c, embedding_rows_param)
    if c.embed_scale != 1.0:
        x = g.mul(x, g.constant(np.float32(c.embed_scale)))
    # RoPE tables: "global" layers read rope_cos/rope_sin, "local" ones (Gemma 3) a second pair
    tables = {"global": (cos, sin)}
    if "local" in c.layer_rope:
        cos_name, sin_name = rope_inputs(c)["local"]
        tables["local"] = (g.input(cos_name, [batch, seq, half]), g.input(sin_name, [batch, seq, half]))
    for layer in range(c.num_layers):
        h = g.rms_norm(x, g.param(layer_tensor(layer, "attn_norm"), [c.hidden_size]), eps=c.rms_eps)
        q = _biased(g, _linear(g, h, specs, layer_tensor(layer, "attn_q"), q_width, c.hidden_size, qa, fa),
                    specs, f"blk.{layer}.attn_q.bias", q_width)
        k = _biased(g, _linear(g, h, specs, layer_tensor(layer, "attn_k"), kv_width, c.hidden_size, qa, fa),
                    specs, f"blk.{layer}.attn_k.bias", kv_width)
        v = _biased(g, _linear(g, h, specs, layer_tensor(layer, "attn_v"), kv_width, c.hidden_size, qa, fa),
                    specs, f"blk.{layer}.attn_v.bias", kv_width)
        if c.qk_norm:
            q = _head_norm(g, q, layer_tensor(layer, "attn_q_norm"), batch, seq, heads, c)
            k = _head_norm(g, k, layer_tensor(layer, "attn_k_norm"), batch, seq, kv_heads, c)
        rope_kind = c.layer_rope_kind(layer)
        if rope_kind != "none":
            rcos, rsin = tables[rope_kind]
            q = g.rope(q, rcos, rsin, head_dim=hd, n_rot=c.n_rot, variant=c.rope_variant)
            k = g.rope(k, rcos, rsin, head_dim=hd, n_rot=c.n_rot, variant=c.rope_variant)
        k_name, v_name = cache_names(layer)
        k_cache = g.state(k_name, [*cache_shape, kv_width], kv_dtype)
        v_cache = g.state(v_name, [*cache_shape, kv_width], kv_dtype)
        # a window at least the cache's capacity never hides a key: plain causal attention then
        window = c.layer_window(layer)
        a = g.cached_attention(q, k, v, k_cache, v_cache, positions, num_heads=heads, head_dim=hd,
                               num_kv_heads=kv_heads, scale=c.attn_scale,
                               window=window if 0 < window < capacity else None, block_table=block_table,
                               page_size=page_size, rows_distinct=rows_distinct)
        out_name = layer_tensor(layer, "attn_output")
        attn = _summed(g, _linear(g, a, specs, out_name, c.hidden_size, q_width, qa, fa), tp, out_name)
        attn = _biased(g, attn, specs, f"blk.{layer}.attn_output.bias", c.hidden_size)
        if c.sandwich_norms:
            attn = g.rms_norm(attn, g.param(layer_tensor(layer, "post_attention_norm"), [c.hidden_size]),
                              eps=c.rms_eps)
        x = g.add_(x, attn)
        h = g.rms_norm(x, g.param(layer_tensor(layer, "ffn_norm"), [c.hidden_size]), eps=c.rms_eps)
        if c.layer_moe(layer):
            x = g.add_(x, _moe_ffn(g, h, specs, c, layer))
            continue
        gate = _biased(g, _linear(g, h, specs, layer_tensor(layer, "ffn_gate"), ffn_size, c.hidden_size, qa, fa),
                       specs, f"blk.{layer}.ffn_gate.bias", ffn_size)
        up = _biased(g, _linear(g, h, specs, layer_tensor(layer, "ffn_up"), ffn_size, c.hidden_size, qa, fa),
                     specs, f"blk.{layer}.ffn_up.bias", ffn_size)
        ffn = g.mul(g.activation(c.ffn_act, gate), up)
        down = layer_tensor(layer, "ffn_down")
        out = _summed(g, _linear(g, ffn, specs, down, c.hidden_size, ffn_size, qa, fa), tp, down)
        out = _biased(g, out, specs, f"blk.{layer}.ffn_down.bias", c.hidden_size)
        if c.sandwich_norms:
            out = g.rms_norm(out, g.param(layer_tensor(layer, "post_ffw_norm"), [c.hidden_size]), eps=c.rms_eps)
        x = g.add_(x, out)
    # logits only for the requested rows: the vocabulary projection is the largest matmul
    flat = g.reshape(x, [batch * seq, c.hidden_size])
    picked = g.gather(flat, rows)
    h = g.rms_norm(picked, g.param("output_norm.weight", [c.hidden_size]), eps=c.rms_eps)
    out_name = output_weight_name(c, specs)
    vocab = c.vocab_size if tp == 1 or out_name != "output.weight" else specs[out_name].shape[0]
    if vocab not in (c.vocab_size, c.vocab_size // tp) or vocab * tp < c.vocab_size:
        raise IRError(f"output.weight has {vocab} rows: the vocabulary {c.vocab_size}, or its 1/{tp} share")
    logits = _linear(g, h, specs, out_name, vocab, c.hidden_size, qa, fa)
    if vocab != c.vocab_size:  # this rank's rows of the vocabulary, in rank order
        logits = g.add(O.AllGather(world=tp, axis=1), [logits], name="output.all_gather")
    if c.final_softcap is not None:  # cap * tanh(logits / cap)
        cap = g.constant(np.float32(c.final_softcap))
        logits = g.mul(g.activation("tanh", g.div(logits, cap)), cap)
    # the greedy next token of each row, so a decode step on a GPU reads back 4 bytes a row, not the logits
    next_token = g.argmax(logits, axis=-1)
    if last_tokens is not None:  # stored where token_dst says, for the next step's token_feed
        next_token = g.token_store(next_token, token_dst, last_tokens)
    # and a sampled one (top_k <= SAMPLE_TOP_K_MAX), for each row's uniform u and the run-time settings
    sampled = g.sample_top_k(logits, sample_u, sample_settings)
    g.set_outputs({"logits": logits, "next_token": next_token, "sampled_token": sampled})
    return g


def decoder_params(specs_and_data: Mapping[str, tuple[WeightSpec, np.ndarray]], graph: Graph) -> dict[str, np.ndarray]:
    """The `set_param` values of `graph` from GGUF tensors: raw blocks as-is, float weights in the
    dtype the graph declares (f16/bf16 as stored when it keeps them narrow, else widened to f32).

    Float matrices are transposed to the `[in, out]` layout the graph's matmuls take; an
    embedding table feeds its own param (`token_embd.weight.rows`).
    """
    return dict(iter_decoder_params(specs_and_data, graph))


def iter_decoder_params(specs_and_data: Mapping[str, tuple[WeightSpec, np.ndarray]],
                        graph: Graph, *, narrow: bool = False) -> Iterator[tuple[str, np.ndarray]]:
    """`decoder_params` one param at a time: a caller that copies each into a compiled model holds one
    converted tensor at a time, not a second copy of the whole model.

    `narrow`: an F16/BF16 matrix whose param is declared f32 comes in its own type (float16, ml_dtypes
    bfloat16; transposed, never widened): `CompiledGraph.set_param` widens such values exactly, or stores
    them as they are where the session keeps f32 params in that type (a CUDA build of precision bf16 with
    bf16 weights) — the same bits as from their f32 values, without the f32 copy and its rounding pass
    (an 8B bf16 checkpoint's load on CUDA spent most of its time there).
    """
    for node in graph.params():
        yield node.op.name, _converted(specs_and_data, node.op.name, node.shape.dtype.value, narrow)


def decoder_param(specs_and_data: Mapping[str, tuple[WeightSpec, np.ndarray]], graph: Graph, name: str, *,
                  narrow: bool = False) -> np.ndarray:
    """The one `set_param` value of `graph`'s param `name` (as `iter_decoder_params` gives it): a compiled model
    can keep this recipe instead of the converted array (`CompiledGraph.set_param(source=...)`)."""
    node = next((n for n in graph.params() if n.op.name == name), None)
    if node is None:
        raise IRError(f"the graph has no param {name!r}")
    return _converted(specs_and_data, name, node.shape.dtype.value, narrow)


def _converted(specs_and_data: Mapping[str, tuple[WeightSpec, np.ndarray]], name: str, want: str,
               narrow: bool = False) -> np.ndarray:
    source = name[: -len(".rows")] if name.endswith(".rows") else name
    if source not in specs_and_data:
        raise IRError(f"the model has no tensor {source!r}")
    spec, data = specs_and_data[source]
    if spec.quantized:
        return np.ascontiguousarray(data, dtype=np.uint8)
    if want != "f32" and want != spec.ggml_type:
        raise IRError(f"param {name!r} is {want} but the tensor is {spec.ggml_type}")
    widen = want == "f32" and not (narrow and spec.ggml_type in NARROW_TYPES)

    def convert(rows: np.ndarray) -> np.ndarray:
        return _as_f32(rows, spec.ggml_type) if widen else _as_stored(rows, spec.ggml_type)

    # dense matrices go in as [in, out]; MoE params keep transformers' layout (moe_block folds the transposes)
    if np.ndim(data) == 2 and not name.endswith(".rows") and f".{MOE_ROLE}." not in name:
        return converted_transpose(data, convert)
    return np.ascontiguousarray(convert(data))


def _as_f32(data: np.ndarray, ggml_type: str) -> np.ndarray:
    if ggml_type == "bf16":
        return (np.asarray(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(data, dtype=np.float32)


def _as_stored(data: np.ndarray, ggml_type: str) -> np.ndarray:
    """An f16/bf16 tensor as the numpy dtype `set_param` takes for it, bit for bit (no copy)."""
    if ggml_type == "bf16":  # GGUF's bf16 arrives as uint16 bit patterns
        return bits_to_bfloat16(np.asarray(data, dtype=np.uint16))
    return np.asarray(data, dtype=np.float16)


def rope_inputs(config: DecoderConfig) -> dict[str, tuple[str, str]]:
    """The graph's RoPE table inputs (cos, sin) per scheme: {"global": ("rope_cos", "rope_sin"), ...}."""
    out = {"global": ("rope_cos", "rope_sin")}
    if "local" in config.layer_rope:
        out["local"] = ("rope_cos_local", "rope_sin_local")
    return out


def rope_tables(positions: np.ndarray, seq: int, config: DecoderConfig,
                which: str = "global") -> tuple[np.ndarray, np.ndarray]:
    """cos and sin `[batch, seq, n_rot/2]` for tokens at `positions[b] + s`: the config's `rope` (or
    `rope_local` for `which="local"`) scheme where given, else GGUF's frequencies (`rope_base`, `rope_scale`)."""
    spec = config.rope_local if which == "local" else config.rope
    if spec is not None:
        from rlx.models.rope import tables

        pos = np.asarray(positions, dtype=np.float64)[:, None] + np.arange(seq, dtype=np.float64)[None, :]
        return tables(spec, config.n_rot, pos)
    half = config.n_rot // 2
    inv_freq = config.rope_base ** (-np.arange(half, dtype=np.float64) * 2.0 / config.n_rot)
    pos = np.asarray(positions, dtype=np.float64)[:, None] + np.arange(seq, dtype=np.float64)[None, :]
    pos = pos / config.rope_scale  # linear position scaling
    angles = pos[:, :, None] * inv_freq[None, None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def random_specs(config: DecoderConfig, ggml_type: str = "f32") -> dict[str, WeightSpec]:
    """Weight specs of a model with `config` (every matrix of type `ggml_type`): for tests and examples."""
    c = config
    q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    specs = {"token_embd.weight": WeightSpec(ggml_type, (c.vocab_size, c.hidden_size)),
             "output_norm.weight": WeightSpec("f32", (c.hidden_size,))}
    if not c.tie_embeddings:
        specs["output.weight"] = WeightSpec(ggml_type, (c.vocab_size, c.hidden_size))
    for layer in range(c.num_layers):
        for role, shape in (("attn_norm", (c.hidden_size,)), ("ffn_norm", (c.hidden_size,)),
                            ("attn_q", (q_width, c.hidden_size)), ("attn_k", (kv_width, c.hidden_size)),
                            ("attn_v", (kv_width, c.hidden_size)), ("attn_output", (c.hidden_size, q_width)),
                            ("ffn_gate", (c.ffn_size, c.hidden_size)), ("ffn_up", (c.ffn_size, c.hidden_size)),
                            ("ffn_down", (c.hidden_size, c.ffn_size))):
            specs[layer_tensor(layer, role)] = WeightSpec("f32" if len(shape) == 1 else ggml_type, shape)
        if c.layer_moe(layer):  # the MoE block replaces the dense FFN (f32 router, experts of ggml_type)
            for role in ("ffn_gate", "ffn_up", "ffn_down"):
                del specs[layer_tensor(layer, role)]
            specs |= {name: WeightSpec("f32" if name.endswith("gate.weight") or ".shared_expert" in name else ggml_type,
                                       shape)
                      for name, shape in moe_shapes(c, layer).items()}
    return specs

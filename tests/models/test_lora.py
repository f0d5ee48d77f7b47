"""LoRA adapters on CausalLM (`rlx.models.lora`, `lora_matmul`): PEFT adapter directories loaded into slots
of one compiled graph; logits against an independent numpy LLaMA on merged weights (W + s B A); mixed
batches equal each row alone; unload; bad adapters refused with nothing half-loaded; the op itself on
the CPU against the reference."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import rlx
from rlx.errors import ExecutionError, RlxError
from rlx.ir import quant as Q
from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import layer_tensor, random_specs
from rlx.models.lora import MODULE_ROLES, with_lora

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_numpy import llama_logits

CONFIG = DecoderConfig(arch="llama", vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=16, ffn_size=96, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=16, context_length=128, tie_embeddings=True, bos_id=-1, eos_id=-1)
ROLE_MODULE = {role: module for module, role in MODULE_ROLES.items()}
SHAPES = {"attn_q": (64, 64), "attn_k": (32, 64), "attn_v": (32, 64), "attn_output": (64, 64),
          "ffn_gate": (96, 64), "ffn_up": (96, 64), "ffn_down": (64, 96)}  # (out, in)


def write_adapter(path: Path, seed: int, rank: int = 4, alpha: float = 8.0,
                  modules: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "down_proj"),
                  rslora: bool = False, layers: int = 2, shapes: dict | None = None) -> dict:
    """A PEFT-layout adapter directory with random A and B; returns {(layer, role): (A, B)} and the scaling."""
    rng = np.random.default_rng(seed)
    shapes = shapes or SHAPES
    tensors, pairs = {}, {}
    for layer in range(layers):
        for module in modules:
            role = MODULE_ROLES[module]
            out, inp = shapes[role]
            a = (rng.standard_normal((rank, inp)) / np.sqrt(inp)).astype(np.float32)
            b = (rng.standard_normal((out, rank)) * 0.5).astype(np.float32)
            block = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"] = a, b
            pairs[(layer, role)] = (a, b)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": rslora, "lora_dropout": 0.1,
        "target_modules": list(modules), "bias": "none"}))
    return {"pairs": pairs, "scaling": alpha / (np.sqrt(rank) if rslora else rank)}


def _dense(tensors: dict) -> dict[str, np.ndarray]:
    """The model's weights as f32 `[out, in]` matrices (quantized ones dequantized)."""
    out = {}
    for name, (spec, data) in tensors.items():
        out[name] = Q.dequantize(data, spec.ggml_type, spec.shape[1]) if spec.quantized else data
    return out


def _merged(dense: dict, adapter: dict) -> dict[str, np.ndarray]:
    merged = dict(dense)
    for (layer, role), (a, b) in adapter["pairs"].items():
        name = layer_tensor(layer, role)
        merged[name] = dense[name] + adapter["scaling"] * (b.astype(np.float64) @ a)
    return merged


@pytest.fixture(scope="module")
def tensors() -> dict:
    return random_tensors(random_specs(CONFIG, "q8_0"), seed=3, scale=2.0)


@pytest.fixture(scope="module")
def lm(tensors: dict) -> CausalLM:
    # f32 activations, as the merged-weights reference multiplies them (a CPU with AVX-512 VNNI defaults to int16
    # ones for the quantized base, `default_quant_act`: an error of its own, ~3e-4 x max|logit| here)
    return CausalLM(CONFIG, tensors, device="cpu", max_context=64, max_batch=4, prefill_chunk=32, max_adapters=3,
                    max_lora_rank=8, quant_act="f32")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("adapters")
    return {"one": (root / "one", write_adapter(root / "one", seed=1)),
            "two": (root / "two", write_adapter(root / "two", seed=2, rank=8, alpha=4.0, rslora=True,
                                                modules=tuple(MODULE_ROLES))),
            "three": (root / "three", write_adapter(root / "three", seed=3, rank=2, modules=("k_proj", "up_proj")))}


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_logits_with_an_adapter_equal_the_merged_weights(lm: CausalLM, tensors: dict, adapters: dict) -> None:
    ids = [int(t) for t in np.random.default_rng(0).integers(0, CONFIG.vocab_size, 23)]
    dense = _dense(tensors)
    for name, (path, adapter) in adapters.items():
        lm.load_adapter(path, name)
        got = lm.logits(ids, adapter=name)
        want = llama_logits(CONFIG, _merged(dense, adapter), ids)
        assert _cosine(got, want).min() > 0.99999
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    base = lm.logits(ids)
    assert np.abs(base - llama_logits(CONFIG, dense, ids)).max() <= 1e-4 * np.abs(base).max()
    assert np.abs(lm.logits(ids, adapter="one") - base).max() > 1e-2  # the adapter changes something
    for name in adapters:
        lm.unload_adapter(name)
    assert lm.adapters == []
    np.testing.assert_array_equal(lm.logits(ids), base)


def test_a_batch_mixing_adapters_equals_each_row_alone(lm: CausalLM, adapters: dict) -> None:
    for name, (path, _) in adapters.items():
        lm.load_adapter(path, name)
    try:
        rng = np.random.default_rng(5)
        prompts = [[int(t) for t in rng.integers(0, CONFIG.vocab_size, n)] for n in (5, 9, 3, 7)]
        names = ["one", None, "two", "three"]
        batch = lm.generate_batch(prompts, 16, adapter=names)
        for prompt, name, got in zip(prompts, names, batch):
            assert got.token_ids == lm.generate(prompt, 16, adapter=name).token_ids
        assert len({tuple(g.token_ids) for g in lm.generate_batch([prompts[0]] * 4, 12,
                                                                    adapter=["one", "two", "three", None])}) > 1
    finally:
        for name in adapters:
            lm.unload_adapter(name)


def test_bad_adapters_are_refused_and_nothing_is_half_loaded(lm: CausalLM, tmp_path: Path) -> None:
    ids = [3, 4, 5, 6]
    base = lm.logits(ids)
    write_adapter(tmp_path / "big", seed=4, rank=16)
    with pytest.raises(RlxError, match="rank r=16 exceeds the model's max_lora_rank 8"):
        lm.load_adapter(tmp_path / "big", "big")
    wide = dict(SHAPES, attn_q=(64, 80))
    write_adapter(tmp_path / "wide", seed=4, modules=("v_proj", "q_proj"), shapes=wide)
    with pytest.raises(RlxError, match="do not fit the base projection"):
        lm.load_adapter(tmp_path / "wide", "wide")
    write_adapter(tmp_path / "deep", seed=4, layers=3)
    with pytest.raises(RlxError, match=r"layer 2 \w+ has LoRA weights, but the model has no such projection"):
        lm.load_adapter(tmp_path / "deep", "deep")
    bad = tmp_path / "embed"
    write_adapter(bad, seed=4)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["q_proj", "embed_tokens"]}))
    with pytest.raises(RlxError, match=r"target module\(s\) \['embed_tokens'\] are not supported"):
        lm.load_adapter(bad, "embed")
    with pytest.raises(RlxError, match=r"adapter_config\.json is missing"):
        lm.load_adapter(tmp_path, "nothing")
    assert lm.adapters == []
    np.testing.assert_array_equal(lm.logits(ids), base)  # nothing of the refused adapters was written
    write_adapter(tmp_path / "ok", seed=6)
    lm.load_adapter(tmp_path / "ok", "ok")
    try:
        with pytest.raises(RlxError, match="already loaded"):
            lm.load_adapter(tmp_path / "ok", "ok")
        for extra in ("x1", "x2"):
            lm.load_adapter(tmp_path / "ok", extra)
        with pytest.raises(RlxError, match="all 3 adapter slots are in use"):
            lm.load_adapter(tmp_path / "ok", "x3")
        with pytest.raises(RlxError, match="no adapter named 'missing'"):
            lm.generate(ids, 2, adapter="missing")
    finally:
        for name in list(lm.adapters):
            lm.unload_adapter(name)


def test_a_model_without_slots_refuses_adapters(tensors: dict, tmp_path: Path) -> None:
    plain = CausalLM(CONFIG, tensors, device="reference", max_context=32)
    with pytest.raises(RlxError, match="max_adapters > 0"):
        plain.load_adapter(tmp_path, "x")
    with pytest.raises(RlxError, match="max_adapters > 0"):
        plain.generate([1, 2], 2, adapter="x")


def _converter_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter reorder of q/k rows (Hugging Face's rotate-half pairs -> adjacent pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_a_gguf_llama_takes_a_peft_adapter_written_for_the_hugging_face_layout(tmp_path: Path) -> None:
    """The same weights as a Hugging Face LLaMA (neox RoPE) and as its GGUF conversion (q/k rows reordered,
    interleaved RoPE) give the same logits; with one PEFT adapter on q and k too, once the GGUF model
    reorders the adapter's q/k B rows (`gguf_qk_rows`, which `from_gguf` sets) — and not without."""
    hf_config = dataclasses.replace(CONFIG, rope_variant="neox")
    hf_tensors = random_tensors(random_specs(hf_config), seed=7)
    gguf_tensors = dict(hf_tensors)
    for layer in range(CONFIG.num_layers):
        for role, heads in (("attn_q", CONFIG.num_heads), ("attn_k", CONFIG.num_kv_heads)):
            name = layer_tensor(layer, role)
            spec, w = hf_tensors[name]
            gguf_tensors[name] = (spec, np.ascontiguousarray(_converter_rows(w, heads)))
    write_adapter(tmp_path, seed=4, modules=("q_proj", "k_proj", "v_proj"))
    hf = CausalLM(hf_config, hf_tensors, device="reference", max_context=32, max_adapters=1, max_lora_rank=4)
    gguf = CausalLM(CONFIG, gguf_tensors, device="reference", max_context=32, max_adapters=1, max_lora_rank=4)
    ids = [3, 17, 42, 5, 88, 1, 60]
    base = hf.logits(ids)
    np.testing.assert_allclose(gguf.logits(ids), base, rtol=0, atol=1e-4 * np.abs(base).max())
    hf.load_adapter(tmp_path, "a")
    want = hf.logits(ids, adapter="a")
    assert np.abs(want - base).max() > 1e-2 * np.abs(base).max()
    gguf.load_adapter(tmp_path, "a")  # as written: the q/k rows in the wrong order
    assert np.abs(gguf.logits(ids, adapter="a") - want).max() > 1e-2 * np.abs(want).max()
    gguf.unload_adapter("a")
    gguf.gguf_qk_rows = True
    gguf.load_adapter(tmp_path, "a")
    np.testing.assert_allclose(gguf.logits(ids, adapter="a"), want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_lora_matmul_on_the_cpu_equals_the_reference() -> None:
    g = rlx.Graph("lora")
    groups = rlx.Dim.dynamic("g", 5)
    x, index = g.input("x", [groups, 3, 70]), g.input("i", [groups], "i32")
    a, b, s = g.param("a", [3, 5, 70]), g.param("b", [3, 33, 5]), g.param("s", [3])
    g.set_outputs([g.lora_matmul(x, a, b, s, index)])
    rng = np.random.default_rng(0)
    params = {"a": rng.standard_normal((3, 5, 70)).astype(np.float32),
              "b": rng.standard_normal((3, 33, 5)).astype(np.float32), "s": np.array([0.5, 2.0, 1.0], np.float32)}
    compiled = rlx.Session("cpu").compile(g)
    for name, value in params.items():
        compiled.set_param(name, value)
    for idx in ([2, -1, 0, 1, 1], [0], [-1, -1]):
        feed = {"x": rng.standard_normal((len(idx), 3, 70)).astype(np.float32), "i": np.array(idx, np.int32)}
        want = rlx.reference.run(g, feed, params)[0]
        got = compiled.run(**feed)[0]
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
        assert not got[np.array(idx) < 0].any()
    with pytest.raises(ExecutionError, match="asks for adapter slot 3; there are 3"):
        compiled.run(x=np.zeros((1, 3, 70), np.float32), i=np.array([3], np.int32))


def test_with_lora_names_its_targets() -> None:
    g = rlx.Graph("none")
    g.set_outputs([g.matmul(g.input("x", [2, 4]), g.param("w", [4, 4]))])
    with pytest.raises(rlx.errors.IRError, match="no projection"):
        with_lora(g, slots=1, rank=2)
    with pytest.raises(rlx.errors.IRError, match="unknown LoRA target role"):
        with_lora(g, slots=1, rank=2, roles=("attn_qkv",))

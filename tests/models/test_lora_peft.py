"""LoRA adapters made by PEFT for a random tiny Hugging Face LLaMA: RLX logits with each adapter equal
transformers + PEFT's, and a batch mixing two adapters and none equals each row run alone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("peft")
pytest.importorskip("transformers")

from rlx.models.causal_lm import CausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_checkpoints import hf_logits, prompt, random_model, save_checkpoint

ADAPTERS = {
    "code": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]),
    "chat": dict(r=8, lora_alpha=4, use_rslora=True, target_modules=["k_proj", "gate_proj", "up_proj"]),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    import torch
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("peft")
    base = random_model("llama", seed=4)
    save_checkpoint(base, root / "base")
    torch.manual_seed(5)
    peft_model = None
    for name, kw in ADAPTERS.items():
        # init_lora_weights=False: B random too (PEFT's default B = 0 would make the adapter a no-op)
        config = LoraConfig(init_lora_weights=False, lora_dropout=0.0, **kw)
        if peft_model is None:
            peft_model = get_peft_model(base, config, adapter_name=name)
        else:
            peft_model.add_adapter(name, config)
        with torch.no_grad():  # B of the size of A's products: the adapters change the logits visibly
            for n, p in peft_model.named_parameters():
                if f"lora_B.{name}" in n:
                    p.normal_(0.0, 0.3)
    peft_model.eval()
    for name in ADAPTERS:
        peft_model.save_pretrained(str(root / "saved"), selected_adapters=[name])
    lm = CausalLM.from_pretrained(root / "base", max_batch=3, max_adapters=2, max_lora_rank=8)
    for name in ADAPTERS:
        # save_pretrained writes every adapter but the default one into a subdirectory of its name
        path = root / "saved" / name if (root / "saved" / name).is_dir() else root / "saved"
        lm.load_adapter(path, name)
    return peft_model, lm


def test_logits_equal_transformers_with_peft(models: tuple) -> None:
    peft_model, lm = models
    ids = prompt(21, seed=1)
    for name in ADAPTERS:
        peft_model.set_adapter(name)
        want = hf_logits(peft_model, ids)
        got = lm.logits(ids, adapter=name)
        cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        assert cos.min() >= 0.99999
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    with peft_model.disable_adapter():
        base = hf_logits(peft_model, ids)
    assert np.abs(lm.logits(ids) - base).max() <= 1e-4 * np.abs(base).max()
    assert np.abs(lm.logits(ids, adapter="code") - base).max() > 1e-2 * np.abs(base).max()


def test_a_mixed_batch_equals_each_row_alone(models: tuple) -> None:
    _, lm = models
    prompts = [prompt(n, seed=n) for n in (6, 11, 3)]
    names = ["code", None, "chat"]
    batch = lm.generate_batch(prompts, 12, adapter=names)
    for p, name, got in zip(prompts, names, batch):
        assert got.token_ids == lm.generate(p, 12, adapter=name).token_ids

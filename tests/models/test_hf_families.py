"""Every Hugging Face family `CausalLM.from_pretrained` loads (dense and sparse MoE), against transformers
on random checkpoints.

One compiled CPU model per family (module-scoped): f32 logits of a 1-token and a 40-token prompt,
24 greedy tokens through the KV cache, and `generate_batch` of two prompts of different lengths.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlx.models.causal_lm import CausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_checkpoints import FAMILY_CONFIGS, cosine, hf_greedy, hf_logits, prompt, random_model, save_checkpoint

FAMILIES = sorted(FAMILY_CONFIGS)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    model = random_model(request.param)
    directory = save_checkpoint(model, tmp_path_factory.mktemp(request.param))
    lm = CausalLM.from_pretrained(directory, context_length=72, max_batch=2, prefill_chunk=48)
    return request.param, model, lm


@pytest.mark.parametrize("length", [1, 40])
def test_logits_equal_transformers(family, length):
    name, model, lm = family
    ids = prompt(length, seed=length)
    ours, theirs = lm.logits(ids), hf_logits(model, ids)
    err = float(np.abs(ours - theirs).max())
    assert cosine(ours, theirs) >= 0.99999, name
    assert err <= 1e-4 * float(np.abs(theirs).max()), (name, err)


def test_greedy_equals_transformers_generate(family):
    name, model, lm = family
    ids = prompt(12, seed=3)
    expected = hf_greedy(model, ids, 24)
    assert len(expected) >= 8, "the random model stopped too early to compare"
    assert lm.generate(ids, max_new_tokens=24).token_ids == expected, name


def test_generate_batch_equals_each_alone(family):
    name, _, lm = family
    short, long = prompt(5, seed=5), prompt(17, seed=6)
    together = lm.generate_batch([short, long], max_new_tokens=10)
    assert [g.token_ids for g in together] == [lm.generate(short, max_new_tokens=10).token_ids,
                                               lm.generate(long, max_new_tokens=10).token_ids], name


def test_family_features_were_read(family):
    """The features each family's checkpoint turns on reach the decoder config (not silently defaulted)."""
    name, _, lm = family
    c = lm.config
    features = {
        "llama": c.rope.kind == "llama3",
        "qwen2": c.qkv_bias,
        "qwen3": c.qk_norm,
        "mistral": c.sliding_window == 24 and c.layer_window(1) == 24,
        "phi3": "blk.0.attn_q.weight" in lm.tensors,
        "smollm3": c.layer_rope == ("global", "none"),
        "gemma3_text": (c.layer_rope == ("local", "global") and (c.layer_window(0), c.layer_window(1)) == (24, 0)
                        and c.sandwich_norms and c.final_softcap == 30.0
                        and c.rope_local.base != c.rope.base and c.embed_scale == 8.0),
        "mixtral": (c.moe is not None and c.moe.num_experts == 8 and c.moe.top_k == 2 and c.moe.normalize
                    and c.layer_moe(0) and c.layer_moe(1) and "blk.0.ffn_gate.weight" not in lm.tensors),
        "qwen3_moe": (c.moe is not None and c.moe.num_experts == 4 and not c.moe.normalize and c.qk_norm
                      and (c.layer_moe(0), c.layer_moe(1)) == (True, False)
                      and "blk.1.ffn_gate.weight" in lm.tensors and "blk.0.ffn_moe.experts.down_proj" in lm.tensors),
    }
    assert features[name], c

"""LoRA adapters on a GPU: a CUDA CausalLM with adapter slots gives the CPU's logits and tokens for a batch
mixing adapters and the base model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.models.causal_lm import CausalLM, random_tensors
from rlx.models.llama import random_specs
from rlx.toolchain.cuda import visible_gpu_arch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_lora import CONFIG, write_adapter

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]


@pytest.mark.parametrize("weights", ["q8_0", "f32"])
def test_cuda_adapters_match_the_cpu(weights: str, tmp_path: Path) -> None:
    tensors = random_tensors(random_specs(CONFIG, weights), seed=3, scale=2.0)
    models = {d: CausalLM(CONFIG, tensors, device=d, max_context=64, max_batch=3, prefill_chunk=32, max_adapters=2,
                          max_lora_rank=8) for d in ("cuda", "cpu")}
    write_adapter(tmp_path / "a", seed=1)
    write_adapter(tmp_path / "b", seed=2, rank=8, modules=("k_proj", "gate_proj", "up_proj"))
    for lm in models.values():
        lm.load_adapter(tmp_path / "a", "a")
        lm.load_adapter(tmp_path / "b", "b")
    ids = [int(t) for t in np.random.default_rng(0).integers(0, CONFIG.vocab_size, 21)]
    for name in ("a", "b", None):
        got, want = models["cuda"].logits(ids, adapter=name), models["cpu"].logits(ids, adapter=name)
        cos = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() > 0.9999
    prompts = [[5, 17, 33, 8], list(range(10, 31)), [7, 7, 9]]
    names = ["a", None, "b"]
    assert [g.token_ids for g in models["cuda"].generate_batch(prompts, 12, adapter=names)] == \
        [g.token_ids for g in models["cpu"].generate_batch(prompts, 12, adapter=names)]

"""MoE decoders from Hugging Face checkpoints on a GPU: a tiny random Mixtral and Qwen3-MoE (transformers'
`from_config` + `save_pretrained`) loaded with `from_pretrained(device="cuda")` give the CPU's logits and greedy
tokens (f32; and Mixtral with Q8_0 experts)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.models.causal_lm import CausalLM
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from hf_checkpoints import cosine, prompt, random_model, save_checkpoint  # noqa: E402


@pytest.mark.parametrize(("family", "quantize"), [("mixtral", None), ("qwen3_moe", None), ("mixtral", "q8_0")])
def test_moe_checkpoint_on_cuda_matches_cpu(family: str, quantize: str | None, tmp_path: Path) -> None:
    directory = save_checkpoint(random_model(family, seed=4), tmp_path / family)
    # f32 activations on both (the CPU's and CUDA's default activation quantization for Q8_0 matmuls differ)
    kw = dict(quantize=quantize, context_length=72, max_batch=2, prefill_chunk=48, quant_act="f32")
    gpu = CausalLM.from_pretrained(directory, device="cuda", **kw)
    cpu = CausalLM.from_pretrained(directory, device="cpu", **kw)
    for length in (1, 40):  # a decode-sized step (one GEMV per chosen expert) and a grouped prefill
        ids = prompt(length, seed=length)
        got, want = gpu.logits(ids), cpu.logits(ids)
        assert cosine(got, want) >= 0.99999, (family, quantize, length)
        assert float(np.abs(got - want).max()) <= 1e-4 * float(np.abs(want).max()), (family, quantize, length)
    prompts = [prompt(5, seed=5), prompt(17, seed=6)]
    assert [g.token_ids for g in gpu.generate_batch(prompts, 16)] == \
        [g.token_ids for g in cpu.generate_batch(prompts, 16)]

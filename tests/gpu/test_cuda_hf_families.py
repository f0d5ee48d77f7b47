"""The dense Hugging Face families on a GPU: each tiny random checkpoint of tests/models/test_hf_families.py
(llama with llama3 RoPE scaling, mistral's sliding window, qwen2's biases, qwen3's q/k norms, gemma3's
sliding/global layers with soft-capping, phi3's fused projections, smollm3's NoPE layer) and the two MoE ones,
loaded with `from_pretrained(device="cuda")`: f32 logits equal the CPU's (a 1-token and a 40-token prompt), 24
greedy tokens equal the CPU's, and f16 greedy decoding runs with every step's logits pointing where the f32 CPU
model's do (cosine >= 0.999) on the f16 model's own tokens.

One test per family (three compiles each: CPU, CUDA f32, CUDA f16), so `pytest -n` spreads the families."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.models.causal_lm import CausalLM
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from hf_checkpoints import FAMILY_CONFIGS, cosine, prompt, save_checkpoint  # noqa: E402

from tests.gpu.decoder_common import assert_f16_greedy_tracks_f32  # noqa: E402

LOAD = dict(context_length=72, max_batch=2, prefill_chunk=48)


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_family_on_cuda_matches_the_cpu(family: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_checkpoints import random_model

    directory = save_checkpoint(random_model(family), tmp_path / family)
    cpu = CausalLM.from_pretrained(directory, device="cpu", **LOAD)
    gpu = CausalLM.from_pretrained(directory, device="cuda", **LOAD)
    half = CausalLM.from_pretrained(directory, device="cuda", precision="f16", **LOAD)
    for length in (1, 40):
        ids = prompt(length, seed=length)
        got, want = gpu.logits(ids), cpu.logits(ids)
        assert cosine(got, want) >= 0.99999, (family, length)
        assert float(np.abs(got - want).max()) <= 1e-4 * float(np.abs(want).max()), (family, length)
    ids = prompt(12, seed=3)
    want_tokens = cpu.generate(ids, max_new_tokens=24).token_ids
    assert len(want_tokens) >= 8, "the random model stopped too early to compare"
    assert gpu.generate(ids, max_new_tokens=24).token_ids == want_tokens, family
    assert_f16_greedy_tracks_f32(half, cpu, ids, family)


@pytest.mark.parametrize("family", ["gemma3_text", "llama"])
def test_f16_one_row_steps_on_the_dense_gemv(family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RLX_DENSE_GEMV=1 (rlx_dgemv in one-row steps): f16 greedy decoding tracks the f32 CPU model. gemma3_text's
    pre-FFN norm is read by the up projection's dense GEMV and by the gate's fused GEMM; its one-row steps once read
    that norm's output of the prompt's step (cosine 0.69, then NaN), the norm left to the small GEMM's prologue."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_checkpoints import random_model

    directory = save_checkpoint(random_model(family), tmp_path / family)
    cpu = CausalLM.from_pretrained(directory, device="cpu", **LOAD)
    monkeypatch.setenv("RLX_DENSE_GEMV", "1")
    half = CausalLM.from_pretrained(directory, device="cuda", precision="f16", **LOAD)
    assert_f16_greedy_tracks_f32(half, cpu, prompt(12, seed=3), f"{family} (dense GEMV)")

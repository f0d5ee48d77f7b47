"""Recurrent decoders from Hugging Face checkpoints on a GPU: a tiny random Mamba-2 (conv + selective scan states)
and Qwen3-Next (gated DeltaNet layer with its conv state, beside a gated attention layer with K/V rows), saved with
transformers' `save_pretrained` (tests/models/recurrent_checkpoints.py) and loaded with
`from_pretrained(device="cuda")`: f32 logits equal the CPU's (a 70-token prompt runs a 64-token prefill chunk,
where the selective scan takes its chunked path, then a second chunk carrying the states), 24 greedy tokens equal
the CPU's, a ragged `generate_batch` equals each prompt alone, a cache reset zeroes the states held on the
device, and f16 greedy decoding stays close to f32 (every step's logits, on the f16 model's own tokens).

Two compiled CUDA models per family (f32, f16) and one CPU model, module-scoped."""

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
from hf_checkpoints import cosine, prompt, save_checkpoint  # noqa: E402
from recurrent_checkpoints import random_model  # noqa: E402

from tests.gpu.decoder_common import assert_f16_greedy_tracks_f32  # noqa: E402

FAMILIES = ("mamba2", "qwen3_next")
#: 96 positions, prefill in chunks of 64 (a 70-token prompt: 64 + 6), two cache slots.
LOAD = dict(context_length=96, max_batch=2, prefill_chunk=64)


@pytest.fixture(scope="module", params=FAMILIES)
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CausalLM]:
    family = request.param
    directory = save_checkpoint(random_model(family, seed=2), tmp_path_factory.mktemp(family))
    return {"family": family,  # type: ignore[dict-item]
            "cpu": CausalLM.from_pretrained(directory, device="cpu", **LOAD),
            "cuda": CausalLM.from_pretrained(directory, device="cuda", **LOAD),
            "cuda_f16": CausalLM.from_pretrained(directory, device="cuda", precision="f16", **LOAD)}


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert cosine(got, want) >= 0.99999, what
    assert float(np.abs(got - want).max()) <= 1e-4 * float(np.abs(want).max()), what


def test_f32_logits_equal_the_cpu(models: dict) -> None:
    gpu, cpu = models["cuda"], models["cpu"]
    for length in (1, 70):
        ids = prompt(length, seed=length)
        _close(gpu.logits(ids), cpu.logits(ids), f"{models['family']} prompt of {length}")


def test_greedy_tokens_and_decode_steps_equal_the_cpu(models: dict) -> None:
    """24 greedy tokens equal the CPU's, and every decode step's logits (one token through the device-resident
    conv, scan / delta-rule and K/V states) equal the CPU's for that step."""
    gpu, cpu = models["cuda"], models["cpu"]
    ids = prompt(12, seed=3)
    want = cpu.generate(ids, max_new_tokens=24).token_ids
    assert len(want) >= 8, "the random model stopped too early to compare"
    assert gpu.generate(ids, max_new_tokens=24).token_ids == want
    gcache, ccache = gpu.new_cache(), cpu.new_cache()
    got, exp = gpu.step(np.array([ids]), gcache, [len(ids) - 1]), cpu.step(np.array([ids]), ccache, [len(ids) - 1])
    for step, token in enumerate(want):
        _close(got, exp, f"{models['family']} decode step {step}")
        got, exp = gpu.step(np.array([[token]]), gcache, [0]), cpu.step(np.array([[token]]), ccache, [0])


def test_generate_batch_equals_each_alone(models: dict) -> None:
    """A short and a long prompt in one batch (the short one's padding, the whole second prefill chunk, never
    reaches its states) give each prompt's tokens alone, and the CPU's."""
    gpu, cpu = models["cuda"], models["cpu"]
    short, long = prompt(5, seed=5), prompt(70, seed=6)
    together = [g.token_ids for g in gpu.generate_batch([short, long], max_new_tokens=10)]
    assert together == [gpu.generate(short, max_new_tokens=10).token_ids,
                        gpu.generate(long, max_new_tokens=10).token_ids]
    assert together == [g.token_ids for g in cpu.generate_batch([short, long], max_new_tokens=10)]


def test_reset_zeroes_the_device_states(models: dict) -> None:
    """A cache that ran a prompt, reset, runs another prompt as a fresh cache does (the states the context held
    resident were written back, then zeroed)."""
    gpu = models["cuda"]
    cache = gpu.new_cache()
    gpu.step(np.array([prompt(9, seed=9)]), cache, [8])
    cache.reset()
    ids = prompt(7, seed=10)
    _close(gpu.step(np.array([ids]), cache, [6]), gpu.step(np.array([ids]), gpu.new_cache(), [6]),
           f"{models['family']} after reset")


def test_f16_greedy_decoding_stays_close_to_f32(models: dict) -> None:
    """f16 storage (f32 accumulation): greedy decoding runs, and on its own tokens every step's logits point where
    the f32 CPU model's do (cosine >= 0.999)."""
    assert_f16_greedy_tracks_f32(models["cuda_f16"], models["cpu"], prompt(12, seed=3), models["family"])

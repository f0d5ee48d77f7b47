"""Loading a checkpoint does not hold its weights twice: the peak RSS growth of `CausalLM.from_pretrained` on a
~130 MB f16 checkpoint stays below 1.5x the weight bytes (the compiled model's own copy plus small change).

Before: each converted (transposed) matrix stayed referenced by the compiled graph beside the library's copy,
and the mapped file's pages stayed resident after they were copied: about 2.9x, measured. The load runs in a
fresh Python process (`resource.getrusage`'s peak is per process), one thread, after the imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.models.weights import release_pages

HIDDEN, FFN, VOCAB = 2048, 6144, 256

LOAD = """
import json, resource, sys
from rlx.models.causal_lm import CausalLM
import rlx.driver
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
lm = CausalLM.from_pretrained(sys.argv[1], context_length=16, prefill_chunk=4, threads=1)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert lm.logits([3, 4]).shape[0] == 2
print(json.dumps({"growth_bytes": (after - before) * 1024}))
"""


def _checkpoint(directory: Path) -> int:
    """A one-layer f16 LLaMA of ~130 MB (big matrices, little to compile); returns its weight bytes."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    p = "model.layers.0."
    ones = np.ones(HIDDEN, np.float16)
    tensors = {"model.embed_tokens.weight": w(VOCAB, HIDDEN), "lm_head.weight": w(VOCAB, HIDDEN),
               "model.norm.weight": ones, p + "input_layernorm.weight": ones,
               p + "post_attention_layernorm.weight": ones}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        tensors[f"{p}self_attn.{name}.weight"] = w(HIDDEN, HIDDEN)
    tensors |= {p + "mlp.gate_proj.weight": w(FFN, HIDDEN), p + "mlp.up_proj.weight": w(FFN, HIDDEN),
                p + "mlp.down_proj.weight": w(HIDDEN, FFN)}
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": 1,
        "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": FFN,
        "max_position_embeddings": 64}))
    return sum(t.nbytes for t in tensors.values())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss is in KiB on Linux (bytes on macOS)")
def test_peak_rss_of_loading_stays_below_one_and_a_half_times_the_weights(tmp_path):
    weight_bytes = _checkpoint(tmp_path / "ckpt")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "ckpt")], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    growth = json.loads(out.stdout.strip().splitlines()[-1])["growth_bytes"]
    assert growth < 1.5 * weight_bytes, f"peak RSS grew {growth / 2**20:.0f} MiB for {weight_bytes / 2**20:.0f} MiB"


def test_released_pages_read_back_the_same_values(tmp_path):
    from safetensors.numpy import save_file

    from rlx.models.hf_weights import open_checkpoint

    values = np.random.default_rng(1).standard_normal((300, 700)).astype(np.float32)
    (tmp_path / "c").mkdir()
    save_file({"a": values[:7], "w": values}, str(tmp_path / "c" / "model.safetensors"))
    tensor = open_checkpoint(tmp_path / "c")["w"].data
    assert float(tensor.sum()) == float(values.sum())  # read: its pages are resident
    assert release_pages(tensor) and release_pages(tensor[5:9])
    np.testing.assert_array_equal(tensor, values)  # mapped in again from the file
    assert not release_pages(np.array(values))

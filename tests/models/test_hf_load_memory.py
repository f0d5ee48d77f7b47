"""Loading a checkpoint does not hold its weights twice: the peak RSS growth of `CausalLM.from_pretrained` on a
~108 MB f16 checkpoint stays below 1.5x the weight bytes (the compiled model's own copy plus small change).

Before: each converted (transposed) matrix stayed referenced by the compiled graph beside the library's copy,
and the mapped file's pages stayed resident after they were copied: about 2.9x, measured. The load runs in a
fresh Python process, one thread; the peak is the kernel's high-water mark of its resident set (`VmHWM`,
reset after the imports), not `getrusage`'s `ru_maxrss`, which Linux carries over `exec` from the forking
process (pytest with torch loaded would hide any growth).
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

HIDDEN, FFN, VOCAB, LAYERS = 1536, 4096, 256, 2

LOAD = """
import json, sys
from rlx.models.causal_lm import CausalLM
import rlx.driver

def status(key):  # kB
    return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith(key + ":")))

before = status("VmRSS")
try:  # the peak so far is reset to the current RSS (Linux >= 4.0)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
except OSError:
    pass  # the peak then counts the imports too: an upper bound
lm = CausalLM.from_pretrained(sys.argv[1], context_length=16, prefill_chunk=4, threads=1)
assert lm.logits([3, 4]).shape[0] == 2
print(json.dumps({"growth_bytes": (status("VmHWM") - before) * 1024}))
"""


def _checkpoint(directory: Path) -> int:
    """A two-layer f16 LLaMA of ~108 MB in matrices of at most 12 MB (a load holds one of them converted, and
    its mapped pages, at a time); returns its weight bytes."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(HIDDEN, np.float16)
    tensors = {"model.embed_tokens.weight": w(VOCAB, HIDDEN), "lm_head.weight": w(VOCAB, HIDDEN),
               "model.norm.weight": ones}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        tensors |= {p + "input_layernorm.weight": ones, p + "post_attention_layernorm.weight": ones,
                    p + "mlp.gate_proj.weight": w(FFN, HIDDEN), p + "mlp.up_proj.weight": w(FFN, HIDDEN),
                    p + "mlp.down_proj.weight": w(HIDDEN, FFN)}
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{p}self_attn.{name}.weight"] = w(HIDDEN, HIDDEN)
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
        "num_attention_heads": 12, "num_key_value_heads": 12, "intermediate_size": FFN,
        "max_position_embeddings": 64}))
    return sum(t.nbytes for t in tensors.values())


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux's /proc/self/status (VmHWM)")
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

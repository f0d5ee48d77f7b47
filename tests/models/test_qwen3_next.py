"""Qwen3-Next (`rlx.models.qwen3_next`) through `CausalLM.from_pretrained`, against transformers on a random
checkpoint: a hybrid whose cache slots hold K/V rows and recurrent states together.

One compiled CPU model (module-scoped) of a tiny random `Qwen3NextForCausalLM` (a gated DeltaNet layer with
4 value heads over 2 key heads, then a gated attention layer with partial RoPE; dense MLPs) saved with
`save_pretrained`: prefill logits (1, 40 and 60 tokens, the last in two chunks), greedy decode (tokens and
every step's logits) against transformers' `generate`, a ragged `generate_batch`, the graph against
`rlx/reference.py`, and the refusal of sparse-MoE configs. transformers runs its torch fallback path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlx.errors import ArtifactError
from rlx.models.causal_lm import CausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_checkpoints import hf_logits, prompt, save_checkpoint
from recurrent_checkpoints import assert_close, check_decode, random_model


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    model = random_model("qwen3_next")
    directory = save_checkpoint(model, tmp_path_factory.mktemp("qwen3_next"))
    lm = CausalLM.from_pretrained(directory, context_length=72, max_batch=2, prefill_chunk=48)
    return model, lm, directory


def test_the_cache_slot_holds_kv_rows_and_recurrent_states(hybrid):
    _, lm, _ = hybrid
    cache = lm.new_cache()
    assert cache.recurrent == ("blk.0.conv_state", "blk.0.ssm_state")
    assert {"blk.1.k_cache", "blk.1.v_cache"} <= set(cache.arrays)
    assert cache.arrays["blk.0.ssm_state"].shape == (2, 4, 16, 16)
    assert lm.config.base.n_rot == 4  # partial_rotary_factor 0.25 of head_dim 16


@pytest.mark.parametrize("length", [1, 40, 60])
def test_logits_equal_transformers(hybrid, length):
    model, lm, _ = hybrid
    ids = prompt(length, seed=length)
    assert_close(lm.logits(ids), hf_logits(model, ids), length)


def test_greedy_decode_equals_transformers(hybrid):
    model, lm, _ = hybrid
    check_decode(lm, model, prompt(12, seed=3))


def test_generate_batch_equals_each_alone(hybrid):
    _, lm, _ = hybrid
    short, long = prompt(5, seed=5), prompt(55, seed=6)  # the long one in two prefill chunks, the short in one
    together = lm.generate_batch([short, long], max_new_tokens=10)
    assert [g.token_ids for g in together] == [lm.generate(short, max_new_tokens=10).token_ids,
                                               lm.generate(long, max_new_tokens=10).token_ids]


def test_graph_equals_the_reference(hybrid):
    """The compiled CPU decoder and `rlx/reference.py` on the same weights: a ragged prefill, then a decode step."""
    _, lm, _ = hybrid
    ref = CausalLM(lm.config, lm.tensors, device="reference", max_context=72, max_batch=2, prefill_chunk=8)
    tokens = np.array([prompt(8, seed=11), prompt(8, seed=12)])
    valid, rows = np.array([8, 5]), [7, 8 + 4]
    caches = lm.new_cache(), ref.new_cache()
    assert_close(*(m.step(tokens, c, rows, valid=valid) for m, c in zip((lm, ref), caches)), "prefill")
    for name in caches[0].recurrent:
        np.testing.assert_allclose(caches[0].arrays[name], caches[1].arrays[name], rtol=1e-4, atol=1e-4)
    for c in caches:
        c.lengths[:2] = valid
    step = np.array([[3], [4]])
    assert_close(lm.step(step, caches[0], [0, 1]), ref.step(step, caches[1], [0, 1]), "decode")


def test_sparse_moe_configs_are_refused_before_loading(hybrid, tmp_path):
    directory = hybrid[2]
    raw = json.loads((directory / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "mlp_only_layers": [0]}))
    with pytest.raises(ArtifactError, match=r"sparse-MoE layers .* are not supported for qwen3_next"):
        CausalLM.from_pretrained(tmp_path)


def test_rlxc_inspect_model(hybrid, capsys):
    from rlx.cli import main

    assert main(["inspect", "--model", str(hybrid[2])]) == 0
    out = capsys.readouterr().out
    assert "model_type: qwen3_next" in out and "layer_types: ('linear_attention', 'full_attention')" in out


def test_cpu_and_cuda_have_a_rule_for_every_op(hybrid):
    """The CPU and CUDA render every op of the graph: the carried conv and delta-rule states, the K/V cache (the
    GPU run: tests/gpu/test_cuda_recurrent_decoder.py)."""
    from rlx.codegen.backends import first_unsupported_op

    lm = hybrid[1]
    assert first_unsupported_op(lm.graph, "cpu") is None
    assert first_unsupported_op(lm.graph, "cuda") is None

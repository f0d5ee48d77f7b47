"""Mamba-2 (`rlx.models.mamba2`) through `CausalLM.from_pretrained`, against transformers on a random checkpoint.

One compiled CPU model (module-scoped) of a tiny random `Mamba2ForCausalLM` (2 layers, hidden 64, 8 heads of
16 channels, state 16, two groups of B/C, conv kernel 4) saved with `save_pretrained`: prefill logits (1, 40
and 60 tokens, the last in two chunks carrying the states across), greedy decode through the recurrent cache
(tokens and every step's logits) against transformers' `generate`, a ragged `generate_batch`, the cache's
reset/truncate rules, and the graph against `rlx/reference.py`. transformers runs its torch fallback path
(no CUDA kernels).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlx.errors import ArtifactError, ExecutionError, RlxError
from rlx.models.causal_lm import CausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_checkpoints import hf_logits, prompt, save_checkpoint
from recurrent_checkpoints import assert_close, check_decode, random_model


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    model = random_model("mamba2")
    directory = save_checkpoint(model, tmp_path_factory.mktemp("mamba2"))
    lm = CausalLM.from_pretrained(directory, context_length=72, max_batch=2, prefill_chunk=48)
    return model, lm, directory


@pytest.mark.parametrize("length", [1, 40, 60])
def test_logits_equal_transformers(mamba, length):
    model, lm, _ = mamba
    ids = prompt(length, seed=length)
    assert_close(lm.logits(ids), hf_logits(model, ids), length)


def test_greedy_decode_through_the_recurrent_cache_equals_transformers(mamba):
    """24 greedy tokens equal `generate(do_sample=False)`; every decode step's logits (one token through the
    cached conv and SSM states) equal transformers' scores for that step."""
    model, lm, _ = mamba
    check_decode(lm, model, prompt(12, seed=3))


def test_generate_batch_equals_each_alone(mamba):
    """Two prompts of different lengths in one batch: the shorter one's padding (all of the second prefill chunk)
    never reaches its states."""
    _, lm, _ = mamba
    short, long = prompt(5, seed=5), prompt(55, seed=6)  # the long one in two prefill chunks, the short in one
    together = lm.generate_batch([short, long], max_new_tokens=10)
    assert [g.token_ids for g in together] == [lm.generate(short, max_new_tokens=10).token_ids,
                                               lm.generate(long, max_new_tokens=10).token_ids]


def test_cache_reset_and_truncate_of_recurrent_states(mamba):
    _, lm, _ = mamba
    ids = prompt(9, seed=8)
    fresh = lm.logits(ids)
    cache = lm.new_cache()
    lm.step(np.array([prompt(7, seed=1)]), cache, [0])
    assert all(np.any(cache.arrays[name] != 0) for name in cache.recurrent[:1])
    with pytest.raises(RlxError, match="cannot truncate a recurrent cache to 3 tokens"):
        cache.truncate(3)
    cache.truncate(7)  # nothing past 7 tokens: nothing to cut
    cache.truncate(0, row=0)  # the row's states are emptied with it
    np.testing.assert_array_equal(lm.step(np.array([ids]), cache, np.arange(len(ids))), fresh)
    cache.reset()
    assert all(not np.any(cache.arrays[name]) for name in cache.recurrent)
    with pytest.raises(ExecutionError, match="valid must give each"):
        lm.step(np.array([ids]), cache, [0], valid=[len(ids) + 1])
    with pytest.raises(RlxError, match="speculative decoding needs a cache it can truncate"):
        lm.generate(ids, max_new_tokens=4, speculative="prompt_lookup")


def test_graph_equals_the_reference(mamba):
    """The compiled CPU decoder and `rlx/reference.py` on the same weights: a ragged prefill, then a decode step."""
    _, lm, _ = mamba
    ref = CausalLM(lm.config, lm.tensors, device="reference", max_context=72, max_batch=2, prefill_chunk=8)
    tokens = np.array([prompt(8, seed=11), prompt(8, seed=12)])
    valid, rows = np.array([8, 5]), [7, 8 + 4]
    caches = lm.new_cache(), ref.new_cache()
    got, want = (m.step(tokens, c, rows, valid=valid) for m, c in zip((lm, ref), caches))
    assert_close(got, want, "prefill")
    for name in caches[0].recurrent:
        np.testing.assert_allclose(caches[0].arrays[name], caches[1].arrays[name], rtol=1e-4, atol=1e-4)
    for c in caches:
        c.lengths[:2] = valid
    step = np.array([[3], [4]])
    assert_close(lm.step(step, caches[0], [0, 1]), ref.step(step, caches[1], [0, 1]), "decode")


def test_bad_checkpoints_name_the_problem(mamba, tmp_path):
    directory = mamba[2]
    raw = json.loads((directory / "config.json").read_text())
    bad = tmp_path / "limit"
    bad.mkdir()
    for f in directory.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "config.json").write_text(json.dumps({**raw, "time_step_limit": [0.0, 0.1]}))
    with pytest.raises(ArtifactError, match="time_step_limit"):
        CausalLM.from_pretrained(bad)
    (bad / "config.json").write_text(json.dumps({**raw, "state_size": 8}))
    with pytest.raises(ArtifactError, match=r"'backbone.layers.0.mixer.in_proj.weight' has shape \[328, 64\], "
                                            r"expected \[296, 64\]"):
        CausalLM.from_pretrained(bad)
    (bad / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 3}))
    with pytest.raises(ArtifactError, match=r"no tensor 'backbone\.layers\.2\.norm\.weight'"):
        CausalLM.from_pretrained(bad)


def test_rlxc_inspect_model(mamba, capsys):
    from rlx.cli import main

    assert main(["inspect", "--model", str(mamba[2])]) == 0
    out = capsys.readouterr().out
    assert "model_type: mamba2" in out and "n_groups: 2" in out and "tensors: 21" in out


def test_cpu_and_cuda_have_a_rule_for_every_op(mamba):
    """The CPU and CUDA render every op of the graph, the carried conv and scan states included (the GPU run:
    tests/gpu/test_cuda_recurrent_decoder.py)."""
    from rlx.codegen.backends import first_unsupported_op

    lm = mamba[1]
    assert first_unsupported_op(lm.graph, "cpu") is None
    assert first_unsupported_op(lm.graph, "cuda") is None

"""Qwen3-Next (`rlx.models.qwen3_next`) through `CausalLM.from_pretrained`, against transformers on a random
checkpoint: a hybrid whose cache slots hold K/V rows and recurrent states together.

One compiled CPU model (module-scoped) of a tiny random `Qwen3NextForCausalLM` (a gated DeltaNet layer with
4 value heads over 2 key heads, then a gated attention layer with partial RoPE; dense MLPs) saved with
`save_pretrained`: prefill logits (1, 40 and 60 tokens, the last in two chunks), greedy decode (tokens and
every step's logits) against transformers' `generate`, a ragged `generate_batch`, the graph against
`rlx/reference.py`. A second one has sparse-MoE layers with a shared expert (router, grouped experts, sigmoid-gated
shared expert): its logits, greedy decode and `generate_batch` against transformers, and which layers are sparse.
transformers runs its torch fallback path.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlx.models.causal_lm import CausalLM
from rlx.models.hf_qwen3_next import qwen3_next_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_checkpoints import cosine, hf_logits, prompt, q8_0_twin, save_checkpoint
from recurrent_checkpoints import CONFIGS, SHARED, assert_close, check_decode, random_model


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


#: Sparse MoE on both layers (a DeltaNet one and an attention one): 4 experts, top-2 renormalized, each
#: beside a shared expert with its sigmoid gate.
SPARSE = dict(mlp_only_layers=[], num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1)


@pytest.fixture(scope="module")
def sparse(tmp_path_factory):
    model = random_model("qwen3_next", seed=1, **SPARSE)
    directory = save_checkpoint(model, tmp_path_factory.mktemp("qwen3_next_moe"))
    lm = CausalLM.from_pretrained(directory, context_length=72, max_batch=2, prefill_chunk=48)
    return model, lm, directory


@pytest.mark.parametrize(("sparse_step", "mlp_only"), [(1, []), (2, []), (1, [0, 2]), (3, [1])])
def test_sparse_layers_are_those_transformers_builds(sparse_step, mlp_only):
    """Which layers get the sparse MoE block (mlp_only_layers, decoder_sparse_step), as transformers decides."""
    from transformers import AutoConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer, Qwen3NextSparseMoeBlock

    raw = {**SHARED, **CONFIGS["qwen3_next"], **SPARSE, "num_hidden_layers": 4, "decoder_sparse_step": sparse_step,
           "mlp_only_layers": mlp_only, "layer_types": ["linear_attention", "full_attention"] * 2}
    hf = AutoConfig.for_model("qwen3_next", **raw)
    theirs = [isinstance(Qwen3NextDecoderLayer(hf, i).mlp, Qwen3NextSparseMoeBlock) for i in range(4)]
    ours = qwen3_next_config({**hf.to_dict(), "model_type": "qwen3_next"})
    assert [ours.base.layer_moe(i) for i in range(4)] == theirs
    if any(theirs):
        moe = ours.base.moe
        assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_intermediate_size, moe.normalize) == \
            (4, 2, 32, 48, True)
    else:
        assert ours.base.moe is None


def test_sparse_moe_tensors_are_read_with_the_shared_expert(sparse):
    model, lm, _ = sparse
    spec, data = lm.tensors["blk.0.ffn_moe.experts.gate_up_proj"]
    assert spec.shape == (4, 64, 64)
    np.testing.assert_array_equal(np.asarray(data), model.model.layers[0].mlp.experts.gate_up_proj.detach().numpy())
    gate = lm.tensors["blk.1.ffn_moe.shared_expert_gate.weight"]
    assert gate[0].ggml_type == "f32" and gate[0].shape == (1, 64)
    np.testing.assert_array_equal(gate[1], model.model.layers[1].mlp.shared_expert_gate.weight.detach().numpy())
    assert "blk.0.ffn_gate.weight" not in lm.tensors  # the MoE block replaces the dense FFN
    kinds = {n.kind for n in lm.graph.nodes}
    assert {"moe_topk", "moe_gate", "moe_matmul"} <= kinds  # the router op (top-k, then its weights), grouped experts


@pytest.mark.parametrize("length", [1, 40])
def test_sparse_moe_logits_equal_transformers(sparse, length):
    model, lm, _ = sparse
    ids = prompt(length, seed=20 + length)
    assert_close(lm.logits(ids), hf_logits(model, ids), length)


def test_sparse_moe_greedy_decode_equals_transformers(sparse):
    model, lm, _ = sparse
    check_decode(lm, model, prompt(12, seed=4))


def test_sparse_moe_generate_batch_equals_each_alone(sparse):
    _, lm, _ = sparse
    short, long = prompt(5, seed=7), prompt(40, seed=8)
    together = lm.generate_batch([short, long], max_new_tokens=10)
    assert [g.token_ids for g in together] == [lm.generate(short, max_new_tokens=10).token_ids,
                                               lm.generate(long, max_new_tokens=10).token_ids]


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


#: What `quantize="q8_0"` keeps f32 in a Qwen3-Next checkpoint: the token embedding, the DeltaNet's b/a
#: projections (per-head gates) and conv, the router, and the shared expert with its gate (hf_qwen3_next,
#: hf_load.moe_tensors).
Q8_KEPT = ("embed_tokens.weight", "in_proj_ba.weight", "conv1d.weight", "mlp.gate.weight", "shared_expert_gate.weight",
           "shared_expert.gate_proj.weight", "shared_expert.up_proj.weight", "shared_expert.down_proj.weight")


def test_sparse_moe_q8_0_equals_transformers_on_the_dequantized_weights(sparse):
    """quantize="q8_0" on the sparse hybrid: equal to transformers run on the dequantized Q8_0 matrices (what is
    left against f32 is Q8_0's rounding, not RLX), and each token's logits within the issue's cos 0.999 of f32's
    at the median.

    Over all 40 x 300 logits the cos against f32 is under 0.999 on some prompts (measured 0.9976, 0.9964, 0.9997
    on three; the dense-MLP fixture 0.9994, 0.9996, 0.9983): measured in transformers on the dequantized weights,
    a route moved across a near tie of the router logits (as Mixtral's, test_hf_moe.py) and, dense too, single
    tokens whose logits hang on the Q8_0 rounding of the DeltaNet's key rows (one token at cos 0.978 from
    quantizing those rows alone; its key heads are not small before their L2 norm)."""
    model, _, directory = sparse
    # f32 activations, as the twin multiplies them: on a CPU with AVX-512 VNNI the default quantizes them to int16
    # per block (`default_quant_act`, ~3e-4 x max|logit| here), an error of RLX's own that the twin does not model
    lm = CausalLM.from_pretrained(directory, quantize="q8_0", context_length=48, prefill_chunk=48, quant_act="f32")
    kinds = {name: spec.ggml_type for name, (spec, _) in lm.tensors.items()}
    assert kinds["blk.0.ffn_moe.experts.gate_up_proj"] == kinds["blk.0.ssm_qkv.weight"] == "q8_0"
    assert kinds["blk.0.ffn_moe.gate.weight"] == kinds["blk.0.ffn_moe.shared_expert_gate.weight"] == "f32"
    assert kinds["blk.0.ssm_beta.weight"] == kinds["blk.0.ssm_conv1d.weight"] == "f32"
    ids = prompt(40, seed=11)
    ours, f32 = lm.logits(ids), hf_logits(model, ids)
    assert np.median([cosine(a, b) for a, b in zip(ours, f32)]) >= 0.999
    assert_close(ours, hf_logits(q8_0_twin(model, Q8_KEPT), ids), "q8_0")

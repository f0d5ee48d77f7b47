"""`rlx.models.moe.moe_block` against transformers' sparse MoE blocks (torch, random weights copied in).

One graph holds three blocks on one input — Mixtral (renormalized top-2), Qwen3-MoE without
`norm_topk_prob` (top-3) and Qwen3-Next (renormalized, a sigmoid-gated shared expert) — compiled once for
the CPU with a dynamic sequence length, so a 1-token step takes the GEMV path and a 40-token step the
grouped path of `moe_matmul`. A fourth block holds the Qwen3-MoE experts as q8_0 blocks; its transformers
twin gets the dequantized blocks. Each output must equal transformers' within max abs <= 1e-4 x max|out|.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rlx
from rlx.ir.quant import dequantize
from rlx.models.moe import MoeConfig, moe_block, param_shapes, quantize_experts

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HIDDEN = 32
MAXS = 40


def _torch_blocks() -> dict[str, tuple[object, MoeConfig]]:
    from transformers.models.mixtral.configuration_mixtral import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

    mixtral = MixtralConfig(hidden_size=HIDDEN, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2)
    qwen3 = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=32, num_experts=16, num_experts_per_tok=3,
                           norm_topk_prob=False)
    qwen3_next = Qwen3NextConfig(hidden_size=HIDDEN, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                                 norm_topk_prob=True, shared_expert_intermediate_size=40)
    torch.manual_seed(0)
    blocks = {"mixtral": (MixtralSparseMoeBlock(mixtral), MoeConfig.mixtral(mixtral)),
              "qwen3_moe": (Qwen3MoeSparseMoeBlock(qwen3), MoeConfig.qwen3_moe(qwen3)),
              "qwen3_next": (Qwen3NextSparseMoeBlock(qwen3_next), MoeConfig.qwen3_moe(qwen3_next))}
    for block, _ in blocks.values():
        with torch.no_grad():
            for p in block.parameters():
                p.normal_(0.0, 0.3)
        block.eval()
    # q8_0 experts: the block's twin in transformers holds the dequantized matrices
    twin = Qwen3MoeSparseMoeBlock(qwen3)
    twin.load_state_dict(blocks["qwen3_moe"][0].state_dict())
    with torch.no_grad():
        for p in (twin.experts.gate_up_proj, twin.experts.down_proj):
            e, n, k = p.shape
            blocks_q8 = quantize_experts(p.numpy(), "q8_0")
            p.copy_(torch.from_numpy(dequantize(blocks_q8.reshape(e * n, -1), "q8_0", k).reshape(e, n, k)))
    blocks["qwen3_moe_q8"] = (twin.eval(), dataclasses.replace(blocks["qwen3_moe"][1], quant="q8_0"))
    return blocks


@pytest.fixture(scope="module")
def compiled():
    blocks = _torch_blocks()
    g = rlx.Graph("moe_blocks")
    x = g.input("x", [1, rlx.Dim.dynamic("seq", MAXS), HIDDEN])
    outs, params = [], {}
    for name, (block, cfg) in blocks.items():
        outs.append(moe_block(g, x, cfg, name))
        state = dict(block.named_parameters())
        for pname, (shape, dtype) in param_shapes(cfg, name).items():
            value = state[pname[len(name) + 1:]].detach().numpy().astype(np.float32)
            if dtype == "u8":  # the twin holds the dequantized blocks: quantizing them again is exact
                value = quantize_experts(value, cfg.quant)
            assert value.shape == shape
            params[pname] = value
    g.set_outputs(outs)
    cg = rlx.Session(rlx.Device.CPU).compile(g)
    for pname, value in params.items():
        cg.set_param(pname, value)
    return blocks, g, cg, params


@pytest.mark.parametrize("seq", [1, 40])
def test_moe_blocks_equal_transformers(compiled, seq):
    blocks, _, cg, _ = compiled
    x = np.random.default_rng(seq).standard_normal((1, seq, HIDDEN)).astype(np.float32)
    got = cg.run({"x": x})
    for (name, (block, _)), out in zip(blocks.items(), got):
        with torch.no_grad():
            want = block(torch.from_numpy(x)).numpy()
        err = np.abs(out - want).max()
        assert err <= 1e-4 * np.abs(want).max(), f"{name}: max abs error {err} vs max |out| {np.abs(want).max()}"


def test_moe_block_reference_equals_transformers(compiled):
    """The numpy reference of the same graph agrees too (the compiled code is checked against it elsewhere)."""
    blocks, g, _, params = compiled
    x = np.random.default_rng(7).standard_normal((1, 5, HIDDEN)).astype(np.float32)
    ref = rlx.reference.run(g, {"x": x}, params)
    for (name, (block, _)), out in zip(blocks.items(), ref):
        with torch.no_grad():
            want = block(torch.from_numpy(x)).numpy()
        assert np.abs(out - want).max() <= 1e-4 * np.abs(want).max(), name


def test_moe_config_checks():
    with pytest.raises(rlx.errors.IRError, match="top_k=9 is more than num_experts=8"):
        MoeConfig(hidden_size=8, num_experts=8, top_k=9, intermediate_size=4, normalize=True)
    with pytest.raises(rlx.errors.IRError, match="quant 'q3' is not one of"):
        MoeConfig(hidden_size=8, num_experts=8, top_k=2, intermediate_size=4, normalize=True, quant="q3")


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_checkpoint_params_stack_saved_experts(tmp_path, family):
    """`checkpoint_params` reads a checkpoint as transformers' `save_pretrained` writes it (one tensor per expert
    and matrix) into the stacked params `moe_block` declares, equal to the model's in-memory experts; a missing
    or misshapen tensor is an IRError naming it."""
    from safetensors import safe_open
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from rlx.models.moe import checkpoint_params

    common = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                  vocab_size=50)
    if family == "mixtral":
        hf = MixtralConfig(intermediate_size=8, num_local_experts=4, num_experts_per_tok=2, **common)
        model, cfg, disk = MixtralForCausalLM(hf), MoeConfig.mixtral(hf), "model.layers.0.block_sparse_moe"
    else:
        hf = Qwen3MoeConfig(intermediate_size=32, moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2,
                            **common)
        model, cfg, disk = Qwen3MoeForCausalLM(hf), MoeConfig.qwen3_moe(hf), "model.layers.0.mlp"
    model.save_pretrained(tmp_path)
    block = model.model.layers[0].mlp
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        keys = set(f.keys())
        assert f"{disk}.experts.0.{'w1' if family == 'mixtral' else 'gate_proj'}.weight" in keys
        params = checkpoint_params(f.get_tensor, keys, cfg, disk, "blk0", family)
        want = {f"blk0.{k}": v.detach().numpy() for k, v in block.named_parameters()}
        assert set(params) == set(want) == set(param_shapes(cfg, "blk0"))
        for name, value in params.items():
            np.testing.assert_array_equal(value, want[name], err_msg=name)
        half = checkpoint_params(f.get_tensor, keys, dataclasses.replace(cfg, expert_dtype="f16"), disk, "b", family)
        assert half["b.experts.down_proj"].dtype == np.float16
        with pytest.raises(rlx.errors.IRError, match=r"no tensor .*experts\.0\..*expected shape \(8, 16\)"):
            checkpoint_params(f.get_tensor, {k for k in keys if ".experts.0." not in k}, cfg, disk, "b", family)
        small = dataclasses.replace(cfg, intermediate_size=4)
        with pytest.raises(rlx.errors.IRError, match=r"has shape \(8, 16\), expected \(4, 16\) from the config"):
            checkpoint_params(f.get_tensor, keys, small, disk, "b", family)

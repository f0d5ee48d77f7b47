"""`rlx.models.llama.build_decoder`: which projections take integer activations (`quant_act`, `quant_act_formats`)."""

from __future__ import annotations

import pytest

from rlx.ir import ops as O
from rlx.ir.quant import INT8_ACT_FORMATS
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import WeightSpec, build_decoder, random_specs

CONFIG = DecoderConfig(arch="llama", vocab_size=64, hidden_size=256, num_layers=1, num_heads=4, num_kv_heads=2,
                       head_dim=64, ffn_size=256, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                       n_rot=64, context_length=64, tie_embeddings=True, bos_id=1, eos_id=2)


def _acts(quant_act: str, formats: tuple[str, ...] | None) -> dict[str, set[str]]:
    """Per weight format, the `act` of its projections (Q4_K attention, Q8_0 FFN and head)."""
    specs = {name: spec if len(spec.shape) == 1 else
             WeightSpec("q4_k" if name.startswith("blk.0.attn") else "q8_0", spec.shape)
             for name, spec in random_specs(CONFIG).items()}
    g = build_decoder(CONFIG, specs, max_seq=4, capacity=16, quant_act=quant_act, quant_act_formats=formats)
    out: dict[str, set[str]] = {}
    for node in g.nodes:
        if isinstance(node.op, O.DequantMatMul):
            out.setdefault(node.op.quant, set()).add(node.op.act)
    return out


@pytest.mark.parametrize("quant_act, formats, want", [
    ("q8", None, {"q4_k": {"f32"}, "q8_0": {"q8"}}),  # every backend's integer formats (the CPU's)
    ("q8", INT8_ACT_FORMATS, {"q4_k": {"q8"}, "q8_0": {"q8"}}),  # CUDA's: Q4_K too
    ("q16", INT8_ACT_FORMATS, {"q4_k": {"f32"}, "q8_0": {"q16"}}),  # q16 is not defined for Q4_K
    ("f32", INT8_ACT_FORMATS, {"q4_k": {"f32"}, "q8_0": {"f32"}}),
])
def test_integer_activations_by_format(quant_act: str, formats: tuple[str, ...] | None,
                                       want: dict[str, set[str]]) -> None:
    assert _acts(quant_act, formats) == want

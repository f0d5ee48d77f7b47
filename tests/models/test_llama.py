"""`rlx.models.llama.build_decoder`: which projections take integer activations (`quant_act`, `quant_act_formats`);
`iter_decoder_params`' narrow float matrices."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.ir import ops as O
from rlx.ir.dtype import is_bfloat16
from rlx.ir.quant import INT8_ACT_FORMATS
from rlx.models.decoder_config import DecoderConfig
from rlx.models.llama import WeightSpec, build_decoder, decoder_param, iter_decoder_params, random_specs

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


def _float_tensors(ggml_type: str) -> dict[str, tuple[WeightSpec, np.ndarray]]:
    """CONFIG's tensors with every matrix `ggml_type` (f16 values, or bf16 bits: the GGUF reader's forms)."""
    rng = np.random.default_rng(3)
    out = {}
    for name, spec in random_specs(CONFIG).items():
        if len(spec.shape) == 1:
            out[name] = (spec, rng.standard_normal(spec.shape).astype(np.float32))
            continue
        values = rng.standard_normal(spec.shape).astype(np.float32) * 0.05
        data = (values.view(np.uint32) >> 16).astype(np.uint16) if ggml_type == "bf16" else values.astype(np.float16)
        out[name] = (WeightSpec(ggml_type, spec.shape), data)
    return out


@pytest.mark.parametrize("ggml_type", ["f16", "bf16"])
def test_narrow_params_are_the_widened_ones_in_their_own_type(ggml_type: str) -> None:
    """`narrow=True` (what CausalLM hands a CUDA build): an F16/BF16 matrix whose param the graph declares f32
    comes transposed in its own type, each value the one the widened param holds; vectors stay f32."""
    tensors = _float_tensors(ggml_type)
    g = build_decoder(CONFIG, {n: s for n, (s, _) in tensors.items()}, max_seq=4, capacity=16)
    wide = dict(iter_decoder_params(tensors, g))
    narrow = dict(iter_decoder_params(tensors, g, narrow=True))
    assert wide.keys() == narrow.keys()
    matrices = 0
    for name, arr in narrow.items():
        assert arr.shape == wide[name].shape and wide[name].dtype == np.float32
        if arr.ndim == 2:
            matrices += 1
            assert (is_bfloat16(arr.dtype) if ggml_type == "bf16" else arr.dtype == np.float16), name
            assert np.array_equal(arr.astype(np.float32), wide[name]), name
            assert np.array_equal(decoder_param(tensors, g, name, narrow=True).view(np.uint16), arr.view(np.uint16))
        else:
            assert arr.dtype == np.float32 and np.array_equal(arr, wide[name]), name
    assert matrices == 9  # 7 projections, the embedding rows the gather reads, the tied head (transposed)


@pytest.mark.parametrize("precision", ["f16", "bf16"])
@pytest.mark.parametrize("ggml_type", ["f16", "bf16"])
def test_a_session_stores_narrow_values_as_their_f32_values(precision: str, ggml_type: str) -> None:
    """`set_param` of a param a session of precision f16/bf16 stores narrow (`rounds_f32`) takes f16 and bf16
    arrays as it takes their f32 values: the same bits stored (the values an f32 holds exactly, rounded once)."""
    g = rlx.Graph("narrow_values")
    x = g.input("x", [3, 8])
    g.set_outputs([g.matmul(x, g.param("w", [8, 5]))])
    cg = rlx.Session(precision=precision).compile(g)
    tensors = {"w": (WeightSpec(ggml_type, (5, 8)), _float_tensors(ggml_type)["blk.0.attn_q.weight"][1][:5, :8])}
    xs = np.random.default_rng(4).standard_normal((3, 8)).astype(np.float32)
    cg.set_param("w", decoder_param(tensors, g, "w"))
    want = cg.run(x=xs)[0]
    narrow = decoder_param(tensors, g, "w", narrow=True)
    assert narrow.dtype != np.float32
    cg.set_param("w", narrow)
    assert np.array_equal(cg.run(x=xs)[0], want)
    if precision == "f16" and ggml_type == "bf16":  # a bf16 value past f16's range is refused, as its f32 value
        with pytest.raises(rlx.ExecutionError, match="overflows f16"):
            cg.set_param("w", np.full((8, 5), 1e6, np.float32).astype(narrow.dtype))

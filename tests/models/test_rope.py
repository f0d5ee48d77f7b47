"""RoPE frequencies of each scaling scheme against transformers' own initializers."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.errors import ArtifactError
from rlx.models.rope import RopeSpec, inv_freq, tables

CASES = [
    ({"rope_type": "default"}, RopeSpec(base=500000.0)),
    ({"rope_type": "linear", "factor": 3.0}, RopeSpec(base=500000.0, kind="linear", factor=3.0)),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192},
     RopeSpec(base=500000.0, kind="llama3", factor=8.0, original_max_positions=8192)),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
     RopeSpec(base=500000.0, kind="yarn", factor=4.0, original_max_positions=4096)),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 16,
      "truncate": False, "mscale": 1.0, "mscale_all_dim": 0.5},
     RopeSpec(base=500000.0, kind="yarn", factor=4.0, original_max_positions=4096, beta_fast=16.0, truncate=False,
              mscale=1.0, mscale_all_dim=0.5)),
]


@pytest.mark.parametrize(("params", "spec"), CASES, ids=lambda v: v.get("rope_type") if isinstance(v, dict) else "")
def test_inv_freq_equals_transformers(params, spec):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=16384,
                                      rope_parameters={"rope_theta": 500000.0, **params})
    if params["rope_type"] == "default":
        theirs = 1.0 / (500000.0 ** (np.arange(0, 64, 2) / 64))
        their_scale = 1.0
    else:
        freq, their_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
        theirs = freq.double().numpy()
    ours, scale = inv_freq(spec, 64)
    np.testing.assert_allclose(ours, theirs, rtol=2e-6)
    assert scale == pytest.approx(their_scale, rel=1e-6)


def test_tables_and_bad_specs():
    cos, sin = tables(RopeSpec(base=10000.0), 4, np.array([[0, 1]]))
    assert cos.shape == (1, 2, 2) and np.allclose(cos[0, 0], 1) and np.allclose(sin[0, 1], np.sin([1.0, 0.01]))
    with pytest.raises(ArtifactError, match="longrope"):
        RopeSpec(kind="longrope")
    with pytest.raises(ArtifactError, match="original_max_position_embeddings"):
        RopeSpec(kind="yarn", factor=2.0)

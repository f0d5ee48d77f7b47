"""`sample_top_k` on a GPU (templates/cuda/kernels/sample.cuh) equals the reference token for token:
SmolLM-sized rows (49152 logits), many random rows and settings, ties, NaN, u at 0 and just below 1; bad
settings fail the run naming the setting; and a CausalLM on CUDA samples the same tokens in the graph as
on the host from the read-back logits."""

from __future__ import annotations

import numpy as np
import pytest

from rlx import reference
from rlx.driver import Device, Session
from rlx.errors import ExecutionError
from rlx.ir.graph import Graph
from rlx.ir.ops_sample import SAMPLE_TOP_K_MAX
from rlx.ir.shape import Dim
from rlx.toolchain.cuda import visible_gpu_arch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

VOCAB = 49152
BELOW_1 = float(np.nextafter(1.0, 0.0))


@pytest.fixture(scope="module")
def compiled():
    g = Graph("sample_gpu")
    rows = Dim.dynamic("rows", max=64)
    x, u, s = g.input("x", [rows, VOCAB]), g.input("u", [rows], "f64"), g.input("s", [3], "f64")
    g.set_outputs([g.sample_top_k(x, u, s)])
    return g, Session(Device.CUDA).compile(g, opt_level=0)


def _check(compiled, x: np.ndarray, u: np.ndarray, s: tuple) -> np.ndarray:
    g, cg = compiled
    feed = {"x": x, "u": np.asarray(u, np.float64), "s": np.array(s, np.float64)}
    got = cg.run(feed)[0]
    want = reference.run(g, feed)[0]
    np.testing.assert_array_equal(got, want, err_msg=f"settings {s}")
    np.testing.assert_array_equal(cg.run(feed)[0], got, err_msg="the replayed CUDA graph differs")
    return got


SETTINGS = [(0.0, 1, 1.0), (0.8, 40, 1.0), (1.0, SAMPLE_TOP_K_MAX, 0.9), (0.7, 50, 0.95), (2.5, 7, 0.3),
            (1.3, 1, 1.0), (1e-3, 200, 1e-6), (1e4, SAMPLE_TOP_K_MAX, 1.0), (1.0, 128, 0.5)]


@pytest.mark.parametrize("s", SETTINGS, ids=str)
def test_random_rows_equal_the_reference(compiled, s: tuple) -> None:
    r = np.random.default_rng(int(s[1]) + 7)
    for rows, grid in ((64, False), (16, True), (3, False)):
        if grid:  # ties everywhere: candidates of the k-th value spread over every warp's segment
            x = (r.integers(-40, 40, (rows, VOCAB)) / 8).astype(np.float32)
        else:
            x = (r.standard_normal((rows, VOCAB)) * r.choice([0.3, 3.0, 12.0])).astype(np.float32)
        u = r.random(rows)
        u[0], u[-1] = 0.0, BELOW_1
        _check(compiled, x, u, s)


def test_ties_nan_inf_and_signed_zero(compiled) -> None:
    x = np.random.default_rng(3).standard_normal((6, VOCAB)).astype(np.float32)
    x[0, [10, 30000, VOCAB - 1]] = 9.0          # a three-way tie for first
    x[1, [5, 40000]] = np.nan                   # the first NaN takes the row
    x[2, 33333] = np.inf
    x[3, :] = -np.inf
    x[4, :] = 0.0
    x[4, 100:] = -0.0                           # -0 ties +0: index order
    for u in (0.0, 0.5, BELOW_1):
        _check(compiled, x, np.full(6, u), (1.0, 3, 1.0))
        _check(compiled, x, np.full(6, u), (1e6, SAMPLE_TOP_K_MAX, 1.0))
    got = _check(compiled, x, np.full(6, BELOW_1), (1.0, 3, 1.0))
    assert got[:5].tolist() == [VOCAB - 1, 5, 33333, 0, 2]


@pytest.mark.parametrize(("s", "u", "match"), [
    ((-1.0, 5, 1.0), 0.5, "temperature must be a finite number >= 0"),
    ((1.0, 0, 1.0), 0.5, r"top_k must be an integer in \[1, 256\]"),
    ((1.0, SAMPLE_TOP_K_MAX + 1, 1.0), 0.5, r"top_k must be an integer in \[1, 256\]"),
    ((1.0, 5, 1.5), 0.5, r"top_p must be in \(0, 1\]"),
    ((1.0, 5, 1.0), 1.0, r"u must be in \[0, 1\)"),
])
def test_bad_settings_fail_the_run(compiled, s: tuple, u: float, match: str) -> None:
    _, cg = compiled
    feed = {"x": np.zeros((2, VOCAB), np.float32), "u": np.array([0.25, u]), "s": np.array(s, np.float64)}
    with pytest.raises(ExecutionError, match=match):
        cg.run(feed)
    assert cg.run({**feed, "u": np.array([0.25, 0.5]), "s": np.array([1.0, 5, 1.0])})[0].shape == (2,)


def test_causal_lm_samples_the_same_tokens_in_the_graph_and_on_the_host() -> None:
    from rlx.models.causal_lm import CausalLM, random_tensors
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import random_specs

    config = DecoderConfig(arch="llama", vocab_size=4096, hidden_size=128, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=32, ffn_size=160, rms_eps=1e-5, rope_base=10000.0,
                           rope_variant="interleaved", n_rot=32, context_length=128, tie_embeddings=True,
                           bos_id=1, eos_id=2)
    lm = CausalLM(config, random_tensors(random_specs(config), seed=3, scale=2.0), device="cuda", max_context=96,
                  max_batch=3, prefill_chunk=16)
    prompts = [[5, 17, 33, 8], list(range(10, 31)), [44]]
    kw = dict(max_new_tokens=24, temperature=0.8, top_k=40, seed=3)
    device = [g.token_ids for g in lm.generate_batch(prompts, **kw)]
    assert device == [g.token_ids for g in lm.generate_batch(prompts, **kw)]
    lm.device_sampling = False
    assert [g.token_ids for g in lm.generate_batch(prompts, **kw)] == device
    assert len({t for row in device for t in row}) > 10

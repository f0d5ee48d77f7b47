"""The macOS host path: a graph compiled for Device.METAL runs on the GPU and matches the reference.

Runs only on macOS with the Xcode command-line tools and PyObjC's Metal bindings (`rlx[metal]`); it has
never run in RLX's CI (Linux), where the same kernels are checked by the emulator in tests/metal/.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest

import rlx

# Collected everywhere (tests/test_collection.py); runs on macOS only.
pytestmark = pytest.mark.skipif(platform.system() != "Darwin", reason="the Metal host runs on macOS only")


def test_metal_session_matches_the_reference():
    pytest.importorskip("Metal", reason="pyobjc-framework-Metal is not installed (pip install 'rlx[metal]')")
    from rlx.toolchain.metal import find_metal_toolchain

    if find_metal_toolchain() is None:
        pytest.skip("no xcrun metal (install the Xcode command-line tools)")
    seq = rlx.Dim.dynamic("seq", max=16)
    g = rlx.Graph("mac")
    x = g.input("x", [2, seq, 24])
    h = g.matmul(x, g.param("w", [24, 16]))
    g.set_outputs([g.softmax(g.layer_norm(h, g.param("ga", [16]), g.param("be", [16])), -1),
                   g.attention(h, h, h, num_heads=2, head_dim=8, mask="causal")])
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((24, 16)).astype(np.float32),
              "ga": rng.standard_normal(16).astype(np.float32), "be": rng.standard_normal(16).astype(np.float32)}
    m = rlx.Session(rlx.Device.METAL).compile(g)
    for k, v in params.items():
        m.set_param(k, v)
    inputs = {"x": rng.standard_normal((2, 7, 24)).astype(np.float32)}
    for got, want in zip(m.run(inputs), rlx.reference.run(g, inputs, params)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

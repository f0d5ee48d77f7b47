"""GGUF-quantized weights through the Metal emulator: `dequantize` bit-exact, `dequant_matmul` to f32 rounding.

Every block format, random valid blocks (negative and subnormal f16 scales included), one graph for all.
"""

from __future__ import annotations

import numpy as np
import pytest
from emulator import emulate, have_compiler

import rlx
from rlx.ir.quant import QUANT_FORMATS, random_blocks, row_bytes

pytestmark = pytest.mark.skipif(not have_compiler(), reason="no C++ compiler for the Metal emulator")


def test_every_format_matches_the_reference():
    g = rlx.Graph("quant")
    rows = rlx.Dim.dynamic("rows", max=5)
    x = g.input("x", [rows, 256])
    outs: dict[str, int] = {}
    for fmt in QUANT_FORMATS:
        w = g.param(f"w_{fmt}", [6, row_bytes(fmt, 256)], "u8")
        outs[f"deq_{fmt}"] = g.dequantize(w, quant=fmt)
        outs[f"mm_{fmt}"] = g.dequant_matmul(x, w, quant=fmt)
    g.set_outputs(outs)
    m = emulate(g)
    rng = np.random.default_rng(3)
    params = {f"w_{fmt}": random_blocks(rng, 6, 256, fmt) for fmt in QUANT_FORMATS}
    for name, value in params.items():
        m.set_param(name, value)
    inputs = {"x": rng.standard_normal((3, 256)).astype(np.float32)}
    got = m.run(inputs)
    want = rlx.reference.run(g, inputs, params)
    for label, a, b in zip(outs, got, want):
        if label.startswith("deq_"):
            np.testing.assert_array_equal(a, b, err_msg=label)  # the same float32 operations, in order
        else:
            scale = np.abs(inputs["x"]) @ np.abs(want[list(outs).index("deq_" + label[3:])]).T
            np.testing.assert_allclose(a, b, rtol=0, atol=float(scale.max()) * 2e-6, err_msg=label)

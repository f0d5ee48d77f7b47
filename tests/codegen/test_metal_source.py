"""The Metal backend's rendered source and manifest, without running anything.

No Metal front end exists for Linux (upstream clang has no Metal language mode and Apple's `metal` ships
with Xcode only), so the emulator in tests/metal/ compiles the source as C++. C++ accepts things MSL
does not; this test keeps the generated source inside the MSL subset the kernels are written in.
"""

from __future__ import annotations

import re

import pytest
from dtype_matrix import DTYPES, build_one, cases

import rlx
from rlx.codegen.backends import first_unsupported_op
from rlx.codegen.metal import MetalTarget
from rlx.driver import lower_to_lir
from rlx.errors import BuildError
from rlx.pipeline.metal import render_metal

#: C/C++ that compiles as C++ in the emulator but is not MSL (or would mean host code in a kernel file).
NOT_MSL = [r"\bdouble\b", r"\bstatic\b", r"\bstd::", r"\bprintf\b", r"\bmalloc\b", r"\bnew\b", r"\bdelete\b",
           r"\bgoto\b", r"\bthrow\b", r"\btry\b", r"__", r"#include <(?!metal_stdlib>)", r"\bvirtual\b",
           # C++17 (the emulator's dialect) beyond MSL's C++14 base
           r"\bif constexpr\b", r"\bauto\s*\[", r"\binline\s+constexpr\b", r"\binline\s+\w+\s+\w+\s*="]


def _render(g: rlx.Graph, level: int = 0):  # type: ignore[no-untyped-def]
    lir = lower_to_lir(g, level, backend="metal")
    return render_metal(lir, MetalTarget(), lir.manifest())


def _strip_comments(src: str) -> str:
    return re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", src), flags=re.S)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d.value != "f64"], ids=lambda d: d.value)
def test_every_op_renders_msl_only(dtype):
    for label, build in cases(dtype):
        g = build_one(dtype, build)
        if g is None or first_unsupported_op(g, "metal") is not None:
            continue
        prog = _render(g)
        code = _strip_comments(prog.source)
        for pattern in NOT_MSL:
            assert not re.search(pattern, code), f"{label} on {dtype.value}: {pattern} in the Metal source"
        names = re.findall(r"kernel void (\w+)\(", prog.source)
        launched = [d["kernel"] for d in prog.manifest["dispatches"]]
        assert set(launched) <= set(names), label  # every dispatch names a kernel of the source
        for d in prog.manifest["dispatches"]:
            t = d["threads"][0] * d["threads"][1] * d["threads"][2]
            assert 32 <= t <= 1024 and (not d["sync"] or t % 32 == 0), label


def test_quantized_ops_render_msl_only():
    from rlx.ir.quant import QUANT_FORMATS, row_bytes

    g = rlx.Graph("q")
    x = g.input("x", [2, 256])
    outs = []
    for fmt in QUANT_FORMATS:
        w = g.param(f"w_{fmt}", [4, row_bytes(fmt, 256)], "u8")
        outs += [g.dequantize(w, quant=fmt), g.dequant_matmul(x, w, quant=fmt)]
    g.set_outputs(outs)
    code = _strip_comments(_render(g).source)
    for pattern in NOT_MSL:
        assert not re.search(pattern, code), pattern


def test_source_is_commented_with_the_ops_and_dims_are_symbols():
    seq = rlx.Dim.dynamic("seq", max=64)
    g = rlx.Graph("dyn")
    x = g.input("x", [2, seq, 16])
    g.set_outputs([g.layer_norm(g.matmul(x, g.param("w", [16, 16])), g.param("ga", [16]), g.param("be", [16]))])
    prog = _render(g)
    assert "/* ── %" in prog.source and "layer_norm" in prog.source and "matmul" in prog.source
    assert "sym[0]" in prog.source  # the dynamic dim is read from the constant buffer
    assert "simdgroup_multiply_accumulate" in prog.source and "simd_sum" in prog.source
    grid = prog.manifest["dispatches"][0]["grid"]
    assert any("seq" in axis[1] for axis in grid)  # grids are evaluated per run from the symbol values
    assert prog.manifest["symbols"] == [{"name": "seq", "max": 64}]


def test_unsupported_combinations_are_refused_before_rendering():
    g = rlx.Graph("f64")
    g.set_outputs([g.softmax(g.input("x", [4], "f64"), -1)])
    assert not rlx.Session(rlx.Device.METAL).supports(g)
    with pytest.raises(BuildError, match="METAL backend does not support softmax on f64"):
        _render(g)
    g = rlx.Graph("wide_head")
    q = g.input("q", [1, 2, 512])
    g.set_outputs([g.attention(q, q, q, num_heads=1, head_dim=512)])
    reason = rlx.Session(rlx.Device.METAL).first_unsupported_op(g)[1]
    assert "head_dim 512 > 256" in reason

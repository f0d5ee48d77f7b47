"""rlx.codegen.activations: every language's activation code rendered from templates/activations.toml.

The numeric checks of the two activations added by formula (mish, hardswish) run on the CPU against the
reference (f32 regions, f64 regions, a GEMM's fused epilogue); the Metal emulator and the CUDA compile test
cover them through the tests parametrized over ACTIVATIONS (tests/metal/test_ops.py, tests/gpu/cases.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from cpu_helpers import U32, assert_within, check, compile_graph, gemm_bound

import rlx
from rlx.codegen.activations import Activations
from rlx.codegen.cuda import CudaTarget
from rlx.codegen.metal import MetalTarget
from rlx.driver import lower_to_lir
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.activation_table import TABLE, activation_table, parse_table
from rlx.pipeline.cuda import render_cuda
from rlx.pipeline.metal import render_metal
from rlx.templates_path import templates_dir
from rlx.toolchain.cuda_units import ACTIVATIONS as CUTLASS_IDS
from rlx.toolchain.cuda_units import activation_defines


@pytest.mark.parametrize("fn", O.ACTIVATIONS)
def test_every_activation_has_a_call_in_every_language(fn):
    acts = Activations()
    for lang in ("c_f", "c_d", "cuda", "metal"):
        assert "v1" in acts.call(lang, fn, "v1")


def test_integer_forms_are_those_the_op_accepts():
    acts = Activations()
    with_int = {e.name for e in acts.entries if e.c_int}
    assert with_int == {"neg", "abs", "relu"}  # rlx.ir.ops.Activation.infer: the rest need floats
    with pytest.raises(BuildError, match="no integer form"):
        acts.call("c_int", "exp", "v1")


def test_formula_renders_per_language_and_composes_other_activations():
    acts = Activations()
    assert acts.body("c_f", "mish") == "x * rlx_tanh_f(rlx_softplus_f(x))"
    assert acts.body("c_d", "mish") == "x * rlx_tanh_d(rlx_softplus_d(x))"
    assert acts.body("cuda_f", "hardswish") == "x * rlx_min(rlx_max(x + 3.0f, 0.0f), 6.0f) * 0.16666666666666666f"
    assert acts.body("cuda_d", "hardswish") == "x * rlx_min(rlx_max(x + 3.0, 0.0), 6.0) * 0.16666666666666666"
    # an expression argument is parenthesized where the language's form needs it
    assert acts.call("cuda", "neg", "a + b") == "(-(a + b))"


def test_unknown_activation_and_bad_formulas_are_build_errors():
    with pytest.raises(BuildError, match="no activation 'swish'"):
        Activations().call("cuda", "swish", "v1")
    text = (templates_dir() / TABLE).read_text()
    for formula, why in [("x * tanhh(x)", "neither an activation nor a primitive"), ("x * (x + 1", "expected"),
                         ("x $ 2", "unexpected"), ("min(x)", "takes 2 arguments"),
                         ("hardswish(x)", "defined after it"), ("mish(x)", "defined after it")]:
        acts = Activations(parse_table(text.replace("x * tanh(softplus(x))", formula)))
        with pytest.raises(BuildError, match=rf"formula of 'mish'.*{why}"):
            acts.body("c_f", "mish")


def _graph() -> rlx.Graph:
    g = rlx.Graph("acts")
    x = g.input("x", [4, 16])
    w = g.param("w", [16, 24])
    h = g.activation("hardswish", g.matmul(x, w))
    g.set_outputs([g.activation("mish", x), h])
    return g


def _enum(src: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(r"(RLX_ACT_\w+) = (\d+),", src)}


def test_cuda_and_metal_enums_and_switches_come_from_the_table():
    want = {e.enum: e.id for e in activation_table().entries} | {"RLX_ACT_NONE": 0}
    cuda = render_cuda(lower_to_lir(_graph(), 0, backend="cuda"), CudaTarget(gemm="builtin"), {"name": "acts"})
    lir = lower_to_lir(_graph(), 0, backend="metal")
    metal = render_metal(lir, MetalTarget(), lir.manifest()).source
    for src in (cuda, metal):
        assert _enum(src) == want
        for e in activation_table().entries:
            assert f"case {e.enum}: return" in src
        assert "rlx_mish(float x) { return x * tanh(rlx_softplus(x)); }" in src
    assert "RLX_ACT_HARDSWISH" in cuda.split("rlx_act(V x)")[1]  # the GEMM's fused activation, by its id


def test_the_cutlass_unit_reads_its_ids_from_the_table():
    table = activation_table()
    assert {e.name: e.id for e in table.entries if e.cutlass} == CUTLASS_IDS
    assert activation_defines() == tuple(f"-D{table.enum(n)}={i}" for n, i in CUTLASS_IDS.items())
    unit = (templates_dir() / "cuda" / "kernels" / "gemm_cutlass.cu").read_text()
    # the unit compares RLX_CUTLASS_ACT with the ids' names only: no number kept by hand (0 = none)
    assert re.findall(r"RLX_CUTLASS_ACT == (\w+)", unit) and all(
        v in ("0", "RLX_ACT_GELU", "RLX_ACT_SILU") for v in re.findall(r"RLX_CUTLASS_ACT == (\w+)", unit))
    assert set(CUTLASS_IDS) == {"gelu", "silu"}  # the functors the unit has (gemm_cutlass.cu's Act)


SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, -3.0, 3.0, -2.999, 2.999, 40.0, -40.0, 100.0, -100.0, 1e-6, -1e-6]


@pytest.mark.parametrize("fn", ["mish", "hardswish"])
def test_new_activations_f64_and_special_values(fn, rng):
    g = rlx.Graph(fn)
    x = g.input("x", [64], "f64")
    g.set_outputs([g.activation(fn, x)])
    xs = np.concatenate([SPECIAL, rng.standard_normal(64 - len(SPECIAL)) * 4])
    got = compile_graph(g).run({"x": xs})[0]
    want = rlx.reference.run(g, {"x": xs})[0]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    # f64 libm tanh / log1p / exp: a few ulp of 2^-53; atol: mish's tail x e^x underflows alike
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-14, atol=1e-300)


def test_new_activations_f32_special_values():
    g = rlx.Graph("special")
    x = g.input("x", [len(SPECIAL)])
    g.set_outputs([g.activation(fn, x) for fn in ("mish", "hardswish")])
    # RLX's vectorizable tanh (<= 3 ulp) and softplus compose in mish: rtol 5e-7 as the other transcendentals
    check(g, {"x": np.array(SPECIAL, np.float32)}, rtol=5e-7, atol=1e-38)


@pytest.mark.parametrize("fn", ["mish", "hardswish"])
def test_new_activations_in_a_fused_gemm_epilogue(fn, rng):
    """matmul + bias + act fuses (opt level 2) into one GEMM whose epilogue calls rlx_<fn>_f."""
    k = 32
    g = rlx.Graph(f"gemm_{fn}")
    x = g.input("x", [8, k])
    w, b = g.param("w", [k, 24]), g.param("b", [24])
    g.set_outputs([g.activation(fn, g.add_(g.matmul(x, w), b))])
    xs = rng.standard_normal((8, k)).astype(np.float32)
    ws = rng.standard_normal((k, 24)).astype(np.float32)
    bs = rng.standard_normal(24).astype(np.float32)
    cg = compile_graph(g, {"w": ws, "b": bs}, opt_level=2)
    assert f"fused_matmul_bias_act[activation={fn}]" in cg.source and f"= rlx_{fn}_f(row[j]);" in cg.source
    got = cg.run({"x": xs})[0]
    want = rlx.reference.run(g, {"x": xs}, {"w": ws, "b": bs})[0]
    # the product's error (plus the bias' rounding) through the activation, whose slope is below 1.6 for
    # both, then the activation's own few ulp
    pre = np.abs(xs.astype(np.float64) @ ws.astype(np.float64) + bs)
    bound = 1.6 * (gemm_bound(xs, ws, k) + pre * U32) + 8 * U32 * np.abs(want.astype(np.float64))
    assert_within(got, want, bound, fn)

"""Toolchain discovery and build settings: BLAS providers, ISA targets, cache-key components,
and whole transformer blocks through the optimizer (opt levels 0-3) into the CPU backend."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cpu_helpers import compile_graph

import rlx
from rlx.config import Config
from rlx.opt.memplan import plan
from rlx.pipeline.cpu import cpu_key_components
from rlx.toolchain.compiler import detect_toolchain


def _cfg(**kw: object) -> Config:
    return dataclasses.replace(Config.from_env(), **kw)


def test_default_toolchain_uses_scipy_openblas32_with_its_prefix():
    pytest.importorskip("scipy_openblas32")
    tc = detect_toolchain(_cfg(blas="openblas32"))
    assert tc.blas.provider == "openblas32" and tc.blas.prefix == "scipy_" and tc.blas.has_thread_api
    assert any(a.startswith("-Wl,-rpath,") for a in tc.blas.link_args)  # loads without LD_LIBRARY_PATH
    assert tc.openmp_flags == ("-fopenmp",) and "-march=native" in tc.flags


def test_blas_path_provider_and_bad_settings(tmp_path):
    sob = pytest.importorskip("scipy_openblas32")
    import os

    lib = os.path.join(sob.get_lib_dir(), sob.get_library(fullname=True))
    tc = detect_toolchain(_cfg(blas=lib))
    assert tc.blas.provider == "path" and tc.blas.prefix == "scipy_"
    with pytest.raises(rlx.BuildError, match="neither openblas32, system, none nor an existing library"):
        detect_toolchain(_cfg(blas=str(tmp_path / "missing.so")))
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a library")
    with pytest.raises(rlx.BuildError, match="exports no cblas_sgemm"):
        detect_toolchain(_cfg(blas=str(junk)))


def test_portable_isa_target_is_recorded_and_keyed():
    g = rlx.Graph("isa")
    x = g.input("x", [4, 4])
    g.set_outputs([g.matmul(x, x)])
    lir = plan(g)
    native = detect_toolchain(_cfg(cpu_target="native"))
    v3 = detect_toolchain(_cfg(cpu_target="x86-64-v3"))
    assert v3.isa == "x86-64-v3" and "-march=x86-64-v3" in v3.flags
    assert cpu_key_components(lir, native)["target_options"] != cpu_key_components(lir, v3)["target_options"]
    cg = rlx.Session(config=_cfg(cpu_target="x86-64-v3")).compile(g)
    assert cg.manifest["isa"]["cpu_target"] == "x86-64-v3" and "avx2" in cg.manifest["isa"]["features"]
    xv = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(cg.run(x=xv)[0], xv @ xv, rtol=1e-6)
    with pytest.raises(rlx.BuildError, match="not a valid -march value"):
        detect_toolchain(_cfg(cpu_target="x86-64; rm -rf /"))


def test_key_components_change_with_blas_and_sanitizer():
    g = rlx.Graph("keys")
    g.set_outputs([g.activation("neg", g.input("x", [2]))])
    lir = plan(g)
    base = cpu_key_components(lir, detect_toolchain(_cfg(blas="none")))
    other = cpu_key_components(lir, detect_toolchain(_cfg(blas="openblas32", sanitize="address")))
    assert base["lir"] == other["lir"] and base["templates"] == other["templates"]
    assert base["blas"] != other["blas"] and base["flags"] != other["flags"]
    assert "-fsanitize=address" in other["flags"]


def _bert_layer(seq_max: int = 32) -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    """One BERT encoder layer written with primitive ops (the optimizer fuses it)."""
    rng = np.random.default_rng(3)
    d, h, f = 64, 4, 128
    seq = rlx.Dim.dynamic("seq", max=seq_max)
    g = rlx.Graph("bert_layer")
    x = g.input("x", [2, seq, d])
    mask = g.input("mask", [2, seq], "i64")
    p = {}

    def param(name, shape, scale=0.1):
        p[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        return g.param(name, list(shape))

    def linear(v, name, n_in, n_out):
        return g.add_(g.matmul(v, g.transpose(param(name + ".w", (n_out, n_in)), [1, 0])), param(name + ".b", (n_out,)))

    q, k, v = (linear(x, n, d, d) for n in ("q", "k", "v"))
    att = g.attention(q, k, v, num_heads=h, head_dim=d // h, mask="padding", mask_input=mask)
    h1 = g.layer_norm(g.add_(linear(att, "o", d, d), x), param("ln1.g", (d,), 1.0), param("ln1.b", (d,)), eps=1e-12)
    ff = linear(g.activation("gelu", linear(h1, "up", d, f)), "down", f, d)
    out = g.layer_norm(g.add_(ff, h1), param("ln2.g", (d,), 1.0), param("ln2.b", (d,)), eps=1e-12)
    g.set_outputs([out])
    return g, p


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_bert_layer_every_opt_level(level):
    g, params = _bert_layer()
    cg = compile_graph(g, params, opt_level=level)
    rng = np.random.default_rng(level)
    for s in (1, 9, 32):
        x = rng.standard_normal((2, s, 64)).astype(np.float32)
        mask = np.ones((2, s), np.int64)
        mask[1, s // 2 + 1:] = 0
        got = cg.run(x=x, mask=mask)[0]
        want = rlx.reference.run(g, {"x": x, "mask": mask}, params)[0]
        # four chained f32 GEMM/attention stages over K <= 128 on O(1) values, then layer norm
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)

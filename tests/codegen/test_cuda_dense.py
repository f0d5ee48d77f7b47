"""The one-row decode GEMV over dense f16 / bf16 weights (`DecodeGemv` walk "dense", rlx_dgemv): which float
projections the CUDA lowering gives it (the LIR records it), what it absorbs, the switch that turns it off, and that
the rendered decoder compiles for sm_80 and sm_90 (nvcc, no GPU). The kernel's numbers: tests/codegen/
test_cuda_dense_emulated.py (CPU shim) and tests/gpu/test_cuda_dense_decode.py (a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlx
from rlx.codegen.cuda import CudaTarget
from rlx.errors import BuildError
from rlx.ir.decisions_cuda import DecodeGemv, DeviceLayout
from rlx.ir.decisions_cuda_kernels import NormInGemm
from rlx.ir.dtype import DType
from rlx.pipeline.cuda import decide_cuda, render_cuda
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc


def _toolchain(arch: str) -> NvccToolchain:
    try:
        path, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    return NvccToolchain(path, text, arch, find_cublas(path))


def float_decoder(hidden: int = 256, ffn: int = 512, vocab: int = 64, max_batch: int = 2) -> rlx.Graph:
    """One LLaMA layer with bf16 weights as a GGUF file holds them (CUDA: f32 params [K, N], stored in the build's
    precision), an untied head."""
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import WeightSpec, build_decoder, random_specs

    cfg = DecoderConfig(arch="llama", vocab_size=vocab, hidden_size=hidden, num_layers=1, num_heads=4, num_kv_heads=2,
                        head_dim=hidden // 4, ffn_size=ffn, rms_eps=1e-5, rope_base=10000.0,
                        rope_variant="interleaved", n_rot=hidden // 4, context_length=64, tie_embeddings=False,
                        bos_id=1, eos_id=2)
    specs = {n: s if len(s.shape) == 1 else WeightSpec("bf16", s.shape) for n, s in random_specs(cfg).items()}
    return build_decoder(cfg, specs, max_batch=max_batch, max_seq=8, capacity=32)


def _decided(g: rlx.Graph, target: CudaTarget):
    from rlx.driver import lower_to_lir

    return decide_cuda(lower_to_lir(g, 2, backend="cuda"), target)


def test_float_decoder_records_the_dense_walk() -> None:
    """f16 and bf16 builds: Q/K/V with the attention norm, the output projection, the fused_swiglu with the FFN norm,
    the down projection and the head with the final norm each record one `DecodeGemv` of walk "dense" (one row), and
    the LIR's text says so; the norms keep their small-GEMM prologue for larger steps (`NormInGemm`); the default
    target takes it. f32 builds and a target with it off (RLX_DENSE_GEMV=0 through Config) record none."""
    from rlx.config import Config
    from rlx.pipeline.cuda import CudaStages

    for precision in (DType.F16, DType.BF16):
        lir = _decided(float_decoder(), CudaTarget(dense_gemv=True, precision=precision, gemm="cublaslt"))
        found = lir.decided(DecodeGemv)
        kinds = [tuple(lir.graph.node(m).kind for m in d.members) for d in found]
        assert kinds == [("matmul",) * 3, ("matmul",), ("fused_swiglu",), ("matmul",), ("matmul",)]
        assert all(d.walk == "dense" and d.max_rows == 1 for d in found)
        assert [bool(d.norm) for d in found] == [True, False, True, False, True]
        assert [bool(d.residual) for d in found] == [False, True, False, True, False]
        assert all("a dense 16-bit GEMV over the weights as stored" in d.describe() for d in found)
        assert lir.inspect().count("a dense 16-bit GEMV over the weights as stored") == 5
        norms = {d.norm for d in lir.decided(NormInGemm)}
        assert {found[0].norm[0], found[4].norm[0]} <= norms
    assert not _decided(float_decoder(), CudaTarget(dense_gemv=True, precision=DType.F32)).decided(DecodeGemv)
    default = CudaTarget(precision=DType.F16)  # on by default since the GPU timed it (docs/perf-h100.md)
    assert len(_decided(float_decoder(), default).decided(DecodeGemv)) == 5
    off = CudaTarget(dense_gemv=False, precision=DType.F16)
    assert not _decided(float_decoder(), off).decided(DecodeGemv)
    assert "dense_gemv" not in default.identity() and "dense_gemv=0" in off.identity()
    assert CudaStages(Config.from_env({"RLX_DENSE_GEMV": "0"})).target_options["dense_gemv"] is False
    assert "dense_gemv" not in CudaStages(Config.from_env({})).target_options
    # the tiles' width: chosen per launch, or forced (RLX_DENSE_GEMV_TILE, through Config: the LIR records it)
    assert all("column tiles sized per launch" in d.describe() for d in found)
    wide = _decided(float_decoder(), CudaTarget(dense_gemv=True, precision=DType.F16, dense_tile=64))
    assert {d.dense_tile for d in wide.decided(DecodeGemv)} == {64}
    assert wide.inspect().count("tiles of 64 columns") == 5
    assert CudaStages(Config.from_env({"RLX_DENSE_GEMV_TILE": "16"})).target_options["dense_tile"] == 16
    with pytest.raises(BuildError, match="dense_tile"):
        CudaTarget(dense_gemv=True, precision=DType.F16, dense_tile=12)
    # K split over blocks: chosen per launch (the scratch region holds 16 splits' f32 partials), none, or forced
    # (RLX_DENSE_GEMV_SPLIT, through Config: the LIR records it and sizes the scratch region for it)
    assert all(d.dense_split == 0 and "K split over blocks (as many as chosen per launch)" in d.describe()
               for d in found)
    assert _decided(float_decoder(), CudaTarget(dense_gemv=True, precision=DType.F16,
                                                dense_tile=512)).inspect().count("tiles of 512 columns") == 5
    # (the widest partials: the gate's and the up's 512 columns x 16 splits, f32)
    (layout,) = lir.decided(DeviceLayout)
    assert {r.name: r.nbytes for r in layout.regions}["scratch"] >= 16 * 2 * 512 * 4
    none = _decided(float_decoder(), CudaTarget(dense_gemv=True, precision=DType.F16, dense_split=1))
    assert none.inspect().count("K split over a block's threads only") == 5
    four = _decided(float_decoder(), CudaTarget(dense_gemv=True, precision=DType.F16, dense_split=4))
    assert {d.dense_split for d in four.decided(DecodeGemv)} == {4}
    assert four.inspect().count("K split over 4 blocks (partials added in split order)") == 5
    assert "dense_split=4" in CudaTarget(precision=DType.F16, dense_split=4).identity()
    assert "dense_split" not in default.identity()
    assert CudaStages(Config.from_env({"RLX_DENSE_GEMV_SPLIT": "8"})).target_options["dense_split"] == 8
    assert "dense_split" not in CudaStages(Config.from_env({})).target_options
    for bad in (-1, 65, True):
        with pytest.raises(BuildError, match="dense_split"):
            CudaTarget(dense_gemv=True, precision=DType.F16, dense_split=bad)


def test_llama3_8b_shaped_float_decoder_takes_the_dense_walk_everywhere() -> None:
    """At the 8B shape (hidden 4096, FFN 14336, vocabulary 128256, GQA 32/8), every projection of a one-row step is a
    dense GEMV: Q/K/V (6144 columns), output + residual, gate/up + SwiGLU, down + residual (K = 14336) and the
    vocabulary head (128256 x 4096) with the final norm: four launches a layer, as the q4_k decoder's."""
    from rlx.driver import lower_to_lir
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import WeightSpec, build_decoder, random_specs

    cfg = DecoderConfig(arch="llama", vocab_size=128256, hidden_size=4096, num_layers=1, num_heads=32,
                        num_kv_heads=8, head_dim=128, ffn_size=14336, rms_eps=1e-5, rope_base=500000.0,
                        rope_variant="neox", n_rot=128, context_length=64, tie_embeddings=False, bos_id=1, eos_id=2)
    specs = {n: s if len(s.shape) == 1 else WeightSpec("bf16", s.shape) for n, s in random_specs(cfg).items()}
    g = build_decoder(cfg, specs, max_batch=1, max_seq=8, capacity=64)
    target = CudaTarget(dense_gemv=True, precision=DType.F16, gemm="cublaslt")
    lir = decide_cuda(lower_to_lir(g, 2, backend="cuda"), target)
    found = lir.decided(DecodeGemv)
    node = lir.graph.node
    shapes = [(tuple(node(m).kind for m in d.members), node(node(d.members[0]).inputs[0]).shape.dims[-1].value,
               sum(node(m).shape.dims[-1].value for m in d.members), bool(d.norm), bool(d.residual)) for d in found]
    assert shapes[0] == (("matmul",) * 3, 4096, 6144, True, False)
    assert shapes[2] == (("fused_swiglu",), 4096, 14336, True, False)
    assert shapes[3] == (("matmul",), 14336, 4096, False, True)
    assert shapes[4] == (("matmul",), 4096, 128256, True, False)  # the vocabulary head
    assert shapes[1] == (("matmul",), 4096, 4096, False, True)
    assert all(d.walk == "dense" for d in found)


@pytest.mark.parametrize(("precision", "arch"), [("f16", "sm_90"), ("bf16", "sm_90"), ("f16", "sm_80"),
                                                 ("bf16", "sm_80")])
def test_float_decoder_with_the_dense_gemv_compiles(precision: str, arch: str, tmp_path: Path) -> None:
    """The decoder's one-row steps launch rlx_dgemv (bf16 weights read as bf16 in a bf16 build, as f16 in an f16
    one) for each group, and its larger steps its GEMMs; the source compiles for sm_80 and sm_90."""
    tc = _toolchain(arch)
    target = CudaTarget(dense_gemv=True, precision=DType.parse(precision),
                        gemm="cublaslt" if tc.cublas.found else "builtin", arch=arch)
    lir = _decided(float_decoder(), target)
    src = render_cuda(lir, target, {"name": f"dense_{precision}"})
    t = "__half" if precision == "f16" else "rlx_bf16"
    bf = "true" if precision == "bf16" else "false"
    # each group: the unsplit launch and the K-split one (chosen per launch) with its rlx_dgemv_reduce
    assert src.count(f"rlx_launch_pdl(c->pdl, rlx_dgemv<{t}, {bf}, ") == 10
    launches = {args: src.count(f"rlx_launch_pdl(c->pdl, rlx_dgemv<{t}, {bf}, {args}>")
                for args in ("true, 0, true, false", "false, 1, true, false", "true, 2, true, false",
                             "true, 0, true, true", "false, 1, true, true", "true, 2, true, true")}
    assert launches == {"true, 0, true, false": 2, "false, 1, true, false": 2, "true, 2, true, false": 1,
                        "true, 0, true, true": 2, "false, 1, true, true": 2, "true, 2, true, true": 1}
    reduces = {epi: src.count(f"rlx_launch_pdl(c->pdl, rlx_dgemv_reduce<{t}, {epi}>") for epi in (0, 1, 2)}
    assert reduces == {0: 2, 1: 2, 2: 1}
    assert src.count("if (M == 1) {") == 5 and src.count("(mem, K, wave, 6, 1, 1, 16, &lg, &nsplit);") == 5
    # a forced tile without the split: today's single launch, no partials, no second kernel
    forced = CudaTarget(dense_gemv=True, precision=target.precision, gemm=target.gemm, arch=arch, dense_tile=8,
                        dense_split=1)
    fsrc = render_cuda(_decided(float_decoder(), forced), forced, {"name": "forced"})
    assert fsrc.count("(mem, K, wave, 0, 0, 1, 1, &lg, &nsplit);") == 5
    assert "rlx_launch_pdl(c->pdl, rlx_dgemv_reduce" not in fsrc and "dim3(gx, (unsigned)nsplit)" not in fsrc
    # a forced split (4) with wide tiles chosen per launch
    split = CudaTarget(dense_gemv=True, precision=target.precision, gemm=target.gemm, arch=arch, dense_split=4)
    ssrc = render_cuda(_decided(float_decoder(), split), split, {"name": "split"})
    assert ssrc.count("(mem, K, wave, 6, 1, 4, 4, &lg, &nsplit);") == 5
    for name, text in (("auto", src), ("split", ssrc)):
        path = tmp_path / f"dense_{precision}_{arch}_{name}.cu"
        path.write_text(text)
        tc.compile(path, path.with_suffix(".o"), target.gemm, compile_only=True)


def test_odd_widths_take_two_byte_loads_and_compile(tmp_path: Path) -> None:
    """Projections whose N is not a multiple of 8 (here 100 and 37 columns, a vocabulary of 37) take rlx_dgemv's
    2-byte loads (VEC false); the x of a lone GEMV is a graph input; the source compiles for sm_90."""
    tc = _toolchain("sm_90")
    g = rlx.Graph("odd")
    x = g.input("x", [rlx.Dim.dynamic("m", 4), 64])
    a = g.matmul(x, g.param("wa", [64, 100]))
    b = g.matmul(x, g.param("wb", [64, 37]))
    g.set_outputs([a, b])
    target = CudaTarget(dense_gemv=True, precision=DType.BF16, gemm="builtin", arch="sm_90")
    lir = _decided(g, target)
    assert [d.members for d in lir.decided(DecodeGemv)] == [(a, b)]
    src = render_cuda(lir, target, {"name": "odd"})
    assert "rlx_dgemv<rlx_bf16, true, false, 0, false, false>" in src
    assert "rlx_dgemv<rlx_bf16, true, false, 0, false, true>" in src
    path = tmp_path / "odd.cu"
    path.write_text(src)
    tc.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)


def test_a_norm_the_dense_gemv_does_not_compute_runs_its_own_kernel_in_one_row_steps() -> None:
    """Gemma's MLP: the pre-FFN norm is read by the up projection (a dense GEMV alone: the gate's matmul + GELU is a
    fused op, not a member) and by the gate. The dense GEMV of a one-row step reads the norm's output, so the norm
    may not be left to the small GEMM's prologue (`NormInGemm`), which does not run in that step (found on an H200:
    gemma3_text f16 one-row steps read the norm's output of the prompt's step, cosine 0.69 then NaN)."""
    g = rlx.Graph("gemma_mlp")
    x = g.input("x", [rlx.Dim.dynamic("m", max=64), 256])
    n = g.rms_norm(x, g.param("gamma", [256]), eps=1e-6)
    up = g.matmul(n, g.param("w_up", [256, 128]))
    gate = g.activation("gelu", g.matmul(n, g.param("w_gate", [256, 128])))
    g.set_outputs([g.mul(gate, up)])
    lir = _decided(g, CudaTarget(dense_gemv=True, precision=DType.F16))
    dense = [d for d in lir.decided(DecodeGemv) if d.walk == "dense"]
    assert dense and not any(d.norm for d in dense)  # the norm has two readers: no dense group absorbs it
    members = {m for d in dense for m in d.members}
    assert not [d for d in lir.decided(NormInGemm) if d.gemm in members]

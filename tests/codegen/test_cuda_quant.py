"""Compile-only checks of the CUDA quantized-weight rules (nvcc, no GPU): every format, every precision.

The numerical checks run on a GPU in tests/gpu/test_cuda_quant.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from render_cases import tiny_decoder

import rlx
from rlx.codegen.cuda import CudaTarget
from rlx.errors import BuildError
from rlx.ir import quant as Q
from rlx.ir.decisions_cuda import DecodeGemv, DequantCopy, DeviceLayout
from rlx.ir.dtype import DType
from rlx.opt.memplan import plan
from rlx.pipeline.cuda import decide_cuda, render_cuda
from rlx.toolchain.cuda import NvccToolchain


def every_format_graph(n: int = 19) -> rlx.Graph:
    """One dequant_matmul per format on a shared activation, and a dequantized embedding gather."""
    g = rlx.Graph("quant_formats")
    m = rlx.Dim.dynamic("m", 64)
    x = g.input("x", [m, 256])
    outs = {f: g.dequant_matmul(x, g.param(f, [n, Q.row_bytes(f, 256)], "u8"), quant=f)
            for f in sorted(Q.QUANT_FORMATS)}
    table = g.param("emb", [7, Q.row_bytes("q8_0", 256)], "u8")
    outs["emb"] = g.dequantize(g.gather(table, g.input("ids", [m], "i32")), quant="q8_0")
    g.set_outputs(outs)
    return g


def _compile(tc: NvccToolchain, g: rlx.Graph, target: CudaTarget, tmp_path: Path) -> str:
    src = render_cuda(plan(g), target, {"name": g.name})
    path = tmp_path / f"{g.name}_{target.precision.value}_{target.gemm}.cu"
    path.write_text(src)
    tc.compile(path, path.with_suffix(".o"), target.gemm, compile_only=True)
    return src


@pytest.mark.parametrize("precision", ["f32", "f16"])  # bf16 renders the same code with another type
def test_every_format_compiles(toolchain: NvccToolchain, precision: str, tmp_path: Path) -> None:
    src = _compile(toolchain, every_format_graph(), CudaTarget(precision=DType.parse(precision), gemm="builtin"),
                   tmp_path)
    for fid in ("RLX_Q8_0", "RLX_Q4_0", "RLX_Q4_1", "RLX_Q5_0", "RLX_Q5_1", "RLX_Q4_K", "RLX_Q6_K"):
        assert f"rlx_qgemv<{'float' if precision == 'f32' else ('__half' if precision == 'f16' else 'rlx_bf16')}, " \
               f"{fid}" in src
    assert "rlx_gemm_tiled<" in src and "rlx_qdequant_rows<" in src


def test_cublaslt_prefill_and_split_weight_compile(toolchain: NvccToolchain, tmp_path: Path) -> None:
    """A vocabulary-sized weight without a dequantized copy (`dequant_copies=0`) is dequantized in column tiles
    (bounded scratch) and multiplied on cuBLASLt."""
    g = rlx.Graph("quant_lt")
    x = g.input("x", [rlx.Dim.dynamic("m", 256), 576])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [49152, Q.row_bytes("q8_0", 576)], "u8"), quant="q8_0")])
    target = CudaTarget(precision=DType.F16, dequant_copies=0)
    src = render_cuda(plan(g), target, {"name": g.name})
    assert "rlx_lt_matmul(c, CUDA_R_16F" in src and "rlx_q_put_cols<__half>" in src
    if not toolchain.cublas.found:
        pytest.skip("cublasLt.h not found (pip install 'rlx[cuda]' adds the nvidia-cublas wheel)")
    _compile(toolchain, g, target, tmp_path)


def test_unknown_format_is_refused_before_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx.codegen.backends import first_unsupported_op
    from rlx.codegen.cuda import quant as cuda_quant

    g = every_format_graph()
    monkeypatch.delitem(cuda_quant.FORMAT_IDS, "q6_k")
    node, reason = first_unsupported_op(g, "cuda")
    assert node.kind == "dequant_matmul" and "'q6_k'" in reason


def test_int16_activations_are_refused_on_cuda() -> None:
    from rlx.codegen.backends import first_unsupported_op, supports

    g = rlx.Graph("q16act")
    x = g.input("x", [2, 64])
    g.set_outputs([g.dequant_matmul(x, g.param("w", [3, 68], "u8"), quant="q8_0", act="q16")])
    node, reason = first_unsupported_op(g, "cuda")
    assert node.kind == "dequant_matmul" and "act='q16'" in reason
    g8 = rlx.Graph("q8act")
    g8.set_outputs([g8.dequant_matmul(g8.input("x", [2, 64]), g8.param("w", [3, 68], "u8"), quant="q8_0", act="q8")])
    assert supports(g8, "cuda")


def test_int8_activation_decoder_compiles(toolchain: NvccToolchain, tmp_path: Path) -> None:
    """act="q8" (kernels/quant_q8.cuh) in a decoder step (q4_1), beside one projection of each other format CUDA
    takes it for: every fused decode GEMV group (the norm, the residual add, the SwiGLU epilogue) takes its ACT = 1
    path, steps of 5-8 rows quantize X into scratch records for rlx_q8_gemv, larger ones multiply x' = q * d on the
    dequantize + GEMM path."""
    from rlx.driver import lower_to_lir
    from rlx.opt.lowering_cuda import find_decode_gemvs

    g = tiny_decoder("q8")
    x = g.input("xq", [rlx.Dim.dynamic("m", 16), 256])
    lone = {f"q8act_{f}": g.dequant_matmul(x, g.param(f"w_{f}", [19, Q.row_bytes(f, 256)], "u8"), quant=f, act="q8")
            for f in ("q8_0", "q4_0", "q4_k")}
    g.set_outputs(dict(zip(g.output_names, g.outputs)) | lone)
    lir = lower_to_lir(g, 2, backend="cuda")
    acts = {lir.graph.node(m).op.act for d in find_decode_gemvs(lir) for m in d.members}
    assert acts == {"q8"}
    src = render_cuda(lir, CudaTarget(precision=DType.F16, gemm="builtin"), {"name": "decoder_q8"})
    # (4 groups a layer x 2 layers + the output head + the 3 lone projections) x a launch for 1..4 rows, every one
    # with int8 activations
    assert src.count("rlx_launch_pdl(c->pdl, rlx_qgemv_fused<") == (4 * 2 + 1 + 3) * 4
    assert src.count("rlx_launch_pdl(c->pdl, rlx_qgemv_fused<__half, RLX_Q4_1, 32, 20, 1, true, 0, 1>") == 3
    assert "rlx_qgemv_fused<__half, RLX_Q4_K, 256, 144, 4, false, 0, 1>" in src and "rlx_q8_act<__half>" in src
    for fid in ("RLX_Q8_0", "RLX_Q4_0", "RLX_Q4_1", "RLX_Q4_K"):
        assert f"rlx_q8_gemv<__half, {fid}, 8>" in src
    assert "rlx_qgemv<" not in src.split("static int rlx_forward")[1]  # no f32-activation GEMV left
    path = tmp_path / "decoder_q8.cu"
    path.write_text(src)
    toolchain.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)


def _q4k_decoder(fmt: str = "q4_k", quant_act: str = "f32") -> rlx.Graph:
    """One LLaMA layer, q4_k (or `fmt`), hidden 2048 and FFN 2304: every decode GEMV has K >= 2048 (rlx_qgemv_xr's
    rows); `quant_act` "q8": int8 activations for every format CUDA takes them in."""
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import WeightSpec, build_decoder, random_specs

    cfg = DecoderConfig(arch="llama", vocab_size=64, hidden_size=2048, num_layers=1, num_heads=16, num_kv_heads=4,
                        head_dim=128, ffn_size=2304, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                        n_rot=128, context_length=64, tie_embeddings=False, bos_id=1, eos_id=2)
    specs = {name: spec if len(spec.shape) == 1 else WeightSpec(fmt, spec.shape)
             for name, spec in random_specs(cfg).items()}
    acts = {"quant_act": quant_act, "quant_act_formats": Q.INT8_ACT_FORMATS} if quant_act != "f32" else {}
    return build_decoder(cfg, specs, max_batch=2, max_seq=8, capacity=32, **acts)


def test_q4k_decoder_takes_the_register_walk(toolchain: NvccToolchain, tmp_path: Path) -> None:
    """Asked for it (`gemv_walk="xreg"`, RLX_QGEMV_WALK=xreg), q4_k decode GEMVs with K >= 2048 record walk="xreg"
    (DecodeGemv) and launch rlx_qgemv_xr for one-row steps (the fused kernel for 2-4 rows);
    `CudaTarget(gemv_walk="rows")` (RLX_QGEMV_WALK=rows) records and renders the old walk, and `xr_groups` forces the
    groups. The xreg source compiles for sm_90."""
    from rlx.config import Config
    from rlx.driver import lower_to_lir
    from rlx.opt.lowering_cuda import find_decode_gemvs
    from rlx.pipeline.cuda import CudaStages, decide_cuda

    lir = lower_to_lir(_q4k_decoder(), 2, backend="cuda")
    found = find_decode_gemvs(lir, "xreg")
    assert found and {(d.walk, d.xr_groups) for d in found} == {("xreg", 4), ("xreg", 2)}  # K 2048: 2 slabs, 2304: 3
    target = CudaTarget(precision=DType.F16, gemm="builtin", gemv_walk="xreg")
    src = render_cuda(lir, target, {"name": "decoder_xr"})
    launches = src.count("rlx_launch_pdl(c->pdl, rlx_qgemv_xr<__half, RLX_Q4_K, 256, 144, ")
    assert launches == len(found) and "rlx_qgemv_xr<__half, RLX_Q4_K, 256, 144, true, 2, 4>" in src
    assert "rlx_qgemv_xr<__half, RLX_Q4_K, 256, 144, false, 1, 2>" in src  # the down projection, K = 2304
    path = tmp_path / "decoder_xr.cu"
    path.write_text(src)
    toolchain.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)
    rows = CudaTarget(precision=DType.F16, gemm="builtin", gemv_walk="rows")
    old = decide_cuda(lower_to_lir(_q4k_decoder(), 2, backend="cuda"), rows)
    assert {(d.walk, d.xr_groups) for d in old.decided(DecodeGemv)} == {("rows", 0)}
    assert "rlx_qgemv_xr<" not in render_cuda(old, rows, {"name": "d"})
    assert {(d.walk, d.xr_groups) for d in find_decode_gemvs(lir, "xreg", groups=1)} == {("xreg", 1)}
    # the environment reaches the target through Config (and so the cache key), never the lowering directly
    stages = CudaStages(Config.from_env({"RLX_QGEMV_WALK": "rows", "RLX_QGEMV_XR_GROUPS": "2"}))
    assert stages.target_options["gemv_walk"] == "rows" and stages.target_options["xr_groups"] == 2
    assert "gemv_walk" not in CudaStages(Config.from_env({})).target_options


def test_q4k_decoder_takes_the_occupancy_walk_when_asked(toolchain: NvccToolchain, tmp_path: Path) -> None:
    """`CudaTarget(gemv_walk="occ")` (RLX_QGEMV_WALK=occ) records walk="occ" with 2 weight rows an item on every q4_k
    decode GEMV (DecodeGemv, in the LIR's description too) and launches rlx_qgemv_occ for one-row steps (the fused
    kernel for 2-4 rows); "occ4" takes 4 rows an item, "occp" 2 and prefetches the next item; "auto" (the default)
    takes "occ4" at these K (occ8 and occ4p also compile). The source compiles for sm_90."""
    from rlx.config import Config
    from rlx.pipeline.cuda import CudaStages

    target = CudaTarget(precision=DType.F16, gemm="builtin", gemv_walk="occ")
    lir = decide_cuda(lower_to_lir_cuda(_q4k_decoder()), target)
    found = lir.decided(DecodeGemv)
    assert found and {(d.walk, d.xr_groups, d.occ_rows) for d in found} == {("occ", 0, 2)}
    assert all("K split over the warps (2 weight rows an item)" in d.describe() for d in found)
    src = render_cuda(lir, target, {"name": "decoder_occ"})
    assert src.count("rlx_launch_pdl(c->pdl, rlx_qgemv_occ<__half, RLX_Q4_K, 256, 144, ") == len(found)
    assert "rlx_qgemv_occ<__half, RLX_Q4_K, 256, 144, true, 2, 2, false>" in src and "rlx_qgemv_xr<" not in src
    assert "rlx_qgemv_occ<__half, RLX_Q4_K, 256, 144, false, 1, 2, false>" in src  # the down projection + residual
    path = tmp_path / "decoder_occ.cu"
    path.write_text(src)
    toolchain.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)
    four = CudaTarget(precision=DType.F16, gemm="builtin", gemv_walk="occ4")
    lir4 = decide_cuda(lower_to_lir_cuda(_q4k_decoder()), four)
    assert {(d.walk, d.occ_rows) for d in lir4.decided(DecodeGemv)} == {("occ", 4)}
    assert "rlx_qgemv_occ<__half, RLX_Q4_K, 256, 144, true, 2, 4, false>" in render_cuda(lir4, four, {"name": "d"})
    pf = CudaTarget(precision=DType.F16, gemm="builtin", gemv_walk="occp")
    lirp = decide_cuda(lower_to_lir_cuda(_q4k_decoder()), pf)
    assert {(d.walk, d.occ_rows, d.occ_prefetch) for d in lirp.decided(DecodeGemv)} == {("occ", 2, True)}
    assert "rlx_qgemv_occ<__half, RLX_Q4_K, 256, 144, true, 2, 2, true>" in render_cuda(lirp, pf, {"name": "d"})
    stages = CudaStages(Config.from_env({"RLX_QGEMV_WALK": "occ"}))
    assert stages.target_options["gemv_walk"] == "occ"
    auto = decide_cuda(lower_to_lir_cuda(_q4k_decoder()), CudaTarget(precision=DType.F16, gemm="builtin"))
    assert {(d.walk, d.occ_rows, d.occ_prefetch) for d in auto.decided(DecodeGemv)} == {("occ", 4, False)}
    for walk, rows, prefetch in (("occ8", 8, "false"), ("occ4p", 4, "true")):
        other = CudaTarget(precision=DType.F16, gemm="builtin", gemv_walk=walk)
        lir_other = decide_cuda(lower_to_lir_cuda(_q4k_decoder()), other)
        assert {(d.walk, d.occ_rows) for d in lir_other.decided(DecodeGemv)} == {("occ", rows)}
        src = render_cuda(lir_other, other, {"name": f"decoder_{walk}"})
        assert f"rlx_qgemv_occ<__half, RLX_Q4_K, 256, 144, true, 2, {rows}, {prefetch}>" in src
        path = tmp_path / f"decoder_{walk}.cu"
        path.write_text(src)
        toolchain.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)
    with pytest.raises(BuildError, match="gemv_walk must be one of"):
        CudaTarget(gemv_walk="occ3")


@pytest.mark.parametrize("fmt", ["q4_k", "q8_0"])
def test_int8_activation_decoder_takes_the_occupancy_walk(toolchain: NvccToolchain, tmp_path: Path, fmt: str) -> None:
    """act="q8" (`quant_act="q8"`): "auto" records the occupancy walk on every decode GEMV at these K (q4_k 8 rows an
    item, q8_0 4: DECODE_OCC_AUTO_Q8), with int8 activations in the LIR's description, and launches rlx_qgemv_occ
    with ACT = 1 for one-row steps (rlx_qgemv_fused's int8 path, ACT = 1, for 2-4 rows); "occ4" / "occ8" force 4 / 8
    rows an item; "rows" keeps the old walk. The sources compile for sm_90."""
    fid = {"q4_k": "RLX_Q4_K, 256, 144", "q8_0": "RLX_Q8_0, 32, 34"}[fmt]
    for walk, rows in (("auto", 8 if fmt == "q4_k" else 4), ("occ4", 4), ("occ8", 8)):
        target = CudaTarget(precision=DType.F16, gemm="builtin", **({} if walk == "auto" else {"gemv_walk": walk}))
        lir = decide_cuda(lower_to_lir_cuda(_q4k_decoder(fmt, "q8")), target)
        found = lir.decided(DecodeGemv)
        assert found and {(d.walk, d.occ_rows, d.act) for d in found} == {("occ", rows, "q8")}
        assert all(f"({rows} weight rows an item, int8 activations quantized in registers)" in d.describe()
                   for d in found)
        src = render_cuda(lir, target, {"name": f"decoder_occ_q8_{walk}"})
        assert src.count(f"rlx_launch_pdl(c->pdl, rlx_qgemv_occ<__half, {fid}, ") == len(found)
        assert f"rlx_qgemv_occ<__half, {fid}, true, 2, {rows}, false, 1>" in src  # norm + gate/up + SwiGLU
        assert f"rlx_qgemv_occ<__half, {fid}, false, 1, {rows}, false, 1>" in src  # the down projection + residual
        assert f"rlx_qgemv_fused<__half, {fid}, 2, true, 2, 1>" in src  # two rows: the int8 rows walk
        path = tmp_path / f"decoder_occ_q8_{walk}.cu"
        path.write_text(src)
        toolchain.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)
    rows_target = CudaTarget(precision=DType.F16, gemm="builtin", gemv_walk="rows")
    old = decide_cuda(lower_to_lir_cuda(_q4k_decoder(fmt, "q8")), rows_target)
    assert {(d.walk, d.act) for d in old.decided(DecodeGemv)} == {("rows", "q8")}
    assert all(d.describe().endswith(", int8 activations") for d in old.decided(DecodeGemv))
    assert "rlx_qgemv_occ<" not in render_cuda(old, rows_target, {"name": "d"})


def lower_to_lir_cuda(g: rlx.Graph):
    from rlx.driver import lower_to_lir

    return lower_to_lir(g, 2, backend="cuda")


def test_large_steps_multiply_a_dequantized_copy(toolchain: NvccToolchain, tmp_path: Path) -> None:
    """f16 / bf16 builds keep each quantized weight whose steps can outgrow its GEMVs and rlx_qmma (here up to 64
    rows; rlx_qmma takes this small weight's steps up to 16) also dequantized, in the params region
    (`DequantCopy`): set_param dequantizes the blocks into it, and a large step is one GEMM on it instead of a
    dequantize kernel and a GEMM per tile. The copies follow the byte budget in schedule order; f32 builds and a
    budget of 0 keep none; the gathered embedding table has none (no dequant_matmul reads it)."""
    from rlx.config import Config
    from rlx.pipeline.cuda import CudaStages

    target = CudaTarget(precision=DType.F16, gemm="cublaslt")
    lir = decide_cuda(plan(every_format_graph()), target)
    copies = lir.decided(DequantCopy)
    layout = lir.decided(DeviceLayout)[0]
    fused = {m for d in lir.decided(DecodeGemv) for m in d.members}
    names = {lir.graph.node(d.weight).name for d in copies}
    assert names == set(Q.QUANT_FORMATS) and "emb" not in names
    spans = sorted((d.offset, d.offset + d.nbytes) for d in copies)
    params = [(p.offset, p.offset + lir.graph.node(spec.node).shape.max_numel) for p, spec in
              zip(layout.params, lir.params)]
    for d in copies:
        assert (d.n, d.k, d.nbytes) == (19, 256, 19 * 256 * 2) and len(d.readers) == 1
        # past a fused decode GEMV's rows (it reads the weight once for them all), else past one row
        assert d.min_rows == ((5,) if d.readers[0] in fused else (2,))
        assert d.offset + d.nbytes <= layout.params_end  # with the params: rlx_clone copies them
        assert lir.params[d.slot].node == d.weight and "dequantized copy" in d.describe()
    assert all(hi <= lo2 for (_, hi), (lo2, _) in itertools.pairwise(spans))
    assert all(hi <= lo2 or hi2 <= lo for lo, hi in spans for lo2, hi2 in params)  # apart from every param
    src = render_cuda(lir, target, {"name": "copies"})
    assert src.count("/* DequantCopy: the blocks also dequantized into the [256, 19] copy") == len(Q.QUANT_FORMATS)
    assert src.count("if (rlx_lt_matmul(c, CUDA_R_16F, M, N, K, 1, 0, 0, M * N, X, wc, Y, NULL") == len(Q.QUANT_FORMATS)
    path = tmp_path / "copies.cu"
    path.write_text(src)
    toolchain.compile(path, path.with_suffix(".o"), "cublaslt", compile_only=True)
    # the built-in GEMM multiplies the copy too (bf16)
    builtin = CudaTarget(precision=DType.BF16, gemm="builtin")
    bsrc = render_cuda(plan(every_format_graph()), builtin, {"name": "copies_bf16"})
    tiled = "rlx_gemm_tiled<rlx_bf16, RLX_ACT_NONE, false><<<grid, 256, 0, st>>>(X, wc, "
    assert bsrc.count(tiled) == len(Q.QUANT_FORMATS)
    bpath = tmp_path / "copies_bf16.cu"
    bpath.write_text(bsrc)
    toolchain.compile(bpath, bpath.with_suffix(".o"), "builtin", compile_only=True)
    # the budget: none at 0 or in f32; three copies' bytes keep the first three in schedule order
    assert not decide_cuda(plan(every_format_graph()), CudaTarget(precision=DType.F16, dequant_copies=0)) \
        .decided(DequantCopy)
    assert not decide_cuda(plan(every_format_graph()), CudaTarget(precision=DType.F32)).decided(DequantCopy)
    three = decide_cuda(plan(every_format_graph()), CudaTarget(precision=DType.F16, dequant_copies=3 * 19 * 256 * 2))
    order = [n for n in three.schedule if n in {d.readers[0] for d in copies}]
    assert [d.readers[0] for d in three.decided(DequantCopy)] == order[:3]
    assert "dequant_copies=0" in CudaTarget(dequant_copies=0).identity() and "dequant" not in CudaTarget().identity()
    with pytest.raises(BuildError, match="dequant_copies"):
        CudaTarget(dequant_copies=-1)
    # a decoder's fused decode GEMVs keep their rows (<= 4 here); the copies take 5 and more (a step of 32 rows)
    from render_cases import _tiny_decoder_parts

    from rlx.models.llama import build_decoder

    cfg, specs = _tiny_decoder_parts()
    dec = decide_cuda(plan(build_decoder(cfg, specs, max_batch=32, max_seq=1, capacity=32)), target)
    fused = {m for d in dec.decided(DecodeGemv) for m in d.members}
    assert dec.decided(DequantCopy) and all(
        m == (5 if r in fused else 2) for d in dec.decided(DequantCopy) for r, m in zip(d.readers, d.min_rows))
    assert fused & {r for d in dec.decided(DequantCopy) for r in d.readers}
    # the attention output and FFN down projections' GEMMs add their residual (cuBLASLt's C): the adds' own kernels
    # are gone (the fused GEMV writes the sum in decode steps)
    adds = {a for d in dec.decided(DequantCopy) for a in d.adds}
    residuals = {a for d in dec.decided(DecodeGemv) for a in d.residual}
    assert adds == residuals and adds
    dsrc = render_cuda(dec, target, {"name": "dec_copies"})
    assert dsrc.count("rlx_lt_matmul_add(c, CUDA_R_16F, M, N, K, X, wc, ") == len(adds)
    for a in adds:
        assert f"%{a}: written by %" in dsrc and f"/* %{a} binary" not in dsrc
    dpath = tmp_path / "dec_copies.cu"
    dpath.write_text(dsrc)
    toolchain.compile(dpath, dpath.with_suffix(".o"), "cublaslt", compile_only=True)
    builtin_dec = decide_cuda(plan(build_decoder(cfg, specs, max_batch=32, max_seq=1, capacity=32)),
                              CudaTarget(precision=DType.F16, gemm="builtin"))
    assert builtin_dec.decided(DequantCopy) and not any(d.adds for d in builtin_dec.decided(DequantCopy))
    # int8 activations keep their q8 GEMV over records up to 8 rows: the copy takes 9 and more
    q8 = rlx.Graph("q8copy")
    xq = q8.input("x", [rlx.Dim.dynamic("m", 64), 256])
    q8.set_outputs([q8.dequant_matmul(xq, q8.param("w", [37, Q.row_bytes("q4_1", 256)], "u8"), quant="q4_1",
                                      act="q8")])
    (q8copy,) = decide_cuda(plan(q8), target).decided(DequantCopy)
    assert q8copy.min_rows == (9,) and not q8copy.adds
    # RLX_CUDA_DEQUANT_COPIES reaches the target (and so the cache key) only when set
    assert CudaStages(Config.from_env({"RLX_CUDA_DEQUANT_COPIES": "0"})).target_options["dequant_copies"] == 0
    assert "dequant_copies" not in CudaStages(Config.from_env({})).target_options

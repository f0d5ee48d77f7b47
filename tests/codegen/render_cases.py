"""Graphs of the codegen test suite with the targets they are rendered for, per backend (no device needed).

Each entry is (label, build, targets): `build()` returns the MIR graph; `targets` the backend targets (and
planning options) it is rendered with. Together they take every op family the backends have rules for
(tests/gpu/cases.py, the dtype matrix of tests/codegen/dtype_matrix.py) and every decision kind of every
backend's lowering (the graphs of the tests that check each decision). Used by
tests/codegen/test_render_roundtrip.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dtype_matrix import build_one, cases

import rlx
from rlx.codegen.backends import first_unsupported_op
from rlx.codegen.cuda import CudaTarget
from rlx.codegen.metal.emit import MetalTarget
from rlx.ir import ops as O
from rlx.ir import quant as Q
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from tests.gpu import cases as gpu_cases
from tests.gpu.gemm_common import gemm_chain, norm_graph
from tests.gpu.pool_common import pool_graph
from tests.gpu.region_gather_common import embed_graph


@dataclass(frozen=True)
class Plan:
    """How a graph is planned for a backend: the driver's `lower_to_lir` options."""

    params_in: str = "f32"
    hold_norm_inputs: bool | None = None


@dataclass(frozen=True)
class Render:
    label: str
    build: Callable[[], Graph]
    targets: tuple[Any, ...]
    plan: Plan = field(default_factory=Plan)


CUDA_F32 = CudaTarget()
CUDA_F16 = CudaTarget(precision=DType.F16)
CUDA_BF16_SM80 = CudaTarget(precision=DType.BF16, arch="sm_80", cutlass_gemm=False)
CUDA_BUILTIN = CudaTarget(precision=DType.F16, gemm="builtin")


def _dtype_matrix(dtype: DType, backend: str) -> Graph:
    """Every op of the dtype matrix on `dtype` that the IR accepts and `backend` renders, each its own output."""
    g = rlx.Graph(f"matrix_{dtype.value}")
    x = g.input("x", [2, 3, 4], dtype.value)
    y = g.input("y", [2, 3, 4], dtype.value)
    outs = {}
    for label, build in cases(dtype):
        alone = build_one(dtype, build)
        if alone is None or first_unsupported_op(alone, backend) is not None:
            continue
        outs[label] = build(_Prefixed(g, label.replace(":", "_") + "_"), x, y)
    g.set_outputs(outs)
    return g


class _Prefixed:
    """A graph whose new params and inputs get a prefix (several builders name theirs alike)."""

    def __init__(self, g: Graph, prefix: str) -> None:
        self._g, self._prefix = g, prefix

    def param(self, name: str, *args: Any, **kwargs: Any) -> int:
        return self._g.param(self._prefix + name, *args, **kwargs)

    def input(self, name: str, *args: Any, **kwargs: Any) -> int:
        return self._g.input(self._prefix + name, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._g, name)


def _transposed_operand() -> Graph:
    """x @ y^T (y an input read only through the transpose: an absorbed transpose) and x @ u (a packed param)."""
    g = rlx.Graph("xyt")
    x = g.input("x", [Dim.dynamic("m", 16), 32])
    g.set_outputs([g.matmul(x, g.transpose(g.input("y", [24, 32]), [1, 0])), g.matmul(x, g.param("u", [32, 8]))])
    return g


def _narrow_bias() -> Graph:
    """A bf16-stored graph's bias: one cast to f32 (a widened param)."""
    g = rlx.Graph("narrow_bias")
    b = g.cast(g.param("b", [8], "bf16"), "f32")
    g.set_outputs([g.add_(g.input("x", [2, 8]), b)])
    return g


def _conv_residual() -> Graph:
    """A residual block: relu(conv(h) + x), the add computed in the conv's store (ConvResidual)."""
    g = rlx.Graph("conv_residual")
    x = g.input("x", [Dim.dynamic("b", 2), 8, 10, 10])
    h = g.conv(x, g.param("w1", [8, 8, 3, 3]), pads=(1, 1, 1, 1), activation="relu")
    y = g.conv(h, g.param("w2", [8, 8, 3, 3]), g.param("b2", [8]), pads=(1, 1, 1, 1))
    g.set_outputs([g.activation("relu", g.add_(y, x))])
    return g


def _int8() -> Graph:
    g = rlx.Graph("int8")
    x = g.input("x", [Dim.dynamic("m", 8), 40])
    g.set_outputs([g.int8_matmul(x, g.param("w", [40, 24]), g.param("b", [24]), activation="relu")])
    return g


def _quant_group(swiglu: bool) -> Graph:
    """Quantized projections of one activation (q8 activations): a decode GEMV group on the CPU."""
    k = 64
    g = rlx.Graph("qgroup")
    x = g.input("x", [Dim.dynamic("m", 8), k])
    h = g.mul(x, x)
    if swiglu:
        gate, up = (g.dequant_matmul(h, g.param(n, [13, Q.row_bytes("q8_0", k)], "u8"), quant="q8_0", act="q8")
                    for n in ("wg", "wu"))
        g.set_outputs({"y": g.mul(g.activation("silu", gate), up)})
    else:
        g.set_outputs({n: g.dequant_matmul(h, g.param(f"w{n}", [w, Q.row_bytes("q8_0", k)], "u8"), quant="q8_0",
                                           act="q8") for n, w in zip("qkv", (37, 13, 11))})
    return g


def fused_gemvs(formats: tuple[str, ...], k: int, n: int = 40) -> Graph:
    """Per block format, an RMSNorm feeding two quantized projections summed: one fused decode GEMV launch each
    (norm staged in the kernel) on CUDA. K past 8192 stages more than 48 KiB of shared memory."""
    from rlx.ir import quant as Q

    g = rlx.Graph("fused_gemvs")
    x = g.input("x", [Dim.dynamic("m", 8), k])
    outs = {}
    for fmt in formats:
        h = g.rms_norm(x, g.param(f"gamma_{fmt}", [k]), eps=1e-5)
        a, b = (g.dequant_matmul(h, g.param(f"w{i}_{fmt}", [n, Q.row_bytes(fmt, k)], "u8"), quant=fmt)
                for i in (0, 1))
        outs[fmt] = g.add_(a, b)
    g.set_outputs(outs)
    return g


def _tiny_decoder_parts() -> tuple[Any, Any]:
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import WeightSpec, random_specs

    cfg = DecoderConfig(arch="llama", vocab_size=64, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=16, ffn_size=96, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                        n_rot=16, context_length=64, tie_embeddings=True, bos_id=1, eos_id=2)
    specs = {name: spec if len(spec.shape) == 1 else WeightSpec("q4_1", spec.shape)
             for name, spec in random_specs(cfg).items()}
    return cfg, specs


def tiny_decoder(quant_act: str = "f32") -> Graph:
    """A LLaMA-style decoder step: quantized GEMVs (fused in decode), rope inside the attention, a KV cache.
    `quant_act` "q8": the projections take int8 activations."""
    from rlx.models.llama import build_decoder

    cfg, specs = _tiny_decoder_parts()
    return build_decoder(cfg, specs, max_batch=2, max_seq=8, capacity=32, quant_act=quant_act)


def tiny_paged_decoder() -> Graph:
    """The tiny decoder over a paged KV cache (a pool of 12 pages of 8 tokens, a block table per row:
    `cached_attention(page_size=8)`), in one-token rows as the serving engine runs it."""
    from rlx.models.llama import build_decoder

    cfg, specs = _tiny_decoder_parts()
    return build_decoder(cfg, specs, max_batch=16, max_seq=1, capacity=32, page_size=8, kv_pages=12)


def tiny_batch_decoder() -> Graph:
    """The tiny decoder in steps of up to 32 one-token rows: past its fused GEMVs (4 rows) and rlx_qmma (16) a step
    multiplies each weight's dequantized copy (`DequantCopy`; CUDA f16: on the small GEMM, `CopySmallGemm`)."""
    from rlx.models.llama import build_decoder

    cfg, specs = _tiny_decoder_parts()
    return build_decoder(cfg, specs, max_batch=32, max_seq=1, capacity=32)


def tiny_tp_decoder(quant: str | None = "q8_0", **steps: int) -> Graph:
    """Rank 0 of a tensor-parallel (tp=2) decoder step: its all-reduces (a one-shot `AllReduceP2P` with the residual
    add) and the logits' all-gather. `quant`: the projections' block format (None: float weights, which an f16 / bf16
    build reads with the dense GEMV). `steps`: `build_decoder`'s step shape (default: 2 rows of a token, capacity
    32)."""
    from rlx.distributed.tp_decoder import shard_decoder
    from rlx.ir.quant import quantize
    from rlx.models.causal_lm import random_tensors
    from rlx.models.decoder_config import DecoderConfig
    from rlx.models.llama import WeightSpec, build_decoder, random_specs

    cfg = DecoderConfig(arch="llama", vocab_size=64, hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                        head_dim=16, ffn_size=128, rms_eps=1e-5, rope_base=10000.0, rope_variant="interleaved",
                        n_rot=16, context_length=64, tie_embeddings=True, bos_id=1, eos_id=2)
    tensors = {n: (WeightSpec(quant, sp.shape), quantize(d, quant)) if quant and len(sp.shape) == 2 else (sp, d)
               for n, (sp, d) in random_tensors(random_specs(cfg)).items()}
    shard = shard_decoder(cfg, tensors, tp=2).tensors[0]
    shape = {"max_batch": 2, "max_seq": 1, "capacity": 32, **steps}
    return build_decoder(cfg, {n: sp for n, (sp, _) in shard.items()}, tp=2, **shape)


def _minilm_embed() -> Graph:
    """An embedding sum (two gathers into one region), a MiniLM layer, a pooling tail."""
    g = rlx.Graph("minilm_embed")
    b, s, h = Dim.dynamic("batch", 4), Dim.dynamic("seq", 32), 384
    ids = g.input("ids", [b, s], "i64")
    pos = g.input("pos", [s], "i64")
    x = g.add_(g.gather(g.param("word", [100, h]), ids), g.gather(g.param("posw", [64, h]), pos))
    x = g.layer_norm(x, g.param("g0", [h]), g.param("b0", [h]), 1e-12)
    f = g.add(O.FusedMatMulBiasAct("gelu"), [x, g.param("f1", [h, 1536]), g.param("fb1", [1536])])
    f = g.add(O.FusedMatMulBiasAct(None), [f, g.param("f2", [1536, h]), g.param("fb2", [h])])
    x = g.add(O.FusedResidualLayerNorm(1e-12), [f, x, g.param("g2", [h]), g.param("b2", [h])])
    m = g.input("m", [b, s])
    summed = g.reshape(g.matmul(g.reshape(m, [b, 1, s]), x), [b, h])
    count = g.binary("max", g.reduce("sum", m, [1], keep_dim=True), g.constant(np.float32(1e-9)))
    g.set_outputs({"e": g.div(summed, count)})
    return g


def _gpu_case(name: str) -> Callable[[], Graph]:
    return lambda: gpu_cases.CASES[name]().graph


def cuda_renders() -> list[Render]:
    out = [Render(f"case:{name}", _gpu_case(name), (CUDA_F32, CUDA_F16)) for name in sorted(gpu_cases.CASES)]
    out += [
        Render("case:minilm_like:more", _gpu_case("minilm_like"),
               (CUDA_BF16_SM80, CUDA_BUILTIN, CudaTarget(precision=DType.F16, small_gemm=False),
                CudaTarget(precision=DType.F16, fused_act_gemm=True))),
        Render("cutlass_chain", lambda: gemm_chain("cutlass_rule", 512, 40, [(136, True, "gelu"), (64, False, "silu"),
                                                                             (32, True, "relu")], every_output=False),
               (CUDA_F16, CudaTarget(precision=DType.BF16), CudaTarget(precision=DType.F16, cutlass_gemm=False),
                CudaTarget(precision=DType.F16, lt_gelu_epilogue=False), CUDA_BF16_SM80)),
        Render("cutlass_unaligned", lambda: gemm_chain("cutlass_n134", 512, 40, [(134, True, "gelu")]), (CUDA_F16,)),
        Render("norm_into_gemm", norm_graph, (CUDA_F16, CudaTarget(precision=DType.BF16), CUDA_BF16_SM80)),
        Render("norm_into_gemm:no_hold", norm_graph, (CUDA_F16,), Plan(hold_norm_inputs=False)),
        Render("norm_into_gemm:s_dead", lambda: norm_graph(keep_s=False), (CUDA_F16,)),
        Render("region_gather", embed_graph, (CUDA_F32, CUDA_F16, CudaTarget(gather_region=False))),
        Render("region_gather:leak", lambda: embed_graph(leak=True), (CUDA_F32,)),
        Render("region_gather:table_input", lambda: embed_graph(table_input=True), (CUDA_F32,)),
        Render("pool_tail", pool_graph, (CUDA_F32, CUDA_F16, CudaTarget(pool_tail=False))),
        Render("pool_tail:norm", lambda: pool_graph(norm="layer_res"),
               (CudaTarget(precision=DType.F16, pool_norm=True), CUDA_F16)),
        Render("minilm_embed", _minilm_embed, (CUDA_F32, CUDA_F16, CUDA_BF16_SM80)),
        Render("decoder", tiny_decoder, (CUDA_F32, CUDA_F16)),
        Render("decoder:paged", tiny_paged_decoder, (CUDA_F32, CUDA_F16)),
        Render("decoder:batch32", tiny_batch_decoder, (CUDA_F16, CudaTarget(precision=DType.F16, arch="sm_80"))),
        Render("decoder:tp2", tiny_tp_decoder, (CUDA_F16, CudaTarget(precision=DType.F16, p2p_all_reduce=False))),
    ]
    return out


#: Cases the CPU has no rule for: KV caches narrower than the compute (CUDA only; the CPU refuses them).
CPU_WITHOUT_RULES = {"kv_attention_window"}


def cpu_renders() -> list[Render]:
    out = [Render(f"case:{name}", _gpu_case(name), (None,)) for name in sorted(gpu_cases.CASES)
           if name not in CPU_WITHOUT_RULES]
    out += [Render(f"matrix:{d.value}", lambda d=d: _dtype_matrix(d, "cpu"), (None,))
            for d in (DType.F32, DType.BF16)]
    out += [
        Render("transposed_operand", _transposed_operand, (None,)),
        Render("narrow_bias", _narrow_bias, (None,)),
        Render("bf16_params", _gpu_case("minilm_like"), (None,), Plan(params_in="bf16")),
        Render("int8", _int8, (None,)),
        Render("conv_residual", _conv_residual, (None,)),
        Render("quant_group:qkv", lambda: _quant_group(False), (None,)),
        Render("quant_group:swiglu", lambda: _quant_group(True), (None,)),
        Render("decoder", tiny_decoder, (None,)),
        Render("decoder:paged", tiny_paged_decoder, (None,)),
    ]
    return out


#: Cases with ops Metal has no rule for yet (scan, the SSM ops, sampling, batched LoRA, MoE, convolution,
#: windowed attention over a narrow cache, token feedback; a while_loop runs as a scan there).
METAL_WITHOUT_RULES = {"conv_family", "lora_matmul", "moe_ops", "sample_top_k", "scan_loop", "scan_ssm_body",
                       "ssm_long", "ssm_ops", "control_flow", "kv_attention_window", "token_feedback"}


def metal_renders() -> list[Render]:
    out = [Render(f"case:{name}", _gpu_case(name), (MetalTarget(),)) for name in sorted(gpu_cases.CASES)
           if name not in METAL_WITHOUT_RULES]
    out += [Render(f"matrix:{d.value}", lambda d=d: _dtype_matrix(d, "metal"), (MetalTarget(),))
            for d in (DType.F32, DType.F16)]
    return out

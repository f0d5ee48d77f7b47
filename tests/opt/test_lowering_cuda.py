"""The CUDA lowering's constant storage (`constant_bytes`): narrow types round to nearest, but a nonzero guard
constant never flushes to zero (the pooling tail's max(count, 1e-9) in f16 would otherwise divide 0 by 0)."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.ir.dtype import DType, f32_to_bf16
from rlx.ir.graph import Graph
from rlx.opt.lowering_cuda import constant_bytes

VALUES = np.array([1e-9, -1e-12, 0.0, -0.0, 0.5, -3.25, 65504.0, 1e-45, 2.0 ** -24], np.float32)


def _stored(dtype: DType) -> np.ndarray:
    g = Graph("c")
    return np.frombuffer(constant_bytes(g.node(g.constant(VALUES)), dtype), np.uint16)


def test_f16_keeps_tiny_guards_nonzero_and_rounds_the_rest_to_nearest() -> None:
    got = _stored(DType.F16)
    nearest = VALUES.astype(np.float16).view(np.uint16)
    assert got[0] == 0x0001 and got[1] == 0x8001 and got[7] == 0x0001  # 6e-8 with the value's sign
    keep = [2, 3, 4, 5, 6, 8]
    np.testing.assert_array_equal(got[keep], nearest[keep])  # zeros (signed), exact values, the subnormal itself
    assert got[3] == 0x8000


def test_bf16_rounds_to_nearest_and_keeps_a_flushed_value_nonzero() -> None:
    got = _stored(DType.BF16)
    nearest = f32_to_bf16(VALUES)
    assert got[7] == 0x0001  # 1e-45 is below bf16's smallest subnormal (9e-41)
    np.testing.assert_array_equal(np.delete(got, 7), np.delete(nearest, 7))


@pytest.mark.parametrize("dtype", [DType.F32, DType.I32])
def test_constants_stored_as_declared_are_unchanged(dtype: DType) -> None:
    g = Graph("c")
    values = VALUES if dtype is DType.F32 else np.arange(5, dtype=np.int32)
    assert constant_bytes(g.node(g.constant(values)), dtype) == values.tobytes()


def test_decode_rope_and_split_decisions_of_a_paged_decoder() -> None:
    """A paged decoder's attention, as the contiguous one's, rotates its queries and keys itself (DecodeRope: over a
    paged cache the append kernel rotates the keys it stores) and runs rlx_kv_decode in steps of up to 4 tokens a
    row, any number of rows; its capacity for DecodeSplitKv is max_pages x page_size, not the page."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
    from render_cases import tiny_decoder, tiny_paged_decoder

    from rlx.driver import lower_to_lir
    from rlx.opt.lowering_cuda import KVD_ROW_TOKENS, find_decode_ropes, find_decode_splits

    assert len(find_decode_ropes(lower_to_lir(tiny_decoder(), 2, backend="cuda"))) == 2
    paged = lower_to_lir(tiny_paged_decoder(), 2, backend="cuda")
    ropes = find_decode_ropes(paged)
    attentions = [n.id for n in paged.graph.nodes if n.kind == "cached_attention"]
    assert sorted(d.attention for d in ropes) == sorted(attentions) and attentions
    assert "when a step's rows hold <= 4 tokens each" in ropes[0].describe()
    # 32 tokens a row (4 pages of 8): no split
    splits = find_decode_splits(paged)
    assert sorted(d.attention for d in splits) == sorted(attentions)
    assert all(d.grouped and d.row_tokens == KVD_ROW_TOKENS == 4 and d.max_splits == 1 and not d.reason
               for d in splits)
    assert "steps of <= 4 tokens a row: rlx_kv_decode" in splits[0].describe()
    # the decoder's distinct-rows hint: steps of distinct sequences store each row's keys in the decode kernel
    assert all(d.stores_rows for d in splits) and not any(d.stores_rows for d in find_decode_splits(
        lower_to_lir(tiny_decoder(), 2, backend="cuda")))
    assert "store each row's keys in its block, no append launch" in splits[0].describe()


def test_paged_decode_launches_the_append_only_without_the_distinct_rows_hint() -> None:
    """The rendered step: the append kernel runs before rlx_kv_decode only when the hint's length (a run symbol) is
    1, and rlx_kv_decode is told to store the rows itself when it is 2; rlx_kv_attend's launches (longer rows) keep
    the append."""
    import re
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
    from render_cases import tiny_paged_decoder

    from rlx.codegen.cuda import CudaTarget
    from rlx.codegen.cuda.emit import render_cuda
    from rlx.driver import lower_to_lir
    from rlx.opt.lowering import lower_for

    lir = lower_for(lower_to_lir(tiny_paged_decoder(), 2, backend="cuda"), "cuda", gemm="builtin")
    src = render_cuda(lir, CudaTarget(gemm="builtin"), {"name": "paged"})
    hint = re.findall(r"if \((S\[\d+\]) < 2\) \{  /\* rows of one sequence", src)
    assert hint and len(set(hint)) == 1  # one symbol for every layer
    decodes = [line for line in src.splitlines() if "rlx_launch_pdl(c->pdl, rlx_kv_decode<" in line]
    assert len(decodes) == len(hint) and all(f"(int)({hint[0]} > 1)))" in line for line in decodes)


def test_quant_mma_rows_by_precision_format_and_weight_size() -> None:
    """f16 / bf16 builds give each projection in a format rlx_qmma reads a `QuantMma` decision: from 2 rows, to 64
    for a weight of 4M+ values and 16 below (the measured switch-over); f32 builds and other formats none."""
    import rlx
    from rlx.driver import lower_to_lir
    from rlx.ir import quant as Q
    from rlx.opt.lowering_cuda import QUANT_MMA_MIN_ROWS, find_quant_mmas

    g = rlx.Graph("q")
    x = g.input("x", [rlx.Dim.dynamic("m", 64), 4096])
    shapes = {"q4_k": 1024, "q8_0": 64, "q6_k": 1024}  # 4M, 256k and 4M values
    outs = {f: g.dequant_matmul(x, g.param(f"w_{f}", [n, Q.row_bytes(f, 4096)], "u8"), quant=f)
            for f, n in shapes.items()}
    g.set_outputs(list(outs.values()))
    lir = lower_to_lir(g, 0, backend="cuda")
    for precision in (DType.F16, DType.BF16):
        found = {d.node: d for d in find_quant_mmas(lir, precision)}
        assert set(found) == {outs["q4_k"], outs["q8_0"]}
        assert found[outs["q4_k"]].max_rows == 64 and found[outs["q8_0"]].max_rows == 16
        assert all(d.min_rows == QUANT_MMA_MIN_ROWS == 2 for d in found.values())
        assert "on the tensor cores (rlx_qmma) in steps of 2 to 64 rows" in found[outs["q4_k"]].describe()
    assert find_quant_mmas(lir, DType.F32) == []


def test_a_decoders_sampler_copies_its_argmax_at_temperature_zero() -> None:
    """The decoder's `sample_top_k` reads the logits its `next_token` argmax reads (scheduled first, its ids kept):
    `SampleFromArgmax`, and the generated kernel gets the argmax's ids; a sampler with no argmax beside it, or one
    over other logits, scans its own."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
    from render_cases import tiny_decoder

    from rlx.codegen.cuda import CudaTarget, render_cuda
    from rlx.driver import lower_to_lir
    from rlx.ir.decisions_cuda import SampleFromArgmax
    from rlx.ir.graph import Graph
    from rlx.opt.lowering import lower_for
    from rlx.opt.lowering_cuda import find_samples_from_argmax

    lir = lower_for(lower_to_lir(tiny_decoder(), 2, backend="cuda"), "cuda", gemm="builtin")
    (d,) = lir.decided(SampleFromArgmax)
    assert lir.graph.node(d.sample).kind == "sample_top_k" and lir.graph.node(d.argmax).kind == "argmax"
    assert lir.graph.node(d.sample).inputs[0] == lir.graph.node(d.argmax).inputs[0]
    assert "copies the ids of" in lir.inspect()
    src = render_cuda(lir, CudaTarget(gemm="builtin"), {"name": "d"})
    launch = next(line for line in src.splitlines() if "rlx_sample_top_k<" in line)
    assert "RLX_FLAG(c), RLX_P(int32_t, " in launch

    g = Graph("pick")
    x, y = g.input("x", [2, 50]), g.input("y", [2, 50])
    u, s = g.input("u", [2], "f64"), g.input("s", [3], "f64")
    g.set_outputs([g.sample_top_k(x, u, s), g.argmax(y)])
    alone = lower_to_lir(g, 0, backend="cuda")
    assert find_samples_from_argmax(alone) == []
    src = render_cuda(lower_for(alone, "cuda", gemm="builtin"), CudaTarget(gemm="builtin"), {"name": "p"})
    assert "RLX_FLAG(c), (const int32_t *)nullptr" in src

"""The CUDA rule table and lowering decisions (no nvcc, no GPU: rendering only)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from rlx.codegen.backends import first_unsupported_op, support_table, supports
from rlx.codegen.backends import load_rules as table
from rlx.codegen.cuda import CudaTarget
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.decisions_cuda import DecodeSplitKv, DeviceLayout, GemmGroup
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.opt.decompose import DECOMPOSITIONS
from rlx.opt.lowering import lower_for
from rlx.opt.memplan import plan
from rlx.pipeline.cuda import cuda_context, render_cuda
from rlx.pipeline.cuda import decide_cuda as lower_cuda
from rlx.pipeline.front import legalize_for, lower_to_lir

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases", Path(__file__).parent.parent / "gpu" / "cases.py")
cases = sys.modules.get("rlx_cuda_cases")
if cases is None:
    cases = importlib.util.module_from_spec(_spec)
    sys.modules["rlx_cuda_cases"] = cases
    _spec.loader.exec_module(cases)


def _relu_graph() -> Graph:
    g = Graph("relu")
    g.set_outputs([g.activation("relu", g.input("x", [4, 8]))])
    return g


#: Op kinds the CUDA backend has no rule for (custom_fn is inlined by the "bodies" pass before any backend;
#: dynamic int8 runs on the CPU only).
CPU_ONLY = {"custom_fn", "int8_matmul"}
#: Collectives render as NCCL calls (rlx/codegen/cuda/collectives.py), checked compile-only in
#: tests/codegen/test_cuda_collectives.py: a single-GPU case run cannot give them a communicator.
COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter"}
#: Control flow has CUDA rules (rlx/codegen/cuda/control.py); a node they refuse is lowered to a select or a masked
#: scan before any rule is asked (rlx/opt/control.py): tests/codegen/test_cuda_control.py checks both.
CONTROL = {"cond", "while_loop"}
#: Kinds no backend renders: the pipeline's decompose stage rewrites them into primitives first.
DECOMPOSED = {"batch_norm"}


def test_every_reference_op_kind_has_a_cuda_rule_or_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each MIR op kind the reference evaluates is rendered by a CUDA rule, or refused before any build."""
    graphs = {name: make().graph for name, make in cases.CASES.items()}
    used = {n.kind for g in graphs.values() for n in g.nodes}
    kinds = {k for k in O.OPS if k not in O.LEAF_KINDS} - CPU_ONLY - COLLECTIVES - DECOMPOSED
    assert all((kind, "") in DECOMPOSITIONS and table("cuda").rule(kind) is None for kind in DECOMPOSED)
    assert kinds <= used, f"tests/gpu/cases.py exercises no graph with {sorted(kinds - used)}"
    for kind in CPU_ONLY:  # no CUDA rule yet: reported by supports() before any build, never rendered
        assert table("cuda").rule(kind) is None
        assert not support_table(["cuda"])[kind]["cuda"]
    assert all(table("cuda").rule(kind) is not None for kind in COLLECTIVES)
    rules = table("cuda")
    for name, g in graphs.items():
        missing = sorted({n.kind for n in g.nodes if n.kind in kinds and rules.rule(n.kind) is None})
        if any(n.kind == "pool" and len(n.op.kernel) > 2 for n in g.nodes):
            g = lower_to_lir(g, 0, backend="cuda").graph  # the pipeline splits a 3-D pool before CUDA sees it
        found = first_unsupported_op(g, "cuda")
        if missing:
            assert found is not None and found[0].kind in missing, name
        else:
            assert found is None, f"{name}: {found and found[1]}"
    assert all(row["cuda"] for kind, row in support_table(["cuda"]).items()
               if kind not in CPU_ONLY | DECOMPOSED)
    for kind in CONTROL:  # ruled: the graph the CUDA rules see keeps them
        assert table("cuda").rule(kind) is not None
        lowered = legalize_for(graphs["control_flow"], "cuda")
        assert kind in {n.kind for n in graphs["control_flow"].nodes}
        assert kind in {n.kind for n in lowered.nodes} and first_unsupported_op(lowered, "cuda") is None
    # the mechanism: a kind without a rule is named before rendering anything
    monkeypatch.delitem(rules.rules, "softmax")
    node, reason = first_unsupported_op(graphs["softmaxes"], "cuda")
    assert node.kind == "softmax" and "no rule for softmax" in reason
    with pytest.raises(BuildError, match="no rule for softmax"):
        render_cuda(plan(graphs["softmaxes"]), CudaTarget(gemm="builtin"), {})


def test_accepts_reports_variants_before_rendering() -> None:
    g = Graph("gather_float_index")
    t = g.input("t", [8, 4])
    i = g.input("i", [3], dtype=DType.I32)
    g.set_outputs([g.gather(t, i, axis=0)])
    assert supports(g, "cuda")
    rule = table("cuda").rule("gather")
    assert rule.accepts(g.nodes[-1].op, (DType.F32, DType.F32), DType.F32) == "takes integer indices only, got f32"
    att = table("cuda").rule("attention")
    assert "floating-point" in att.accepts(O.Attention(num_heads=1, head_dim=4), (DType.I32,) * 3, DType.I32)


def test_kernels_carry_typed_frozen_args() -> None:
    ctx = cuda_context(plan(cases.CASES["minilm_like"]().graph), CudaTarget(precision=DType.F16), {})
    macros = set()
    for k in ctx["kernels"]:
        assert dataclasses.is_dataclass(k.args) and type(k.args).__dataclass_params__.frozen
        assert k.template == "cuda/ops.cu.j2"
        macros.add(k.macro)
    assert {"block_gemm", "block_attention", "block_norm", "block_none"} <= macros


def test_qkv_groups_and_layout_are_lir_decisions() -> None:
    lir = plan(cases.CASES["minilm_like"]().graph)
    f16 = lower_for(lir, "cuda", precision=DType.F16, gemm="cublaslt")
    (group,) = f16.decided(GemmGroup)
    assert len(group.members) == 3 and group.row_stride == 1152
    (layout,) = f16.decided(DeviceLayout)
    assert layout.uses_lt and [r.name for r in layout.regions][:2] == ["params", "qkv"]
    text = f16.inspect()
    assert "lowering decisions for cuda:" in text and "combined [384, 1152] weight" in text
    assert "device memory (f16, gemm cublaslt)" in text
    # decisions are hashed: another precision or GEMM provider is another LIR
    builtin = lower_for(lir, "cuda", precision=DType.F16, gemm="builtin")
    assert not builtin.decided(GemmGroup) and not builtin.decided(DeviceLayout)[0].uses_lt
    assert len({f16.hash(), builtin.hash(), lower_for(lir, "cuda").hash(), lir.hash()}) == 4
    # codegen renders only the LIR it was lowered for
    with pytest.raises(BuildError, match="lowered for precision=f16"):
        render_cuda(f16, CudaTarget(precision=DType.F32), {})
    assert lower_cuda(f16, CudaTarget(precision=DType.F16)) is f16


def test_split_decode_attention_is_a_lir_decision() -> None:
    """A KV cache longer than one block's keys: decode queries split their keys (flash-decoding), visible in the
    LIR, with partials in scratch and per-query counters in their own region, zeroed once at rlx_create."""
    split = lower_for(plan(cases.CASES["kv_attention_split"]().graph), "cuda", precision=DType.F32, gemm="builtin",
                      kv_decode=False)  # rlx_kv_attend's own split (the grouped kernel's: the test below)
    (d,) = split.decided(DecodeSplitKv)
    assert (d.max_splits, d.split_keys, d.max_rows) == (5, 256, 4)  # 1100 rows of cache
    assert "splits a query's keys over up to 5 blocks of >= 256 keys when a step has <= 4 rows" in split.inspect()
    (layout,) = split.decided(DeviceLayout)
    regions = {r.name: r.nbytes for r in layout.regions}
    assert regions["counters"] == layout.counters_bytes == 4 * 4 * 4  # 4 rows x 4 heads, int32
    assert regions["scratch"] >= 4 * 4 * 5 * (64 + 2) * 4  # partials: rows x heads x splits x (max, sum, 64 values)
    src = render_cuda(split, CudaTarget(gemm="builtin"), {"name": "s"})
    assert "batch * sq <= 4 ? 5u : 1u" in src and "RLX_P(int32_t, RLX_OFF_COUNTERS)" in src
    assert "cudaMemsetAsync(RLX_P(unsigned char, RLX_OFF_COUNTERS), 0, 64" in src
    # a short cache never splits: no decision, no counters, the launch has one block per query
    short = lower_for(plan(cases.CASES["kv_attention"]().graph), "cuda", precision=DType.F32, gemm="builtin",
                      kv_decode=False)
    assert not short.decided(DecodeSplitKv) and short.decided(DeviceLayout)[0].counters_bytes == 0
    assert "RLX_OFF_COUNTERS)" not in render_cuda(short, CudaTarget(gemm="builtin"), {"name": "k"}).split("#define")[-1]


def test_grouped_decode_attention_is_a_lir_decision() -> None:
    """Decode steps run rlx_kv_decode: a block per (query, KV head) for its query heads, the key split sized from
    the visible keys and the SM count (`CudaTarget.decode_sms`), recorded in the LIR; prefill steps rlx_kv_attend."""
    graph = cases.CASES["kv_attention_split"]().graph  # 1100 cache rows, 4 heads over 2 KV heads, head dim 64
    lir = lower_for(plan(graph), "cuda", precision=DType.F16, gemm="builtin")
    (d,) = lir.decided(DecodeSplitKv)
    # f16 rows of 64: 8 lanes a row; ceil(1100 / 64) = 18 splits (4 x 132 SMs / 2 KV heads would allow 128, the cap)
    assert (d.grouped, d.group, d.lanes, d.max_splits, d.split_keys, d.sms) == (True, 2, 8, 18, 64, 132)
    assert "rlx_kv_decode, a block per (query, KV head) for its 2 query heads" in lir.inspect()
    few = lower_for(plan(graph), "cuda", precision=DType.F32, gemm="builtin", decode_sms=8)
    (d8,) = few.decided(DecodeSplitKv)
    # f32 rows: 16 lanes, 2 heads x 4 dims a lane: 4 blocks an SM; 4 x 8 SMs / 2 KV heads = 16 splits
    assert (d8.lanes, d8.blocks_per_sm, d8.max_splits) == (16, 4, 16)
    src = render_cuda(lir, CudaTarget(gemm="builtin", precision=DType.F16), {"name": "g"})
    decode = ("rlx_kv_decode<__half, __half, 64, 2, false, false, false, false>, dim3((unsigned)(batch * 2), "
              "(unsigned)sq, splits)")
    assert decode in src and "const unsigned splits = batch * sq <= 4 ? 18u : 1u;" in src
    assert "if (sq <= 4) {" in src  # any number of one-token rows: the grouped kernel
    assert "rlx_kv_attend<__half, __half, 64, false, false>, dim3((unsigned)(batch * 4), (unsigned)sq, 1u)" in src
    # a window bounds the keys a query sees, so the split; a short cache still runs the grouped kernel, unsplit
    windowed = lower_for(plan(cases.CASES["kv_attention_window"]().graph), "cuda", precision=DType.F32,
                         gemm="builtin")
    (dw,) = windowed.decided(DecodeSplitKv)
    assert dw.grouped and dw.max_splits == 2  # window 100: ceil(100 / 64)
    short = lower_for(plan(cases.CASES["kv_attention"]().graph), "cuda", precision=DType.F32, gemm="builtin")
    (ds,) = short.decided(DecodeSplitKv)
    assert ds.grouped and ds.max_splits == 1 and short.decided(DeviceLayout)[0].counters_bytes == 0


def test_fixed_kernels_are_included_only_when_used() -> None:
    relu = render_cuda(plan(_relu_graph()), CudaTarget(gemm="builtin"), {"name": "r"})
    for fixed in ("rlx_copy_nd", "rlx_gemm_tiled", "rlx_attn_fa", "rlx_norm", "rlx_gather", "rlx_rope", "cublasLt"):
        assert fixed not in relu, fixed
    # f16 storage converts the f32 input and output at the boundary: the copy kernels come in, nothing else
    relu16 = render_cuda(plan(_relu_graph()), CudaTarget(gemm="builtin", precision=DType.F16), {"name": "r"})
    assert "rlx_convert<" in relu16 and "rlx_gemm_tiled" not in relu16
    attn = render_cuda(plan(cases.CASES["attention_plain"]().graph), CudaTarget(gemm="builtin"), {"name": "a"})
    assert "void __launch_bounds__(128) rlx_attn_decode(" in attn and "rlx_gemm_tiled" not in attn

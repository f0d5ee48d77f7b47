"""CUDA collectives render as NCCL calls on the context's stream; compile-only with nvcc and NCCL's header.

Running them needs several GPUs (`benchmarks/tp.py` on a multi-GPU machine); here the generated
source is checked and compiled (skipped without nvcc or the `nvidia-nccl-cu12` headers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import rlx
from rlx.codegen.cuda import CudaTarget
from rlx.errors import BuildError
from rlx.ir import ops as O
from rlx.ir.decisions_cuda import AllReduceP2P
from rlx.ir.dtype import DType
from rlx.opt.lowering_cuda import P2P_ALL_REDUCE_BYTES
from rlx.opt.memplan import plan
from rlx.pipeline.cuda import decide_cuda, render_cuda
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc
from rlx.toolchain.nccl import find_nccl


def _graph() -> rlx.Graph:
    g = rlx.Graph("nccl_ops")
    x = g.input("x", [rlx.Dim.dynamic("rows", max=8), 16])
    g.set_outputs([
        g.activation("relu", g.add(O.AllReduce(world=2), [x])),
        g.add(O.AllReduce(world=2, reduce="max"), [x]),
        g.add(O.AllGather(world=2, axis=0), [g.input("y", [3, 16])]),
        g.add(O.AllGather(world=2, axis=1), [x]),  # rows before the axis: through scratch
        g.add(O.ReduceScatter(world=2, axis=1), [x]),
    ])
    return g


def test_rendered_nccl_calls():
    src = render_cuda(plan(_graph()), CudaTarget(arch="sm_90"), {"name": "nccl_ops"})
    for call in ("ncclAllReduce(", "ncclAllGather(", "ncclReduceScatter(", "ncclMax", "rlx_set_nccl",
                 "ncclComm_t comm;", "ncclCommDestroy(c->comm)", "cudaMemcpy2DAsync("):
        assert call in src, call
    assert "RLX_NCCL_COMM(c, 2," in src
    plain = rlx.Graph("plain")
    plain.set_outputs([plain.activation("relu", plain.input("x", [4]))])
    assert "nccl" not in render_cuda(plan(plain), CudaTarget(arch="sm_90"), {"name": "plain"}).lower()


def test_tp_decoder_renders_and_compiles_for_cuda(tmp_path: Path):
    from render_cases import tiny_tp_decoder

    g = tiny_tp_decoder(max_batch=1, max_seq=4, capacity=16)
    assert rlx.Session("cuda").first_unsupported_op(g) is None
    target = CudaTarget(arch="sm_90", precision=DType.F16, gemm="builtin")
    lir = decide_cuda(plan(g), target)
    p2p = lir.decided(AllReduceP2P)  # the attention's and the FFN's sums; the logits' gather stays on NCCL
    assert [(d.world, d.max_bytes) for d in p2p] == [(2, P2P_ALL_REDUCE_BYTES)] * 2
    assert all(lir.graph.node(d.node).kind == "all_reduce" for d in p2p)
    assert all(d.gemv == () for d in p2p)  # q8_0 projections: no dense GEMV makes the sums
    for d in p2p:  # each sum's one reader is the residual add, scheduled right after it: the one-shot call does it
        (add,) = d.residual
        assert lir.graph.node(add).kind == "binary" and d.node in lir.graph.node(add).inputs
        assert lir.schedule.index(add) == lir.schedule.index(d.node) + 1
    src = render_cuda(lir, target, {"name": "tp"})
    # each sum: one-shot through the peers' memory when small, else NCCL; rlx_set_nccl maps the peers' buffers;
    # the add's own kernel runs under the negated condition only
    assert src.count("rlx_launch_pdl(c->pdl, rlx_all_reduce_p2p<__half, true>,") == 2
    assert src.count("if (!(c->ar_ready && ") == 2
    assert src.count("RLX_NCCL(c, ncclAllReduce(") == 2 and src.count("RLX_NCCL(c, ncclAllGather(") == 1
    assert "rlx_ar_open(c, rank, world)" in src and "cudaIpcOpenMemHandle(" in src
    nccl_only = CudaTarget(arch="sm_90", precision=DType.F16, gemm="builtin", p2p_all_reduce=False)
    plain = render_cuda(plan(g), nccl_only, {"name": "tp"})
    assert "rlx_launch_pdl(c->pdl, rlx_all_reduce_p2p" not in plain
    assert "rlx_ar_open" not in plain and plain.count("RLX_NCCL(c, ncclAllReduce(") == 2
    tc, nccl = _nvcc_and_nccl()
    for name, text in (("tp_decoder", src), ("tp_decoder_nccl", plain)):
        path = tmp_path / f"{name}.cu"
        path.write_text(text)
        tc.compile(path, path.with_suffix(".o"), "builtin", compile_only=True, extra=nccl.flags)


@pytest.mark.parametrize("precision", [DType.BF16, DType.F16])
def test_tp_decoder_dense_gemvs_make_their_sums_over_the_clique(tmp_path: Path, precision: DType):
    """Float projections of an f16 / bf16 tp decoder: the attention output's and FFN down's one-row dense GEMVs make
    the sums in their split reduce (AllReduceP2P.gemv): the split rlx_dgemv + rlx_dgemv_reduce_ar under the one-shot
    condition (with the residual), the all-reduce's own launches left to larger steps or NCCL; compiled with nvcc and
    NCCL's header."""
    from render_cases import tiny_tp_decoder

    g = tiny_tp_decoder(None, max_batch=1, max_seq=4, capacity=16)
    target = CudaTarget(arch="sm_90", precision=precision, gemm="builtin")
    lir = decide_cuda(plan(g), target)
    p2p = lir.decided(AllReduceP2P)
    assert len(p2p) == 2
    for d in p2p:
        (x,) = lir.graph.node(d.node).inputs
        assert d.gemv == (x,) and lir.graph.node(x).kind == "matmul" and d.residual
        assert "made by the reduce of the dense GEMV of" in d.describe()
    src = render_cuda(lir, target, {"name": "tp"})
    t = "rlx_bf16" if precision is DType.BF16 else "__half"
    assert src.count(f"rlx_launch_pdl(c->pdl, rlx_dgemv_reduce_ar<{t}, true, 2>,") == 2
    assert src.count("summed by the reduce of the dense GEMV of %") == 2
    assert src.count(f"rlx_launch_pdl(c->pdl, rlx_all_reduce_p2p<{t}, true>,") == 2  # steps of more rows
    nccl_only = CudaTarget(arch="sm_90", precision=precision, gemm="builtin", p2p_all_reduce=False)
    assert "rlx_dgemv_ar" not in render_cuda(plan(g), nccl_only, {"name": "tp"})  # neither launched nor included
    tc, nccl = _nvcc_and_nccl()
    path = tmp_path / "tp_dense.cu"
    path.write_text(src)
    tc.compile(path, path.with_suffix(".o"), "builtin", compile_only=True, extra=nccl.flags)


def _nvcc_and_nccl():
    try:
        nvcc, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    nccl = find_nccl()
    if not nccl.found:
        pytest.skip("NCCL headers not installed (pip install nvidia-nccl-cu12, the rlx[cuda] extra)")
    return NvccToolchain(nvcc, text, "sm_90", find_cublas(nvcc)), nccl


def test_compiles_with_nvcc_and_nccl(tmp_path: Path):
    tc, nccl = _nvcc_and_nccl()
    src = render_cuda(plan(_graph()), CudaTarget(arch="sm_90", precision=DType.F16, gemm="builtin"),
                      {"name": "nccl_ops"})
    path = tmp_path / "nccl_ops.cu"
    path.write_text(src)
    tc.compile(path, path.with_suffix(".o"), "builtin", compile_only=True, extra=nccl.flags)
    assert path.with_suffix(".o").stat().st_size > 0

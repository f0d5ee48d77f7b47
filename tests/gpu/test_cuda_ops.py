"""CUDA backend parity with rlx.reference on a real GPU, for every op, in f32, f16 and bf16.

Tolerances follow from the storage precision. f32 runs compute in f32 with f32 (reductions: f64)
accumulation and no TF32, so results sit within a few f32 ulps of the f64 reference: rtol 1e-5 and an
absolute floor of 1e-5 x the output's RMS (for values that cancel to near zero), 1e-5 in relative L2.
In f16 / bf16 sessions every stored tensor (inputs, weights, intermediates) is rounded once to 11 / 8
significant bits (unit roundoff u = 4.9e-4 / 3.9e-3) while arithmetic accumulates in f32; a short chain of
k roundings is accurate to about k*u, so we allow 20u elementwise (against the output RMS) and 10u in
relative L2. Integer and bool outputs must match exactly.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx import reference
from rlx.driver import Device, Session
from rlx.errors import CudaError, ExecutionError
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.toolchain.cuda import visible_gpu_arch

_spec = importlib.util.spec_from_file_location("rlx_cuda_cases", Path(__file__).parent / "cases.py")
cases = importlib.util.module_from_spec(_spec)
sys.modules["rlx_cuda_cases"] = cases
_spec.loader.exec_module(cases)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(visible_gpu_arch() is None, reason="no NVIDIA GPU visible (nvidia-smi)")]

U = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}


def tolerance(precision: str, out_dtype: DType) -> tuple[float, float]:
    """(elementwise relative tolerance, relative-L2 tolerance) for an output of `out_dtype`."""
    eff = precision
    if out_dtype is DType.F16 and precision == "f32":
        eff = "f16"
    if out_dtype is DType.BF16:
        eff = "bf16"
    if eff == "f32":
        return 1e-5, 1e-5
    return 20 * U[eff], 10 * U[eff]


def check(out: np.ndarray, ref: np.ndarray, dtype: DType, precision: str, what: str) -> None:
    assert out.shape == ref.shape, f"{what}: shape {out.shape} vs {ref.shape}"
    if not dtype.is_float:
        np.testing.assert_array_equal(out, ref, err_msg=what)
        return
    o = np.asarray(out, np.float64)
    r = np.asarray(ref, np.float64)
    assert np.array_equal(np.isnan(o), np.isnan(r)), f"{what}: NaN positions differ"
    o, r = np.nan_to_num(o), np.nan_to_num(r)
    rtol, l2 = tolerance(precision, dtype)
    scale = max(cases.scale_of(r), 1e-30)
    err = np.abs(o - r)
    bound = rtol * np.abs(r) + rtol * scale
    worst = int(np.argmax(err - bound))
    assert np.all(err <= bound), (f"{what}: |out-ref| exceeds {rtol:.1e}*(|ref|+rms) at flat index {worst}: "
                                  f"out={o.flat[worst]!r} ref={r.flat[worst]!r} (rms {scale:.3g})")
    assert cases.rel_l2(o, r) <= l2, f"{what}: relative L2 error {cases.rel_l2(o, r):.2e} > {l2:.1e}"


def compile_case(case: cases.Case, precision: str, opt_level: int = 0):
    cg = Session(Device.CUDA, precision=precision).compile(case.graph, opt_level=opt_level)
    for name, value in case.params.items():
        cg.set_param(name, value)
    return cg


def run_case(name: str, precision: str, opt_level: int = 0) -> None:
    case = cases.CASES[name]()
    if precision != "f32" and not case.lowp:
        pytest.skip(f"{name} checks exact float logic; only meaningful in f32")
    cg = compile_case(case, precision, opt_level)
    dtypes = [case.graph.node(o).shape.dtype for o in case.graph.outputs]
    for i, feed in enumerate(case.feeds):
        refs = reference.run(case.graph, feed, case.params)
        first = cg.run(feed)
        again = cg.run(feed)  # the second run replays the captured CUDA Graph
        for k, (o, o2, r, dt) in enumerate(zip(first, again, refs, dtypes)):
            what = f"{name}[{precision}] feed {i} output {k}"
            check(o, r, dt, precision, what)
            np.testing.assert_array_equal(o, o2, err_msg=f"{what}: replay differs from the eager run")


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", sorted(n for n in cases.CASES if n != "minilm_like"))
def test_op_parity(name: str, precision: str) -> None:
    run_case(name, precision)


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
def test_minilm_like_layer_stack_optimized(precision: str) -> None:
    run_case("minilm_like", precision, opt_level=2)


def test_builtin_gemm_matches_reference() -> None:
    from rlx.codegen.cuda import CudaTarget
    from rlx.opt.memplan import plan
    from rlx.pipeline.cuda import build_cuda
    from rlx.runtime.cuda_device import CudaGraph
    from rlx.runtime.loader import load_library

    case = cases.CASES["matmuls"]()
    built = build_cuda(plan(case.graph), target=CudaTarget(gemm="builtin"))
    assert built.target.gemm == "builtin"
    cg = CudaGraph(load_library(built.library))
    for k, v in case.params.items():
        cg.set_param(k, v)
    feed = case.feeds[0]
    for o, r, n in zip(cg.run(feed), reference.run(case.graph, feed, case.params), case.graph.outputs):
        check(o, r, case.graph.node(n).shape.dtype, "f32", "builtin gemm")


def test_gelu_keeps_its_negative_tail() -> None:
    """f32 GELU against the reference down to x = -12, where 0.5 x (1 + erf) would cancel to 0. The bound: the
    f32 argument u = x * f32(-1/sqrt 2) is off by up to 1.3 * 2^-24 relative (half an ulp for the product, 0.29
    for the constant), which erfc's slope 2u magnifies to 2u^2 * 1.3 * 2^-24 = 1.3 x^2 * 2^-24 relative; plus
    erfcf's 4 ulps and the product's rounding."""
    g = Graph("gelu_tail")
    x = g.input("x", [4001])
    g.set_outputs([g.activation("gelu", x)])
    feed = {"x": np.linspace(-12.0, 6.0, 4001).astype(np.float32)}
    out = np.asarray(Session(Device.CUDA).compile(g, opt_level=0).run(feed)[0], np.float64)
    ref = np.asarray(reference.run(g, feed)[0], np.float64)
    keep = np.abs(ref) >= np.finfo(np.float32).tiny  # normal f32 results
    x2 = feed["x"].astype(np.float64) ** 2
    bound = (1.3 * x2 + 5) * 2.0 ** -24 * np.abs(ref)
    assert np.all((np.abs(out - ref) <= bound)[keep])


def test_errors_are_reported_and_the_process_survives() -> None:
    g = Graph("gather_err")
    t = g.param("t", [5, 3])
    ids = g.input("ids", [4], "i64")
    g.set_outputs([g.gather(t, ids)])
    cg = Session(Device.CUDA).compile(g, opt_level=0)
    cg.set_param("t", np.arange(15, dtype=np.float32).reshape(5, 3))
    with pytest.raises(ExecutionError, match="gather index out of range"):
        cg.run(ids=np.array([0, 1, 7, 2], np.int64))
    out = cg.run(ids=np.array([4, 0, 0, 1], np.int64))[0]
    np.testing.assert_array_equal(out[0], [12, 13, 14])

    g2 = Graph("idiv")
    a = g2.input("a", [3], "i32")
    b = g2.input("b", [3], "i32")
    g2.set_outputs([g2.div(a, b)])
    cg2 = Session(Device.CUDA).compile(g2, opt_level=0)
    with pytest.raises(ExecutionError, match="division by zero"):
        cg2.run(a=np.array([1, 2, 3], np.int32), b=np.array([1, 0, 1], np.int32))
    np.testing.assert_array_equal(cg2.run(a=np.array([-7, 7, 9], np.int32), b=np.array([2, 2, -4], np.int32))[0],
                                  [-3, 3, -2])


def test_out_of_device_memory_is_a_cuda_error() -> None:
    g = Graph("huge")
    x = g.input("x", [1 << 37])  # 512 GiB of f32: no GPU has it
    g.set_outputs([g.activation("neg", x)])
    with pytest.raises(CudaError, match="out of memory"):
        Session(Device.CUDA).compile(g, opt_level=0)


def test_unset_param_and_bad_symbols() -> None:
    case = cases.CASES["swiglu"]()
    cg = Session(Device.CUDA).compile(case.graph, opt_level=0)
    with pytest.raises(ExecutionError, match="never set"):
        cg.run(case.feeds[0])
    for k, v in case.params.items():
        cg.set_param(k, v)
    with pytest.raises(ExecutionError, match="outside"):
        cg.run(x=np.zeros((2, 34, 64), np.float32))


def test_run_device_zero_copy_and_clone() -> None:
    case = cases.CASES["norms"]()
    cg = compile_case(case, "f32")
    feed = case.feeds[0]
    refs = reference.run(case.graph, feed, case.params)
    dev = {k: cg.to_device(v) for k, v in feed.items()}
    outs = cg.run_device(dev)
    for o, r, n in zip(outs, refs, case.graph.outputs):
        check(o.numpy(), r, case.graph.node(n).shape.dtype, "f32", "run_device")
    # outputs given by the caller are written in place
    given = {cg.output_names[0]: cg.to_device(np.zeros_like(refs[0]))}
    res = cg.run_device(dev, outputs=given)
    assert res[0] is given[cg.output_names[0]]
    check(given[cg.output_names[0]].numpy(), refs[0], DType.F32, "f32", "run_device into given outputs")
    twin = cg.clone()
    for o, r, n in zip(twin.run(feed), refs, case.graph.outputs):
        check(o, r, case.graph.node(n).shape.dtype, "f32", "clone")
    with pytest.raises(ExecutionError, match="__cuda_array_interface__"):
        cg.run_device({k: v for k, v in feed.items()})
    # a bound runner re-reads its buffers on every call
    out = cg.to_device(np.zeros_like(refs[0]))
    run = cg.bind_device(dev, outputs={cg.output_names[0]: out})
    run()
    check(out.numpy(), refs[0], DType.F32, "f32", "bind_device")
    feed2 = {k: v * np.float32(2.0) for k, v in feed.items()}
    for k, v in feed2.items():
        dev[k].copy_from_host(v)
    run()
    check(out.numpy(), reference.run(case.graph, feed2, case.params)[0], DType.F32, "f32", "bind_device again")


def test_run_device_accepts_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    case = cases.CASES["attention_padding"]()
    cg = compile_case(case, "f16")
    feed = case.feeds[0]
    ref = reference.run(case.graph, feed, case.params)[0]
    tin = {k: torch.from_numpy(v).cuda() for k, v in feed.items()}
    out = torch.empty(ref.shape, dtype=torch.float32, device="cuda")
    cg.run_device(tin, outputs={"out0": out})
    check(out.cpu().numpy(), ref, DType.F32, "f16", "torch tensors")
    with pytest.raises(ExecutionError, match="float64"):
        cg.run_device({**tin, "q": tin["q"].double()})

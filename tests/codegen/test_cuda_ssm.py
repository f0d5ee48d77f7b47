"""The CUDA rules of the carried SSM forms (rlx/codegen/cuda/ssm.py): a Mamba-2-like step whose selective scan and
causal conv read state inputs and update them in place (a recurrent cache), rendered and compiled with nvcc (no GPU
needed; the kernels' arithmetic is checked in test_cuda_ssm_emulated.py, the decoders on a GPU in
tests/gpu/test_cuda_recurrent_decoder.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx.codegen.backends import first_unsupported_op
from rlx.codegen.cuda import CudaTarget
from rlx.errors import BuildError
from rlx.ir.dtype import DType
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim
from rlx.pipeline import lower_to_lir
from rlx.pipeline.cuda import render_cuda
from rlx.toolchain.cuda import NvccToolchain, find_cublas, find_nvcc


def _carried_step(states: bool = True) -> Graph:
    """conv (carried conv state, lengths) -> silu -> selective scan (carried SSM state); `states=False` passes
    plain inputs as the states (read, never written)."""
    g = Graph("carried_ssm")
    seq = Dim.dynamic("seq", max=80)
    x, dt = g.input("x", [2, seq, 24]), g.input("dt", [2, seq, 24])
    bm, cm = g.input("bm", [2, seq, 16]), g.input("cm", [2, seq, 16])
    a, w = g.input("a", [24, 16]), g.input("w", [24, 4])
    lengths = g.input("lengths", [2], "i32")
    make = g.state if states else g.input
    conv_state, ssm_state = make("conv_state", [2, 3, 24]), make("ssm_state", [2, 24, 16])
    h = g.activation("silu", g.depthwise_conv1d_causal(x, w, conv_state, lengths=lengths))
    g.set_outputs({"y": g.selective_scan(h, dt, a, bm, cm, state=ssm_state)})
    return g


def _render(g: Graph, precision: str = "f32") -> str:
    return render_cuda(lower_to_lir(g, 0, backend="cuda"), CudaTarget(gemm="builtin", precision=DType.parse(precision)),
                       {"name": g.name})


def test_carried_forms_have_cuda_rules() -> None:
    assert first_unsupported_op(_carried_step(), "cuda") is None


def test_state_inputs_are_updated_in_place() -> None:
    src = _render(_carried_step())
    body = src.split("── host side")[1]
    # the conv state update follows the conv and raises the flag on a bad length
    assert body.index("rlx_dwconv1d_causal<float>") < body.index("rlx_conv_state_update<float>")
    assert "RLX_FLAG(c));" in body.split("rlx_conv_state_update<float>")[1].split("\n")[0]
    assert "(real tokens) is outside 0..seq" in src
    # both scan paths take the state in and out (the same buffer)
    assert "the state carried in and out of the state input" in body
    for launch in ("rlx_selective_scan<float>", "rlx_ssm_chunk_carry<float>"):
        args = body.split(launch)[1].split("\n")[0]
        assert args.count("nullptr") == 0, launch


def test_plain_inputs_as_states_are_only_read() -> None:
    src = _render(_carried_step(states=False)).split("── host side")[1]
    assert "rlx_conv_state_update" not in src  # (as on the CPU: only a state input receives the new state)
    assert "the state from the given state" in src
    args = src.split("rlx_selective_scan<float>")[1].split("\n")[0]
    assert args.count("nullptr") == 1


def _toolchain() -> NvccToolchain:
    try:
        path, text = find_nvcc("nvcc")
    except BuildError:
        pytest.skip("nvcc is not installed")
    return NvccToolchain(path, text, "sm_90", find_cublas(path))


@pytest.mark.parametrize("precision", ["f16"])  # (f16 storage: the conversions; one nvcc run, ~18 s on CI)
def test_carried_step_compiles(precision: str, tmp_path: Path) -> None:
    tc = _toolchain()
    path = tmp_path / f"carried_{precision}.cu"
    path.write_text(_render(_carried_step(), precision))
    tc.compile(path, path.with_suffix(".o"), "builtin", compile_only=True)
    assert path.with_suffix(".o").stat().st_size > 0

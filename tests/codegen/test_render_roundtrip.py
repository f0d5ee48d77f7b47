"""Codegen reads nothing but the LIR and the target: every graph of the codegen suite (tests/codegen/render_cases.py)
renders the same source from its decided LIR and from that LIR after serialize → deserialize
(`rlx.ir.serialize_lir`), for the CPU, CUDA (no GPU needed) and Metal; and the graphs take every decision kind."""

from __future__ import annotations

import functools
import json

import pytest
import render_cases as rc

from rlx.codegen.backends import first_unsupported_op
from rlx.codegen.cpu.emit import CTarget, render_c
from rlx.codegen.cuda import render_cuda
from rlx.codegen.metal.emit import render_metal
from rlx.driver import lower_to_lir, to_mir
from rlx.ir.decisions import DECISION_KINDS
from rlx.ir.lir import LirModule
from rlx.ir.serialize_lir import lir_from_json, lir_to_json
from rlx.pipeline.cuda import decide_cuda as lower_cuda
from rlx.pipeline.decide import decide

RENDERS = {"cpu": rc.cpu_renders(), "cuda": rc.cuda_renders(), "metal": rc.metal_renders()}
CASES = [(backend, r.label, i) for backend, renders in RENDERS.items() for r in renders for i in range(len(r.targets))]


@functools.cache
def _planned(backend: str, label: str) -> LirModule:
    """The graph planned for `backend`."""
    r = next(r for r in RENDERS[backend] if r.label == label)
    lir = lower_to_lir(to_mir(r.build()), 2, backend=backend, params_in=r.plan.params_in,
                       hold_norm_inputs=r.plan.hold_norm_inputs)
    assert first_unsupported_op(lir.graph, backend) is None, (label, first_unsupported_op(lir.graph, backend))
    return lir


def _target(backend: str, label: str, index: int):
    return next(r for r in RENDERS[backend] if r.label == label).targets[index]


@functools.cache
def _decided(backend: str, label: str, index: int) -> LirModule:
    lir = _planned(backend, label)
    target = _target(backend, label, index)
    if backend == "cuda":
        return lower_cuda(lir, target)
    return decide(lir, backend)  # the pipeline's decide stage (scan bodies included)


def _render(backend: str, lir: LirModule, target) -> str:
    if backend == "cuda":
        return render_cuda(lir, target, lir.manifest())
    if backend == "metal":
        program = render_metal(lir, target, lir.manifest())
        return program.source + json.dumps(program.manifest, sort_keys=True, default=str)
    return render_c(lir, CTarget(), lir.manifest())


@pytest.mark.parametrize(("backend", "label", "index"), CASES, ids=[f"{b}-{lbl}-{i}" for b, lbl, i in CASES])
def test_a_deserialized_lir_renders_the_same_source(backend: str, label: str, index: int) -> None:
    lir = _decided(backend, label, index)
    target = _target(backend, label, index)
    text = lir_to_json(lir)
    back = lir_from_json(text)
    assert back.backend == backend and back.decisions == lir.decisions
    assert back.hash() == lir.hash() and lir_to_json(back) == text
    assert _render(backend, back, target) == _render(backend, lir, target)


@pytest.mark.parametrize("backend", sorted(RENDERS))
def test_the_graphs_take_every_decision_kind(backend: str) -> None:
    kinds = {d.kind for b, label, index in CASES if b == backend for d in _decided(b, label, index).decisions}
    prefix = {"cpu": ("absorbed_transpose", "packed_param", "widened_param", "int8_param", "conv_plan", "conv_residual",
                      "cpu_"),
              "cuda": ("cuda_",), "metal": ("metal_",)}[backend]
    expected = {k for k in DECISION_KINDS if k.startswith(prefix)}
    assert expected and expected <= kinds, sorted(expected - kinds)


def test_the_new_cuda_decisions_print_in_the_lir() -> None:
    """The CUTLASS, gather and norm choices of an embedding + MiniLM layer are lines of `inspect()`."""
    lir = _decided("cuda", "minilm_embed", 1)  # f16 on sm_90
    text = lir.inspect()
    assert "GEMM on CUTLASS sm90 (rlx_cutlass_gemm_f16_gelu): bias and gelu in its epilogue" in text
    assert "gather looked up inside" in text and "'s elementwise kernel (no kernel of its own)" in text
    assert "norm computed in the prologue of" in text and "small GEMM when a step has <= 64 rows" in text
    assert "kernel choices for sm_90: CUTLASS GEMMs on, gathers in regions on, small GEMMs on" in text

"""One pipeline for every caller: `rlxc compile` / `rlxc inspect --stage lir --target T` decide and render exactly
what `Session(T)` does (the same source digest), `compiled.lir` is the decided LIR that was rendered, and no module
but rlx.pipeline decides (`lower_for`) or renders (`render_c`, `render_cuda`, `render_metal`)."""

from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.cli import main
from rlx.ir import serialize
from rlx.ir.shape import Dim

REPO = Path(__file__).resolve().parents[2]
HEADS, HEAD_DIM = 2, 8
HIDDEN = HEADS * HEAD_DIM


@pytest.fixture(autouse=True)
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RLX_CACHE_DIR", str(root))
    monkeypatch.delenv("RLX_CACHE_PATH", raising=False)
    return root


PARAMS = {"gamma": [HIDDEN], "beta": [HIDDEN], "wq": [HIDDEN, HIDDEN], "wk": [HIDDEN, HIDDEN],
          "wv": [HIDDEN, HIDDEN], "w1": [HIDDEN, 32], "b1": [32], "w2": [32, HIDDEN]}


def block() -> rlx.Graph:
    """A GEMM + GELU, a norm and attention: the ops whose decisions differ most between targets."""
    g = rlx.Graph("block")
    p = {name: g.param(name, shape) for name, shape in PARAMS.items()}
    x = g.input("x", [1, Dim.dynamic("n", max=8), HIDDEN])
    normed = g.layer_norm(x, p["gamma"], p["beta"])
    q, k, v = (g.matmul(normed, p[f"w{c}"]) for c in "qkv")
    attn = g.attention(q, k, v, num_heads=HEADS, head_dim=HEAD_DIM)
    up = g.activation("gelu", g.add_(g.matmul(attn, p["w1"]), p["b1"]))
    g.set_outputs([g.matmul(up, p["w2"])])
    return g


def digest_lines(text: str) -> list[str]:
    return re.findall(r"^source digest ([0-9a-f]{64})$", text, flags=re.M)


def inspect_lir(path: Path, target: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """(stdout of `rlxc inspect --stage lir --target T`, its one source digest)."""
    assert main(["inspect", str(path), "--stage", "lir", "--target", target]) == 0
    out = capsys.readouterr().out
    (digest,) = digest_lines(out)
    return out, digest


def has_nvcc() -> bool:
    return shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()


def test_cpu_cli_compile_and_inspect_build_what_the_session_builds(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "block.json"
    serialize.save(block(), path)
    compiled = rlx.Session(rlx.Device.CPU).compile(block())
    assert compiled.lir.backend == "cpu" and compiled.lir.decisions  # the decided LIR that was rendered
    rendered = rlx.Session(rlx.Device.CPU).render(block())
    assert compiled.source_digest == rendered.digest and rendered.lir.hash() == compiled.lir.hash()
    assert compiled.source == rendered.with_key(compiled.key)  # the C file built is the one rendered
    assert main(["compile", str(path)]) == 0
    out = capsys.readouterr().out
    assert digest_lines(out) == [compiled.source_digest]
    assert f"key {compiled.key}" in out  # the very same build
    lir_text, digest = inspect_lir(path, "cpu", capsys)
    assert digest == compiled.source_digest
    assert "lowering decisions for cpu:" in lir_text
    assert all(d.describe() in lir_text for d in compiled.lir.decisions)


def test_a_compile_index_hit_decides_the_lir_when_asked(tmp_path: Path):
    first = rlx.Session().compile(block())
    again = rlx.Session().compile(block())
    assert again.cache_hit and again.source_digest == first.source_digest
    assert again.lir.hash() == first.lir.hash()  # computed on first access after the index hit


def test_cuda_inspect_decides_and_renders_what_the_session_renders(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]):
    if not has_nvcc():
        pytest.skip("nvcc is not installed (the CUDA target is resolved against the toolchain)")
    path = tmp_path / "block.json"
    serialize.save(block(), path)
    rendered = rlx.Session(rlx.Device.CUDA, target="cuda:sm_90").render(block())
    lir_text, digest = inspect_lir(path, "cuda:sm_90", capsys)
    assert digest == rendered.digest
    assert "lowering decisions for cuda:" in lir_text and "device memory" in lir_text
    # the CPU's LIR differs: the targets decide differently (no "same for every target")
    _, cpu_digest = inspect_lir(path, "cpu", capsys)
    assert cpu_digest != digest


def test_metal_compile_and_inspect_render_what_the_session_renders(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "block.json"
    serialize.save(block(), path)
    rendered = rlx.Session(rlx.Device.METAL).render(block())
    lir_text, digest = inspect_lir(path, "metal", capsys)
    assert digest == rendered.digest and "metal buffer: one allocation" in lir_text
    assert main(["compile", str(path), "--target", "metal", "-o", str(tmp_path / "art")]) == 0
    assert digest_lines(capsys.readouterr().out) == [rendered.digest]
    assert (tmp_path / "art" / "model.metal").read_text() == rendered.text


def test_the_metal_program_the_session_renders_runs_right_emulated():
    sys.path.insert(0, str(REPO / "tests" / "metal"))  # as tests/metal/conftest.py does
    import emulator

    if not emulator.have_compiler():
        pytest.skip("no C++ compiler for the Metal emulator")
    from rlx.runtime.metal_host import MetalGraph

    rendered = rlx.Session(rlx.Device.METAL).render(block())
    manifest, _msl = rendered.extra
    program = emulator.MetalProgram(rendered.text, manifest)
    runner = emulator.EmulatorRunner(emulator.build(program), manifest["layout"]["total"])
    graph = MetalGraph(manifest, runner, source=rendered.text)
    rng = np.random.default_rng(0)
    g = block()
    params = {name: (rng.standard_normal(shape) * 0.3).astype(np.float32) for name, shape in PARAMS.items()}
    for name, value in params.items():
        graph.set_param(name, value)
    feed = {"x": rng.standard_normal((1, 5, HIDDEN)).astype(np.float32)}
    (out,) = graph.run(feed)
    (want,) = reference.run(g, feed, params)
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-4)


def test_only_the_pipeline_decides_or_renders():
    """No module of rlx but rlx.pipeline calls `lower_for` or a backend's `render_*`."""
    names = {"lower_for", "render_c", "render_cuda", "render_metal"}
    offenders = []
    for path in sorted((REPO / "rlx").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("rlx/pipeline/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in names:
                    offenders.append(f"{rel}:{node.lineno} {name}")
    assert not offenders, offenders


def test_cuda_inspect_of_minilm_in_f16_prints_the_kernel_decisions(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]):
    """`rlxc inspect --stage lir --target cuda:sm_90 --precision f16` on a MiniLM-shaped encoder: the CUTLASS,
    gather-into-region and (with cuBLASLt, the `cuda` extra) norm-into-GEMM decisions are printed, and the
    digest is `Session`'s."""
    if not has_nvcc():
        pytest.skip("nvcc is not installed (the CUDA target is resolved against the toolchain)")
    from rlx.models import bert as B
    from rlx.models.embedder import SentenceEmbedder

    config = B.BertConfig(vocab_size=64, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128,
                          max_position_embeddings=32)
    graph = SentenceEmbedder(config, B.random_weights(config), None, device="reference", max_seq=16,
                             max_batch=2).graph("embeddings")
    path = tmp_path / "encoder.json"
    serialize.save(graph, path)
    assert main(["inspect", str(path), "--stage", "lir", "--target", "cuda:sm_90", "--precision", "f16"]) == 0
    out = capsys.readouterr().out
    (digest,) = digest_lines(out)
    assert digest == rlx.Session(rlx.Device.CUDA, target="cuda:sm_90", precision="f16").render(graph).digest
    assert re.search(r"kernel choices for sm_90: CUTLASS GEMMs (on|off)", out)
    assert re.search(r"%\d+ gather looked up inside %\d+'s elementwise kernel", out)
    if re.search(r"\(f16, gemm builtin\)", out):
        # no cuBLASLt (the `cuda` extra is not installed): every GEMM is the built-in one, so none is on the
        # cuBLASLt path that CUTLASS verdicts and small GEMMs with a norm prologue are decided for
        assert "CUTLASS GEMMs off" in out
    else:
        verdict = r"CUTLASS sm90 .*gelu in its epilogue|cuBLASLt, then a gelu pass; not on CUTLASS"
        assert re.search(rf"%\d+ GEMM on ({verdict})", out)
        assert re.search(r"%\d+ norm computed in the prologue of %\d+'s small GEMM", out)
    assert main(["inspect", str(path), "--stage", "lir", "--target", "metal", "--precision", "f16"]) == 2

"""Relocatable artifacts: save, load in a compiler-less process, refuse what cannot run here, use from plain C."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.abi_version import ABI_VERSION
from rlx.config import Config
from rlx.errors import ArtifactError
from rlx.models.bert import BertConfig, bert_inputs, build_bert, random_weights
from rlx.runtime.artifact_load import load, read_manifest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
CC = shutil.which(os.environ.get("CC") or "cc")

pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler to build the artifact")

TINY = BertConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                  max_position_embeddings=16)


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory):
    """A tiny BERT (dynamic batch and seq, int64 inputs, padding mask) compiled once, params set."""
    root = tmp_path_factory.mktemp("cache")
    graph = build_bert(TINY, max_batch=4, max_seq=16, output="tokens")
    compiled = rlx.Session(config=Config(cache_dir=root)).compile(graph)
    weights = random_weights(TINY, seed=3)
    for name in compiled.param_names:
        compiled.set_param(name, weights[name])
    ids = np.array([[2, 7, 9, 11, 3], [2, 5, 3, 0, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=np.int64)
    inputs = bert_inputs(ids, mask)
    return graph, compiled, weights, inputs


def _reference(graph, weights, inputs) -> np.ndarray:
    names = {n.op.name for n in graph.params()}
    return reference.run(graph, inputs, {k: v for k, v in weights.items() if k in names})[0]


def test_save_writes_the_documented_files(bert, tmp_path: Path):
    _, compiled, _, _ = bert
    out = compiled.save(tmp_path / "art")
    m = read_manifest(out)
    blas = ["libscipy_openblas.so"] if m["blas"] == "openblas32" else []
    assert m["bundled_libraries"] == blas
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.json", "model.c", "model.so", "rlx.h", *blas])
    assert m["abi_version"] == ABI_VERSION and m["target"] == "cpu" and m["key"] == compiled.key
    assert [i["name"] for i in m["inputs"]] == compiled.input_names
    assert [p["name"] for p in m["params"]] == compiled.param_names
    assert {s["name"]: s["max"] for s in m["symbols"]} == {"batch": 4, "seq": 16}
    assert m["isa"]["arch"] and m["isa"]["cpu_target"] == "native" and "features" in m["isa"]
    assert m["components"]["lir"] and m["weights"] == []
    for name, info in m["files"].items():
        assert (out / name).stat().st_size == info["size"]
    assert f"RLX_ABI_VERSION {ABI_VERSION}" in (out / "rlx.h").read_text()


def test_round_trip_with_weights_matches_reference(bert, tmp_path: Path):
    graph, compiled, weights, inputs = bert
    out = compiled.save(tmp_path / "art", weights=True)
    assert (out / "weights.safetensors").is_file()
    loaded = load(out)
    got = loaded.run(inputs)[0]
    assert np.array_equal(got, compiled.run(inputs)[0])  # same library, same inputs
    # f32 end to end through two small layers: agreement to float32 round-off.
    np.testing.assert_allclose(got, _reference(graph, weights, inputs), rtol=1e-4, atol=1e-4)
    # Saving again without weights must not leave the old weights to be loaded silently.
    compiled.save(out)
    assert not (out / "weights.safetensors").exists()
    with pytest.raises(rlx.ExecutionError, match="params never set"):
        load(out).run(inputs)


def test_bf16_and_f16_params_round_trip(tmp_path: Path):
    g = rlx.Graph("halves")
    x = g.input("x", [rlx.Dim.dynamic("n", max=4), 3])
    w = g.param("w", [3, 2], "bf16")
    b = g.param("b", [2], "f16")
    g.set_outputs([g.add_(g.matmul(x, g.cast(w, "f32")), g.cast(b, "f32"))])
    compiled = rlx.Session(config=Config(cache_dir=tmp_path / "cache")).compile(g)
    compiled.set_param("w", np.array([[1.5, 2], [3, 4], [5, 6.25]], np.float32))
    compiled.set_param("b", np.array([0.5, 1], np.float16))
    out = compiled.save(tmp_path / "art", weights=True)
    x_val = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(load(out).run(x=x_val)[0], compiled.run(x=x_val)[0])


def test_explicit_weights_mapping_is_checked(bert, tmp_path: Path):
    _, compiled, weights, _ = bert
    with pytest.raises(ArtifactError, match="not a param"):
        compiled.save(tmp_path / "art", weights={"no.such.param": np.zeros(3)})
    name = compiled.param_names[0]
    # The dtype rules of set_param: no silent float64 -> f32 (1e40 would become inf).
    with pytest.raises(ArtifactError, match=f"param '{name}' is f32 but got a float64 array"):
        compiled.save(tmp_path / "art", weights={name: weights[name].astype(np.float64)})
    with pytest.raises(ArtifactError, match="must have shape"):
        compiled.save(tmp_path / "art", weights={name: weights[name].reshape(-1)})


def test_load_in_a_process_without_a_compiler(bert, tmp_path: Path):
    _, compiled, _, inputs = bert
    out = compiled.save(tmp_path / "art", weights=True)
    for name, arr in inputs.items():
        np.save(tmp_path / f"{name}.npy", arr)
    script = tmp_path / "load_it.py"
    script.write_text(
        "import sys, numpy as np, rlx\n"
        f"art, d = {str(out)!r}, {str(tmp_path)!r}\n"
        "cg = rlx.load(art)\n"
        "inputs = {n: np.load(f'{d}/{n}.npy') for n in cg.input_names}\n"
        "np.save(f'{d}/out.npy', cg.run(inputs)[0])\n"
        "assert 'rlx.toolchain.compiler' not in sys.modules, 'loading probed the toolchain'\n"
    )
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    # Same environment (OPENBLAS_CORETYPE etc. pick the BLAS kernel), minus any compiler.
    env = {**os.environ, "PATH": str(empty), "CC": str(empty / "no-cc"), "PYTHONPATH": str(REPO),
           "RLX_CACHE_DIR": str(tmp_path / "unused-cache")}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(tmp_path / "out.npy"), compiled.run(inputs)[0])
    assert not (tmp_path / "unused-cache").exists()


def _edit_manifest(out: Path, **changes) -> None:
    m = json.loads((out / "manifest.json").read_text())
    for k, v in changes.items():
        if isinstance(v, dict) and isinstance(m.get(k), dict):
            m[k].update(v)
        else:
            m[k] = v
    (out / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(("change", "message"), [
    ({"isa": {"features": ["sse2", "rlx_imaginary_simd"]}}, "rlx_imaginary_simd, which this CPU lacks"),
    ({"isa": {"arch": "riscv128"}}, "built for riscv128"),
    ({"abi_version": 999}, "ABI 999"),
    ({"target": "metal"}, "targets 'metal'"),
    ({"target": "cuda"}, "records no valid GPU arch"),  # a CUDA manifest must name its arch
    ({"format_version": 7}, "format version 7"),
    ({"format": "something-else"}, "not an RLX artifact"),
])
def test_artifacts_that_cannot_run_here_are_refused(bert, tmp_path: Path, change: dict, message: str):
    _, compiled, _, _ = bert
    out = compiled.save(tmp_path / "art")
    _edit_manifest(out, **change)
    with pytest.raises(ArtifactError, match=message):
        load(out)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_library_is_refused_before_dlopen(bert, tmp_path: Path, damage: str):
    _, compiled, _, _ = bert
    out = compiled.save(tmp_path / "art")
    lib = out / "model.so"
    data = bytearray(lib.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 3]
    else:
        data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="checksum"):
        load(out)


def test_not_an_artifact(tmp_path: Path):
    with pytest.raises(ArtifactError, match=r"no manifest\.json"):
        load(tmp_path)
    (tmp_path / "manifest.json").write_text("{oops")
    with pytest.raises(ArtifactError, match="unreadable"):
        load(tmp_path)
    with pytest.raises(ArtifactError, match="not an artifact directory"):
        load(tmp_path / "missing")


def _build_c_consumer(out: Path, tmp_path: Path) -> Path:
    """tests/toolchain/data/run_artifact.c, built against the artifact's rlx.h."""
    exe = tmp_path / "run_artifact"
    build = subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-O1", "-Wall", "-Werror", f"-I{out}",
                            str(DATA / "run_artifact.c"), "-o", str(exe), "-ldl"],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return exe


def _write_plan(compiled, inputs, out: Path, work: Path) -> list[np.ndarray]:
    """The run_artifact plan (library, symbols, params, inputs, outputs) in `work`; returns the expected outputs."""
    m = read_manifest(out)
    symbols = {"batch": inputs["input_ids"].shape[0], "seq": inputs["input_ids"].shape[1]}
    lines = [f"library {out / 'model.so'}",
             "symbols " + " ".join([str(len(m["symbols"]))] + [str(symbols[s["name"]]) for s in m["symbols"]])]
    for i, (name, arr) in enumerate(compiled.param_arrays().items()):
        assert compiled.param_names[i] == name
        arr.tofile(work / f"p{i}.bin")
        lines.append(f"param {i} {work / f'p{i}.bin'}")
    for spec in m["inputs"]:
        np.ascontiguousarray(inputs[spec["name"]]).tofile(work / f"in_{spec['name']}.bin")
        lines.append(f"input {work / ('in_' + spec['name'] + '.bin')}")
    expected = compiled.run(inputs)
    for spec, arr in zip(m["outputs"], expected):
        lines.append(f"output {work / ('out_' + spec['name'] + '.bin')} {arr.nbytes}")
    (work / "plan.txt").write_text("\n".join(lines) + "\n")
    return expected


def _check_outputs(out: Path, work: Path, expected: list[np.ndarray]) -> None:
    for spec, arr in zip(read_manifest(out)["outputs"], expected):
        got = np.fromfile(work / f"out_{spec['name']}.bin", dtype=arr.dtype).reshape(arr.shape)
        assert np.array_equal(got, arr)


def test_plain_c_program_reproduces_python_outputs(bert, tmp_path: Path):
    """tests/toolchain/data/run_artifact.c dlopens the artifact through rlx.h; no Python runs the model."""
    _, compiled, _, inputs = bert
    out = compiled.save(tmp_path / "art")
    exe = _build_c_consumer(out, tmp_path)
    expected = _write_plan(compiled, inputs, out, tmp_path)
    proc = subprocess.run([str(exe), str(tmp_path / "plan.txt")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    _check_outputs(out, tmp_path, expected)


def test_moved_artifact_runs_from_c_on_its_own_copy_of_the_blas(bert, tmp_path: Path):
    """The directory, moved elsewhere, runs from plain C in a bare environment, and the dynamic
    linker takes the BLAS from the artifact (model.so's $ORIGIN RUNPATH), never from the venv."""
    _, compiled, _, inputs = bert
    saved = compiled.save(tmp_path / "build" / "art")
    m = read_manifest(saved)
    if m["blas"] != "openblas32":
        pytest.skip("built without scipy-openblas32: nothing to bundle")
    out = tmp_path / "elsewhere" / "deployed"
    out.parent.mkdir()
    shutil.move(saved, out)
    work = tmp_path / "work"
    work.mkdir()
    exe = _build_c_consumer(out, work)
    expected = _write_plan(compiled, inputs, out, work)
    import scipy_openblas32

    venv_blas_dir = os.path.realpath(scipy_openblas32.get_lib_dir())
    # A fresh environment: no LD_LIBRARY_PATH, no LD_PRELOAD, no Python; LD_DEBUG reports every lookup.
    env = {"PATH": "/usr/bin:/bin", "LD_DEBUG": "libs", "LD_DEBUG_OUTPUT": str(work / "ld")}
    proc = subprocess.run([str(exe), str(work / "plan.txt")], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    _check_outputs(out, work, expected)
    trace = "".join(p.read_text() for p in work.glob("ld.*"))
    assert f"calling init: {out / 'libscipy_openblas.so'}" in trace, trace[-3000:]
    lines = trace.splitlines()
    loaded = [line for line in lines if "calling init:" in line]
    blas_lookups = [line for line in lines if "trying file=" in line and "libscipy_openblas" in line]
    assert blas_lookups and not any(venv_blas_dir in line for line in loaded + blas_lookups), trace[-3000:]
    # And a copy without the bundled BLAS is refused by load() before dlopen, with a clear message.
    (out / "libscipy_openblas.so").unlink()
    with pytest.raises(ArtifactError, match=r"lacks its copy of libscipy_openblas\.so"):
        load(out)


def test_loading_imports_no_code_generator(bert, tmp_path: Path):
    """rlx.load needs neither jinja2 nor any rlx.codegen module (checked in a fresh interpreter)."""
    _, compiled, _, _ = bert
    out = compiled.save(tmp_path / "art", weights=True)
    script = (
        "import sys, numpy as np, rlx\n"
        f"cg = rlx.load({str(out)!r})\n"
        "ids = np.array([[2, 7, 3]], np.int64)\n"
        "cg.run(input_ids=ids, attention_mask=np.ones_like(ids), position_ids=np.arange(3))\n"
        "bad = sorted(m for m in sys.modules if m == 'jinja2' or m.startswith(('jinja2.', 'rlx.codegen')))\n"
        "assert not bad, bad\n"
        "print('CLEAN')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "RLX_CACHE_DIR": str(tmp_path / "unused-cache")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "CLEAN" in proc.stdout, proc.stderr[-3000:]

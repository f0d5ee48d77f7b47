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
from rlx.config import Config
from rlx.errors import ArtifactError
from rlx.models.bert import BertConfig, bert_inputs, build_bert, random_weights
from rlx.toolchain.artifact import load, read_manifest

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
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.c", "model.so", "rlx.h"]
    m = read_manifest(out)
    assert m["abi_version"] == 1 and m["target"] == "cpu" and m["key"] == compiled.key
    assert [i["name"] for i in m["inputs"]] == compiled.input_names
    assert [p["name"] for p in m["params"]] == compiled.param_names
    assert {s["name"]: s["max"] for s in m["symbols"]} == {"batch": 4, "seq": 16}
    assert m["isa"]["arch"] and m["isa"]["cpu_target"] == "native" and "features" in m["isa"]
    assert m["components"]["lir"] and m["weights"] == []
    for name, info in m["files"].items():
        assert (out / name).stat().st_size == info["size"]
    assert "RLX_ABI_VERSION 1" in (out / "rlx.h").read_text()


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
    compiled.set_param("b", np.array([0.5, 1], np.float32))
    out = compiled.save(tmp_path / "art", weights=True)
    x_val = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(load(out).run(x=x_val)[0], compiled.run(x=x_val)[0])


def test_explicit_weights_mapping_is_checked(bert, tmp_path: Path):
    _, compiled, _, _ = bert
    with pytest.raises(ArtifactError, match="not a param"):
        compiled.save(tmp_path / "art", weights={"no.such.param": np.zeros(3)})


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
    ({"target": "cuda"}, "targets 'cuda'"),
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


def test_plain_c_program_reproduces_python_outputs(bert, tmp_path: Path):
    """tests/toolchain/data/run_artifact.c dlopens the artifact through rlx.h; no Python runs the model."""
    _, compiled, _, inputs = bert
    out = compiled.save(tmp_path / "art")
    exe = tmp_path / "run_artifact"
    build = subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-O1", "-Wall", "-Werror", f"-I{out}",
                            str(DATA / "run_artifact.c"), "-o", str(exe), "-ldl"],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    m = read_manifest(out)
    symbols = {"batch": inputs["input_ids"].shape[0], "seq": inputs["input_ids"].shape[1]}
    lines = [f"library {out / 'model.so'}",
             "symbols " + " ".join([str(len(m["symbols"]))] + [str(symbols[s["name"]]) for s in m["symbols"]])]
    for i, (name, arr) in enumerate(compiled.param_arrays().items()):
        assert compiled.param_names[i] == name
        arr.tofile(tmp_path / f"p{i}.bin")
        lines.append(f"param {i} {tmp_path / f'p{i}.bin'}")
    for spec in m["inputs"]:
        np.ascontiguousarray(inputs[spec["name"]]).tofile(tmp_path / f"in_{spec['name']}.bin")
        lines.append(f"input {tmp_path / ('in_' + spec['name'] + '.bin')}")
    expected = compiled.run(inputs)
    for spec, arr in zip(m["outputs"], expected):
        lines.append(f"output {tmp_path / ('out_' + spec['name'] + '.bin')} {arr.nbytes}")
    (tmp_path / "plan.txt").write_text("\n".join(lines) + "\n")
    proc = subprocess.run([str(exe), str(tmp_path / "plan.txt")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for spec, arr in zip(m["outputs"], expected):
        got = np.fromfile(tmp_path / f"out_{spec['name']}.bin", dtype=arr.dtype).reshape(arr.shape)
        assert np.array_equal(got, arr)

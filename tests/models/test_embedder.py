"""SentenceEmbedder on a tiny BERT directory: edge inputs of `embed`, and what a warm start loads.

The warm start runs in fresh processes against a private cache: one compiles (cold), the next
finds the built library by the graph's recipe (`Session.compile_recipe`: without building the graph)
and embeds; that one must not import the code generators, the optimizer, jinja2 or any optional
frontend, nor the IR's graphs and op classes, nor ml_dtypes, nor what only a build uses (`WARM_MUST_NOT_IMPORT`), nor,
once the cache's memos are written, what writing one needs (`WARM_MEMOS_MUST_NOT_IMPORT`). Module sets,
not wall-clock times: what is imported is what costs start-up time. The GEMM weights the cold process
packed are kept beside the library (`rlx.toolchain.param_store`) and bound by the warm ones, not packed again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rlx.errors import ExecutionError
from rlx.models.embedder import SentenceEmbedder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_bert import write_model_dir

REPO = Path(__file__).resolve().parents[2]

#: Prefixes of modules a warm `from_pretrained(...).embed(...)` has no use for.
WARM_MUST_NOT_IMPORT = ("jinja2", "rlx.codegen", "rlx.opt", "rlx.reference", "rlx.frontends", "onnx",
                        # the IR's graphs and op classes and the tracer: the object is found by recipe,
                        # and the runtime needs rlx.ir.dtype only (rlx/__init__.py's lazy names)
                        "rlx.ir.graph", "rlx.ir.ops", "rlx.ir.ops_control", "rlx.ir.hir", "rlx.ir.lir",
                        "rlx.ir.module", "rlx.ir.serialize", "rlx.trace",
                        "rlx.models.causal_lm", "rlx.models.gguf", "rlx.models.llama", "rlx.distributed",
                        "rlx.report", "scipy", "torch", "pyarrow",
                        # run_async's executor; the governor's median is computed without statistics
                        "concurrent.futures", "statistics",
                        # numpy's bfloat16 and narrow types, for graphs and arrays that have them (rlx.ir.dtype)
                        "ml_dtypes",
                        # what only a build or cache maintenance uses: the kernel units, the memory estimate,
                        # the ISA record, the cache listing's values
                        "rlx.toolchain.units", "rlx.runtime.memory", "rlx.toolchain.isa", "rlx.toolchain.cache_report")
#: ...and what writing a memo loads: the stdlib modules of temp files (shutil loads zlib, bz2 and lzma;
#: the toolchain's `which` and the cache's stats update do without them) and cffi's C parser (which
#: imports subprocess, as running the C compiler does). The first
#: process after a cold one in a new cache root writes the runtime's cffi declarations (`rlx.runtime.ffi_memo`:
#: the cold process loaded the runtime before the root existed); every later one reads them.
WARM_MEMOS_MUST_NOT_IMPORT = ("shutil", "tempfile", "bz2", "lzma", "random", "pycparser", "subprocess")

# argv: the model directory. Prints one JSON line: the embedding, whether the library came from the
# cache, and the loaded modules that WARM_MUST_NOT_IMPORT names.
CHILD = r'''
import json, sys
from rlx.models import SentenceEmbedder
emb = SentenceEmbedder.from_pretrained(sys.argv[1], max_seq=16, max_batch=4)
vecs = emb.embed(["hi", "a man eats food"])
import rlx.pristine
forbidden = tuple(json.loads(sys.argv[2]))
print(json.dumps({
    "vecs": vecs.tolist(),
    "hit": emb.runner("embeddings").compiled.cache_hit,
    "built_graph": emb.runner("embeddings")._graph is not None,
    "in_place": list(emb.runner("embeddings").compiled.params_in_place),
    "stored": list(emb.runner("embeddings").compiled.params_stored),
    "pristine": rlx.pristine.compiler_is_pristine(),
    "loaded": sorted(m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in forbidden)),
}))
'''


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny-bert"))


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_no_sentences_embed_to_an_empty_batch(model_dir: Path, device: str) -> None:
    emb = SentenceEmbedder.from_pretrained(model_dir, device=device, max_seq=16, max_batch=4)
    out = emb.embed([])
    assert out.shape == (0, emb.dim) and out.dtype == np.float32
    assert emb._runners == {}  # nothing to run, so nothing was compiled


@pytest.mark.parametrize(("sentences", "message"), [
    (None, r"embed\(\) takes a list of sentences \(str\), got NoneType"),
    (3, r"embed\(\) takes a list of sentences \(str\), got int"),
    ("hi", r"embed\(\) takes a list of sentences; wrap a single sentence in a list"),
    (["hi", None], "sentence 1 is NoneType, not str"),
])
def test_bad_sentences_are_named(model_dir: Path, sentences: object, message: str) -> None:
    emb = SentenceEmbedder.from_pretrained(model_dir, device="reference", max_seq=16, max_batch=4)
    with pytest.raises(ExecutionError, match=message):
        emb.embed(sentences)  # type: ignore[arg-type]


def _named(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def _settle(weights: Path) -> None:
    """Wait until `weights` has been unchanged for `param_store.SETTLE_SECONDS` (a file changed more recently
    is packed in every process, never kept)."""
    from rlx.toolchain.param_store import SETTLE_SECONDS

    time.sleep(max(0.0, os.stat(weights).st_ctime + SETTLE_SECONDS + 0.05 - time.time()))


def _fresh_process(model_dir: Path, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RLX_TEMPLATES_DIR", "RLX_CACHE", "RLX_CACHE_PATH")}
    env.update(RLX_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    # -P: the working directory must not shadow PYTHONPATH's rlx
    forbidden = WARM_MUST_NOT_IMPORT + WARM_MEMOS_MUST_NOT_IMPORT
    proc = subprocess.run([sys.executable, "-P", "-c", CHILD, str(model_dir), json.dumps(forbidden)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="needs a C compiler")
def test_a_warm_start_imports_no_compiler_stage_nor_optional_package(model_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _settle(model_dir / "model.safetensors")
    cold = _fresh_process(model_dir, cache)
    assert not cold["hit"] and "rlx.codegen.cpu.emit" in cold["loaded"] and "rlx.opt.pipeline" in cold["loaded"]
    first = _fresh_process(model_dir, cache)
    assert first["hit"] and first["pristine"] and not first["built_graph"]
    assert _named(first["loaded"], WARM_MUST_NOT_IMPORT) == [], f"a warm start imported {first['loaded']}"
    warm = _fresh_process(model_dir, cache)
    assert warm["hit"] and warm["pristine"]
    assert cold["built_graph"] and not warm["built_graph"], "a warm start built the graph (recipe index missed)"
    assert warm["loaded"] == [], f"a warm start imported {warm['loaded']}"
    # the weights file is mapped read-only: the tables stored as given are read in place, not copied
    assert "embeddings.word_embeddings.weight" in warm["in_place"] == cold["in_place"]
    # the GEMM weights, packed by the cold process and kept beside the library, are mapped, not packed again
    assert cold["stored"] == [] and "encoder.layer.0.attention.self.query.weight" in warm["stored"]
    assert warm["stored"] == first["stored"] and not set(warm["stored"]) & set(warm["in_place"])
    np.testing.assert_allclose(warm["vecs"], cold["vecs"], rtol=1e-6, atol=1e-7)
    reference = SentenceEmbedder.from_pretrained(model_dir, device="reference", max_seq=16, max_batch=4)
    np.testing.assert_allclose(warm["vecs"], reference.embed(["hi", "a man eats food"]), rtol=1e-4, atol=1e-5)


def test_a_subclass_building_its_own_graph_is_compiled_by_that_graph(model_dir: Path) -> None:
    """The recipe describes SentenceEmbedder.graph: a subclass that overrides `graph` (and not `recipe`)
    must never be served the object built for the base class's graph (the base one is compiled first, so
    its recipe is indexed)."""
    class Scaled(SentenceEmbedder):
        def graph(self, output: str):  # the same encoder, its pooled output doubled
            g = super().graph(output)
            (out,) = g.outputs
            g.set_outputs([g.mul(out, g.constant(np.float32(2.0)))])
            return g

    base = SentenceEmbedder.from_pretrained(model_dir, max_seq=16, max_batch=4)
    want = base.embed(["hi"])
    scaled = Scaled(base.config, base.weights, base.tokenizer, max_seq=16, max_batch=4, sentence=base.sentence)
    np.testing.assert_allclose(scaled.embed(["hi"]), 2 * want, rtol=1e-6, atol=1e-7)

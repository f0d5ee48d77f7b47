"""Ray Data: embed_dataset on a local 2-CPU cluster equals the single-process embeddings by id."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from rlx.distributed import corpus, embed_dataset
from rlx.distributed.bundle import BundledEmbedder

from .conftest import sentences

# Collected everywhere (tests/test_collection.py); run where the optional `ray[data]` and pyarrow are.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None or importlib.util.find_spec("pyarrow") is None,
    reason="ray[data] and pyarrow are optional (pip install 'rlx[ray]')")
if importlib.util.find_spec("ray") is not None:
    import ray
    import ray.data

N = 4000


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def test_embed_dataset_equals_single_process_by_id(cluster, bundle):
    texts = sentences(N, seed=11)
    model = BundledEmbedder.load(bundle)
    want = model.embed(texts)
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
    out = embed_dataset(ds, model=bundle, batch_size=500, workers=2)
    ids, embs, startup = [], [], []
    for batch in out.iter_batches(batch_format="numpy", batch_size=None):
        ids.append(batch["id"])
        embs.append(batch["embedding"])
        startup.append(batch["_rlx_startup_s"])
    ids = np.concatenate(ids)
    emb = np.concatenate(embs)
    assert sorted(ids.tolist()) == list(range(N))
    # Workers sort each 500-text batch by length, the reference sorts all N: batches differ,
    # rows agree to f32 rounding.
    np.testing.assert_allclose(emb, want[ids], rtol=1e-5, atol=1e-6)
    assert np.concatenate(startup).min() > 0  # each actor timed its load


def test_corpus_on_ray_equals_local_and_resumes(cluster, bundle, tmp_path):
    from rlx.distributed.ray_embed import ray_executor

    texts = sentences(1000, seed=12)
    src = tmp_path / "c.txt"
    src.write_text("".join(t + "\n" for t in texts))
    model = BundledEmbedder.load(bundle)
    kw = dict(model_key=model.key, dim=model.dim, shard_size=300, progress=False)
    local = corpus.embed_corpus(src, tmp_path / "local", executor=corpus.local_executor(model), **kw)
    # An earlier run stopped after its first shard: Ray resumes and computes only the other three.
    out = tmp_path / "ray"

    class Stop(Exception):
        pass

    def stop(shard):
        raise Stop

    with pytest.raises(Stop):
        corpus.embed_corpus(src, out, executor=corpus.local_executor(model), on_shard=stop, **kw)
    res = corpus.embed_corpus(src, out, executor=ray_executor(bundle, workers=2, batch_size=128), **kw)
    assert (res.rows, res.shards, res.computed, res.reused) == (local.rows, local.shards, 3, 1)
    ids_l, emb_l = corpus.read_embeddings(local.output)
    ids_r, emb_r = corpus.read_embeddings(res.output)
    assert ids_r.tolist() == ids_l.tolist()
    np.testing.assert_allclose(emb_r, emb_l, rtol=1e-5, atol=1e-6)


def test_cli_ray_flag(cluster, model_dir, tmp_path, capsys):
    from rlx.examples import embed

    texts = sentences(200, seed=13)
    src = tmp_path / "c.txt"
    src.write_text("".join(t + "\n" for t in texts))
    argv = ["--model", str(model_dir), "--max-seq", "32", "--input", str(src), "--batch-size", "8",
            "--shard-size", "100", "--no-progress", "--workers", "2", "--ray"]
    assert embed.main([*argv[:-1], "--output", str(tmp_path / "local")]) == 0
    assert embed.main([*argv, "--output", str(tmp_path / "ray")]) == 0
    assert "200 embeddings of size 32 in 2 shards (2 computed now" in capsys.readouterr().out
    ids_l, emb_l = corpus.read_embeddings(tmp_path / "local")
    ids_r, emb_r = corpus.read_embeddings(tmp_path / "ray")
    assert ids_r.tolist() == ids_l.tolist() == list(range(200))
    np.testing.assert_allclose(emb_r, emb_l, rtol=1e-5, atol=1e-6)

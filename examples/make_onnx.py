"""Write a small transformer-style encoder as an ONNX file, built with `onnx.helper` (no torch).

    python examples/make_onnx.py model.onnx [--layers 2 --hidden 32 --heads 4 --seed 0]
    rlxc compile model.onnx -o out/ --max-dim batch=8 --max-dim sequence=64

Inputs: ``input_ids`` and ``attention_mask`` (int64 ``[batch, sequence]``) and
``position_ids`` (int64 ``[sequence]``); outputs ``last_hidden_state``
(``[batch, sequence, hidden]``) and ``pooled`` (masked mean over the sequence,
``[batch, hidden]``). Weights are random (``--seed``). Head splitting goes
through a ``Shape → Gather → Unsqueeze → Concat → Reshape`` chain and the MLP
uses the exported erf-GELU pattern, as in models exported from PyTorch, so
the file exercises what `rlx.from_onnx` folds and pattern-matches.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    """Accumulates nodes and initializers with generated tensor names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def op(self, op_type: str, *inputs: str, n_out: int = 1, **attrs: object) -> str:
        self.count += 1
        outs = [f"{op_type.lower()}_{self.count}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=f"{op_type}_{self.count}", **attrs))
        return outs[0]

    def const(self, value: object, dtype: type = np.float32) -> str:
        self.count += 1
        name = f"const_{self.count}"
        tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
        self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        return name

    def weight(self, name: str, shape: Sequence[int], scale: float = 0.1) -> str:
        value = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def ones(self, name: str, n: int) -> str:
        self.inits.append(numpy_helper.from_array(np.ones(n, np.float32), name))
        return name

    def linear(self, x: str, prefix: str, n_in: int, n_out: int) -> str:
        y = self.op("MatMul", x, self.weight(prefix + ".weight", [n_in, n_out]))
        return self.op("Add", y, self.weight(prefix + ".bias", [n_out]))

    def layer_norm(self, x: str, prefix: str, n: int) -> str:
        return self.op("LayerNormalization", x, self.ones(prefix + ".gamma", n), self.weight(prefix + ".beta", [n]),
                       axis=-1, epsilon=1e-12)

    def erf_gelu(self, x: str) -> str:
        """0.5 * x * (1 + erf(x / sqrt(2))), as torch.onnx exports F.gelu."""
        e = self.op("Erf", self.op("Div", x, self.const(math.sqrt(2.0))))
        return self.op("Mul", self.op("Mul", x, self.op("Add", e, self.const(1.0))), self.const(0.5))

    def dims(self, x: str, *axes: int) -> list[str]:
        """The sizes of `x` along `axes`, each an int64 [1] tensor computed from Shape."""
        shape = self.op("Shape", x)
        return [self.op("Unsqueeze", self.op("Gather", shape, self.const(a, np.int64), axis=0),
                        self.const([0], np.int64)) for a in axes]


def build_model(*, vocab: int = 50, hidden: int = 32, heads: int = 4, layers: int = 2, ffn: int = 64,
                max_positions: int = 64, seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """The encoder described in the module docstring, as an `onnx.ModelProto`."""
    if hidden % heads:
        raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
    b = _Builder(np.random.default_rng(seed))
    head_dim = hidden // heads
    x = b.op("Add", b.op("Gather", b.weight("tok_emb", [vocab, hidden], 1.0), "input_ids", axis=0),
             b.op("Gather", b.weight("pos_emb", [max_positions, hidden], 1.0), "position_ids", axis=0))
    x = b.layer_norm(x, "emb_ln", hidden)
    keep = b.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    bias = b.op("Mul", b.op("Sub", b.const(1.0), b.op("Unsqueeze", keep, b.const([1, 2], np.int64))),
                b.const(-1e4))
    for i in range(layers):
        p = f"layer{i}"
        batch, seq = b.dims(x, 0, 1)
        split_shape = b.op("Concat", batch, seq, b.const([heads, head_dim], np.int64), axis=0)
        q, k, v = (b.op("Transpose", b.op("Reshape", b.linear(x, f"{p}.{n}", hidden, hidden), split_shape),
                        perm=[0, 2, 1, 3]) for n in ("q", "k", "v"))
        scores = b.op("Div", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2])),
                      b.const(math.sqrt(head_dim)))
        probs = b.op("Softmax", b.op("Add", scores, bias), axis=-1)
        ctx = b.op("Transpose", b.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        merged = b.op("Reshape", ctx, b.op("Concat", batch, seq, b.const([hidden], np.int64), axis=0))
        x = b.layer_norm(b.op("Add", x, b.linear(merged, f"{p}.o", hidden, hidden)), f"{p}.ln1", hidden)
        h = b.linear(b.erf_gelu(b.linear(x, f"{p}.up", hidden, ffn)), f"{p}.down", ffn, hidden)
        x = b.layer_norm(b.op("Add", x, h), f"{p}.ln2", hidden)
    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    weights = b.op("Unsqueeze", keep, b.const([2], np.int64))
    total = b.op("ReduceSum", b.op("Mul", x, weights), b.const([1], np.int64), keepdims=0)
    count = b.op("ReduceSum", weights, b.const([1], np.int64), keepdims=0)
    b.nodes.append(helper.make_node("Div", [total, count], ["pooled"]))
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
           for n in ("input_ids", "attention_mask")]
    graph = helper.make_graph(
        b.nodes, "tiny_encoder",
        [*ids, helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["sequence"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", hidden])],
        b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="rlx-example")
    onnx.checker.check_model(model)
    return model


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output", help="path of the .onnx file to write")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=64)
    p.add_argument("--vocab", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    model = build_model(vocab=args.vocab, hidden=args.hidden, heads=args.heads, layers=args.layers, ffn=args.ffn,
                        seed=args.seed)
    onnx.save(model, args.output)
    print(f"wrote {args.output}: {len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers; "
          f"dynamic axes batch, sequence", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shape and dtype inference of every MIR op, and the errors it raises."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import pytest

from rlx.errors import IRError, ShapeError
from rlx.ir import ops as O
from rlx.ir import ops_control as C
from rlx.ir import ops_conv as CV
from rlx.ir import ops_feedback as FB
from rlx.ir import ops_int8 as Q8
from rlx.ir import ops_lora as LR
from rlx.ir import ops_moe as MOE
from rlx.ir import ops_range as RG
from rlx.ir import ops_sample as SP
from rlx.ir import ops_scan as L
from rlx.ir import ops_ssm as S
from rlx.ir import ops_user as U
from rlx.ir.graph import Graph
from rlx.ir.shape import Dim, Shape
from tests.ir.user_ops import swish_beta

SEQ = Dim.dynamic("seq", max=64)
#: The registered user op of the user_op cases.
SWISH = swish_beta()
BATCH = Dim.dynamic("batch", max=4)
_SYMS = {"seq": SEQ, "batch": BATCH}


def sh(spec: str) -> Shape:
    """'f32[2,seq,3]' → Shape; names 'seq' and 'batch' are dynamic, '2*seq' a product."""
    dtype, _, rest = spec.partition("[")
    dims = []
    for tok in filter(None, rest.rstrip("]").split(",")):
        d = Dim(1)
        for factor in tok.split("*"):
            d = d * (_SYMS[factor] if factor in _SYMS else Dim(int(factor)))
        dims.append(d)
    return Shape.of(dims, dtype)


def _body(*specs: str, fn: str = "tanh", out: int = 0) -> L.Body:
    """A body whose inputs have `specs` and whose one output is `fn(input[out] + input[-1])`."""
    b = Graph("body")
    ins = [b.input(f"i{k}", sh(sp)) for k, sp in enumerate(specs)]
    b.set_outputs([b.activation(fn, b.add_(ins[out], ins[-1]))])
    return b.as_body()


def _pred_body(*specs: str, fn: str = "gt") -> L.Body:
    """A body whose inputs have `specs` and whose one output is ``compare(fn, sum(input[0]), 0)`` (a bool)."""
    b = Graph("pred")
    ins = [b.input(f"i{k}", sh(sp)) for k, sp in enumerate(specs)]
    b.set_outputs([b.compare(fn, b.reduce("sum", ins[0]), b.constant(np.float32(0)))])
    return b.as_body()


def infer(op: O.Op, *specs: str) -> Shape:
    """Build a graph feeding `op` from inputs of the given shapes; return the inferred shape."""
    g = Graph("t")
    ids = [g.input(f"i{k}", sh(s)) for k, s in enumerate(specs)]
    return g.shape(g.add(op, ids, name="probe"))


# (op, input shapes, expected output shape)
VALID: list[tuple[O.Op, tuple[str, ...], str]] = [
    # leaves are checked in test_leaves; everything else here
    (O.Activation("gelu"), ("f32[2,3]",), "f32[2,3]"),
    (O.Activation("silu"), ("bf16[seq,8]",), "bf16[seq,8]"),
    (O.Activation("relu"), ("i32[4]",), "i32[4]"),  # relu/neg/abs accept integers
    (O.Activation("neg"), ("i8[4]",), "i8[4]"),
    (O.Activation("abs"), ("f16[]",), "f16[]"),
    (O.Binary("add"), ("f32[2,3]", "f32[3]"), "f32[2,3]"),
    (O.Binary("mul"), ("f32[batch,1,8]", "f32[seq,1]"), "f32[batch,seq,8]"),
    (O.Binary("div"), ("i64[4,1]", "i64[1,5]"), "i64[4,5]"),
    (O.Binary("pow"), ("f32[]", "f32[2]"), "f32[2]"),
    (O.Binary("fmod"), ("f64[3]", "f64[2,1]"), "f64[2,3]"),
    (CV.Pool("avg", (2, 2), dilations=(2, 2)), ("f32[2,3,8,8]",), "f32[2,3,6,6]"),  # opset 19's dilations
    (CV.Pool("max", (2, 3, 2), strides=(2, 1, 2), pads=(1, 0, 0, 1, 0, 0), ceil_mode=True), ("f32[batch,3,5,6,7]",),
     "f32[batch,3,3,4,4]"),  # D: ceil_mode's last window would start in the end padding
    (RG.Iota(SEQ), (), "i64[seq]"),
    (RG.Iota(SEQ * 2, 0.5, -0.25, O.DType.F16), (), "f16[2*seq]"),
    (O.Binary("max"), ("f16[seq,2]", "f16[seq,2]"), "f16[seq,2]"),
    (O.Compare("lt"), ("f32[2,3]", "f32[1]"), "bool[2,3]"),
    (O.Compare("eq"), ("bool[seq]", "bool[seq]"), "bool[seq]"),
    (O.Where(), ("bool[2,1]", "f32[3]", "f32[2,3]"), "f32[2,3]"),
    (O.Where(), ("bool[seq]", "i32[]", "i32[]"), "i32[seq]"),
    (O.Cast(O.DType.BF16), ("f32[2,seq]",), "bf16[2,seq]"),
    (O.Cast(O.DType.BOOL), ("i32[3]",), "bool[3]"),
    (O.MatMul(), ("f32[4,8]", "f32[8,16]"), "f32[4,16]"),
    (O.DequantMatMul("q4_1"), ("f32[batch,seq,64]", "u8[5,40]"), "f32[batch,seq,5]"),
    (O.DequantMatMul("q6_k"), ("f32[1,256]", "u8[3,210]"), "f32[1,3]"),
    (O.DequantMatMul("q8_0", "q8"), ("f32[seq,32]", "u8[2,34]"), "f32[seq,2]"),
    (O.DequantMatMul("q4_k", "q8"), ("f32[1,256]", "u8[3,144]"), "f32[1,3]"),
    (O.Dequantize("q8_0"), ("u8[seq,68]",), "f32[seq,64]"),
    (Q8.Int8MatMul(), ("f32[batch,seq,6]", "f32[6,5]"), "f32[batch,seq,5]"),
    (Q8.Int8MatMul("gelu"), ("f32[3,6]", "f32[6,5]", "f32[5]"), "f32[3,5]"),
    (O.MatMul(), ("f32[batch,seq,8]", "f32[8,3]"), "f32[batch,seq,3]"),
    (O.MatMul(), ("f32[2,1,4,8]", "f32[5,8,3]"), "f32[2,5,4,3]"),
    (O.MatMul(), ("f16[seq,seq]", "f16[seq,4]"), "f16[seq,4]"),
    (O.Reduce("sum", (1,)), ("f32[2,3,4]",), "f32[2,4]"),
    (O.Reduce("mean", (-1, 0), True), ("f32[2,3,4]",), "f32[1,3,1]"),
    (O.Reduce("max", ()), ("f32[2,seq]",), "f32[]"),
    (O.Reduce("prod", (), True), ("i32[2,3]",), "i32[1,1]"),
    (O.Reduce("min", (1,)), ("f32[batch,seq]",), "f32[batch]"),
    (O.Softmax(), ("f32[2,seq]",), "f32[2,seq]"),
    (O.ArgMax(), ("f16[2,seq,7]",), "i32[2,seq]"),
    (O.ArgMax(0), ("f32[5,3]",), "i32[3]"),
    (SP.SampleTopK(), ("f32[batch,49]", "f64[batch]", "f64[3]"), "i32[batch]"),
    (FB.TokenFeed(), ("i32[batch,seq]", "i32[batch]", "i32[8]"), "i32[batch,seq]"),
    (FB.TokenStore(), ("i32[batch]", "i32[batch]", "i32[8]"), "i32[batch]"),
    (O.Softmax(0), ("bf16[5]",), "bf16[5]"),
    (O.LayerNorm(1e-5), ("f32[seq,8]", "f32[8]", "f32[8]"), "f32[seq,8]"),
    (O.RmsNorm(1e-6), ("f16[2,3,8]", "f16[8]"), "f16[2,3,8]"),
    (O.Reshape((6,)), ("f32[2,3]",), "f32[6]"),
    (O.Reshape((-1, 4)), ("f32[2,3,4]",), "f32[6,4]"),
    (O.Reshape((BATCH * SEQ, 8)), ("f32[batch,seq,8]",), "f32[batch*seq,8]"),
    (O.Reshape((BATCH, -1, 2)), ("f32[batch,seq,8]",), "f32[batch,4*seq,2]"),
    (O.Reshape(()), ("f32[1,1]",), "f32[]"),
    (O.Transpose((1, 0)), ("f32[2,3]",), "f32[3,2]"),
    (O.Transpose((0, 2, 1, 3)), ("f32[batch,seq,4,8]",), "f32[batch,4,seq,8]"),
    (O.Narrow(1, 2, 3), ("f32[seq,8]",), "f32[seq,3]"),
    (O.Narrow(-1, 0, 0), ("f32[2,8]",), "f32[2,0]"),
    (O.Concat(1), ("f32[seq,2]", "f32[seq,3]"), "f32[seq,5]"),
    (O.AllReduce(world=2), ("bf16[seq,8]",), "bf16[seq,8]"),
    (O.AllGather(world=4, axis=-1), ("f16[seq,2]",), "f16[seq,8]"),
    (O.ReduceScatter(world=2, reduce="max", axis=1), ("f32[seq,8]",), "f32[seq,4]"),
    (O.Concat(-1), ("i32[4]",), "i32[4]"),
    (O.Expand((2, 3)), ("f32[1,3]",), "f32[2,3]"),
    (O.Expand((BATCH, SEQ, 4)), ("f32[4]",), "f32[batch,seq,4]"),
    (O.Gather(0), ("f32[100,8]", "i32[seq]"), "f32[seq,8]"),
    (O.Gather(1), ("f32[2,100,8]", "i64[3,4]"), "f32[2,3,4,8]"),
    (O.Attention(4, 8), ("f32[2,seq,32]", "f32[2,seq,32]", "f32[2,seq,32]"), "f32[2,seq,32]"),
    (O.Attention(4, 8, "causal", num_kv_heads=2), ("f16[1,3,32]", "f16[1,7,16]", "f16[1,7,16]"), "f16[1,3,32]"),
    (O.Attention(2, 4, "padding"), ("f32[2,3,8]", "f32[2,5,8]", "f32[2,5,8]", "i32[2,5]"), "f32[2,3,8]"),
    (O.Attention(2, 4, "bias"), ("f32[2,3,8]", "f32[2,5,8]", "f32[2,5,8]", "f32[3,5]"), "f32[2,3,8]"),
    (O.Attention(2, 4, "bias"), ("f32[2,3,8]", "f32[2,5,8]", "f32[2,5,8]", "f32[2,2,1,5]"), "f32[2,3,8]"),
    (O.Attention(2, 4, scale=0.5), ("bf16[1,1,8]", "bf16[1,9,8]", "bf16[1,9,8]"), "bf16[1,1,8]"),
    (O.Rope(8), ("f32[2,seq,32]", "f32[seq,4]", "f32[seq,4]"), "f32[2,seq,32]"),
    (O.Rope(8, 4, "interleaved"), ("f16[1,5,16]", "f16[5,2]", "f16[5,2]"), "f16[1,5,16]"),
    (O.Rope(8), ("f32[batch,seq,16]", "f32[batch,seq,4]", "f32[batch,seq,4]"), "f32[batch,seq,16]"),
    (O.CachedAttention(4, 8, 2), ("f32[batch,seq,32]", "f32[batch,seq,16]", "f32[batch,seq,16]", "f32[4,64,16]",
                                  "f32[4,64,16]", "i32[batch]"), "f32[batch,seq,32]"),
    (O.CachedAttention(4, 8, 2, page_size=16), ("f32[batch,1,32]", "f32[batch,1,16]", "f32[batch,1,16]",
                                                "f32[64,16,16]", "f32[64,16,16]", "i32[batch]", "i32[batch,8]"),
     "f32[batch,1,32]"),
    (O.CachedAttention(4, 8, 2), ("f32[batch,seq,32]", "f32[batch,seq,16]", "f32[batch,seq,16]", "f16[4,64,16]",
                                  "f16[4,64,16]", "i32[batch]"), "f32[batch,seq,32]"),
    (O.FusedMatMulBiasAct(), ("f32[seq,8]", "f32[8,4]"), "f32[seq,4]"),
    (O.FusedMatMulBiasAct("gelu"), ("f32[2,3,8]", "f32[8,4]", "f32[4]"), "f32[2,3,4]"),
    (O.FusedResidualLayerNorm(), ("f32[seq,8]", "f32[seq,8]", "f32[8]", "f32[8]"), "f32[seq,8]"),
    (O.FusedResidualLayerNorm(), ("f32[2,8]", "f32[2,8]", "f32[8]", "f32[8]", "f32[8]"), "f32[2,8]"),
    (O.FusedResidualRmsNorm(), ("bf16[seq,8]", "bf16[seq,8]", "bf16[8]"), "bf16[seq,8]"),
    (O.FusedResidualRmsNorm(), ("f32[2,8]", "f32[2,8]", "f32[8]", "f32[8]"), "f32[2,8]"),
    (O.FusedSwiGLU(), ("f32[seq,8]", "f32[8,16]", "f32[8,16]"), "f32[seq,16]"),
    (O.ElementwiseRegion((O.RegionStep(O.Binary("mul"), (0, 1)), O.RegionStep(O.Activation("silu"), (2,)))),
     ("f32[seq,1]", "f32[4]"), "f32[seq,4]"),
    (O.ElementwiseRegion((O.RegionStep(O.Compare("gt"), (0, 1)), O.RegionStep(O.Where(), (2, 0, 1)),
                          O.RegionStep(O.Cast(O.DType.F16), (3,)))), ("f32[3]", "f32[3]"), "f16[3]"),
    (S.SelectiveScan(16), ("f32[2,seq,8]", "f32[2,seq,8]", "f32[8,16]", "f32[2,seq,16]", "f32[2,seq,16]"),
     "f32[2,seq,8]"),
    (S.GatedDeltaNet(4), ("f32[1,seq,2,4]",) * 3 + ("f32[1,seq,2]",) * 2, "f32[1,seq,2,4]"),
    (S.GatedDeltaNet(4, True, 0.5), ("f32[1,seq,2,4]",) * 3 + ("f32[1,seq,2]",) * 2 + ("f32[1,2,4,4]",),
     "f32[1,seq,2,4]"),
    (CV.Conv(), ("f32[batch,3,8,8]", "f32[4,3,3,3]"), "f32[batch,4,6,6]"),
    (CV.Conv((2, 2), (1, 1), (1, 1, 1, 1), activation="relu"), ("f32[1,3,8,8]", "f32[4,3,3,3]", "f32[4]"),
     "f32[1,4,4,4]"),
    (CV.Conv((1, 1), (2, 2), (2, 2, 2, 2), groups=4), ("f32[2,4,5,7]", "f32[4,1,3,3]"), "f32[2,4,5,7]"),
    (CV.Conv((2,), (), (1, 1)), ("f16[2,5,17]", "f16[7,5,3]"), "f16[2,7,9]"),
    (CV.Pool("max", (3, 3), (2, 2), (1, 1, 1, 1)), ("f32[batch,3,9,9]",), "f32[batch,3,5,5]"),
    (CV.Pool("avg", (3, 2), (2, 2), (1, 1, 1, 1), ceil_mode=True), ("f32[2,3,10,9]",), "f32[2,3,6,5]"),
    (CV.Pool("max", (3,), (2,), ceil_mode=True), ("f32[2,3,11]",), "f32[2,3,5]"),
    (CV.BatchNorm(1e-3), ("f32[2,3,4,4]",) + ("f32[3]",) * 4, "f32[2,3,4,4]"),
    (S.DepthwiseConv1dCausal(3), ("f32[2,seq,8]", "f32[8,3]"), "f32[2,seq,8]"),
    (S.DepthwiseConv1dCausal(3), ("f32[2,seq,8]", "f32[8,3]", "f32[2,2,8]"), "f32[2,seq,8]"),
    (S.DepthwiseConv1dCausal(3, carry_state=True), ("f32[2,seq,8]", "f32[8,3]", "f32[2,2,8]", "i32[2]"),
     "f32[2,seq,8]"),
    (S.SelectiveScan(16, True), ("f32[2,seq,8]", "f32[2,seq,8]", "f32[8,16]", "f32[2,seq,16]", "f32[2,seq,16]",
                                 "f32[2,8,16]"), "f32[2,seq,8]"),
    (MOE.MoeTopK(2), ("f32[seq,8]",), "i32[seq,2]"),
    (MOE.MoeGate(True), ("f32[seq,8]", "i32[seq,2]"), "f32[seq,2]"),
    (MOE.MoeMatMul(), ("f32[seq,64]", "i32[seq,2]", "bf16[8,5,64]"), "f32[seq,2,5]"),
    (MOE.MoeMatMul("q8_0"), ("f32[seq,2,64]", "i32[seq,2]", "u8[8,5,68]"), "f32[seq,2,5]"),
    (L.Scan(_body("f32[3]", "f32[3]"), SEQ, 0, 1), ("f32[3]", "f32[seq,3]"), "f32[3]"),
    (L.Scan(_body("f32[3]", "f32[3]", "f32[3]"), SEQ, 1, 1, save_trajectory=True),
     ("f32[3]", "f32[3]", "f32[seq,3]"), "f32[seq,3]"),
    (L.CustomFn(_body("f32[2]", "f32[2]")), ("f32[2]", "f32[2]"), "f32[2]"),
    (C.Cond(_body("f32[3]", "f32[3]"), _body("f32[3]", "f32[3]", fn="exp")), ("bool[]", "f32[3]", "f32[3]"),
     "f32[3]"),
    (C.Cond(_body("f32[seq]"), _body("f32[seq]", fn="exp")), ("bool[1]", "f32[seq]"), "f32[seq]"),
    (C.WhileLoop(_pred_body("f32[3]", "f32[3]"), _body("f32[3]", "f32[3]"), 5), ("f32[3]", "f32[3]"), "f32[3]"),
    (C.WhileLoop(_pred_body("f32[2]", fn="lt"), _body("f32[2]")), ("f32[2]",), "f32[2]"),
    (U.UserOp(SWISH.name, SWISH.spec.digest()), ("f32[seq,3]", "f32[]"), "f32[seq,3]"),
    (LR.LoraMatMul(), ("f32[batch,seq,8]", "f32[3,4,8]", "f32[3,5,4]", "f32[3]", "i32[batch]"), "f32[batch,seq,5]"),
    (LR.LoraMatMul(), ("f32[batch,8]", "f32[1,2,8]", "f32[1,6,2]", "f32[1]", "i32[batch]"), "f32[batch,6]"),
]


@pytest.mark.parametrize(("op", "specs", "want"), VALID, ids=[f"{c[0].kind}-{i}" for i, c in enumerate(VALID)])
def test_infer(op: O.Op, specs: tuple[str, ...], want: str) -> None:
    assert infer(op, *specs) == sh(want)


# (op, input shapes, exception, message pattern)
ERRORS: list[tuple[O.Op, tuple[str, ...], type, str]] = [
    (O.Activation("swish"), ("f32[2]",), ShapeError, "unknown activation 'swish'"),
    (O.Activation("exp"), ("i32[2]",), ShapeError, "needs a floating-point input"),
    (O.Activation("neg"), ("bool[2]",), ShapeError, "does not accept bool"),
    (O.Activation("relu"), ("f32[2]", "f32[2]"), IRError, "activation takes 1 inputs, got 2"),
    (O.Binary("mod"), ("f32[2]", "f32[2]"), ShapeError, "unknown binary op 'mod'"),
    (O.Binary("add"), ("f32[2,3]", "f32[2]"), ShapeError, r"cannot broadcast shapes \[2,3\] vs \[2\]"),
    (O.Binary("add"), ("f32[seq]", "f32[4]"), ShapeError, "cannot broadcast"),
    (O.Binary("add"), ("f32[2]", "f16[2]"), ShapeError, "needs inputs of one dtype"),
    (O.Binary("add"), ("bool[2]", "bool[2]"), ShapeError, "does not accept bool"),
    (O.Binary("add"), ("f32[2]",), IRError, "binary takes 2 inputs, got 1"),
    (O.Compare("approx"), ("f32[2]", "f32[2]"), ShapeError, "unknown comparison"),
    (O.Compare("lt"), ("f32[2]", "i32[2]"), ShapeError, "one dtype"),
    (O.Compare("lt"), ("f32[2]", "f32[3]"), ShapeError, "cannot broadcast"),
    (O.Where(), ("f32[2]", "f32[2]", "f32[2]"), ShapeError, "bool condition"),
    (O.Where(), ("bool[2]", "f32[2]", "f16[2]"), ShapeError, "one dtype"),
    (O.Where(), ("bool[3]", "f32[2]", "f32[2]"), ShapeError, "cannot broadcast"),
    (O.Cast(O.DType.F32), (), IRError, "cast takes 1 inputs, got 0"),
    (O.MatMul(), ("f32[4,8]", "f32[7,16]"), ShapeError, r"inner dims differ: f32\[4,8\] @ f32\[7,16\]"),
    (O.MatMul(), ("f32[8]", "f32[8,2]"), ShapeError, "rank >= 2"),
    (O.MatMul(), ("f32[2,4,8]", "f32[3,8,2]"), ShapeError, "batch dims do not broadcast"),
    (O.MatMul(), ("i32[2,2]", "i32[2,2]"), ShapeError, "floating-point"),
    (O.MatMul(), ("f16[2,2]", "f32[2,2]"), ShapeError, "one dtype"),
    (O.MatMul(), ("f32[seq,8]", "f32[seq,8]"), ShapeError, "inner dims differ"),
    (O.Reduce("median", ()), ("f32[2]",), ShapeError, "unknown reduction"),
    (O.Reduce("sum", (2,)), ("f32[2,3]",), ShapeError, "reduce axis 2 is out of range for rank 2"),
    (O.Reduce("sum", (0, -2)), ("f32[2,3]",), ShapeError, "repeat an axis"),
    (O.Reduce("sum", (0,)), ("f32[]",), ShapeError, "out of range for rank 0"),
    (O.Reduce("sum", ()), ("bool[2]",), ShapeError, "bool"),
    (O.Softmax(2), ("f32[2,3]",), ShapeError, "softmax axis 2 is out of range"),
    (O.ArgMax(2), ("f32[2,3]",), ShapeError, "argmax axis 2 is out of range"),
    (O.ArgMax(), ("i32[3]",), ShapeError, "floating-point"),
    (O.ArgMax(), ("f32[4,0]",), ShapeError, "empty axis"),
    (SP.SampleTopK(), ("f32[4]", "f64[4]", "f64[3]"), ShapeError, r"logits \[rows, vocab\]"),
    (FB.TokenFeed(), ("i64[4,1]", "i32[4]", "i32[8]"), ShapeError, r"tokens as i32 \[batch, seq\]"),
    (FB.TokenFeed(), ("i32[4,1]", "i32[3]", "i32[8]"), ShapeError, r"src as i32 \[4\]"),
    (FB.TokenFeed(), ("i32[4,1]", "i32[4]", "i32[batch]"), ShapeError, r"token state as a static i32 \[slots\]"),
    (FB.TokenStore(), ("i32[4]", "i32[5]", "i32[8]"), ShapeError, r"dst as i32 \[4\]"),
    (FB.TokenStore(), ("i32[4]", "i32[4]", "f32[8]"), ShapeError, r"token state as a static i32 \[slots\]"),
    (SP.SampleTopK(), ("f32[4,7]", "f32[4]", "f64[3]"), ShapeError, r"u as f64\[4\]"),
    (SP.SampleTopK(), ("f32[4,7]", "f64[4]", "f64[2]"), ShapeError, r"settings as f64\[3\]"),
    (SP.SampleTopK(), ("f32[1,2147483648]", "f64[1]", "f64[3]"), ShapeError, r"more than 2\*\*31 - 1 tokens"),
    (O.Softmax(), ("i32[3]",), ShapeError, "floating-point"),
    (O.Softmax(0), ("f32[]",), ShapeError, "rank 0"),
    (O.LayerNorm(), ("f32[2,8]", "f32[4]", "f32[8]"), ShapeError, r"parameter must be f32\[8\], got f32\[4\]"),
    (O.LayerNorm(), ("f32[2,8]", "f16[8]", "f16[8]"), ShapeError, "parameter must be f32"),
    (O.LayerNorm(), ("f32[]", "f32[1]", "f32[1]"), ShapeError, "rank >= 1"),
    (O.LayerNorm(), ("i32[2,8]", "i32[8]", "i32[8]"), ShapeError, "floating-point"),
    (O.LayerNorm(float("nan")), ("f32[2,8]", "f32[8]", "f32[8]"), ShapeError, "eps must be a finite number"),
    (O.LayerNorm(-1.0), ("f32[2,8]", "f32[8]", "f32[8]"), ShapeError, "eps must be a finite number >= 0"),
    (O.LayerNorm(), ("f32[2,8]", "f32[8]"), IRError, "layer_norm takes 3 inputs, got 2"),
    (O.RmsNorm(), ("f32[2,8]", "f32[2,8]"), ShapeError, "parameter must be"),
    (O.RmsNorm(math.inf), ("f32[2,8]", "f32[8]"), ShapeError, "eps must be a finite"),
    (O.Reshape((5,)), ("f32[2,3]",), ShapeError, r"cannot reshape f32\[2,3\] \(6 elements\) to \[5\]"),
    (O.Reshape((-1, -1)), ("f32[2,3]",), ShapeError, "at most one -1"),
    (O.Reshape((-1, 4)), ("f32[2,3]",), ShapeError, "not divisible by 4"),
    (O.Reshape((SEQ, 8)), ("f32[batch,seq,8]",), ShapeError, "cannot reshape"),
    (O.Reshape((-1, 8)), ("f32[seq,4]",), ShapeError, "not divisible"),
    (O.Reshape((1,) * 17), ("f32[1]",), IRError, "rank 17"),
    (O.Transpose((0, 0)), ("f32[2,3]",), ShapeError, r"perm \[0, 0\] is not a permutation of rank 2"),
    (O.Transpose((1, 0)), ("f32[2,3,4]",), ShapeError, "not a permutation of rank 3"),
    (O.Narrow(0, 1, 3), ("f32[3,2]",), ShapeError, r"narrow \[1, 4\) is out of range for axis 0"),
    (O.Narrow(0, -1, 1), ("f32[3,2]",), ShapeError, "out of range"),
    (O.Narrow(0, 0, 1), ("f32[seq,2]",), ShapeError, "dynamic axis"),
    (O.Narrow(2, 0, 1), ("f32[3,2]",), ShapeError, "narrow axis 2 is out of range"),
    (O.Narrow(0, 0, 1), ("f32[]",), ShapeError, "rank 0"),
    (O.Concat(0), ("f32[2,3]", "f32[2,4]"), ShapeError, "differ on axis 1"),
    (O.AllReduce(world=2, reduce="prod"), ("f32[2]",), ShapeError, "reduce must be one of"),
    (O.AllReduce(world=2), ("i32[2]",), ShapeError, "supports f32, f16, bf16"),
    (O.AllGather(world=2), ("f32[seq,2]",), ShapeError, "dynamic axis 0"),
    (O.ReduceScatter(world=3), ("f32[4]",), ShapeError, "divisible by world 3"),
    (O.Concat(0), ("f32[2,3]", "f16[2,3]"), ShapeError, "differ in rank or dtype"),
    (O.Concat(0), ("f32[2,3]", "f32[2]"), ShapeError, "differ in rank or dtype"),
    (O.Concat(0), ("f32[seq,3]", "f32[2,3]"), ShapeError, "dynamic axis"),
    (O.Concat(0), ("f32[]",), ShapeError, "rank 0"),
    (O.Concat(0), (), IRError, r"concat takes 1\.\.1024 inputs, got 0"),
    (O.Expand((3,)), ("f32[2]",), ShapeError, r"cannot expand f32\[2\] to \[3\]"),
    (O.Expand((3,)), ("f32[2,3]",), ShapeError, "fewer dims"),
    (O.Expand((SEQ,)), ("f32[4]",), ShapeError, "cannot expand"),
    (O.Gather(0), ("f32[10,4]", "f32[3]"), ShapeError, "indices must be i32 or i64"),
    (O.Gather(2), ("f32[10,4]", "i32[3]"), ShapeError, "gather axis 2 is out of range"),
    (O.Gather(0), ("f32[]", "i32[3]"), ShapeError, "rank 0"),
    (O.Attention(4, 8, "sliding"), ("f32[1,2,32]",) * 3, ShapeError, "unknown attention mask 'sliding'"),
    (O.Attention(4, 8), ("f32[1,2,32]",) * 2, IRError, r"attention takes 3\.\.4 inputs, got 2"),
    (O.Attention(4, 8, "padding"), ("f32[1,2,32]",) * 3, ShapeError, "mask='padding' takes 4 inputs, got 3"),
    (O.Attention(4, 8), ("f32[1,2,32]",) * 3 + ("f32[1,2]",), ShapeError, "mask='none' takes 3 inputs, got 4"),
    (O.Attention(4, 8, num_kv_heads=3), ("f32[1,2,32]", "f32[1,2,24]", "f32[1,2,24]"), ShapeError,
     "heads invalid"),
    (O.Attention(4, 8, num_kv_heads=0), ("f32[1,2,32]",) * 3, ShapeError, "heads invalid"),
    (O.Attention(0, 8), ("f32[1,2,32]",) * 3, ShapeError, "heads invalid"),
    (O.Attention(4, 8), ("f32[1,2,30]",) * 3, ShapeError, r"q must be \[batch, seq, 4\*8\]"),
    (O.Attention(4, 8), ("f32[2,32]",) * 3, ShapeError, "q must be"),
    (O.Attention(4, 8, num_kv_heads=2), ("f32[1,2,32]",) * 3, ShapeError, r"k must be \[batch, seq, 2\*8\]"),
    (O.Attention(4, 8), ("f32[1,2,32]", "f32[1,3,32]", "f32[1,4,32]"), ShapeError, "kv length disagree"),
    (O.Attention(4, 8), ("f32[1,2,32]", "f32[2,3,32]", "f32[2,3,32]"), ShapeError, "batch or kv length"),
    (O.Attention(4, 8), ("f32[1,2,32]", "f16[1,2,32]", "f16[1,2,32]"), ShapeError, "one dtype"),
    (O.Attention(2, 4, "padding"), ("f32[2,3,8]", "f32[2,5,8]", "f32[2,5,8]", "i32[2,3]"), ShapeError,
     r"padding mask must be \[2,5\]"),
    (O.Attention(2, 4, "bias"), ("f32[2,3,8]", "f32[2,5,8]", "f32[2,5,8]", "f32[4,5]"), ShapeError,
     "cannot broadcast"),
    (O.Attention(2, 4, "bias"), ("f32[2,3,8]", "f32[2,5,8]", "f32[2,5,8]", "f32[1,2,2,3,5]"), ShapeError,
     "must broadcast to"),
    (O.Attention(2, 4, "bias"), ("f32[1,3,8]", "f32[1,5,8]", "f32[1,5,8]", "f32[2,1,1,5]"), ShapeError,
     "does not broadcast to"),  # the bias may not widen the output
    (O.Attention(2, 4, "bias"), ("f32[2,3,8]", "f32[2,5,8]", "f32[2,5,8]", "f16[3,5]"), ShapeError,
     "bias dtype f16 differs"),
    (O.Attention(2, 4, scale=math.nan), ("f32[1,2,8]",) * 3, ShapeError, "scale must be a finite"),
    (O.Rope(8, variant="yarn"), ("f32[1,2,16]", "f32[2,4]", "f32[2,4]"), ShapeError, "unknown rope variant"),
    (O.Rope(8, 3), ("f32[1,2,16]", "f32[2,1]", "f32[2,1]"), ShapeError, "n_rot=3 must be even"),
    (O.Rope(8), ("f32[2,3,16]", "f32[2,3,4]", "f32[3,4]"), ShapeError, "cos .* and sin .* differ"),
    (O.CachedAttention(4, 8, 2), ("f32[1,3,32]", "f32[1,3,16]", "f32[1,3,16]", "f32[1,8,16]", "f32[1,8,16]",
                                  "i64[1]"), ShapeError, r"positions must be i32\[1\]"),
    (O.CachedAttention(4, 8, 2), ("f32[batch,seq,32]", "f32[batch,seq,16]", "f32[batch,seq,16]", "f32[4,8,16]",
                                  "f32[4,8,16]", "i32[batch]"), ShapeError, "exceed the cache"),
    (O.CachedAttention(4, 8, 3), ("f32[1,3,32]", "f32[1,3,24]", "f32[1,3,24]", "f32[1,8,24]", "f32[1,8,24]",
                                  "i32[1]"), ShapeError, "heads invalid"),
    (O.CachedAttention(4, 8, 2, page_size=16), ("f32[1,3,32]", "f32[1,3,16]", "f32[1,3,16]", "f32[8,16,16]",
                                                "f32[8,16,16]", "i32[1]"), ShapeError, "block table .* exactly when"),
    (O.CachedAttention(4, 8, 2), ("f32[1,3,32]", "f32[1,3,16]", "f32[1,3,16]", "f32[1,8,16]", "f32[1,8,16]",
                                  "i32[1]", "i32[1,2]"), ShapeError, "block table .* exactly when"),
    (O.CachedAttention(4, 8, 2, page_size=8), ("f32[1,3,32]", "f32[1,3,16]", "f32[1,3,16]", "f32[8,16,16]",
                                               "f32[8,16,16]", "i32[1]", "i32[1,2]"), ShapeError,
     r"must be static \[num_pages, 8, 16\]"),
    (O.CachedAttention(4, 8, 2, page_size=16), ("f32[1,3,32]", "f32[1,3,16]", "f32[1,3,16]", "f32[8,16,16]",
                                                "f32[8,16,16]", "i32[1]", "i64[1,2]"), ShapeError,
     r"block table must be i32\[1, max_pages\]"),
    (O.CachedAttention(4, 8, 2, page_size=2), ("f32[1,5,32]", "f32[1,5,16]", "f32[1,5,16]", "f32[8,2,16]",
                                               "f32[8,2,16]", "i32[1]", "i32[1,2]"), ShapeError,
     "exceeds the 4 tokens"),
    (O.CachedAttention(4, 8, 2, page_size=0), ("f32[1,3,32]", "f32[1,3,16]", "f32[1,3,16]", "f32[8,16,16]",
                                               "f32[8,16,16]", "i32[1]", "i32[1,2]"), ShapeError,
     "page_size must be None or a positive int"),
    (O.CachedAttention(4, 8, 2), ("f32[1,3,32]", "f32[1,3,16]", "f32[1,3,16]", "f16[1,8,16]", "f32[1,8,16]",
                                  "i32[1]"), ShapeError, "caches must share one dtype"),
    (O.CachedAttention(4, 8, 2), ("f32[1,3,32]", "f32[1,3,16]", "f32[1,3,16]", "i8[1,8,16]", "i8[1,8,16]",
                                  "i32[1]"), ShapeError, "caches must share one dtype, q's or f32/f16/bf16"),
    (O.Rope(8, 10), ("f32[1,2,16]", "f32[2,5]", "f32[2,5]"), ShapeError, "within head_dim=8"),
    (O.Rope(8, 0), ("f32[1,2,16]", "f32[2,0]", "f32[2,0]"), ShapeError, "n_rot=0"),
    (O.Rope(8), ("f32[1,2,12]", "f32[2,4]", "f32[2,4]"), ShapeError, r"rope input must be \[batch, seq, heads\*8\]"),
    (O.Rope(8), ("f32[2,16]", "f32[2,4]", "f32[2,4]"), ShapeError, "rope input must be"),
    (O.Rope(8), ("f32[1,2,16]", "f32[3,4]", "f32[2,4]"), ShapeError, r"rope cos must be f32\[2,4\]"),
    (O.Rope(8), ("f32[1,2,16]", "f32[2,4]", "f16[2,4]"), ShapeError, "rope sin must be"),
    (O.Rope(8), ("i32[1,2,16]", "i32[2,4]", "i32[2,4]"), ShapeError, "floating-point"),
    (O.FusedMatMulBiasAct(), ("f32[2,8]", "f32[4,8]"), ShapeError, "inner dims differ"),
    (O.FusedMatMulBiasAct(), ("f32[2,8]", "f32[8,4]", "f32[2,4]"), ShapeError, r"bias must be \[4\]"),
    (O.FusedMatMulBiasAct("swish"), ("f32[2,8]", "f32[8,4]"), ShapeError, "unknown activation"),
    (O.FusedMatMulBiasAct(), ("i32[2,8]", "i32[8,4]"), ShapeError, "floating-point"),
    (O.FusedMatMulBiasAct(), ("f32[2,8]", "f32[8,4]", "f16[4]"), ShapeError, "one dtype"),
    (O.FusedResidualLayerNorm(), ("f32[2,8]", "f32[1,8]", "f32[8]", "f32[8]"), ShapeError,
     "residual must match input exactly"),
    (O.FusedResidualLayerNorm(), ("f32[2,8]", "f32[2,8]", "f32[8]", "f32[4]"), ShapeError, "parameter must be"),
    (O.FusedResidualLayerNorm(-1.0), ("f32[2,8]", "f32[2,8]", "f32[8]", "f32[8]"), ShapeError, "eps"),
    (O.FusedResidualRmsNorm(), ("f32[2,8]", "f16[2,8]", "f32[8]"), ShapeError, "residual must match"),
    (O.FusedResidualRmsNorm(), ("f32[2,8]", "f32[2,8]"), IRError, r"takes 3\.\.4 inputs, got 2"),
    (O.FusedResidualRmsNorm(math.nan), ("f32[2,8]", "f32[2,8]", "f32[8]"), ShapeError, "eps"),
    (O.FusedSwiGLU(), ("f32[2,8]", "f32[8,16]", "f32[8,8]"), ShapeError, "gate and up weights differ"),
    (O.FusedSwiGLU(), ("f32[2,4]", "f32[8,16]", "f32[8,16]"), ShapeError, "inner dims differ"),
    (O.FusedSwiGLU(), ("i32[2,8]", "i32[8,16]", "i32[8,16]"), ShapeError, "floating-point"),
    (O.DequantMatMul("q3_k"), ("f32[1,64]", "u8[5,40]"), ShapeError, "unknown quantization 'q3_k'"),
    (O.DequantMatMul("q4_1"), ("f32[1,48]", "u8[5,30]"), ShapeError, "multiple of the q4_1 block size 32"),
    (O.DequantMatMul("q4_1"), ("f32[1,seq]", "u8[5,40]"), ShapeError, "K=seq must be a static multiple"),
    (O.DequantMatMul("q4_1"), ("f16[1,64]", "u8[5,40]"), ShapeError, r"input must be f32 \[\.\.\., K\]"),
    (O.DequantMatMul("q4_1"), ("f32[1,64]", "u8[5,36]"), ShapeError, r"must be u8\[N, 40\], got u8\[5,36\]"),
    (O.DequantMatMul("q4_1"), ("f32[1,64]", "i8[5,40]"), ShapeError, r"must be u8\[N, 40\]"),
    (O.DequantMatMul("q4_1"), ("f32[1,64]", "u8[2,5,40]"), ShapeError, "static u8 \\[N, row_bytes\\] matrix"),
    (O.DequantMatMul("q4_1"), ("f32[1,64]", "u8[seq,40]"), ShapeError, "static u8"),
    (O.DequantMatMul("q4_1", "q4"), ("f32[1,64]", "u8[5,40]"), ShapeError, "unknown activation mode 'q4'"),
    (O.DequantMatMul("q4_k", "q16"), ("f32[1,256]", "u8[5,144]"), ShapeError, "act='q16' takes q8_0/q4_0/q4_1"),
    (O.DequantMatMul("q6_k", "q8"), ("f32[1,256]", "u8[5,210]"), ShapeError, "act='q8' takes q8_0/q4_0/q4_1/q4_k"),
    (Q8.Int8MatMul(), ("f32[2,6]", "f32[5,5]"), ShapeError, "inner dims differ"),
    (Q8.Int8MatMul(), ("f16[2,6]", "f32[6,5]"), ShapeError, r"input must be f32 \[\.\.\., K\]"),
    (Q8.Int8MatMul(), ("f32[2,6]", "f32[2,6,5]"), ShapeError, r"static f32 \[K, N\] matrix"),
    (Q8.Int8MatMul(), ("f32[2,6]", "f32[6,5]", "f32[6]"), ShapeError, r"bias must be f32 \[5\]"),
    (Q8.Int8MatMul("swish"), ("f32[2,6]", "f32[6,5]"), ShapeError, "unknown activation 'swish'"),
    (Q8.Int8MatMul(), ("f32[1,70000]", "f32[70000,2]"), ShapeError, "overflow the int32 accumulators"),
    (O.Dequantize("q4_0"), ("u8[3,20]",), ShapeError, "static multiple of 18 bytes"),
    (O.Dequantize("q4_0"), ("f32[3,18]",), ShapeError, "raw q4_0 blocks as u8"),
    (O.Dequantize("q4_0"), ("u8[]",), ShapeError, "rows of blocks"),
    (O.Dequantize(""), ("u8[3,18]",), ShapeError, "unknown quantization"),
    (O.ElementwiseRegion(()), ("f32[2]",), ShapeError, "has no steps"),
    (O.ElementwiseRegion((O.RegionStep(O.MatMul(), (0, 0)),)), ("f32[2,2]",), ShapeError,
     "step 0 is matmul, which is not elementwise"),
    (O.ElementwiseRegion((O.RegionStep(O.Binary("add"), (0, 1)),)), ("f32[2]",), ShapeError,
     "step 0 reads value 1, which is not defined yet"),
    (O.ElementwiseRegion((O.RegionStep(O.Binary("add"), (0,)),)), ("f32[2]",), IRError, "binary takes 2 inputs"),
    (O.ElementwiseRegion((O.RegionStep(O.Binary("add"), (0, 1)),)), ("f32[2]", "f32[3]"), ShapeError,
     "cannot broadcast"),
    (S.SelectiveScan(16), ("f32[2,4,8]", "f32[2,4,8]", "f32[8,4]", "f32[2,4,16]", "f32[2,4,16]"), ShapeError,
     r"A must be \[8,16\]"),
    (S.SelectiveScan(0), ("f32[2,4,8]",) * 2 + ("f32[8,0]",) + ("f32[2,4,0]",) * 2, ShapeError, "state_size"),
    (S.GatedDeltaNet(4), ("f32[1,3,2,4]",) * 3 + ("f32[1,3,2]",) * 3, ShapeError, "takes 5 inputs, got 6"),
    (S.GatedDeltaNet(4, scale=math.inf), ("f32[1,3,2,4]",) * 3 + ("f32[1,3,2]",) * 2, ShapeError, "scale"),
    (CV.Conv(), ("f32[2,3,8]", "f32[4,3,3,3]"), ShapeError, r"weight must be a static \[O, C/groups, k\]"),
    (CV.Conv(), ("f32[2,3,8,8,8]", "f32[4,3,3,3,3]"), ShapeError, r"input must be \[N, C, L\] or \[N, C, H, W\]"),
    (CV.Conv(), ("f32[2,3,seq,8]", "f32[4,3,3,3]"), ShapeError, "static channels and spatial sizes"),
    (CV.Conv(groups=2), ("f32[2,3,8,8]", "f32[4,3,3,3]"), ShapeError, "must divide both"),
    (CV.Conv(), ("f32[2,4,8,8]", "f32[4,3,3,3]"), ShapeError, "3 channels per group"),
    (CV.Conv(), ("f32[2,3,2,2]", "f32[4,3,3,3]"), ShapeError, "smaller than the window"),
    (CV.Conv((0, 1)), ("f32[2,3,8,8]", "f32[4,3,3,3]"), ShapeError, "strides must be 2 int"),
    (CV.Conv(pads=(1, 1)), ("f32[2,3,8,8]", "f32[4,3,3,3]"), ShapeError, "pads must be 4 int"),
    (CV.Conv(), ("f32[2,3,8,8]", "f32[4,3,3,3]", "f32[3]"), ShapeError, r"bias must be \[4\]"),
    (CV.Conv(activation="swish"), ("f32[2,3,8,8]", "f32[4,3,3,3]"), ShapeError, "unknown activation"),
    (CV.Conv(), ("i32[2,3,8,8]", "i32[4,3,3,3]"), ShapeError, "float inputs of one dtype"),
    (CV.Pool("sum", (2, 2)), ("f32[2,3,8,8]",), ShapeError, "unknown pooling 'sum'"),
    (O.Binary("fmod"), ("i32[3]", "i32[3]"), ShapeError, "fmod needs floating-point inputs"),
    (RG.Iota(Dim(4), 0, 0), (), ShapeError, "delta must not be 0"),
    (RG.Iota(Dim(4), 0.5, 1, O.DType.I32), (), ShapeError, "needs an integer start"),
    (RG.Iota(Dim(4), 0, 1, O.DType.BOOL), (), ShapeError, "iota of bool is not supported"),
    (RG.Iota(Dim(300), 32700, 1, O.DType.I16), (), ShapeError, "overflows i16"),
    (RG.Iota(Dim(4), math.nan, 1, O.DType.F32), (), ShapeError, "start must be a finite number"),
    (CV.Pool("max", (2,)), ("f32[2,3,8,8]",), ShapeError, "kernel must be 2 int"),
    (CV.Pool("avg", (2, 2, 2)), ("f32[2,3,4,4,4,4]",), ShapeError, r"or \[N, C, D, H, W\]"),
    (CV.Pool("max", (2, 2), pads=(2, 0, 0, 0)), ("f32[2,3,8,8]",), ShapeError, "smaller than the window"),
    (CV.BatchNorm(), ("f32[2,3,4]", "f32[3]", "f32[3]", "f32[4]", "f32[3]"), ShapeError, r"mean must be f32\[3\]"),
    (CV.BatchNorm(-1.0), ("f32[2,3,4]",) + ("f32[3]",) * 4, ShapeError, "eps must be"),
    (S.DepthwiseConv1dCausal(3), ("f32[2,5,8]", "f32[8,4]"), ShapeError, r"weight must be \[8,3\]"),
    (S.DepthwiseConv1dCausal(3, carry_state=True), ("f32[2,5,8]", "f32[8,3]", "f32[2,2,8]", "f32[2]"), ShapeError,
     r"lengths must be i32 \[2\]"),
    (S.DepthwiseConv1dCausal(3), ("f32[2,5,8]", "f32[8,3]", "f32[2,2,8]", "i32[2]"), ShapeError,
     "carry_state=False takes 2 or 3 inputs"),
    (S.SelectiveScan(16, True), ("f32[2,4,8]", "f32[2,4,8]", "f32[8,16]", "f32[2,4,16]", "f32[2,4,16]",
                                 "f32[2,16,8]"), ShapeError, r"state must be \[2,8,16\]"),
    (MOE.MoeTopK(9), ("f32[3,8]",), ShapeError, "top_k=9 is more than the 8 experts"),
    (MOE.MoeGate(True), ("f32[3,8]", "f32[3,2]"), ShapeError, "ids must be i32"),
    (MOE.MoeMatMul(), ("f32[3,64]", "i32[3,2]", "f32[8,5,32]"), ShapeError, r"must be \[experts, N, 64\]"),
    (MOE.MoeMatMul("q4_0"), ("f32[3,64]", "i32[3,2]", "u8[8,5,40]"), ShapeError, r"u8\[experts, N, 36\]"),
    (L.Scan(_body("f32[3]", "f32[3]"), Dim(4), 0, 1), ("f32[3]", "f32[5,3]"), ShapeError, r"xs 0 must be \[4,3\]"),
    (L.Scan(_body("f32[3]", "f32[3]"), Dim(4), 0, 0), ("f32[3]",), ShapeError, "body takes 2 inputs"),
    (L.Scan(_body("f32[3]", "f32[3]"), SEQ, 0, 1, num_checkpoints=2), ("f32[3]", "f32[seq,3]"), ShapeError,
     "needs a static length"),
    (L.CustomFn(_body("f32[2]", "f32[2]")), ("f32[2]", "f32[3]"), ShapeError, "custom_fn fwd takes"),
    (C.Cond(_body("f32[3]"), _body("f32[3]")), ("f32[]", "f32[3]"), ShapeError, "predicate must be one bool"),
    (C.Cond(_body("f32[3]"), _body("f32[3]")), ("bool[2]", "f32[3]"), ShapeError, "predicate must be one bool"),
    (C.Cond(_body("f32[3]"), _body("f32[4]")), ("bool[]", "f32[3]"), ShapeError,
     r"false branch takes f32\[4\] for operand 0, but operand 0 is f32\[3\]"),
    (C.Cond(_body("f32[3]"), _body("f32[3]", "f32[3]")), ("bool[]", "f32[3]"), ShapeError,
     "false branch takes 2 inputs but the cond passes 1"),
    (C.Cond(_body("f32[3]", "f32[3]"), _pred_body("f32[3]", "f32[3]")), ("bool[]", "f32[3]", "f32[3]"), ShapeError,
     r"the true branch returns f32\[3\], the false branch bool\[\]"),
    (C.WhileLoop(_pred_body("f32[3]"), _body("f32[3]"), -1), ("f32[3]",), ShapeError, "max_trips must be None or"),
    (C.WhileLoop(_body("f32[3]"), _body("f32[3]")), ("f32[3]",), ShapeError, r"cond must return one bool"),
    (C.WhileLoop(_pred_body("f32[3]"), _body("f32[3]")), ("f32[4]",), ShapeError,
     r"cond takes f32\[3\] for the carry, but the carry is f32\[4\]"),
    (C.WhileLoop(_pred_body("f32[3]", "f32[4]"), _body("f32[3]", "f32[4]", fn="exp", out=1)), ("f32[3]", "f32[4]"),
     ShapeError, r"carry must keep its shape and dtype: init is f32\[3\], the body returns f32\[4\]"),
    (U.UserOp("never_registered", "0" * 64), ("f32[2]",), IRError, "'never_registered' is not registered"),
    (U.UserOp(SWISH.name, SWISH.spec.digest(), _body("f32[2]", "f32[]", "f32[2]", "f32[2]")), ("f32[2]", "f32[]"),
     ShapeError, "vjp must take the 2 inputs, the output and its cotangent"),
    (LR.LoraMatMul(), ("f32[2,8]", "f32[3,4,7]", "f32[3,5,4]", "f32[3]", "i32[2]"), ShapeError,
     r"a \[slots, rank, K\] with K = 8"),
    (LR.LoraMatMul(), ("f32[2,8]", "f32[3,4,8]", "f32[3,5,2]", "f32[3]", "i32[2]"), ShapeError,
     r"b \[slots, N, rank\] matching"),
    (LR.LoraMatMul(), ("f32[2,8]", "f32[3,4,8]", "f32[3,5,4]", "f32[2]", "i32[2]"), ShapeError, "one per slot"),
    (LR.LoraMatMul(), ("f32[2,8]", "f32[3,4,8]", "f32[3,5,4]", "f32[3]", "i32[3]"), ShapeError,
     "one slot per row group"),
    (LR.LoraMatMul(), ("f16[2,8]", "f32[3,4,8]", "f32[3,5,4]", "f32[3]", "i32[2]"), ShapeError, "needs f32 x"),
]


@pytest.mark.parametrize(("op", "specs", "exc", "pattern"), ERRORS,
                         ids=[f"{c[0].kind}-{i}" for i, c in enumerate(ERRORS)])
def test_infer_errors_name_node_and_problem(op: O.Op, specs: tuple[str, ...], exc: type, pattern: str) -> None:
    with pytest.raises(exc, match=pattern) as info:
        infer(op, *specs)
    # Graph prefixes the node being built: its id, its name and its op kind.
    assert str(info.value).startswith(f"node %{len(specs)} (probe) {op.kind}: ")


def test_every_op_is_covered() -> None:
    covered_valid = {op.kind for op, _, _ in VALID} | O.LEAF_KINDS
    covered_errors = {op.kind for op, _, _, _ in ERRORS} | O.LEAF_KINDS
    assert set(O.OPS) - covered_valid == set()
    assert set(O.OPS) - covered_errors == set()


def test_leaves() -> None:
    g = Graph("leaves")
    x = g.input("x", [BATCH, 4], "f16")
    w = g.param("w", [4, 2], "bf16")
    c = g.constant(np.arange(6, dtype=np.int32).reshape(2, 3))
    f = g.constant(1.5)
    assert g.shape(x) == Shape.of([BATCH, 4], "f16")
    assert g.shape(w) == Shape.of([4, 2], "bf16")
    assert g.shape(c) == Shape.of([2, 3], "i32")
    assert g.shape(f) == Shape.of([], "f32")
    assert g.node(c).op.array().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert g.node(c).op.describe() == "constant[6 values]"
    assert g.node(f).op.describe() == "constant[1.5]"


def test_param_layout() -> None:
    p = O.Param("w", Shape.of([4, 2]), layout=(1, 0))
    assert p.infer([]) == Shape.of([4, 2])
    assert p.user_shape == Shape.of([2, 4])
    p3 = O.Param("w", Shape.of([2, 3, 4]), layout=(2, 0, 1))
    # stored axis i is user axis layout[i]: user dims are (3, 4, 2)
    assert p3.user_shape.static_dims == (3, 4, 2)
    assert np.zeros((3, 4, 2)).transpose(p3.layout).shape == (2, 3, 4)


@pytest.mark.parametrize(("op", "pattern"), [
    (O.Param("w", Shape.of([4, 2]), layout=(0, 0)), "not a permutation"),
    (O.Param("w", Shape.of([SEQ, 2])), "static shape"),
    (O.Constant(b"\x00" * 7, Shape.of([2], "f32")), "holds 7 bytes but f32\\[2\\] needs 8"),
    (O.Constant(b"", Shape.of([SEQ], "f32")), "static shape"),
])
def test_leaf_errors(op: O.Op, pattern: str) -> None:
    with pytest.raises(ShapeError, match=pattern):
        Graph().add(op)


def test_graph_structural_errors() -> None:
    g = Graph("g")
    x = g.input("x", [2])
    with pytest.raises(IRError, match="node %1: name must be a string"):
        g.add(O.Activation("relu"), [x], name=3)  # type: ignore[arg-type]
    with pytest.raises(IRError, match=r"node %1 \(activation\): input 5 does not name an earlier node"):
        g.add(O.Activation("relu"), [5])
    with pytest.raises(IRError, match="input -1 does not name"):
        g.add(O.Activation("relu"), [-1])
    with pytest.raises(IRError, match="input True does not name"):
        g.add(O.Activation("relu"), [True])
    with pytest.raises(IRError, match="input takes no inputs"):
        g.add(O.Input("y", Shape.of([2])), [x])
    with pytest.raises(IRError, match="is not a MIR op"):
        g.add("relu", [x])  # type: ignore[arg-type]
    with pytest.raises(IRError, match="has no node -1"):
        g.node(-1)
    with pytest.raises(IRError, match="has no node True"):
        g.node(True)  # type: ignore[arg-type]
    with pytest.raises(IRError, match="has no node -1"):
        g.set_outputs([-1])
    with pytest.raises(IRError, match="needs at least one output"):
        g.set_outputs([])
    with pytest.raises(IRError, match="duplicate output names"):
        g.set_outputs([x, x], ["a", "a"])
    assert len(g) == 1  # failed adds leave the graph unchanged


def test_op_that_is_not_registered_is_refused() -> None:
    @dataclass(frozen=True)
    class Local(O.Op):
        registry: ClassVar[dict] = {}
        kind: ClassVar[str] = "local"
        arity: ClassVar[tuple[int, int]] = (1, 1)

        def infer(self, inputs: list[Shape]) -> Shape:
            return inputs[0]

    g = Graph()
    x = g.input("x", [2])
    with pytest.raises(IRError, match="not a MIR op"):
        g.add(Local(), [x])
    assert "local" not in O.OPS


def test_verify_catches_tampering() -> None:
    g = Graph("g")
    x = g.input("x", [2, 3])
    y = g.activation("relu", x)
    g.set_outputs([y])
    g.verify()
    bad = g.copy()
    bad.nodes[1] = replace(bad.nodes[1], shape=Shape.of([3, 2]))
    with pytest.raises(ShapeError, match=r"node %1 activation: recorded shape f32\[3,2\] but inputs give f32\[2,3\]"):
        bad.verify()
    dup = g.copy()
    dup.add(O.Input("x", Shape.of([1])))
    with pytest.raises(IRError, match="duplicate input name 'x'"):
        dup.verify()
    clash = g.copy()
    clash.param("x", [1])
    with pytest.raises(IRError, match="both inputs and params"):
        clash.verify()
    bounds = g.copy()
    bounds.input("a", [Dim.dynamic("n", max=4)])
    bounds.input("b", [Dim.dynamic("n", max=8)])
    with pytest.raises(IRError, match="two bounds"):
        bounds.verify()


def test_describe_and_str() -> None:
    assert O.Reduce("sum", (0, 1), True).describe() == "reduce[fn=sum, axes=(0,1), keep_dim=True]"
    assert O.MatMul().describe() == "matmul"
    assert O.Attention(4, 8).describe() == "attention[num_heads=4, head_dim=8, mask=none]"
    region = O.ElementwiseRegion((O.RegionStep(O.Binary("add"), (0, 1)), O.RegionStep(O.Activation("relu"), (2,))))
    assert region.describe() == "elementwise_region[v2=binary[fn=add](v0,v1); v3=activation[fn=relu](v2)]"
    g = Graph("s")
    x = g.input("x", [SEQ, 2])
    g.set_outputs({"y": g.softmax(x)})
    assert str(g) == ("graph s {\n  %0: f32[seq,2] = input 'x'()  # x\n"
                      "  %1: f32[seq,2] = softmax[axis=-1](%0)\n  return y=%1\n}")


def test_attention_and_rope_properties() -> None:
    a = O.Attention(8, 64, num_kv_heads=2)
    assert a.kv_heads == 2 and a.softmax_scale == pytest.approx(1 / 8)
    assert O.Attention(8, 64).kv_heads == 8
    assert O.Attention(8, 64, scale=0.25).softmax_scale == 0.25
    assert O.Rope(64).rot == 64 and O.Rope(64, 32).rot == 32


def test_op_registry_is_complete_and_unique() -> None:
    kinds = [cls.kind for cls in O.OPS.values()]
    assert len(kinds) == len(set(kinds))
    assert all(O.OPS[k].kind == k for k in O.OPS)
    with pytest.raises(TypeError, match="registered twice"):

        @dataclass(frozen=True)
        class Again(O.Op):  # registering it is the point
            kind: ClassVar[str] = "matmul"

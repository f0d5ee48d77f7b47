"""The NaN-checked build variant: the first kernel writing NaN/inf fails the run, naming its op."""

from __future__ import annotations

import re

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.errors import ExecutionError
from rlx.ir import ops as O
from rlx.models import bert as B


def log_graph() -> rlx.Graph:
    """x @ w, then a named log (NaN for negative values), then a softmax."""
    g = rlx.Graph("nan_log")
    x = g.input("x", [rlx.Dim.dynamic("n", max=8), 3])
    m = g.matmul(x, g.param("w", [3, 3]))
    lg = g.add(O.Activation("log"), [m], name="encoder.layer.0.log")
    g.set_outputs([g.softmax(lg, -1)])
    return g


W = {"w": np.eye(3, dtype=np.float32)}


@pytest.mark.parametrize("level", [0, 2])
def test_planted_nan_is_reported_at_the_log(level: int):
    cg = rlx.Session(check_nans=True).compile(log_graph(), opt_level=level)
    cg.set_param("w", W["w"])
    good = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    (got,) = cg.run(x=good)
    np.testing.assert_allclose(got, reference.run(log_graph(), {"x": good}, W)[0], rtol=1e-5)
    with pytest.raises(ExecutionError) as info:
        cg.run(x=np.array([[1, 2, 3], [4, -1, 6]], np.float32))
    msg = str(info.value)
    # the node the log ended up in (level 2 fuses it into the GEMM's epilogue), its source name, its shape
    lir = rlx.Session().lower(log_graph(), opt_level=level)
    node = next(n for n in lir.graph.nodes if n.name == "encoder.layer.0.log")
    assert f"%{node.id} {node.kind} (encoder.layer.0.log)" in msg
    assert "non-finite value (NaN) at flat index 4" in msg
    assert "f32[2,3] (declared f32[n,3])" in msg
    if level == 0:
        assert node.kind == "activation"


def test_infinity_is_reported_too():
    g = rlx.Graph("inf")
    x = g.input("x", [4])
    g.set_outputs([g.activation("exp", x)])
    cg = rlx.Session(check_nans=True).compile(g)
    with pytest.raises(ExecutionError, match=r"non-finite value \(\+inf\) at flat index 2 .*%1 activation"):
        cg.run(x=np.array([0, 1, 1000, 2], np.float32))


def test_the_normal_build_returns_the_nan():
    cg = rlx.Session().compile(log_graph())
    cg.set_param("w", W["w"])
    assert "nonfinite" not in cg.source
    (got,) = cg.run(x=np.array([[1, 2, 3], [4, -1, 6]], np.float32))
    assert np.isnan(got[1]).all()


def test_first_op_wins_in_bert():
    """A NaN planted in one layer's weights is reported at the first op it reaches, by its HF module path."""
    cfg = B.BertConfig(vocab_size=60, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                       max_position_embeddings=16)
    weights = B.random_weights(cfg, seed=3)
    weights["encoder.layer.0.intermediate.dense.bias"][5] = np.nan
    cg = rlx.Session(check_nans=True).compile(B.build_bert(cfg, max_batch=2, max_seq=8))
    for k, v in weights.items():
        if k in cg.param_names:
            cg.set_param(k, v)
    ids = np.array([[2, 7, 9, 3], [2, 5, 3, 0]], np.int64)
    mask = (ids != 0).astype(np.int64)
    with pytest.raises(ExecutionError) as info:
        cg.run(B.bert_inputs(ids, mask))
    assert re.search(r"%\d+ fused_matmul_bias_act \(encoder\.layer\.0\.intermediate\.dense\) : f32\[2,4,32\]",
                     str(info.value)), str(info.value)


def test_check_nans_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RLX_CHECK_NANS", "1")
    assert "rlx_first_nonfinite_f32" in rlx.Session().compile(log_graph()).source

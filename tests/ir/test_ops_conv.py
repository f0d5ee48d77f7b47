"""`rlx.ir.ops_conv`: the reference semantics of conv / pool / batch_norm against PyTorch, on random shapes.

Shape inference is covered with the other ops in tests/ir/test_ops.py; here the numpy reference
(what every backend is tested against) is itself checked against a peer, and `pads_for_auto`
against ONNX's definition of SAME_UPPER / SAME_LOWER output sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.ir.ops_conv import out_size, pads_for_auto

torch = pytest.importorskip("torch")
F = torch.nn.functional


@st.composite
def conv_cases(draw: st.DrawFn) -> dict:
    rank = draw(st.integers(1, 2))
    groups = draw(st.integers(1, 3))
    cg, og = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    d = draw(st.integers(1, 2))
    s = draw(st.integers(1, 3))
    p = draw(st.integers(0, (k - 1) * d))
    size = draw(st.integers(d * (k - 1) + 1, 9))
    return {"rank": rank, "groups": groups, "c": cg * groups, "o": og * groups, "k": k, "d": d, "s": s, "p": p,
            "size": size, "bias": draw(st.booleans()), "act": draw(st.sampled_from([None, "relu", "hardswish"]))}


@settings(max_examples=40, deadline=None)
@given(conv_cases())
def test_reference_conv_matches_torch(case: dict) -> None:
    r, n = case["rank"], 2
    rng = np.random.default_rng(0)
    xs = [n, case["c"], *([case["size"]] * r)]
    ws = [case["o"], case["c"] // case["groups"], *([case["k"]] * r)]
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws, [case["o"]]))
    g = rlx.Graph("c")
    gx, gw = g.input("x", xs), g.param("w", ws)
    gb = g.param("b", [case["o"]]) if case["bias"] else None
    g.set_outputs([g.conv(gx, gw, gb, strides=(case["s"],) * r, dilations=(case["d"],) * r, pads=(case["p"],) * 2 * r,
                          groups=case["groups"], activation=case["act"])])
    params = {"w": w, **({"b": b} if case["bias"] else {})}
    got = rlx.reference.run(g, {"x": x}, params)[0]
    conv = F.conv1d if r == 1 else F.conv2d
    want = conv(torch.tensor(x), torch.tensor(w), torch.tensor(b) if case["bias"] else None, stride=case["s"],
                padding=case["p"], dilation=case["d"], groups=case["groups"])
    want = {None: want, "relu": F.relu(want), "hardswish": F.hardswish(want)}[case["act"]].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(0, 1), st.integers(3, 9), st.booleans(),
       st.booleans())
def test_reference_pooling_matches_torch(rank: int, k: int, s: int, p: int, size: int, ceil: bool,
                                         count_pad: bool) -> None:
    p = min(p, k // 2)  # torch: pads at most half the window
    x = np.random.default_rng(1).standard_normal([2, 3, *([size] * rank)]).astype(np.float32)
    for fn in ("max", "avg"):
        g = rlx.Graph("p")
        g.set_outputs([g.pool(fn, g.input("x", x.shape), (k,) * rank, strides=(s,) * rank, pads=(p,) * 2 * rank,
                              ceil_mode=ceil, count_include_pad=count_pad)])
        got = rlx.reference.run(g, {"x": x})[0]
        t = torch.tensor(x)
        if fn == "max":
            want = (F.max_pool1d if rank == 1 else F.max_pool2d)(t, k, s, p, ceil_mode=ceil)
        else:
            avg = F.avg_pool1d if rank == 1 else F.avg_pool2d
            want = avg(t, k, s, p, ceil_mode=ceil, count_include_pad=count_pad)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=fn)


def test_reference_batch_norm_matches_torch() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal([2, 4, 5, 3]).astype(np.float32)
    s, b, m = (rng.standard_normal(4).astype(np.float32) for _ in range(3))
    v = rng.random(4).astype(np.float32) + np.float32(0.5)
    g = rlx.Graph("bn")
    g.set_outputs([g.batch_norm(g.input("x", x.shape), *(g.param(n, [4]) for n in "sbmv"), eps=1e-3)])
    got = rlx.reference.run(g, {"x": x}, {"s": s, "b": b, "m": m, "v": v})[0]
    want = F.batch_norm(torch.tensor(x), torch.tensor(m), torch.tensor(v), torch.tensor(s), torch.tensor(b), eps=1e-3)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize(("size", "k", "s", "d"), [(7, 3, 2, 1), (8, 3, 2, 1), (5, 4, 1, 1), (9, 2, 3, 1),
                                                   (6, 3, 1, 2)])
def test_same_pads_give_ceil_of_size_over_stride(mode: str, size: int, k: int, s: int, d: int) -> None:
    begin, end = pads_for_auto(mode, (size,), (k,), (s,), (d,))
    assert out_size(size, k, s, d, begin, end) == -(-size // s)
    assert abs(begin - end) <= 1 and (begin <= end if mode == "SAME_UPPER" else begin >= end)
    assert pads_for_auto("VALID", (size,), (k,), (s,), (d,)) == (0, 0)

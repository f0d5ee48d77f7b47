"""Collective ops: shapes, reference semantics over the LocalTransport (ranks as threads), errors."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx import reference
from rlx.errors import ExecutionError, ShapeError
from rlx.ir import ops as O
from rlx.ir import serialize
from rlx.ir.dtype import DType, round_to_dtype
from rlx.ir.transport import run_ranks


def _graph(op, shape, dtype="f32"):
    g = rlx.Graph(op.kind)
    x = g.input("x", shape, dtype=dtype)
    g.set_outputs([g.add(op, [x])])
    return g


def _rounded(a, dtype):
    return round_to_dtype(np.asarray(a, np.float32), DType.parse(dtype)).astype(np.float32)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_all_reduce_sum_and_max(rng, dtype, world):
    xs = [_rounded(rng.standard_normal((2, 5)), dtype) for _ in range(world)]
    for reduce, fn in (("sum", np.sum), ("max", np.max)):
        g = _graph(O.AllReduce(world=world, reduce=reduce), [2, 5], dtype)
        outs = reference.run_ranks(g, [{"x": x} for x in xs])
        want = _rounded(fn(np.stack(xs).astype(np.float64), axis=0), dtype)
        for out in outs:
            np.testing.assert_array_equal(np.asarray(out[0], np.float32), want)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_all_gather_concatenates_in_rank_order(rng, axis):
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    g = _graph(O.AllGather(world=3, axis=axis), [2, 3])
    assert g.node(g.outputs[0]).shape.static_dims == np.concatenate(xs, axis=axis).shape
    for out in reference.run_ranks(g, [{"x": x} for x in xs]):
        np.testing.assert_array_equal(out[0], np.concatenate(xs, axis=axis))


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_reduce_scatter_gives_each_rank_its_block(rng, reduce):
    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(2)]
    g = _graph(O.ReduceScatter(world=2, reduce=reduce, axis=0), [4, 3])
    total = (xs[0].astype(np.float64) + xs[1]) if reduce == "sum" else np.maximum(xs[0], xs[1])
    outs = reference.run_ranks(g, [{"x": x} for x in xs])
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out[0], total[2 * r:2 * r + 2].astype(np.float32))


def test_row_parallel_matmul_equals_the_whole(rng):
    """Megatron's row-parallel layer: each rank multiplies its slice of K, one all-reduce sums them."""
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    g = rlx.Graph("row_parallel")
    xi = g.input("x", [3, 4])
    wi = g.param("w", [4, 5])
    g.set_outputs([g.add(O.AllReduce(world=2), [g.matmul(xi, wi)])])
    outs = reference.run_ranks(g, [{"x": x[:, :4]}, {"x": x[:, 4:]}], [{"w": w[:4]}, {"w": w[4:]}])
    for out in outs:
        np.testing.assert_allclose(out[0], x @ w, rtol=1e-5, atol=1e-5)


def test_shape_errors():
    with pytest.raises(ShapeError, match="reduce must be one of"):
        _graph(O.AllReduce(world=2, reduce="mean"), [4])
    with pytest.raises(ShapeError, match="world must be a positive int"):
        _graph(O.AllReduce(world=0), [4])
    with pytest.raises(ShapeError, match="supports f32, f16, bf16"):
        _graph(O.AllReduce(world=2), [4], "i32")
    with pytest.raises(ShapeError, match="divisible by world 3"):
        _graph(O.ReduceScatter(world=3), [4])


def test_run_errors_do_not_hang():
    g = _graph(O.AllReduce(world=2), [4])
    with pytest.raises(ExecutionError, match="outside a multi-rank run"):
        reference.run(g, {"x": np.ones(4, np.float32)})
    with pytest.raises(ExecutionError, match="missing inputs"):  # rank 1 fails; rank 0 must not wait forever
        reference.run_ranks(g, [{"x": np.ones(4, np.float32)}, {}])
    with pytest.raises(ExecutionError, match="world 3 ran among 2"):
        reference.run_ranks(_graph(O.AllReduce(world=3), [4]), [{"x": np.ones(4, np.float32)}] * 2)
    with pytest.raises(ExecutionError, match="differ in shape"):
        run_ranks(2, lambda r: __import__("rlx.ir.transport").ir.transport.current().all_reduce(
            np.ones(r + 1), "sum"))


def test_serializes_and_is_refused_before_any_build_where_no_backend_rule_exists():
    g = _graph(O.ReduceScatter(world=2, reduce="max", axis=0), [4, 3], "bf16")
    again = serialize.from_json(serialize.to_json(g))
    assert serialize.to_json(again) == serialize.to_json(g)
    assert rlx.Session("cpu").supports(g)  # bf16 reduced in f32 between legalizing casts
    from rlx.codegen.backends import first_unsupported_op

    assert first_unsupported_op(g, "metal")[0].kind == "reduce_scatter"  # no Metal rule yet

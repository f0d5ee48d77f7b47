"""Every MIR op on every dtype: small graphs for the right-or-refused property (see test_dtype_matrix.py).

`cases(dtype)` returns (label, build) pairs: `build(g, x, y)` adds one op reading the
`[2, 3, 4]` inputs x and y of `dtype` (and whatever params/inputs it needs) and returns its
node. Run as a script (`python dtype_matrix.py`) it checks every dtype's supported ops in one
compiled graph against the reference and prints MATRIX-OK: the ASan test runs it that way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

import rlx
from rlx.errors import IRError, ShapeError
from rlx.ir import ops as O
from rlx.ir.dtype import BFLOAT16, DType

Build = Callable[[rlx.Graph, int, int], int]
#: Every dtype, of the storage formats (`DType.is_narrow`: cast and moved only, through one converter, which
#: tests/codegen/test_c_narrow.py checks on every format bit for bit) one float and one integer format.
DTYPES = (*(d for d in DType if not d.is_narrow), DType.F8E5M2, DType.I4)


def _region(g: rlx.Graph, x: int, y: int) -> int:
    steps = (O.RegionStep(O.Binary("mul"), (0, 1)), O.RegionStep(O.Activation("tanh"), (2,)),
             O.RegionStep(O.Binary("add"), (3, 0)))
    return g.add(O.ElementwiseRegion(steps), [x, y])


def cases(dtype: DType) -> list[tuple[str, Build]]:
    """Every op kind (every variant of the elementwise ones) as a builder over inputs x, y of `dtype`."""
    dt = dtype.value
    out: list[tuple[str, Build]] = []
    out += [(f"activation:{fn}", lambda g, x, y, fn=fn: g.activation(fn, x)) for fn in O.ACTIVATIONS]
    out += [(f"binary:{fn}", lambda g, x, y, fn=fn: g.add(O.Binary(fn), [x, y])) for fn in O.BINARY_OPS]
    out += [(f"compare:{fn}", lambda g, x, y, fn=fn: g.add(O.Compare(fn), [x, y])) for fn in O.COMPARE_OPS]
    out += [(f"reduce:{fn}", lambda g, x, y, fn=fn: g.add(O.Reduce(fn, (1,)), [x])) for fn in O.REDUCE_OPS]
    out += [
        ("where", lambda g, x, y: g.add(O.Where(), [g.add(O.Compare("gt"), [x, y]), x, y])),
        ("cast:to_f32", lambda g, x, y: g.add(O.Cast(DType.F32), [x])),
        ("cast:from_f32", lambda g, x, y: g.add(O.Cast(dtype), [g.input("c", [2, 3, 4])])),
        ("matmul", lambda g, x, y: g.matmul(x, g.param("w", [4, 5], dt))),
        ("softmax", lambda g, x, y: g.softmax(x, -1)),
        ("layer_norm", lambda g, x, y: g.layer_norm(x, g.param("ga", [4], dt), g.param("be", [4], dt))),
        ("rms_norm", lambda g, x, y: g.rms_norm(x, g.param("ga", [4], dt))),
        ("reshape", lambda g, x, y: g.reshape(x, [6, 4])),
        ("transpose", lambda g, x, y: g.transpose(x, [2, 0, 1])),
        ("narrow", lambda g, x, y: g.narrow(x, 1, 1, 2)),
        ("concat", lambda g, x, y: g.concat([x, y], 1)),
        ("expand", lambda g, x, y: g.expand(g.narrow(x, 0, 0, 1), [3, 3, 4])),
        ("gather", lambda g, x, y: g.gather(g.param("table", [5, 4], dt), g.input("ids", [2, 3], "i32"))),
        # q, k and v are one node: the self-attention case whose dtype check once skipped every input.
        ("attention:self", lambda g, x, y: g.attention(g.reshape(x, [2, 3, 4]), g.reshape(x, [2, 3, 4]),
                                                       g.reshape(x, [2, 3, 4]), num_heads=2, head_dim=2)),
        ("attention:causal", lambda g, x, y: g.attention(x, y, y, num_heads=2, head_dim=2, mask="causal")),
        ("rope", lambda g, x, y: g.rope(x, g.input("cos", [3, 1], dt), g.input("sin", [3, 1], dt), head_dim=2)),
        ("fused_matmul_bias_act", lambda g, x, y: g.add(O.FusedMatMulBiasAct("gelu"),
                                                        [x, g.param("w", [4, 5], dt), g.param("bi", [5], dt)])),
        ("fused_residual_layer_norm", lambda g, x, y: g.add(O.FusedResidualLayerNorm(1e-5),
                                                            [x, y, g.param("ga", [4], dt), g.param("be", [4], dt)])),
        ("fused_residual_rms_norm", lambda g, x, y: g.add(O.FusedResidualRmsNorm(1e-5),
                                                          [x, y, g.param("ga", [4], dt)])),
        ("fused_swiglu", lambda g, x, y: g.add(O.FusedSwiGLU(), [x, g.param("w", [4, 5], dt),
                                                                 g.param("w2", [4, 5], dt)])),
        ("elementwise_region", _region),
    ]
    return out


def build_one(dtype: DType, build: Build) -> rlx.Graph | None:
    """A graph holding just this op, or None when the IR itself refuses it on `dtype`."""
    g = rlx.Graph("m")
    x = g.input("x", [2, 3, 4], dtype.value)
    y = g.input("y", [2, 3, 4], dtype.value)
    try:
        g.set_outputs({"out": build(g, x, y)})
    except (IRError, ShapeError):
        return None
    return g


def sample(shape: tuple[int, ...], dtype: DType, rng: np.random.Generator, name: str) -> np.ndarray:
    """Values every op accepts: positive floats (log, sqrt, pow), small nonzero ints, any bools."""
    if dtype is DType.BOOL:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.is_int:
        if name.endswith("ids"):
            return rng.integers(0, 5, shape).astype(dtype.np)
        return rng.integers(1, 4, shape).astype(dtype.np)
    values = rng.uniform(0.25, 2.0, shape)
    return values.astype(BFLOAT16 if dtype is DType.BF16 else dtype.np)  # bf16 crosses as real bf16


def feeds(g: rlx.Graph, rng: np.random.Generator) -> tuple[dict, dict]:
    inputs = {n.op.name: sample(n.op.shape.static_dims, n.op.shape.dtype, rng, n.op.name) for n in g.inputs()}
    params = {n.op.name: sample(n.op.shape.static_dims, n.op.shape.dtype, rng, n.op.name) for n in g.params()}
    return inputs, params


#: Relative tolerance per dtype: a few units in the last place (the backend rounds once per op, as the
#: reference does, but computes transcendentals in float rather than double).
RTOL = {DType.F32: 2e-5, DType.F16: 2e-3, DType.BF16: 1.6e-2, DType.F64: 1e-6}


def cpu_builds(g: rlx.Graph) -> bool:
    """True when a CPU session builds `g`: its rules take every op, after legalization (f16/bf16 ops
    the CPU lacks run in f32 between casts) and decomposition."""
    return rlx.Session().first_unsupported_op(g, opt_level=0) is None


def check_supported(dtype: DType) -> list[str]:
    """Compile every op a CPU session builds on `dtype` into one graph, run it, compare each output to the
    reference."""
    g = rlx.Graph(f"matrix_{dtype.value}")
    x = g.input("x", [2, 3, 4], dtype.value)
    y = g.input("y", [2, 3, 4], dtype.value)
    outputs: dict[str, int] = {}
    for label, build in cases(dtype):
        single = build_one(dtype, build)
        if single is None or not cpu_builds(single):
            continue
        outputs[label] = build(_Prefixed(g, label), x, y)
    g.set_outputs(outputs)
    rng = np.random.default_rng(7)
    inputs, params = feeds(g, rng)
    cg = rlx.Session().compile(g, opt_level=0)
    for name, value in params.items():
        cg.set_param(name, value)
    got = cg.run(inputs)
    want = rlx.reference.run(g, inputs, params)
    for label, a, b in zip(outputs, got, want):
        rtol = RTOL.get(DType.parse(np.asarray(b).dtype) if dtype.is_float else dtype, 0.0)
        if np.asarray(b).dtype.kind in "iub":
            np.testing.assert_array_equal(a, b, err_msg=f"{label} on {dtype.value}")
        else:
            np.testing.assert_allclose(a, b, rtol=rtol or RTOL.get(dtype, 2e-5), atol=1e-6, equal_nan=True,
                                       err_msg=f"{label} on {dtype.value}")
    return list(outputs)


class _Prefixed:
    """A Graph proxy whose new inputs and params get the case label as a prefix (one graph, many cases)."""

    def __init__(self, graph: rlx.Graph, prefix: str) -> None:
        self._g = graph
        self._prefix = prefix.replace(":", "_") + "_"

    def input(self, name: str, *args: object, **kwargs: object) -> int:
        return self._g.input(self._prefix + name, *args, **kwargs)

    def param(self, name: str, *args: object, **kwargs: object) -> int:
        return self._g.param(self._prefix + name, *args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self._g, name)


if __name__ == "__main__":
    for dt in DTYPES:
        check_supported(dt)
    print("MATRIX-OK")
    sys.exit(0)

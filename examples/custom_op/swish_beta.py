"""A user-defined op: swish_beta(x, beta) = x * sigmoid(beta * x), registered from outside RLX.

`register()` gives RLX the op's shape rule, its numpy reference, a C body (swish_beta.h), a CUDA body
(swish_beta.cuh), a Metal body (swish_beta.metal) and its derivative in traced ops. Run this file to compile
a graph using it on the CPU, check it against the reference and take a gradient through it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import rlx

HERE = Path(__file__).resolve().parent


def _reference(x: np.ndarray, beta: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-beta * x))


def _vjp(x, beta, y, dy):
    s = (beta * x).sigmoid()
    ds = s * (1.0 - s)
    return dy * (s + beta * x * ds), (dy * x * x * ds).sum()


def register(name: str = "swish_beta", c_header: Path = HERE / "swish_beta.h",
             cuda_header: Path = HERE / "swish_beta.cuh", metal_header: Path = HERE / "swish_beta.metal",
             ) -> rlx.CustomOp:
    """Register swish_beta as `name` (x: any f32 shape, beta: f32 scalar) and return it."""
    return rlx.custom_op(name, infer=lambda x, beta: x, reference=_reference, cpu=(c_header, "swish_beta"),
                         cuda=(cuda_header, "swish_beta_cuda"), metal=(metal_header, "swish_beta_metal"), vjp=_vjp)


def main() -> None:
    swish_beta = register()

    def model(t):
        x = t.input("x", [4, 8])
        w = t.param("w", [8, 8])
        return swish_beta(x @ w, t.input("beta", []))

    graph = rlx.trace("swish_mlp", model)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    beta = np.array(1.5, np.float32)
    compiled = rlx.Session().compile(graph)
    compiled.set_param("w", w)
    (y,) = compiled.run(x=x, beta=beta)
    (want,) = rlx.reference.run(graph, {"x": x, "beta": beta}, {"w": w})
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    print("swish_beta on the CPU matches the reference:", y.shape)

    # a gradient through the op (its vjp), compiled like any graph
    def loss_of(t):
        y = model(t)
        return (y * y).sum()

    loss = rlx.trace("swish_loss", loss_of)
    grads = rlx.grad(loss, wrt=["w", "beta"])
    compiled_grads = rlx.Session().compile(grads)
    compiled_grads.set_param("w", w)
    got = compiled_grads.run(x=x, beta=beta)
    for g, r in zip(got, rlx.reference.run(grads, {"x": x, "beta": beta}, {"w": w})):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    print("d loss / d beta =", float(got[2]))


if __name__ == "__main__":
    main()

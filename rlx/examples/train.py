"""Train a small model with the loss, its gradients and the Adam (or SGD) update in one compiled graph.

    python -m rlx.examples.train                       # MLP classifier on generated blobs
    python -m rlx.examples.train --model mamba --steps 200
    python -m rlx.examples.train --optimizer sgd --lr 0.5

The forward graph is traced with the weights as inputs; `rlx.grad` turns it
into a graph of the loss and every weight's gradient; the optimizer update is
appended to that same graph (new weights and moments are outputs, fed back
on the next step), and the whole thing is compiled once for the CPU. Every
step is one call into the compiled library. Models:

- `mlp`: 2-layer GELU MLP with layer norm, 3 classes, data from a random
  teacher network.
- `mamba`: in-projection, causal depthwise conv, SiLU, selective scan with
  input-dependent delta/B/C (Mamba's S6), mean-pool, classifier; the label
  depends on the order of the sequence (is the first half's mean above the
  second half's?).

>>> main(["--steps", "20", "--print-every", "0"]) < 1.2
True
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import rlx
from rlx.ir.graph import Graph, NodeId

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class Task:
    """A model (forward graph builder + weight shapes) and the data it learns."""

    name: str
    weights: dict[str, tuple[int, ...]]
    x_shape: tuple[int, ...]
    classes: int
    forward: Callable[[rlx.Tracer, rlx.TracedTensor, dict[str, rlx.TracedTensor]], rlx.TracedTensor]
    data: Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]
    init: Callable[[np.random.Generator], dict[str, np.ndarray]]


def _glorot(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / sum(shape[-2:]))).astype(np.float32)


# ── MLP on a teacher network's labels ──────────────────────────────────

MLP_IN, MLP_HIDDEN, MLP_CLASSES = 8, 32, 3


def _mlp_forward(t: rlx.Tracer, x: rlx.TracedTensor, w: dict[str, rlx.TracedTensor]) -> rlx.TracedTensor:
    h = (x @ w["w1"] + w["b1"]).gelu().layer_norm(w["ln_g"], w["ln_b"])
    return h @ w["w2"] + w["b2"]


def _mlp_data(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    teacher = np.random.default_rng(1234)  # the same teacher for every batch
    a = teacher.standard_normal((MLP_IN, 16))
    b = teacher.standard_normal((16, MLP_CLASSES))
    x = rng.standard_normal((n, MLP_IN)).astype(np.float32)
    return x, np.argmax(np.tanh(x @ a) @ b, axis=-1)


def _mlp_init(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"w1": _glorot(rng, (MLP_IN, MLP_HIDDEN)), "b1": np.zeros(MLP_HIDDEN, np.float32),
            "ln_g": np.ones(MLP_HIDDEN, np.float32), "ln_b": np.zeros(MLP_HIDDEN, np.float32),
            "w2": _glorot(rng, (MLP_HIDDEN, MLP_CLASSES)), "b2": np.zeros(MLP_CLASSES, np.float32)}


# ── Mamba-style sequence classifier ────────────────────────────────────

SEQ, FEAT, CH, STATE, KSIZE = 12, 2, 8, 4, 3


def _mamba_forward(t: rlx.Tracer, x: rlx.TracedTensor, w: dict[str, rlx.TracedTensor]) -> rlx.TracedTensor:
    u = t.depthwise_conv1d_causal(x @ w["w_in"], w["conv"]).silu()  # [B, S, CH]
    dt = (u @ w["w_dt"] + w["b_dt"]).softplus()
    a = -(w["a_log"].exp())
    y = t.selective_scan(u, dt, a, u @ w["w_b"], u @ w["w_c"]) + u * w["d"]
    return y.mean(1) @ w["w_out"]


def _mamba_data(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((n, SEQ, FEAT)).astype(np.float32)
    first, second = x[:, :SEQ // 2, 0].mean(1), x[:, SEQ // 2:, 0].mean(1)
    return x, (first > second).astype(np.int64)


def _mamba_init(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"w_in": _glorot(rng, (FEAT, CH)), "conv": (rng.standard_normal((CH, KSIZE)) * 0.5).astype(np.float32),
            "w_dt": _glorot(rng, (CH, CH)), "b_dt": np.full(CH, -1.0, np.float32),
            "a_log": np.log(np.tile(np.arange(1, STATE + 1, dtype=np.float32), (CH, 1))),
            "w_b": _glorot(rng, (CH, STATE)), "w_c": _glorot(rng, (CH, STATE)), "d": np.ones(CH, np.float32),
            "w_out": _glorot(rng, (CH, 2))}


TASKS = {
    "mlp": Task("mlp", {k: v.shape for k, v in _mlp_init(np.random.default_rng(0)).items()}, (MLP_IN,),
                MLP_CLASSES, _mlp_forward, _mlp_data, _mlp_init),
    "mamba": Task("mamba", {k: v.shape for k, v in _mamba_init(np.random.default_rng(0)).items()}, (SEQ, FEAT),
                  2, _mamba_forward, _mamba_data, _mamba_init),
}


# ── the training step graph ────────────────────────────────────────────


def loss_graph(task: Task, batch: int) -> Graph:
    """Mean softmax cross-entropy of the model on one batch; the weights are inputs."""

    def fn(t: rlx.Tracer) -> dict[str, rlx.TracedTensor]:
        x = t.input("x", [batch, *task.x_shape])
        y = t.input("y", [batch, task.classes])  # one-hot labels
        w = {name: t.input(name, list(shape)) for name, shape in task.weights.items()}
        logits = task.forward(t, x, w)
        m = logits.max(-1, keepdim=True)
        logp = logits - m - (logits - m).exp().sum(-1, keepdim=True).log()
        return {"loss": -(logp * y).sum() * (1.0 / batch)}

    return rlx.trace(f"{task.name}_loss", fn)


def train_step_graph(task: Task, batch: int, optimizer: str = "adam") -> Graph:
    """Loss, gradients and the optimizer update in one graph.

    Inputs: x, y, the weights, then (adam) `m_<w>`, `v_<w>` per weight, and `lr`,
    `bc1`, `bc2` (learning rate and the bias corrections 1-beta^t) — or (sgd) `lr`.
    Outputs: loss, `new_<w>` per weight, and (adam) `new_m_<w>`, `new_v_<w>`.
    """
    g = rlx.grad(loss_graph(task, batch), wrt=list(task.weights))
    ids = {n.op.name: n.id for n in g.inputs()}
    grads = dict(zip(g.output_names, g.outputs))
    outs: dict[str, NodeId] = {"loss": grads["loss"]}
    lr = g.input("lr", [1])
    if optimizer == "sgd":
        for name in task.weights:
            outs[f"new_{name}"] = g.sub(ids[name], g.mul(lr, grads[f"grad_{name}"]))
    elif optimizer == "adam":
        bc1, bc2 = g.input("bc1", [1]), g.input("bc2", [1])
        b1, b2 = (g.constant(np.float32(b)) for b in ADAM_BETAS)
        one, eps = g.constant(np.float32(1.0)), g.constant(np.float32(ADAM_EPS))
        new_m, new_v = {}, {}
        for name, shape in task.weights.items():
            gr = grads[f"grad_{name}"]
            m = g.add_(g.mul(b1, g.input(f"m_{name}", list(shape))), g.mul(g.sub(one, b1), gr))
            v = g.add_(g.mul(b2, g.input(f"v_{name}", list(shape))), g.mul(g.sub(one, b2), g.mul(gr, gr)))
            step = g.div(g.div(m, bc1), g.add_(g.activation("sqrt", g.div(v, bc2)), eps))
            outs[f"new_{name}"] = g.sub(ids[name], g.mul(lr, step))
            new_m[f"new_m_{name}"], new_v[f"new_v_{name}"] = m, v
        outs.update(new_m)
        outs.update(new_v)
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected 'adam' or 'sgd'")
    g.set_outputs(outs)
    g.verify()
    return g


def train(task: Task, *, steps: int, batch: int = 64, lr: float = 0.01, optimizer: str = "adam", seed: int = 0,
          print_every: int = 50, out=None) -> list[float]:
    """Run `steps` compiled training steps; returns the loss of every step (printed to `out`, default stdout)."""
    out = out if out is not None else sys.stdout
    rng = np.random.default_rng(seed)
    graph = train_step_graph(task, batch, optimizer)
    step_fn = rlx.Session().compile(graph)
    weights = task.init(rng)
    moments = {f"{k}_{n}": np.zeros_like(w) for n, w in weights.items() for k in ("m", "v")}
    losses = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x, labels = task.data(rng, batch)
        feeds = {"x": x, "y": np.eye(task.classes, dtype=np.float32)[labels], **weights,
                 "lr": np.array([lr], np.float32)}
        if optimizer == "adam":
            feeds.update(moments)
            feeds["bc1"] = np.array([1 - ADAM_BETAS[0] ** step], np.float32)
            feeds["bc2"] = np.array([1 - ADAM_BETAS[1] ** step], np.float32)
        res = dict(zip(graph.output_names, step_fn.run(feeds)))
        losses.append(float(res["loss"].reshape(())))
        weights = {n: res[f"new_{n}"] for n in weights}
        if optimizer == "adam":
            moments = {f"{k}_{n}": res[f"new_{k}_{n}"] for n in weights for k in ("m", "v")}
        if print_every and (step % print_every == 0 or step == 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}", file=out)
    if print_every:
        ms = (time.perf_counter() - t0) * 1e3 / steps
        print(f"{steps} steps, {ms:.2f} ms/step; loss {losses[0]:.4f} -> {np.mean(losses[-10:]):.4f} "
              f"(mean of the last 10)", file=out)
    return losses


def main(argv: Sequence[str] | None = None) -> float:
    """Command-line entry: trains and returns the mean loss of the last 10 steps."""
    p = argparse.ArgumentParser(prog="python -m rlx.examples.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(TASKS), default="mlp")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=None, help="default: 0.01 (adam), 0.3 (sgd)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-every", type=int, default=50)
    a = p.parse_args(argv)
    lr = a.lr if a.lr is not None else (0.01 if a.optimizer == "adam" else 0.3)
    losses = train(TASKS[a.model], steps=a.steps, batch=a.batch, lr=lr, optimizer=a.optimizer, seed=a.seed,
                   print_every=a.print_every)
    return float(np.mean(losses[-10:]))


if __name__ == "__main__":
    main()

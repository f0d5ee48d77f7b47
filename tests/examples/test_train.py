"""rlx.examples.train: loss, gradients and the optimizer update compiled as one graph, and the loss falls."""

from __future__ import annotations

import io

import numpy as np

from rlx.examples.train import TASKS, train, train_step_graph


def test_one_graph_holds_loss_gradients_and_update() -> None:
    g = train_step_graph(TASKS["mlp"], 16, "adam")
    names = set(g.output_names)
    assert "loss" in names and {f"new_{w}" for w in TASKS["mlp"].weights} <= names
    assert {f"new_m_{w}" for w in TASKS["mlp"].weights} <= names
    assert {n.op.name for n in g.inputs()} >= {"x", "y", "lr", "bc1", "bc2", *TASKS["mlp"].weights}


def test_mlp_loss_falls_with_adam_and_sgd() -> None:
    for optimizer, lr in (("adam", 0.01), ("sgd", 0.3)):
        out = io.StringIO()
        losses = train(TASKS["mlp"], steps=120, batch=32, lr=lr, optimizer=optimizer, print_every=40, out=out)
        assert np.isfinite(losses).all()
        first, last = losses[0], np.mean(losses[-10:])
        assert last < 0.5 * first, f"{optimizer}: loss {first:.3f} -> {last:.3f}\n{out.getvalue()}"
        assert "ms/step" in out.getvalue()


def test_rlxc_train_runs(capsys) -> None:
    from rlx.cli import main

    assert main(["train", "--steps", "5", "--print-every", "5", "--batch", "8"]) == 0
    assert "ms/step" in capsys.readouterr().out
    assert main(["train", "--model", "nope"]) == 2
